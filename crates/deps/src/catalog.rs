//! What the catalog of one database says, as plain rows, and the queries that read them.
//!
//! The proxy runs each query below on the primary (as the monitor user, in the database the
//! graph is for) and fills [`CatalogRows`]; the column lists of the queries match the fields
//! of the row types one to one (a unit test checks the names). Every query is read-only and
//! returns text or `int8` only, so any driver can decode the rows (oids arrive as `int8`:
//! convert with `u32::try_from`; one-letter columns as text: [`char_column`]).

use serde::{Deserialize, Serialize};

/// Object identifier (`oid`), as PostgreSQL numbers catalog rows.
pub type Oid = u32;

/// Everything the graph is built from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogRows {
    /// Tables, partitioned tables, views, materialized views, foreign tables ([`RELATIONS_SQL`]).
    pub relations: Vec<RelationRow>,
    /// Enabled, user-defined triggers ([`TRIGGERS_SQL`]).
    pub triggers: Vec<TriggerRow>,
    /// Foreign keys ([`FOREIGN_KEYS_SQL`]).
    pub foreign_keys: Vec<ForeignKeyRow>,
    /// Relations each view's query uses ([`VIEW_DEPS_SQL`]).
    pub view_deps: Vec<ViewDepRow>,
    /// Partitions and inheritance children ([`INHERITS_SQL`]).
    pub inherits: Vec<InheritsRow>,
    /// User functions and procedures ([`FUNCTIONS_SQL`]).
    pub functions: Vec<FunctionRow>,
    /// Enabled rewrite rules on writes ([`RULES_SQL`]; absent from rows saved before they
    /// were read).
    #[serde(default)]
    pub rules: Vec<RuleRow>,
    /// User functions each view's query calls ([`VIEW_CALLS_SQL`]; absent from rows saved
    /// before they were read).
    #[serde(default)]
    pub view_calls: Vec<ViewCallRow>,
    /// What the row-security policies that filter reads refer to ([`POLICY_DEPS_SQL`];
    /// absent from rows saved before they were read).
    #[serde(default)]
    pub policy_deps: Vec<PolicyDepRow>,
    /// User functions a write to a table evaluates in column defaults, generated columns,
    /// check constraints and index expressions ([`WRITE_CALLS_SQL`]; absent from rows
    /// saved before they were read).
    #[serde(default)]
    pub write_calls: Vec<WriteCallRow>,
    /// Enabled event triggers ([`EVENT_TRIGGERS_SQL`]; absent from rows saved before they
    /// were read).
    #[serde(default)]
    pub event_triggers: Vec<EventTriggerRow>,
    /// Functions that run behind syntax naming none: aggregates' support functions,
    /// operators' and casts' functions ([`IMPLICIT_CALLS_SQL`]; absent from rows saved
    /// before they were read).
    #[serde(default)]
    pub implicit_calls: Vec<ImplicitCallRow>,
    /// Where user casts applied implicitly or on assignment may run ([`IMPLICIT_CASTS_SQL`];
    /// absent from rows saved before they were read).
    #[serde(default)]
    pub implicit_casts: Vec<ImplicitCastRow>,
}

/// One row of `pg_class` (relkinds `r`, `p`, `v`, `m`, `f`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelationRow {
    /// `pg_class.oid`.
    pub oid: Oid,
    /// Schema name (`pg_namespace.nspname`), exactly as stored (no folding needed).
    pub schema: String,
    /// Relation name (`pg_class.relname`), exactly as stored.
    pub name: String,
    /// `pg_class.relkind`: `r` table, `p` partitioned table, `v` view, `m` materialized
    /// view, `f` foreign table.
    pub relkind: char,
    /// `pg_class.relpersistence = 'u'`: an unlogged table, which a standby cannot read
    /// (absent from rows saved before it was read).
    #[serde(default)]
    pub unlogged: bool,
}

/// One enabled, non-internal row of `pg_trigger`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerRow {
    /// The table (or view, for INSTEAD OF triggers) the trigger is on (`tgrelid`).
    pub table_oid: Oid,
    /// The trigger function (`tgfoid`).
    pub function_oid: Oid,
    /// Trigger name (`tgname`), for introspection.
    pub name: String,
}

/// One foreign key (`pg_constraint` with `contype = 'f'`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignKeyRow {
    /// Constraint name (`conname`), for introspection.
    pub name: String,
    /// The table holding the key (`conrelid`): written by a cascade.
    pub referencing_oid: Oid,
    /// The table referenced (`confrelid`): the write that cascades is to this one.
    pub referenced_oid: Oid,
    /// `confdeltype`: `a` no action, `r` restrict, `c` cascade, `n` set null, `d` set default.
    pub on_delete: char,
    /// `confupdtype`, same letters.
    pub on_update: char,
}

