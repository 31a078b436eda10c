//! Which schema changes can change what other statements touch behind their text.
//!
//! pgfresh learns triggers, rules, views, partitions, foreign keys and function bodies
//! from the catalog and reloads them after DDL. Between such a change and the reload,
//! the dependency graph in hand is out of date: a write may fire a trigger it does not
//! know, a read of a new view may read tables it does not know. The caller treats
//! those windows conservatively (see `Statement::changes_effects`).
//!
//! The list below is of what certainly changes nothing of that kind; every other
//! schema change counts, so a statement pgfresh does not know errs on the safe side.

use pg_query::protobuf::{self, AlterTableType, ConstrType, Node};
use pg_query::NodeEnum;

/// True when the DDL statement `node` may change what writes touch behind their text
/// (triggers, rules, functions, partitions, inheritance, foreign-key actions) or what a
/// read of a relation reads (views, row-security policies).
pub(crate) fn changes_effects(node: &NodeEnum) -> bool {
    match node {
        NodeEnum::CreateStmt(c) => {
            c.partbound.is_some()
                || !c.inh_relations.is_empty()
                || c.constraints
                    .iter()
                    .any(|n| is_foreign_key(n) || calls_user_function(n))
                || c.table_elts.iter().any(|e| match &e.node {
                    Some(NodeEnum::ColumnDef(d)) => column_moves_effects(d),
                    Some(NodeEnum::Constraint(_)) => is_foreign_key(e) || calls_user_function(e),
                    // `LIKE src INCLUDING ...` copies defaults, checks and generated columns
                    // pgfresh does not see here.
                    Some(NodeEnum::TableLikeClause(l)) => l.options != 0,
                    _ => false,
                })
        }
        // A domain's checks and default run on writes of columns of its type.
        NodeEnum::CreateDomainStmt(d) => d.constraints.iter().any(calls_user_function),
        NodeEnum::AlterTableStmt(a) => a.cmds.iter().any(|c| match &c.node {
            Some(NodeEnum::AlterTableCmd(cmd)) => !neutral_alter(cmd),
            _ => true,
        }),
        NodeEnum::CreateSchemaStmt(s) => !s.schema_elts.is_empty(),
        NodeEnum::IndexStmt(_)
        | NodeEnum::CreateSeqStmt(_)
        | NodeEnum::AlterSeqStmt(_)
        | NodeEnum::DropStmt(_)
        | NodeEnum::GrantStmt(_)
        | NodeEnum::GrantRoleStmt(_)
        | NodeEnum::AlterDefaultPrivilegesStmt(_)
        | NodeEnum::CommentStmt(_)
        | NodeEnum::SecLabelStmt(_)
        | NodeEnum::CreateRoleStmt(_)
        | NodeEnum::AlterRoleStmt(_)
        | NodeEnum::AlterRoleSetStmt(_)
        | NodeEnum::DropRoleStmt(_)
        | NodeEnum::AlterOwnerStmt(_)
        | NodeEnum::CreatedbStmt(_)
        | NodeEnum::DropdbStmt(_)
        | NodeEnum::CreateEnumStmt(_)
        | NodeEnum::AlterEnumStmt(_)
        | NodeEnum::CompositeTypeStmt(_)
        | NodeEnum::CreateStatsStmt(_)
        | NodeEnum::AlterStatsStmt(_) => false,
        _ => true,
    }
}

/// Whether `node` (an expression, or a constraint with one: a default, a check, a generated
/// column) calls a function that is not a known built-in. A write then runs it, and what it
/// writes is learned only at the reload after the change (see `WRITE_CALLS_SQL` in
/// pgfresh-deps), so the change opens the window like a new trigger. `nextval`, `now()`,
/// `gen_random_uuid()` and the like do not count.
fn calls_user_function(node: &Node) -> bool {
    let mut w = crate::visit::Walker::default();
    match &node.node {
        Some(NodeEnum::Constraint(c)) => {
            if let Some(e) = &c.raw_expr {
                w.expr(e);
            }
        }
        _ => w.expr(node),
    }
    crate::functions::calls_user_functions(&w.functions)
}

/// A column definition (or a composite type's attribute: `ALTER TYPE ... ADD ATTRIBUTE`
/// parses as one) with a cascading foreign key, a default, check or generated expression
/// that calls a user function, or a type that is not a plain built-in: a user type may be a
/// domain, or contain one, whose check or default calls a function (learned from the
/// catalog only at the reload after the change).
fn column_moves_effects(d: &protobuf::ColumnDef) -> bool {
    d.constraints
        .iter()
        .any(|c| is_foreign_key(c) || calls_user_function(c))
        || d.raw_default.as_deref().is_some_and(calls_user_function)
        || d.type_name.as_ref().is_some_and(|t| !is_builtin_type(t))
}

