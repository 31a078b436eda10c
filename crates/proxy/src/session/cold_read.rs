//! The last cold read a session routed, kept with what its route depended on.
//!
//! Clients send the same few reads again and again. A read the router sent to any
//! replica because nothing it reads was written recently (`Reason::Replica`) is routed
//! the same way next time as long as nothing its decision read has changed:
//!
//! - the text's analysis (the same `Arc`, from the session's recent texts);
//! - the dependency graph, the config snapshot, the function lists and the function
//!   catalog (each the same `Arc`: they are replaced, never changed in place);
//! - the recency map's count of changes ([`pgfresh_recency::RecencyMap::changes`]),
//!   read before the lookup: a cold answer stays cold until a write is marked or a
//!   setting changes, since entries only age;
//! - the session's own state, which `Session::route` checks each time: no transaction,
//!   pin, routing hint or position token.
//!
//! Only the decision is kept. The replica is chosen for each read as before
//! (`Session::resolve`), and a standby's recent refusal of the statement still sends it
//! to the primary. A hot answer, or any other decision, is never kept: it may change
//! with time alone (a write ages out, a replica catches up).

use std::sync::Arc;

use pgfresh_sql::Analysis;

use crate::catalog::DbFunctions;
use crate::router::{Decision, Reason, Target};

/// What a kept route answers.
pub(super) const COLD: Decision = Decision {
    target: Target::Replica { required: None },
    reason: Reason::Replica,
};

/// What the route of one cold read depended on, besides the session's state.
pub(super) struct RouteInputs<'a> {
    pub analysis: &'a Arc<Analysis>,
    pub graph: &'a Option<Arc<pgfresh_deps::DepGraph>>,
    pub config: &'a Arc<pgfresh_config::Config>,
    pub policy: &'a Arc<pgfresh_sql::FunctionPolicy>,
    pub functions: &'a Option<Arc<DbFunctions>>,
    /// The recency map's count of changes, read before its lookup.
    pub changes: u64,
}

/// A read routed [`COLD`], with what that depended on.
pub(super) struct ColdRead {
    analysis: Arc<Analysis>,
    graph: Option<Arc<pgfresh_deps::DepGraph>>,
    config: Arc<pgfresh_config::Config>,
    policy: Arc<pgfresh_sql::FunctionPolicy>,
    functions: Option<Arc<DbFunctions>>,
    changes: u64,
}

fn same<T>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl ColdRead {
    fn new(i: &RouteInputs<'_>) -> Self {
        ColdRead {
            analysis: i.analysis.clone(),
            graph: i.graph.clone(),
            config: i.config.clone(),
            policy: i.policy.clone(),
            functions: i.functions.clone(),
            changes: i.changes,
        }
    }

    /// The router would route `i` [`COLD`] again: nothing it depends on has changed.
    pub(super) fn holds_for(&self, i: &RouteInputs<'_>) -> bool {
        self.changes == i.changes && self.same_text_and_rules(i)
    }

    /// Keeps `i`, routed [`COLD`], in `kept`. The same text routed under the same rules
    /// again after a write elsewhere (a read-mostly load) only takes the new count.
    pub(super) fn keep(kept: &mut Option<ColdRead>, i: &RouteInputs<'_>) {
        match kept {
            Some(k) if k.same_text_and_rules(i) => k.changes = i.changes,
            _ => *kept = Some(ColdRead::new(i)),
        }
    }

    fn same_text_and_rules(&self, i: &RouteInputs<'_>) -> bool {
        Arc::ptr_eq(&self.analysis, i.analysis)
            && Arc::ptr_eq(&self.config, i.config)
            && Arc::ptr_eq(&self.policy, i.policy)
            && same(&self.graph, i.graph)
            && same(&self.functions, i.functions)
    }
}