/// A relation a view's (or materialized view's) query uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDepRow {
    /// The view.
    pub view_oid: Oid,
    /// A relation its query reads (never the view itself).
    pub base_oid: Oid,
}

/// A function a view's (or materialized view's) query calls.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewCallRow {
    /// The view.
    pub view_oid: Oid,
    /// A function its query calls (`pg_proc.oid`; built-ins are in no row of
    /// [`FUNCTIONS_SQL`] and add nothing).
    pub function_oid: Oid,
}

/// A relation or function a row-security policy that filters reads refers to: a read of
/// the table reads what the policy's `USING` expression reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyDepRow {
    /// The table the policy is on (`polrelid`; row security enabled).
    pub table_oid: Oid,
    /// The policy's name.
    pub name: String,
    /// What the expression refers to (`pg_depend.refobjid`).
    pub ref_oid: Oid,
    /// `r`: a relation (`pg_class`), `f`: a function (`pg_proc`).
    pub ref_kind: char,
}

/// A function a write to a table evaluates: in a column default or generated column, a check
/// constraint, or an index expression or predicate.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteCallRow {
    /// The table written.
    pub table_oid: Oid,
    /// The function its expression calls (`pg_proc.oid`).
    pub function_oid: Oid,
    /// Where: `default`, `check`, `domain` (a check of a column's domain), `index`, `cast`
    /// (an assignment or implicit cast to the type of one of its columns, which a value of
    /// another type written to the column goes through), `trigger condition` (a
    /// trigger's `WHEN`) or `policy` (a row-security policy).
    pub via: String,
}

/// A function that runs where a statement names something else: an aggregate's support
/// function (`audit_sum(x)` runs its state transition function), an operator's function
/// (`a <+> b`), a cast's function (`x::money_t`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImplicitCallRow {
    /// `a` an aggregate, `o` an operator, `c` a cast.
    pub kind: char,
    /// The schema of the aggregate, the operator, or the type cast to.
    pub schema: String,
    /// The aggregate's name, the operator's symbol, or the name of the type cast to.
    pub name: String,
    /// The function that runs (`pg_proc.oid`; built-ins are in no row of
    /// [`FUNCTIONS_SQL`] and add nothing).
    pub function_oid: Oid,
    /// The aggregate's own `pg_proc.oid` (what a view's or a default's dependencies name),
    /// the operator's or the cast's oid.
    #[serde(default)]
    pub owner_oid: Oid,
}

/// Where a user cast that PostgreSQL applies without being asked (`AS IMPLICIT`, `AS
/// ASSIGNMENT`) may run: the text of a statement names neither the cast nor, often, its
/// types. It can run only where a value or a column of one of its types appears.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImplicitCastRow {
    /// `t`: a type built on one of the cast's types (the type itself, a domain, array,
    /// range or multirange over it, a composite or row type with such a column), whose
    /// name an explicit cast in a text may use; `r`: a relation with a column of such a
    /// type; `b`: the cast is between two built-in types, so any statement may apply it.
    pub kind: char,
    /// The type's schema and name (`t`), empty otherwise.
    pub schema: String,
    pub name: String,
    /// The cast's function (`pg_cast.castfunc`).
    pub function_oid: Oid,
    /// The type's oid (`t`), the relation's (`r`), the cast's (`b`).
    pub oid: Oid,
}

/// An enabled event trigger: DDL runs its function (`CREATE EVENT TRIGGER ... ON
/// ddl_command_end EXECUTE FUNCTION audit_ddl()`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventTriggerRow {
    /// `evtname`.
    pub name: String,
    /// `evtevent`: `ddl_command_start`, `ddl_command_end`, `sql_drop`, `table_rewrite`.
    pub event: String,
    /// The function it runs (`evtfoid`).
    pub function_oid: Oid,
}

/// A rewrite rule on an INSERT, UPDATE or DELETE of a relation (`CREATE RULE ... DO ALSO |
/// INSTEAD ...`): what its actions do happens with every such write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRow {
    /// The relation the rule is on (`pg_rewrite.ev_class`).
    pub table_oid: Oid,
    /// The rule's name.
    pub name: String,
    /// `pg_get_ruledef(oid)`: the whole `CREATE RULE` text.
    pub definition: String,
}

/// One row of `pg_inherits`: a partition of a partitioned table, or an inheritance child.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InheritsRow {
    /// `inhrelid`.
    pub child_oid: Oid,
    /// `inhparent`.
    pub parent_oid: Oid,
}

