//! Errors raised while building or driving a local cluster.

use std::time::Duration;

/// Something went wrong while creating, changing or querying a [`crate::LocalCluster`].
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A filesystem or process-spawning operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A PostgreSQL tool (or a helper such as `runuser`) exited unsuccessfully.
    #[error("`{command}` failed ({status}): {detail}")]
    Command {
        /// The command line, for the reader.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error (and, for server starts, the tail of the server log).
        detail: String,
    },
    /// A condition was polled for and did not become true in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long it was polled.
        waited: Duration,
    },
    /// A node index outside the cluster.
    #[error("node {index} does not exist (the cluster has {count} nodes)")]
    NoSuchNode {
        /// The index asked for.
        index: usize,
        /// How many nodes exist.
        count: usize,
    },
    /// The machine cannot host a cluster (no server binaries, no unprivileged user, ...).
    #[error("cannot set up a local cluster: {0}")]
    Setup(String),
}

impl ClusterError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ClusterError::Io {
            what: what.into(),
            source,
        }
    }
}
