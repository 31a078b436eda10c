//! A throwaway PostgreSQL primary with streaming hot standbys on loopback ports.
//!
//! [`LocalCluster::start`] builds a primary and `standbys` physical streaming replicas from
//! the installed server binaries (`pg_config --bindir`, or the directory named by the
//! `PGFRESH_PG_BINDIR` environment variable), each listening on a free `127.0.0.1` port and
//! on a Unix socket in the cluster's own temporary directory. It returns once every standby
//! streams from the primary. Dropping the cluster stops every server (immediate mode) and
//! removes the directory.
//!
//! It is used by `pgfresh demo` and by the integration tests: [`LocalCluster::shared`] gives
//! each test binary one cluster that is torn down when the process exits, even though
//! statics are never dropped.
//!
//! PostgreSQL refuses to run as root. When this process is root, the servers and tools run
//! as the `postgres` OS user (via `runuser`) in a directory owned by that user.
//!
//! Settings are tuned for tests, not durability: `fsync` and `full_page_writes` are off,
//! while `synchronous_commit` stays at its default. The extra login roles and databases of
//! [`ClusterOptions`] are created on the primary before the standbys are cloned, and every
//! role may create objects in the `public` schema of every database.

mod cluster;
mod error;
mod process;
mod reaper;

pub use cluster::LocalCluster;
pub use error::ClusterError;

use std::path::PathBuf;

/// How clients and standbys authenticate over TCP (`pg_hba.conf` `host` lines).
/// Unix-socket connections are always trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMethod {
    /// No password is asked for.
    Trust,
    /// MD5 challenge; passwords are stored MD5-hashed (`password_encryption = md5`).
    Md5,
    /// SCRAM-SHA-256, PostgreSQL's default.
    #[default]
    ScramSha256,
}

impl AuthMethod {
    /// The `pg_hba.conf` method keyword.
    pub fn hba_keyword(self) -> &'static str {
        match self {
            AuthMethod::Trust => "trust",
            AuthMethod::Md5 => "md5",
            AuthMethod::ScramSha256 => "scram-sha-256",
        }
    }
}

/// What to build. [`Default`] is a primary with two standbys, superuser `postgres`.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of streaming hot standbys (0 is allowed: a lone primary).
    pub standbys: usize,
    /// Name of the bootstrap superuser, also used for replication.
    pub superuser: String,
    /// The superuser's password (needed for TCP logins unless `auth` is [`AuthMethod::Trust`]).
    pub password: String,
    /// Authentication method for TCP connections and replication.
    pub auth: AuthMethod,
    /// Extra login roles `(name, password)` created on the primary.
    pub users: Vec<(String, String)>,
    /// Databases created on the primary (owned by the superuser).
    pub databases: Vec<String>,
    /// Lines appended verbatim to every node's `postgresql.conf`.
    pub extra_conf: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            standbys: 2,
            superuser: "postgres".to_string(),
            password: "pgfresh-super".to_string(),
            auth: AuthMethod::ScramSha256,
            users: Vec::new(),
            databases: Vec::new(),
            extra_conf: Vec::new(),
        }
    }
}

/// One server of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `node0` for the initial primary, `node1`… for the standbys (also its `cluster_name`
    /// and replication `application_name`).
    pub name: String,
    /// TCP port on `127.0.0.1` (also the Unix socket's port number).
    pub port: u16,
    /// The data directory.
    pub data_dir: PathBuf,
}