/// One user function or procedure.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionRow {
    /// `pg_proc.oid`.
    pub oid: Oid,
    /// Schema name, exactly as stored.
    pub schema: String,
    /// Function name (`proname`), exactly as stored.
    pub name: String,
    /// Language name (`pg_language.lanname`): `sql` and `plpgsql` bodies are analysed; any
    /// other language is unanalysable.
    pub language: String,
    /// `pg_get_functiondef(oid)` for `sql` and `plpgsql`, `None` for other languages.
    pub definition: Option<String>,
    /// `provolatile`: `i`, `s` or `v`.
    pub volatility: char,
}

/// Relations: tables, partitioned tables, views, materialized views and foreign tables
/// outside the system schemas.
pub const RELATIONS_SQL: &str = "\
SELECT c.oid::int8 AS oid, n.nspname::text AS schema, c.relname::text AS name, \
c.relkind::text AS relkind, c.relpersistence = 'u' AS unlogged \
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') \
AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'";

/// Triggers that can fire: enabled (`tgenabled <> 'D'`; `O`, `R` and `A` all fire in some
/// session replication role) and not internal (foreign-key enforcement triggers are internal
/// and are described by [`FOREIGN_KEYS_SQL`] instead). On PostgreSQL 11–14 row triggers a
/// partition inherits from its parent are marked internal; the graph covers them by letting a
/// write to a partition fire its ancestors' triggers.
pub const TRIGGERS_SQL: &str = "\
SELECT t.tgrelid::int8 AS table_oid, t.tgfoid::int8 AS function_oid, t.tgname::text AS name \
FROM pg_catalog.pg_trigger t \
WHERE NOT t.tgisinternal AND t.tgenabled <> 'D'";

/// Foreign keys with their referential actions (all of them: the graph keeps the ones whose
/// ON DELETE or ON UPDATE action writes the referencing table).
pub const FOREIGN_KEYS_SQL: &str = "\
SELECT c.conname::text AS name, c.conrelid::int8 AS referencing_oid, \
c.confrelid::int8 AS referenced_oid, c.confdeltype::text AS on_delete, \
c.confupdtype::text AS on_update \
FROM pg_catalog.pg_constraint c WHERE c.contype = 'f'";

/// The relations a view's or materialized view's query uses: the dependencies (`deptype
/// 'n'`) of its `_RETURN` rewrite rule on other relations; system views left out.
pub const VIEW_DEPS_SQL: &str = "\
SELECT DISTINCT r.ev_class::int8 AS view_oid, d.refobjid::int8 AS base_oid \
FROM pg_catalog.pg_rewrite r \
JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid \
JOIN pg_catalog.pg_class b ON b.oid = d.refobjid \
JOIN pg_catalog.pg_class v ON v.oid = r.ev_class \
JOIN pg_catalog.pg_namespace n ON n.oid = v.relnamespace \
WHERE r.rulename = '_RETURN' AND d.refclassid = 'pg_catalog.pg_class'::regclass \
AND d.deptype = 'n' AND d.refobjid <> r.ev_class AND b.relkind IN ('r', 'p', 'v', 'm', 'f') \
AND n.nspname NOT IN ('pg_catalog', 'information_schema')";

/// The user functions a view's or materialized view's query calls: the dependencies of its
/// `_RETURN` rule on functions, and on operators (as their functions); system views left
/// out.
pub const VIEW_CALLS_SQL: &str = "\
SELECT DISTINCT r.ev_class::int8 AS view_oid, \
coalesce(o.oprcode::oid, d.refobjid)::int8 AS function_oid \
FROM pg_catalog.pg_rewrite r \
JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid \
LEFT JOIN pg_catalog.pg_operator o ON d.refclassid = 'pg_catalog.pg_operator'::regclass \
AND o.oid = d.refobjid \
JOIN pg_catalog.pg_class v ON v.oid = r.ev_class \
JOIN pg_catalog.pg_namespace n ON n.oid = v.relnamespace \
WHERE r.rulename = '_RETURN' \
AND d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass) \
AND d.deptype = 'n' AND n.nspname NOT IN ('pg_catalog', 'information_schema')";

