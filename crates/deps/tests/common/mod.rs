//! Building catalog rows by hand, as the proxy's loader would from a real database.
#![allow(dead_code)]

use pgfresh_deps::{
    CatalogRows, EventTriggerRow, ForeignKeyRow, FunctionRow, ImplicitCallRow, InheritsRow,
    PolicyDepRow, RelationRow, RuleRow, TriggerRow, ViewCallRow, ViewDepRow, WriteCallRow,
};
use pgfresh_sql::{FuncName, RelName};

#[derive(Default)]
pub struct Schema {
    pub rows: CatalogRows,
    next: u32,
}

fn split(q: &str) -> (String, String) {
    let (s, n) = q.split_once('.').expect("qualified name");
    (s.to_owned(), n.to_owned())
}

/// `pg_get_functiondef` output for a PL/pgSQL function with `body` between BEGIN and END.
pub fn plpgsql_def(qualified: &str, returns: &str, vol: &str, body: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {qualified}()\n RETURNS {returns}\n LANGUAGE plpgsql\n{vol}AS $function$\nBEGIN\n{body}\nEND;\n$function$\n"
    )
}

impl Schema {
    fn oid(&mut self) -> u32 {
        self.next += 1;
        16384 + self.next
    }

    pub fn rel(&mut self, qualified: &str, relkind: char) -> u32 {
        let oid = self.oid();
        let (schema, name) = split(qualified);
        self.rows.relations.push(RelationRow {
            oid,
            schema,
            name,
            relkind,
            unlogged: false,
        });
        oid
    }

    /// An unlogged table.
    pub fn unlogged_table(&mut self, qualified: &str) -> u32 {
        let oid = self.table(qualified);
        if let Some(r) = self.rows.relations.last_mut() {
            r.unlogged = true;
        }
        oid
    }

    pub fn table(&mut self, qualified: &str) -> u32 {
        self.rel(qualified, 'r')
    }

    pub fn func(&mut self, qualified: &str, language: &str, vol: char, def: Option<String>) -> u32 {
        let oid = self.oid();
        let (schema, name) = split(qualified);
        self.rows.functions.push(FunctionRow {
            oid,
            schema,
            name,
            language: language.to_owned(),
            definition: def,
            volatility: vol,
        });
        oid
    }

    /// A volatile PL/pgSQL trigger function.
    pub fn trigger_fn(&mut self, qualified: &str, body: &str) -> u32 {
        let def = plpgsql_def(qualified, "trigger", "", body);
        self.func(qualified, "plpgsql", 'v', Some(def))
    }

    pub fn trigger(&mut self, table: u32, function: u32, name: &str) {
        self.rows.triggers.push(TriggerRow {
            table_oid: table,
            function_oid: function,
            name: name.to_owned(),
        });
    }

    pub fn fk(&mut self, referencing: u32, referenced: u32, on_delete: char, on_update: char) {
        let name = format!("fk_{referencing}_{referenced}");
        self.rows.foreign_keys.push(ForeignKeyRow {
            name,
            referencing_oid: referencing,
            referenced_oid: referenced,
            on_delete,
            on_update,
        });
    }

    pub fn view(&mut self, qualified: &str, relkind: char, bases: &[u32]) -> u32 {
        let oid = self.rel(qualified, relkind);
        for &b in bases {
            self.rows.view_deps.push(ViewDepRow {
                view_oid: oid,
                base_oid: b,
            });
        }
        oid
    }

    /// A write to `table` evaluates an expression (`via`) calling `function`.
    pub fn write_call(&mut self, table: u32, function: u32, via: &str) {
        self.rows.write_calls.push(WriteCallRow {
            table_oid: table,
            function_oid: function,
            via: via.to_owned(),
        });
    }

    /// `function` runs behind aggregate, operator or cast (`kind` a, o, c) `qualified`;
    /// returns the aggregate's (operator's, cast's) own oid.
    pub fn implicit_call(&mut self, kind: char, qualified: &str, function: u32) -> u32 {
        let owner = self.oid();
        let (schema, name) = split(qualified);
        self.rows.implicit_calls.push(ImplicitCallRow {
            kind,
            schema,
            name,
            function_oid: function,
            owner_oid: owner,
        });
        owner
    }

    /// An enabled event trigger running `function`.
    pub fn event_trigger(&mut self, name: &str, event: &str, function: u32) {
        self.rows.event_triggers.push(EventTriggerRow {
            name: name.to_owned(),
            event: event.to_owned(),
            function_oid: function,
        });
    }

    /// View `view`'s query calls `function`.
    pub fn view_call(&mut self, view: u32, function: u32) {
        self.rows.view_calls.push(ViewCallRow {
            view_oid: view,
            function_oid: function,
        });
    }

    /// Row-security policy `name` on `table` refers to relation (`'r'`) or function (`'f'`)
    /// `target`.
    pub fn policy(&mut self, table: u32, name: &str, target: u32, kind: char) {
        self.rows.policy_deps.push(PolicyDepRow {
            table_oid: table,
            name: name.to_owned(),
            ref_oid: target,
            ref_kind: kind,
        });
    }

    /// A rewrite rule on `table`, `definition` as `pg_get_ruledef` gives it.
    pub fn rule(&mut self, table: u32, name: &str, definition: &str) {
        self.rows.rules.push(RuleRow {
            table_oid: table,
            name: name.to_owned(),
            definition: definition.to_owned(),
        });
    }

    pub fn inherit(&mut self, child: u32, parent: u32) {
        self.rows.inherits.push(InheritsRow {
            child_oid: child,
            parent_oid: parent,
        });
    }
}

pub fn rel(name: &str) -> RelName {
    RelName::parse(name).unwrap()
}

pub fn func(name: &str) -> FuncName {
    FuncName::parse(name).unwrap()
}

pub fn rels(names: &[&str]) -> Vec<RelName> {
    let mut v: Vec<RelName> = names.iter().map(|n| rel(n)).collect();
    v.sort();
    v
}