/// A type named `pg_catalog.x`, or by one of the plain names of the common built-ins (an
/// array of one too).
fn is_builtin_type(t: &protobuf::TypeName) -> bool {
    match crate::visit::string_parts(&t.names)[..] {
        ["pg_catalog", _] => true,
        [name] => {
            crate::builtins::PLAIN_BUILTIN_TYPES.contains(&name)
                || crate::builtins::CATALOG_TYPES.contains(&name)
        }
        _ => false,
    }
}

/// A foreign key whose ON DELETE or ON UPDATE action writes the referencing table
/// (CASCADE, SET NULL, SET DEFAULT); NO ACTION and RESTRICT write nothing.
fn is_foreign_key(n: &Node) -> bool {
    let writes = |action: &str| matches!(action, "c" | "n" | "d");
    matches!(&n.node, Some(NodeEnum::Constraint(c))
        if c.contype == ConstrType::ConstrForeign as i32
            && (writes(&c.fk_del_action) || writes(&c.fk_upd_action)))
}

/// An `ALTER TABLE` action that changes no trigger, rule, partition, inheritance, foreign
/// key or row security.
fn neutral_alter(cmd: &protobuf::AlterTableCmd) -> bool {
    use AlterTableType as T;
    let def_moves_effects = || {
        cmd.def.as_deref().is_some_and(|d| match &d.node {
            Some(NodeEnum::ColumnDef(c)) => column_moves_effects(c),
            _ => is_foreign_key(d) || calls_user_function(d),
        })
    };
    match AlterTableType::try_from(cmd.subtype) {
        // (`ALTER COLUMN ... TYPE ... USING expr`: the expression is the definition's
        // `raw_default`, run on every row.)
        Ok(T::AtAddColumn | T::AtAddConstraint | T::AtColumnDefault | T::AtAlterColumnType) => {
            !def_moves_effects()
        }
        Ok(
            T::AtDropNotNull
            | T::AtSetNotNull
            | T::AtSetStatistics
            | T::AtSetOptions
            | T::AtResetOptions
            | T::AtSetStorage
            | T::AtSetCompression
            | T::AtDropColumn
            | T::AtAddIndex
            | T::AtValidateConstraint
            | T::AtAddIndexConstraint
            | T::AtDropConstraint
            | T::AtChangeOwner
            | T::AtClusterOn
            | T::AtDropCluster
            | T::AtSetLogged
            | T::AtSetUnLogged
            | T::AtSetAccessMethod
            | T::AtSetTableSpace
            | T::AtSetRelOptions
            | T::AtResetRelOptions
            | T::AtReplaceRelOptions
            | T::AtReplicaIdentity
            | T::AtAddIdentity
            | T::AtSetIdentity
            | T::AtDropIdentity,
        ) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::analyze_uncached;

    fn changes(sql: &str) -> bool {
        let a = analyze_uncached(sql);
        assert!(a.error.is_none(), "{sql}: {:?}", a.error);
        a.statements.iter().any(|s| s.changes_effects)
    }

    #[test]
    fn schema_changes_that_move_effects_count() {
        for sql in [
            "CREATE TRIGGER t AFTER INSERT ON a FOR EACH ROW EXECUTE FUNCTION f()",
            "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "CREATE PROCEDURE p() LANGUAGE sql AS 'UPDATE a SET x = 1'",
            "CREATE RULE r AS ON INSERT TO a DO ALSO UPDATE b SET n = n + 1",
            "CREATE VIEW v AS SELECT * FROM a",
            "CREATE OR REPLACE VIEW v AS SELECT * FROM b",
            "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (1) TO (10)",
            "CREATE TABLE c () INHERITS (a)",
            "CREATE TABLE c (id int REFERENCES a ON DELETE CASCADE)",
            "CREATE TABLE c (id int, FOREIGN KEY (id) REFERENCES a ON UPDATE SET NULL)",
            "ALTER TABLE c ADD CONSTRAINT fk FOREIGN KEY (id) REFERENCES a ON DELETE CASCADE",
            "ALTER TABLE c ADD COLUMN a_id int REFERENCES a ON DELETE SET DEFAULT",
            "ALTER TABLE p ATTACH PARTITION p2 FOR VALUES FROM (10) TO (20)",
            "ALTER TABLE a ENABLE TRIGGER t",
            "ALTER TABLE a RENAME TO b",
            "ALTER FUNCTION f() RENAME TO g",
            "CREATE EXTENSION hstore",
            "CREATE SCHEMA s CREATE VIEW v AS SELECT 1",
            "CREATE POLICY p ON a FOR SELECT USING (g IN (SELECT g FROM m))",
            "ALTER TABLE a ENABLE ROW LEVEL SECURITY",
            // A write runs the user functions of defaults, checks and generated columns.
            "CREATE TABLE i (no bigint DEFAULT next_invoice_no(), amount int)",
            "CREATE TABLE i (amount int CHECK (audit_amount(amount)))",
            "CREATE TABLE i (amount int, CONSTRAINT c CHECK (app.audit(amount)))",
            "CREATE TABLE i (a int, b int GENERATED ALWAYS AS (score(a)) STORED)",
            "ALTER TABLE i ADD COLUMN no bigint DEFAULT next_invoice_no()",
            "ALTER TABLE i ALTER COLUMN no SET DEFAULT next_invoice_no()",
            "ALTER TABLE i ADD CONSTRAINT c CHECK (audit_amount(amount))",
            "ALTER TABLE i ALTER COLUMN amount TYPE bigint USING convert_amount(amount)",
            "CREATE DOMAIN d AS int CHECK (audit_amount(VALUE))",
            "CREATE DOMAIN d AS bigint DEFAULT next_invoice_no()",
            "CREATE TABLE c (LIKE i INCLUDING ALL)",
            "CREATE TABLE c (LIKE i INCLUDING DEFAULTS)",
            // A column or attribute of a user type: a domain, or a type containing one.
            "CREATE TABLE c (amount checked_amount)",
            "CREATE TABLE c (pairs app.pair[])",
            "ALTER TABLE i ADD COLUMN d checked_amount",
            "ALTER TABLE i ALTER COLUMN amount TYPE checked_amount",
            "ALTER TYPE pair ADD ATTRIBUTE b checked_amount",
        ] {
            assert!(changes(sql), "{sql}");
        }
    }

    #[test]
    fn writes_that_create_relations_fire_event_triggers() {
        let fires = |sql: &str| {
            let a = analyze_uncached(sql);
            assert!(a.error.is_none(), "{sql}: {:?}", a.error);
            a.statements.iter().any(|s| s.fires_event_triggers)
        };
        for sql in [
            "CREATE TABLE a (id int)",
            "DROP TABLE a",
            "CREATE TEMP TABLE t (id int)",
            "CREATE TEMPORARY VIEW v AS SELECT 1",
            "CREATE TABLE t AS SELECT 1 AS id",
            "SELECT 1 AS id INTO t",
            "CREATE MATERIALIZED VIEW m AS SELECT 1 AS id",
            "REFRESH MATERIALIZED VIEW m",
            "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
        ] {
            assert!(fires(sql), "{sql}");
        }
        for sql in [
            "SELECT 1",
            "INSERT INTO a VALUES (1)",
            "UPDATE a SET id = 2",
            "EXPLAIN SELECT 1",
        ] {
            assert!(!fires(sql), "{sql}");
        }
    }

    #[test]
    fn plain_schema_changes_do_not_count() {
        for sql in [
            "CREATE TABLE a (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)",
            "CREATE TABLE t (a varchar(10), b text[], c numeric(10, 2), d double precision, \
             e timestamptz, f jsonb, g bigserial, h timestamp with time zone, \
             i character varying(5), j bit varying(3), k boolean, l uuid, m pg_catalog.int8, \
             n regclass)",
            "ALTER TABLE a ALTER COLUMN n TYPE bigint",
            "CREATE TABLE p (id int) PARTITION BY RANGE (id)",
            "CREATE INDEX ON a (n)",
            "CREATE SEQUENCE s",
            "CREATE SCHEMA s",
            "DROP TABLE a",
            "DROP TRIGGER t ON a",
            "ALTER TABLE a ADD COLUMN m int, ALTER COLUMN n SET NOT NULL",
            "ALTER TABLE a ADD CONSTRAINT u UNIQUE (n)",
            "CREATE TABLE c (id int REFERENCES a, b int, FOREIGN KEY (b) REFERENCES a ON DELETE RESTRICT)",
            "ALTER TABLE c ADD COLUMN a_id int REFERENCES a",
            "CREATE TABLE i (id bigint DEFAULT nextval('s'), at timestamptz DEFAULT now(), u uuid DEFAULT gen_random_uuid())",
            "ALTER TABLE i ALTER COLUMN at SET DEFAULT clock_timestamp()",
            "ALTER TABLE i ADD CONSTRAINT c CHECK (length(name) > 0 AND amount > 0)",
            "ALTER TABLE i ALTER COLUMN amount TYPE bigint",
            "ALTER TABLE i ALTER COLUMN amount TYPE bigint USING amount::bigint",
            "CREATE DOMAIN d AS int CHECK (VALUE > 0) DEFAULT 1",
            "CREATE TABLE c (LIKE i)",
            "GRANT SELECT ON a TO PUBLIC",
            "COMMENT ON TABLE a IS 'x'",
            "SELECT 1",
            "INSERT INTO a VALUES (1)",
        ] {
            assert!(!changes(sql), "{sql}");
        }
    }
}