/// What the policies that filter reads (`FOR SELECT` or `FOR ALL`) of tables with row security
/// enabled refer to: the relations and functions their expressions use (PostgreSQL records
/// them as normal dependencies of the policy; an operator as its function), the policy's
/// own table left out.
pub const POLICY_DEPS_SQL: &str = "\
SELECT DISTINCT p.polrelid::int8 AS table_oid, p.polname::text AS name, \
coalesce(o.oprcode::oid, d.refobjid)::int8 AS ref_oid, \
CASE WHEN d.refclassid = 'pg_catalog.pg_class'::regclass THEN 'r' ELSE 'f' END AS ref_kind \
FROM pg_catalog.pg_policy p \
JOIN pg_catalog.pg_class c ON c.oid = p.polrelid \
JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_policy'::regclass AND d.objid = p.oid \
LEFT JOIN pg_catalog.pg_operator o ON d.refclassid = 'pg_catalog.pg_operator'::regclass \
AND o.oid = d.refobjid \
WHERE c.relrowsecurity AND p.polcmd IN ('r', '*') AND d.deptype = 'n' \
AND d.refclassid IN ('pg_catalog.pg_class'::regclass, 'pg_catalog.pg_proc'::regclass, \
'pg_catalog.pg_operator'::regclass) \
AND d.refobjid <> p.polrelid";

/// The domains each type is or contains, and the permanent table columns of those types:
/// the first part of [`WRITE_CALLS_SQL`] and of a term of [`SCHEMA_FINGERPRINT_SQL`]. A
/// domain contains itself; a type contains what the types it is made of contain: a domain
/// its base type's, an array its element type's, a range its subtype's, a multirange its
/// range's, a composite type (a table's row type used as a column type included) its
/// attributes' types'. A value of any of them is checked against the domains inside when it
/// is made (`ROW(3, 'x')::pair`, `'[1,5)'::span`). The recursion starts from the domains
/// outside the system schemas (those of `information_schema` check with built-ins only, and
/// sit in the row types of its many views) and goes from a type to what is made of it
/// through `pg_depend` (indexed by the referenced object): the types that depend on it
/// (domains, arrays, ranges, multiranges) and the relations with an attribute of it (their
/// row types). Columns are found the same way, never by a scan of `pg_attribute`.
macro_rules! domain_columns_cte {
    () => {
        "WITH RECURSIVE dom(type_oid, domain_oid) AS (\
SELECT t.oid, t.oid FROM pg_catalog.pg_type t WHERE t.typtype = 'd' \
AND t.typnamespace <> 'pg_catalog'::regnamespace \
AND t.typnamespace <> 'information_schema'::regnamespace \
UNION SELECT e.child, dom.domain_oid FROM dom CROSS JOIN LATERAL (\
SELECT d.objid AS child FROM pg_catalog.pg_depend d \
WHERE d.refclassid = 'pg_catalog.pg_type'::regclass AND d.refobjid = dom.type_oid \
AND d.classid = 'pg_catalog.pg_type'::regclass \
UNION ALL SELECT c.reltype FROM pg_catalog.pg_depend d \
JOIN pg_catalog.pg_class c ON c.oid = d.objid AND c.reltype <> 0 \
WHERE d.refclassid = 'pg_catalog.pg_type'::regclass AND d.refobjid = dom.type_oid \
AND d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid > 0\
) e), \
domain_column(table_oid, attnum, type_oid, domain_oid) AS (\
SELECT d.objid, d.objsubid, dom.type_oid, dom.domain_oid FROM dom \
JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_type'::regclass \
AND d.refobjid = dom.type_oid AND d.classid = 'pg_catalog.pg_class'::regclass \
AND d.objsubid > 0 \
JOIN pg_catalog.pg_class c ON c.oid = d.objid AND c.relkind IN ('r', 'p', 'f') \
AND c.relpersistence <> 't') "
    };
}

