//! The dependency graph of one database: what a statement touches behind its text.
//!
//! PostgreSQL writes and reads more than a statement names: triggers run functions that write
//! other tables, rewrite rules (`CREATE RULE ... DO ALSO`) run statements of their own,
//! foreign keys cascade deletes and updates, a write to a partitioned table
//! writes its partitions (and a write to a partition is visible through its ancestors), a view
//! reads its base relations (and what the functions it calls read), a read of a table with
//! row security reads what its policies' expressions read, and a function's body reads and
//! writes whatever it says. DESIGN
//! §1 rule 6 requires those side effects to be marked with the statement's own writes.
//!
//! This crate turns what the catalog says ([`CatalogRows`], filled by the queries in
//! [`catalog`]) plus the operator's manual rules ([`ManualRule`], config
//! `relation_dependencies`) into a [`DepGraph`] whose closures are all computed once, so the
//! proxy learns the side effects of a statement with no catalog query and a few hash lookups:
//! [`DepGraph::expand_writes`] and [`DepGraph::expand_reads`]. When something that cannot be
//! analysed may run (dynamic SQL, a procedural language other than SQL and PL/pgSQL), the
//! answer is [`Expansion::WholeDatabase`]. [`DepGraph::report`] describes the graph for people.
//!
//! Pure and synchronous: no I/O, no async runtime.
//!
//! ```
//! use pgfresh_deps::{CatalogRows, DepGraph, Expansion, ForeignKeyRow, RelationRow};
//! use pgfresh_sql::RelName;
//!
//! let rel = |oid, name: &str| RelationRow {
//!     oid, schema: "app".into(), name: name.into(), relkind: 'r', unlogged: false,
//! };
//! let rows = CatalogRows {
//!     relations: vec![rel(1, "orders"), rel(2, "order_items")],
//!     foreign_keys: vec![ForeignKeyRow {
//!         name: "items_order_fk".into(), referencing_oid: 2, referenced_oid: 1,
//!         on_delete: 'c', on_update: 'a',
//!     }],
//!     ..Default::default()
//! };
//! let graph = DepGraph::build(&rows, &[]);
//! let mut marks = Vec::new();
//! let e = graph.expand_writes(&[RelName::new(None, "orders")], &[], &mut marks);
//! assert_eq!(e, Expansion::Precise);
//! assert_eq!(marks, vec![RelName::new(Some("app"), "order_items")]);
//! ```

pub mod body;
pub mod catalog;
mod closure;
pub use closure::MAX_CLOSURE_ENTRIES;
mod expand;
mod graph;
pub mod report;
pub mod rules;
mod unlogged;

pub use catalog::{
    CatalogRows, EventTriggerRow, ForeignKeyRow, FunctionRow, ImplicitCallRow, ImplicitCastRow,
    InheritsRow, Oid, PolicyDepRow, RelationRow, RuleRow, TriggerRow, ViewCallRow, ViewDepRow,
    WriteCallRow,
};
pub use expand::{DepGraph, Expansion};
pub use report::{DependencyReport, Edge, EdgeKind, UnanalysableBody};
pub use rules::{parse_rules, ManualRule, RuleSource};
