//! The synthetic schema of the dependency-graph benches: 1,000 tables, 500 triggers (PL/pgSQL
//! bodies writing 1–3 other tables, with chains and cycles), 2,000 foreign keys (a quarter of
//! them cascading) and 200 views (some over views), all in schema `app`: tables `t0`..`t999`,
//! views `v0`..`v199`. Shared with `crates/proxy/benches/route.rs` (included by path; not
//! every item is used by both benches).

#![allow(dead_code)]

use pgfresh_deps::{CatalogRows, ForeignKeyRow, FunctionRow, RelationRow, TriggerRow, ViewDepRow};

pub const TABLES: u32 = 1000;
const VIEW_BASE: u32 = 10_000;
const FUNC_BASE: u32 = 20_000;

/// A small deterministic generator (no extra dependency).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

pub fn schema() -> CatalogRows {
    let mut rng = Lcg(42);
    let mut rows = CatalogRows::default();
    for i in 0..TABLES {
        rows.relations.push(RelationRow {
            oid: i,
            schema: "app".into(),
            name: format!("t{i}"),
            relkind: 'r',
            unlogged: false,
        });
    }
    // 500 triggers: on every other table; bodies write 1–3 tables a little further on
    // (chains), and every 25th writes back (cycles).
    for k in 0..500u32 {
        let table = k * 2;
        let mut body = String::new();
        for _ in 0..=rng.next(3) {
            let target = if k % 25 == 0 {
                table.saturating_sub(1 + rng.next(20))
            } else {
                (table + 1 + rng.next(30)) % TABLES
            };
            body.push_str(&format!(
                "  INSERT INTO app.t{target}(ref, at) VALUES (NEW.id, now());\n"
            ));
        }
        let name = format!("trg_fn{k}");
        let definition = format!(
            "CREATE OR REPLACE FUNCTION app.{name}()\n RETURNS trigger\n LANGUAGE plpgsql\nAS $function$\nBEGIN\n  IF TG_OP = 'DELETE' THEN\n    RETURN OLD;\n  END IF;\n{body}  RETURN NEW;\nEND\n$function$\n"
        );
        rows.functions.push(FunctionRow {
            oid: FUNC_BASE + k,
            schema: "app".into(),
            name,
            language: "plpgsql".into(),
            definition: Some(definition),
            volatility: 'v',
        });
        rows.triggers.push(TriggerRow {
            table_oid: table,
            function_oid: FUNC_BASE + k,
            name: format!("trg{k}"),
        });
    }
    // 2,000 foreign keys: children reference tables shortly before them; a quarter cascade.
    for k in 0..2000u32 {
        let referencing = 1 + rng.next(TABLES - 1);
        let referenced = referencing.saturating_sub(1 + rng.next(50));
        let action = ['c', 'a', 'a', 'r'][(k % 4) as usize];
        rows.foreign_keys.push(ForeignKeyRow {
            name: format!("fk{k}"),
            referencing_oid: referencing,
            referenced_oid: referenced,
            on_delete: action,
            on_update: 'a',
        });
    }
    // 200 views over 2–3 tables; every 5th also over an earlier view.
    for v in 0..200u32 {
        rows.relations.push(RelationRow {
            oid: VIEW_BASE + v,
            schema: "app".into(),
            name: format!("v{v}"),
            relkind: 'v',
            unlogged: false,
        });
        for _ in 0..2 + rng.next(2) {
            rows.view_deps.push(ViewDepRow {
                view_oid: VIEW_BASE + v,
                base_oid: rng.next(TABLES),
            });
        }
        if v % 5 == 4 {
            rows.view_deps.push(ViewDepRow {
                view_oid: VIEW_BASE + v,
                base_oid: VIEW_BASE + rng.next(v),
            });
        }
    }
    rows
}