/// The functions writes evaluate behind a table: those the expressions of its column defaults
/// and generated columns (`pg_attrdef`), check constraints, index expressions or predicates,
/// and the checks and defaults of the domains its columns are of (a domain over a domain,
/// or an array of one, included: see `domain_columns_cte`) call (normal dependencies of
/// those objects on `pg_proc`, or on `pg_operator`: an operator's function). Domains inside
/// composite, range and multirange column
/// types are followed too, and so are the assignment and implicit casts users made to the
/// types of its columns (a column depends on a type that is not built in), the `WHEN`
/// conditions of its triggers (the trigger's own function is a trigger edge already), and
/// its row-security policies when row security is on (a write checks its rows against
/// them: `WITH CHECK`, and `USING` for the rows an UPDATE or DELETE reads).
pub const WRITE_CALLS_SQL: &str = concat!(
    domain_columns_cte!(),
    "SELECT DISTINCT x.table_oid::int8 AS table_oid, \
coalesce(o.oprcode::oid, d.refobjid)::int8 AS function_oid, x.via::text AS via \
FROM (\
SELECT 'pg_catalog.pg_attrdef'::regclass AS classid, a.oid AS objid, a.adrelid AS table_oid, \
'default' AS via, 0::oid AS skip FROM pg_catalog.pg_attrdef a \
UNION ALL SELECT 'pg_catalog.pg_constraint'::regclass, c.oid, c.conrelid, 'check', 0 \
FROM pg_catalog.pg_constraint c WHERE c.contype = 'c' AND c.conrelid <> 0 \
UNION ALL SELECT 'pg_catalog.pg_constraint'::regclass, c.oid, dc.table_oid, 'domain', 0 \
FROM domain_column dc \
JOIN pg_catalog.pg_constraint c ON c.contypid = dc.domain_oid AND c.contype = 'c' \
UNION ALL SELECT 'pg_catalog.pg_type'::regclass, dc.domain_oid, dc.table_oid, 'domain', 0 \
FROM domain_column dc \
UNION ALL SELECT 'pg_catalog.pg_class'::regclass, i.indexrelid, i.indrelid, 'index', 0 \
FROM pg_catalog.pg_index i WHERE i.indexprs IS NOT NULL OR i.indpred IS NOT NULL \
UNION ALL SELECT 'pg_catalog.pg_cast'::regclass, c.oid, d.objid, 'cast', 0 \
FROM pg_catalog.pg_cast c JOIN pg_catalog.pg_depend d \
ON d.refclassid = 'pg_catalog.pg_type'::regclass AND d.refobjid = c.casttarget \
AND d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid > 0 \
WHERE c.castfunc <> 0 AND c.castcontext IN ('a', 'i') AND c.oid >= 16384 \
UNION ALL SELECT 'pg_catalog.pg_policy'::regclass, p.oid, p.polrelid, 'policy', 0 \
FROM pg_catalog.pg_policy p JOIN pg_catalog.pg_class r ON r.oid = p.polrelid \
WHERE r.relrowsecurity \
UNION ALL SELECT 'pg_catalog.pg_trigger'::regclass, t.oid, t.tgrelid, 'trigger condition', \
t.tgfoid FROM pg_catalog.pg_trigger t \
WHERE t.tgqual IS NOT NULL AND NOT t.tgisinternal AND t.tgenabled <> 'D'\
) x \
JOIN pg_catalog.pg_depend d ON d.classid = x.classid AND d.objid = x.objid \
LEFT JOIN pg_catalog.pg_operator o ON d.refclassid = 'pg_catalog.pg_operator'::regclass \
AND o.oid = d.refobjid \
WHERE d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass) \
AND d.deptype = 'n' AND coalesce(o.oprcode::oid, d.refobjid) <> x.skip"
);

/// What [`ImplicitCallRow`] describes: the support functions of aggregates outside the
/// system schemas, and the functions of operators and casts users made (built-in ones run
/// built-in functions only).
pub const IMPLICIT_CALLS_SQL: &str = "\
SELECT u.kind AS kind, u.schema AS schema, u.name AS name, \
u.function_oid AS function_oid, u.owner_oid AS owner_oid FROM (\
SELECT 'a'::text AS kind, n.nspname::text AS schema, p.proname::text AS name, \
f.fn::int8 AS function_oid, p.oid::int8 AS owner_oid \
FROM pg_catalog.pg_aggregate a \
JOIN pg_catalog.pg_proc p ON p.oid = a.aggfnoid \
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
CROSS JOIN LATERAL (VALUES (a.aggtransfn::oid), (a.aggfinalfn::oid), (a.aggcombinefn::oid), \
(a.aggserialfn::oid), (a.aggdeserialfn::oid), (a.aggmtransfn::oid), (a.aggminvtransfn::oid), \
(a.aggmfinalfn::oid)) f(fn) \
WHERE f.fn <> 0 AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
UNION ALL SELECT 'o', n.nspname::text, o.oprname::text, o.oprcode::oid::int8, o.oid::int8 \
FROM pg_catalog.pg_operator o JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace \
WHERE o.oprcode::oid <> 0 AND o.oid >= 16384 \
UNION ALL SELECT 'c', n.nspname::text, t.typname::text, c.castfunc::int8, c.oid::int8 \
FROM pg_catalog.pg_cast c JOIN pg_catalog.pg_type t ON t.oid = c.casttarget \
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace \
WHERE c.castfunc <> 0 AND c.oid >= 16384\
) u";

/// What [`ImplicitCastRow`] describes, for each user cast applied implicitly or on
/// assignment with a function: the types built on its source and target types that are
/// not built in (followed through domains, arrays, ranges, multiranges and the row types
/// of relations with such a column, at any depth), the relations with a column of one,
/// and the casts between two built-in types.
pub const IMPLICIT_CASTS_SQL: &str = "WITH RECURSIVE c AS (SELECT c.oid AS cast_oid, c.castfunc, c.castsource, c.casttarget FROM pg_catalog.pg_cast c WHERE c.castfunc <> 0 AND c.castcontext IN ('i', 'a') AND c.oid >= 16384), edge(from_type, to_type) AS (SELECT t.typbasetype, t.oid FROM pg_catalog.pg_type t WHERE t.typbasetype <> 0 UNION ALL SELECT t.typelem, t.oid FROM pg_catalog.pg_type t WHERE t.typelem <> 0 UNION ALL SELECT r.rngsubtype, r.rngtypid FROM pg_catalog.pg_range r UNION ALL SELECT r.rngtypid, r.rngmultitypid FROM pg_catalog.pg_range r UNION ALL SELECT a.atttypid, k.reltype FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class k ON k.oid = a.attrelid WHERE a.attnum > 0 AND NOT a.attisdropped AND k.reltype <> 0 AND a.atttypid >= 16384), involved(castfunc, type_oid) AS (SELECT c.castfunc, c.castsource FROM c WHERE c.castsource >= 16384 UNION SELECT c.castfunc, c.casttarget FROM c WHERE c.casttarget >= 16384 UNION SELECT i.castfunc, e.to_type FROM involved i JOIN edge e ON e.from_type = i.type_oid) SELECT 't'::text AS kind, n.nspname::text AS schema, t.typname::text AS name, i.castfunc::int8 AS function_oid, t.oid::int8 AS oid FROM involved i JOIN pg_catalog.pg_type t ON t.oid = i.type_oid JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace UNION SELECT 'r', '', '', i.castfunc::int8, a.attrelid::int8 FROM involved i JOIN pg_catalog.pg_attribute a ON a.atttypid = i.type_oid AND a.attnum > 0 AND NOT a.attisdropped UNION SELECT 'b', '', '', c.castfunc::int8, c.cast_oid::int8 FROM c WHERE c.castsource < 16384 AND c.casttarget < 16384";

/// Event triggers that can fire (`evtenabled <> 'D'`; `O`, `R` and `A` all fire in some
/// session replication role).
pub const EVENT_TRIGGERS_SQL: &str = "\
SELECT e.evtname::text AS name, e.evtevent::text AS event, e.evtfoid::int8 AS function_oid \
FROM pg_catalog.pg_event_trigger e WHERE e.evtenabled <> 'D'";

/// Partitions and inheritance children.
pub const INHERITS_SQL: &str = "\
SELECT i.inhrelid::int8 AS child_oid, i.inhparent::int8 AS parent_oid \
FROM pg_catalog.pg_inherits i";

/// User functions and procedures (not aggregates or window functions) outside the system
/// schemas, with their full definition for `sql` and `plpgsql`. C and internal-language
/// functions that belong to an extension (pgcrypto, uuid-ossp, PostGIS ...) are left out:
/// extension code does not write the application's relations, and treating each of its
/// functions as unanalysable would make every call of them mark the whole database.
pub const FUNCTIONS_SQL: &str = "\
SELECT p.oid::int8 AS oid, n.nspname::text AS schema, p.proname::text AS name, \
l.lanname::text AS language, \
CASE WHEN l.lanname IN ('sql', 'plpgsql') THEN pg_catalog.pg_get_functiondef(p.oid) END AS definition, \
p.provolatile::text AS volatility \
FROM pg_catalog.pg_proc p \
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
JOIN pg_catalog.pg_language l ON l.oid = p.prolang \
WHERE p.prokind IN ('f', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
AND (l.lanname IN ('sql', 'plpgsql') OR NOT EXISTS (\
SELECT 1 FROM pg_catalog.pg_depend e WHERE e.classid = 'pg_catalog.pg_proc'::regclass \
AND e.objid = p.oid AND e.deptype = 'e'))";

/// Rewrite rules that run on a write (`ev_type` 2, 3, 4: UPDATE, INSERT, DELETE; the SELECT
/// rules are views' `_RETURN`, read by [`VIEW_DEPS_SQL`]) and are not disabled (`O`, `R` and
/// `A` all fire in some session replication role), on relations outside the system schemas.
pub const RULES_SQL: &str = "\
SELECT r.ev_class::int8 AS table_oid, r.rulename::text AS name, \
pg_catalog.pg_get_ruledef(r.oid) AS definition \
FROM pg_catalog.pg_rewrite r \
JOIN pg_catalog.pg_class c ON c.oid = r.ev_class \
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
WHERE r.ev_type IN ('2', '3', '4') AND r.ev_enabled <> 'D' \
AND n.nspname NOT IN ('pg_catalog', 'information_schema')";

/// One text that changes whenever a catalog row the graph is built from may have changed:
/// user triggers, rewrite rules, foreign keys, inheritance, user functions (their source,
/// name, schema and volatility), row-security policies, event triggers, the dependencies of
/// defaults, checks, indexes, views and policies on user functions and operators (and of
/// operators, casts and aggregates on their functions), the names, kinds and
/// row-security flags of the relations the graph can name an edge for (those with triggers,
/// rules, children, partitions, row security, and views), user schemas, and the columns
/// whose type is a domain (or an array of one: its checks run on writes). Plain tables,
/// indexes, sequences, grants, statistics and temporary relations are left out: creating,
/// truncating, analysing or dropping them changes no edge.
///
/// Rows whose content is large (view and rule actions, policy expressions) count by their
/// `xmin`, which changes on every update; freezing changes it too, which costs one needless
/// reload. Run by the proxy's schema check (about a millisecond on a small schema), and in
/// each load's snapshot so the first check has what the loaded graph saw.
pub const SCHEMA_FINGERPRINT_SQL: &str = concat!(
    domain_columns_cte!(),
    "\
SELECT pg_catalog.md5(pg_catalog.concat_ws('|', \
coalesce((SELECT pg_catalog.string_agg(t.oid || ':' || t.tgrelid || ':' || t.tgfoid || ':' \
|| t.tgenabled::text || ':' || t.tgtype, ',' ORDER BY t.oid) \
FROM pg_catalog.pg_trigger t WHERE NOT t.tgisinternal), ''), \
coalesce((SELECT pg_catalog.string_agg(r.oid || ':' || r.ev_class || ':' || r.ev_type::text || ':' \
|| r.ev_enabled::text || ':' || r.xmin, ',' ORDER BY r.oid) \
FROM pg_catalog.pg_rewrite r WHERE r.oid >= 16384), ''), \
coalesce((SELECT pg_catalog.string_agg(c.oid || ':' || c.conrelid || ':' || c.confrelid || ':' \
|| c.confdeltype::text || c.confupdtype::text, ',' ORDER BY c.oid) \
FROM pg_catalog.pg_constraint c WHERE c.contype = 'f'), ''), \
coalesce((SELECT pg_catalog.string_agg(i.inhrelid || ':' || i.inhparent, ',' \
ORDER BY i.inhrelid, i.inhparent) FROM pg_catalog.pg_inherits i), ''), \
coalesce((SELECT pg_catalog.string_agg(p.oid || ':' || p.pronamespace || ':' || p.proname || ':' \
|| p.provolatile::text || ':' || p.prolang || ':' || pg_catalog.md5(p.prosrc), ',' ORDER BY p.oid) \
FROM pg_catalog.pg_proc p WHERE p.oid >= 16384), ''), \
coalesce((SELECT pg_catalog.string_agg(p.oid || ':' || p.polrelid || ':' || p.polcmd::text || ':' \
|| p.xmin, ',' ORDER BY p.oid) FROM pg_catalog.pg_policy p), ''), \
coalesce((SELECT pg_catalog.string_agg(e.oid || ':' || e.evtevent || ':' || e.evtfoid || ':' \
|| e.evtenabled::text, ',' ORDER BY e.oid) FROM pg_catalog.pg_event_trigger e), ''), \
coalesce((SELECT pg_catalog.string_agg(d.classid || ':' || d.objid || ':' || d.objsubid || ':' \
|| d.refclassid || ':' || d.refobjid, ',' \
ORDER BY d.classid, d.objid, d.objsubid, d.refclassid, d.refobjid) \
FROM pg_catalog.pg_depend d \
WHERE d.refclassid IN ('pg_catalog.pg_proc'::regclass, 'pg_catalog.pg_operator'::regclass) \
AND d.refobjid >= 16384 AND d.deptype = 'n'), ''), \
coalesce((SELECT pg_catalog.string_agg(c.oid || ':' || c.relnamespace || ':' || c.relname || ':' \
|| c.relkind::text || ':' || c.relrowsecurity || ':' || c.relispartition || ':' \
|| c.relpersistence::text, ',' ORDER BY c.oid) \
FROM pg_catalog.pg_class c WHERE c.oid >= 16384 AND c.relpersistence <> 't' \
AND (c.relkind::text IN ('v', 'm', 'p') OR c.relhastriggers OR c.relhasrules OR c.relhassubclass \
OR c.relispartition OR c.relrowsecurity OR c.relpersistence = 'u')), ''), \
coalesce((SELECT pg_catalog.string_agg(n.oid || ':' || n.nspname, ',' ORDER BY n.oid) \
FROM pg_catalog.pg_namespace n WHERE n.oid >= 16384 AND n.nspname NOT LIKE 'pg\\_%'), ''), \
coalesce((SELECT pg_catalog.string_agg(dc.table_oid || ':' || dc.attnum || ':' \
|| dc.type_oid, ',' ORDER BY dc.table_oid, dc.attnum, dc.type_oid) FROM domain_column dc), ''), \
coalesce((SELECT pg_catalog.string_agg(a.attrelid || ':' || a.attnum || ':' || a.atttypid, ',' \
ORDER BY a.attrelid, a.attnum) FROM pg_catalog.pg_attribute a \
JOIN pg_catalog.pg_class k ON k.oid = a.attrelid \
WHERE a.atttypid >= 16384 AND a.attnum > 0 AND NOT a.attisdropped \
AND k.relkind::text IN ('r', 'p', 'v', 'm', 'f', 'c') AND k.relpersistence <> 't' \
AND EXISTS (SELECT 1 FROM pg_catalog.pg_cast c WHERE c.oid >= 16384 AND c.castfunc <> 0 \
AND c.castcontext IN ('i', 'a'))), '') \
)) AS fingerprint"
);

/// Each query with the row type it fills, for loaders and tests.
pub const QUERIES: [(&str, &str); 13] = [
    ("relations", RELATIONS_SQL),
    ("triggers", TRIGGERS_SQL),
    ("foreign_keys", FOREIGN_KEYS_SQL),
    ("view_deps", VIEW_DEPS_SQL),
    ("inherits", INHERITS_SQL),
    ("functions", FUNCTIONS_SQL),
    ("rules", RULES_SQL),
    ("view_calls", VIEW_CALLS_SQL),
    ("policy_deps", POLICY_DEPS_SQL),
    ("write_calls", WRITE_CALLS_SQL),
    ("event_triggers", EVENT_TRIGGERS_SQL),
    ("implicit_calls", IMPLICIT_CALLS_SQL),
    ("implicit_casts", IMPLICIT_CASTS_SQL),
];

/// First character of a one-character text column (`relkind`, `confdeltype` ...), `'?'` when
/// empty; a helper for loaders.
pub fn char_column(text: &str) -> char {
    text.chars().next().unwrap_or('?')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output column names of a query, in order, from the parser's target list.
    fn columns(sql: &str) -> Vec<String> {
        let parsed = pg_query::parse(sql).expect("query parses");
        let stmt = parsed.protobuf.stmts[0].stmt.as_ref().unwrap();
        let Some(pg_query::NodeEnum::SelectStmt(select)) = stmt.node.as_ref() else {
            panic!("not a SELECT: {sql}")
        };
        select
            .target_list
            .iter()
            .map(|t| match t.node.as_ref() {
                Some(pg_query::NodeEnum::ResTarget(r)) => r.name.clone(),
                other => panic!("unexpected target {other:?}"),
            })
            .collect()
    }

    /// Field names of a row type, in declaration order (serde_json keeps them sorted, so
    /// compare sorted lists).
    fn fields<T: Serialize + Default>() -> Vec<String> {
        let v = serde_json::to_value(T::default()).unwrap();
        let mut f: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        f.sort();
        f
    }

    #[test]
    fn query_columns_match_row_types() {
        let expected = [
            fields::<RelationRow>(),
            fields::<TriggerRow>(),
            fields::<ForeignKeyRow>(),
            fields::<ViewDepRow>(),
            fields::<InheritsRow>(),
            fields::<FunctionRow>(),
            fields::<RuleRow>(),
            fields::<ViewCallRow>(),
            fields::<PolicyDepRow>(),
            fields::<WriteCallRow>(),
            fields::<EventTriggerRow>(),
            fields::<ImplicitCallRow>(),
        ];
        for ((what, sql), want) in QUERIES.iter().zip(expected) {
            let mut got = columns(sql);
            assert!(got.iter().all(|c| !c.is_empty()), "{what}: unnamed column");
            got.sort();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_fingerprint_is_one_named_column() {
        assert_eq!(columns(SCHEMA_FINGERPRINT_SQL), vec!["fingerprint"]);
    }

    #[test]
    fn char_columns() {
        assert_eq!(char_column("c"), 'c');
        assert_eq!(char_column(""), '?');
    }
}
