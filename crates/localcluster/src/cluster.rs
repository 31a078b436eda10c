//! Building the cluster and the operations tests use to drive it.

use std::collections::HashSet;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::ClusterError;
use crate::process::{self, Tools};
use crate::{reaper, AuthMethod, ClusterOptions, NodeInfo};

/// How long a server start or stop, or a standby's first streaming, may take.
const SERVER_TIMEOUT: Duration = Duration::from_secs(90);
/// Interval between polls of a condition.
const POLL: Duration = Duration::from_millis(40);
/// Attempts at finding a port the server can bind.
const PORT_ATTEMPTS: usize = 5;
/// Name of the per-node settings file included from `postgresql.conf`.
const NODE_CONF: &str = "pgfresh_node.conf";
/// Name of the server log file inside each data directory.
const LOG_FILE: &str = "server.log";

/// A running primary plus streaming standbys. See the crate documentation.
#[derive(Debug)]
pub struct LocalCluster {
    tools: Tools,
    dir: PathBuf,
    nodes: Vec<NodeInfo>,
    superuser: String,
    password: String,
    /// Index of the node that is currently primary (changes on [`LocalCluster::promote`]).
    primary: Mutex<usize>,
}

impl LocalCluster {
    /// Creates the primary, its roles and databases, clones each standby with
    /// `pg_basebackup -X stream -R`, starts them and waits until each one streams.
    pub fn start(opts: ClusterOptions) -> Result<LocalCluster, ClusterError> {
        let tools = Tools::discover()?;
        let dir = make_cluster_dir(&tools)?;
        reaper::spawn(&dir);
        // From here on, dropping `cluster` stops whatever was started and removes `dir`.
        let mut cluster = LocalCluster {
            tools,
            dir,
            nodes: Vec::new(),
            superuser: opts.superuser.clone(),
            password: opts.password.clone(),
            primary: Mutex::new(0),
        };
        cluster.init_primary(&opts)?;
        for i in 1..=opts.standbys {
            cluster.clone_standby(i)?;
        }
        for i in 1..=opts.standbys {
            cluster.wait_streaming(i, SERVER_TIMEOUT)?;
        }
        Ok(cluster)
    }

    /// One cluster per process, built on first use with the default options plus the login
    /// role `app` (password `app-secret`) and the database `app`.
    ///
    /// The servers are stopped and the directory removed shortly after the process exits.
    ///
    /// # Panics
    /// If the cluster cannot be started (for instance, no PostgreSQL server binaries are
    /// installed); every later call panics with the same message.
    pub fn shared() -> &'static LocalCluster {
        static SHARED: OnceLock<Result<LocalCluster, String>> = OnceLock::new();
        let result = SHARED.get_or_init(|| {
            LocalCluster::start(ClusterOptions {
                users: vec![("app".to_string(), "app-secret".to_string())],
                databases: vec!["app".to_string()],
                ..ClusterOptions::default()
            })
            .map_err(|e| e.to_string())
        });
        match result {
            Ok(cluster) => cluster,
            Err(e) => panic!("the shared local PostgreSQL cluster could not be started: {e}"),
        }
    }

    /// All nodes: index 0 is the initial primary, 1.. the standbys.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// TCP port of node `i`.
    ///
    /// # Panics
    /// If `i` is not a node index.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// The address every node listens on: `127.0.0.1`.
    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    /// The superuser's name and password.
    pub fn superuser(&self) -> (&str, &str) {
        (&self.superuser, &self.password)
    }

    /// A libpq / tokio-postgres `key=value` connection string for node `i` over TCP.
    ///
    /// # Panics
    /// If `i` is not a node index.
    pub fn conninfo(&self, i: usize, user: &str, password: &str, db: &str) -> String {
        format!(
            "host={} port={} user={} password={} dbname={}",
            self.host(),
            self.port(i),
            conninfo_value(user),
            conninfo_value(password),
            conninfo_value(db)
        )
    }

    /// Runs `sql` with `psql -XAtq` as the superuser over the Unix socket of node `i` and
    /// returns its standard output, trimmed. Several statements are run as one request.
    pub fn psql(&self, i: usize, db: &str, sql: &str) -> Result<String, ClusterError> {
        let node = self.node(i)?;
        let port = node.port.to_string();
        let host = self.dir.to_string_lossy();
        let args = [
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            &host,
            "-p",
            &port,
            "-U",
            &self.superuser,
            "-d",
            db,
            "-c",
            sql,
        ];
        let out = self.tools.run("psql", &self.dir, &args)?;
        Ok(out.trim().to_string())
    }

    /// Pauses WAL replay on standby `i` (`pg_wal_replay_pause()`); it keeps receiving WAL.
    pub fn pause_replay(&self, i: usize) -> Result<(), ClusterError> {
        self.psql(i, "postgres", "SELECT pg_wal_replay_pause()")
            .map(drop)
    }

    /// Resumes WAL replay on standby `i` (`pg_wal_replay_resume()`).
    pub fn resume_replay(&self, i: usize) -> Result<(), ClusterError> {
        self.psql(i, "postgres", "SELECT pg_wal_replay_resume()")
            .map(drop)
    }

    /// Sets `recovery_min_apply_delay` on standby `i` (0 removes the delay) and reloads.
    pub fn set_apply_delay(&self, i: usize, ms: u64) -> Result<(), ClusterError> {
        self.psql(
            i,
            "postgres",
            &format!("ALTER SYSTEM SET recovery_min_apply_delay = '{ms}ms'"),
        )?;
        self.psql(i, "postgres", "SELECT pg_reload_conf()")
            .map(drop)
    }

    /// Turns TLS on in every node: `cert_pem` and `key_pem` become `server.crt` and
    /// `server.key` in each data directory (owned by the servers' OS user, mode 0600),
    /// `ssl = on` is set and the nodes reload. With `require`, TCP logins other than
    /// replication must then use TLS (`hostnossl … reject` first in `pg_hba.conf`); the
    /// superuser's Unix-socket logins ([`LocalCluster::psql`]) are not affected.
    pub fn enable_ssl(
        &self,
        cert_pem: &str,
        key_pem: &str,
        require: bool,
    ) -> Result<(), ClusterError> {
        use std::os::unix::fs::PermissionsExt;
        for node in &self.nodes {
            for (name, text) in [("server.crt", cert_pem), ("server.key", key_pem)] {
                let path = node.data_dir.join(name);
                write_file(&path, text, false)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(|e| {
                    ClusterError::io(format!("setting permissions on {}", path.display()), e)
                })?;
                if let Some(user) = &self.tools.run_as {
                    let (uid, gid) = process::user_ids(user)?;
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| {
                        ClusterError::io(format!("giving {} to {user}", path.display()), e)
                    })?;
                }
            }
            if require {
                let hba = node.data_dir.join("pg_hba.conf");
                let old = fs::read_to_string(&hba)
                    .map_err(|e| ClusterError::io(format!("reading {}", hba.display()), e))?;
                let lines =
                    "hostnossl all all 127.0.0.1/32 reject\nhostnossl all all ::1/128 reject\n";
                write_file(&hba, &format!("{lines}{old}"), false)?;
            }
        }
        for i in 0..self.nodes.len() {
            self.psql(i, "postgres", "ALTER SYSTEM SET ssl = on")?;
            self.psql(i, "postgres", "SELECT pg_reload_conf()")?;
        }
        for i in 0..self.nodes.len() {
            poll_until(&format!("node {i} to turn TLS on"), SERVER_TIMEOUT, || {
                Ok(self.psql(i, "postgres", "SHOW ssl")? == "on")
            })?;
        }
        Ok(())
    }

    /// Waits until node `i` has replayed the current primary's WAL position as of this call.
    /// Returns at once when `i` is the primary.
    pub fn wait_caught_up(&self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        self.node(i)?;
        let primary = self.current_primary();
        if primary == i {
            return Ok(());
        }
        let target = self.psql(primary, "postgres", "SELECT pg_current_wal_lsn()")?;
        let check = format!(
            "SELECT coalesce(pg_last_wal_replay_lsn() >= '{}'::pg_lsn, false)",
            sql_literal_body(&target)
        );
        poll_until(
            &format!("node {i} to replay up to {target}"),
            timeout,
            || Ok(self.psql(i, "postgres", &check)? == "t"),
        )
    }

    /// Waits until standby `i` reports `streaming` in `pg_stat_wal_receiver`.
    pub fn wait_streaming(&self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        self.node(i)?;
        poll_until(
            &format!("node {i} to stream from its primary"),
            timeout,
            || {
                // A node that is restarting refuses connections; keep polling.
                Ok(self
                    .psql(i, "postgres", "SELECT status FROM pg_stat_wal_receiver")
                    .map(|s| s == "streaming")
                    .unwrap_or(false))
            },
        )
    }

    /// Stops node `i` (`pg_ctl stop -m fast`, which hands all WAL to connected standbys).
    pub fn stop_node(&self, i: usize) -> Result<(), ClusterError> {
        self.pg_ctl_stop(i, "fast")
    }

    /// Stops node `i` the way a crash would (`pg_ctl stop -m immediate`): no shutdown
    /// checkpoint, and WAL the standbys had not received yet never reaches them.
    pub fn kill_node(&self, i: usize) -> Result<(), ClusterError> {
        self.pg_ctl_stop(i, "immediate")
    }

    /// `pg_ctl stop -m <mode>` of node `i`, waiting for it.
    fn pg_ctl_stop(&self, i: usize, mode: &str) -> Result<(), ClusterError> {
        let dir = self.node(i)?.data_dir.to_string_lossy().into_owned();
        let timeout = SERVER_TIMEOUT.as_secs().to_string();
        let args = ["stop", "-s", "-w", "-m", mode, "-t", &timeout, "-D", &dir];
        self.tools.run("pg_ctl", &self.dir, &args).map(drop)
    }

    /// Freezes node `i`: SIGSTOP to its postmaster and every process it started. Its
    /// sockets stay open and accept bytes, but nothing answers: a hung host, as far as
    /// a client can tell. [`LocalCluster::thaw_node`] undoes it.
    pub fn freeze_node(&self, i: usize) -> Result<(), ClusterError> {
        // The postmaster first, so that it starts no process after the list is taken.
        let postmaster = self.postmaster_pid(i)?;
        signal(&[postmaster], "STOP")?;
        let mut pids = children_of(postmaster);
        pids.push(postmaster);
        signal(&pids, "STOP")
    }

    /// Lets a node frozen by [`LocalCluster::freeze_node`] run again.
    pub fn thaw_node(&self, i: usize) -> Result<(), ClusterError> {
        let postmaster = self.postmaster_pid(i)?;
        let mut pids = children_of(postmaster);
        pids.push(postmaster);
        signal(&pids, "CONT")
    }

    /// The postmaster's process id, from `postmaster.pid`.
    fn postmaster_pid(&self, i: usize) -> Result<u32, ClusterError> {
        let path = self.node(i)?.data_dir.join("postmaster.pid");
        let text = fs::read_to_string(&path)
            .map_err(|e| ClusterError::io(format!("reading {}", path.display()), e))?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| ClusterError::Setup(format!("no process id in {}", path.display())))
    }

    /// Starts node `i` again on its port and waits until it accepts connections.
    pub fn start_node(&self, i: usize) -> Result<(), ClusterError> {
        let node = self.node(i)?;
        start_server(&self.tools, &self.dir, &node.data_dir)
    }

    /// Promotes standby `i` (`pg_ctl promote -w`); it becomes the node
    /// [`LocalCluster::wait_caught_up`] measures against.
    pub fn promote(&self, i: usize) -> Result<(), ClusterError> {
        let dir = self.node(i)?.data_dir.to_string_lossy().into_owned();
        let timeout = SERVER_TIMEOUT.as_secs().to_string();
        self.tools.run(
            "pg_ctl",
            &self.dir,
            &["promote", "-s", "-w", "-t", &timeout, "-D", &dir],
        )?;
        *self.primary.lock().unwrap_or_else(|p| p.into_inner()) = i;
        Ok(())
    }

    /// Points standby `i` at node `new_primary` (`ALTER SYSTEM SET primary_conninfo` and a
    /// reload). With `recovery_target_timeline = latest` (the default) it follows the new
    /// primary's timeline; use [`LocalCluster::wait_streaming`] to wait for it.
    pub fn repoint_standby(&self, i: usize, new_primary: usize) -> Result<(), ClusterError> {
        let target = self.node(new_primary)?;
        let name = &self.node(i)?.name;
        let conninfo = format!(
            "host={} port={} user={} password={} application_name={}",
            self.host(),
            target.port,
            conninfo_value(&self.superuser),
            conninfo_value(&self.password),
            conninfo_value(name)
        );
        self.psql(
            i,
            "postgres",
            &format!(
                "ALTER SYSTEM SET primary_conninfo = '{}'",
                sql_literal_body(&conninfo)
            ),
        )?;
        self.psql(i, "postgres", "SELECT pg_reload_conf()")
            .map(drop)
    }

    /// Data directory of node `i`.
    ///
    /// # Panics
    /// If `i` is not a node index.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.nodes[i].data_dir.clone()
    }

    /// Directory of the PostgreSQL binaries in use.
    pub fn bin_dir(&self) -> &Path {
        &self.tools.bin_dir
    }

    fn node(&self, i: usize) -> Result<&NodeInfo, ClusterError> {
        self.nodes.get(i).ok_or(ClusterError::NoSuchNode {
            index: i,
            count: self.nodes.len(),
        })
    }

    fn current_primary(&self) -> usize {
        *self.primary.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn init_primary(&mut self, opts: &ClusterOptions) -> Result<(), ClusterError> {
        let data_dir = self.dir.join("node0");
        let data = data_dir.to_string_lossy().into_owned();
        let auth_host = format!("--auth-host={}", opts.auth.hba_keyword());
        self.tools.run(
            "initdb",
            &self.dir,
            &[
                "-D",
                &data,
                "-U",
                &opts.superuser,
                "--auth-local=trust",
                &auth_host,
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ],
        )?;
        write_file(
            &data_dir.join("postgresql.conf"),
            &base_conf(&self.dir, opts),
            true,
        )?;
        write_file(&data_dir.join("pg_hba.conf"), &hba_conf(opts.auth), false)?;
        let port = self.start_on_free_port(&data_dir, "node0")?;
        self.nodes.push(NodeInfo {
            name: "node0".to_string(),
            port,
            data_dir,
        });

        let su = quote_ident(&opts.superuser);
        self.psql(
            0,
            "postgres",
            &format!(
                "ALTER ROLE {su} PASSWORD '{}'",
                sql_literal_body(&opts.password)
            ),
        )?;
        for (user, password) in &opts.users {
            self.psql(
                0,
                "postgres",
                &format!(
                    "CREATE ROLE {} LOGIN PASSWORD '{}'",
                    quote_ident(user),
                    sql_literal_body(password)
                ),
            )?;
        }
        // Let every role create objects in `public` (PostgreSQL 15 no longer does by default);
        // template1 first so that the databases created below inherit it.
        for db in ["template1", "postgres"] {
            self.psql(0, db, "GRANT CREATE ON SCHEMA public TO PUBLIC")?;
        }
        for db in &opts.databases {
            self.psql(
                0,
                "postgres",
                &format!("CREATE DATABASE {}", quote_ident(db)),
            )?;
        }
        Ok(())
    }

    fn clone_standby(&mut self, i: usize) -> Result<(), ClusterError> {
        let name = format!("node{i}");
        let data_dir = self.dir.join(&name);
        let data = data_dir.to_string_lossy().into_owned();
        let source = format!(
            "host={} port={} user={} password={} application_name={}",
            self.host(),
            self.port(0),
            conninfo_value(&self.superuser),
            conninfo_value(&self.password),
            conninfo_value(&name)
        );
        self.tools.run(
            "pg_basebackup",
            &self.dir,
            &[
                "-D", &data, "-X", "stream", "-R", "-c", "fast", "-d", &source,
            ],
        )?;
        // The primary's log came along with the copy; the standby starts its own.
        match fs::remove_file(data_dir.join(LOG_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ClusterError::io("removing the copied server log", e)),
        }
        let port = self.start_on_free_port(&data_dir, &name)?;
        self.nodes.push(NodeInfo {
            name,
            port,
            data_dir,
        });
        Ok(())
    }

    /// Writes the node's port into its settings and starts it, choosing another port when
    /// the chosen one turns out to be taken.
    fn start_on_free_port(&self, data_dir: &Path, name: &str) -> Result<u16, ClusterError> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let conf = format!("port = {port}\ncluster_name = '{name}'\n");
            write_file(&data_dir.join(NODE_CONF), &conf, false)?;
            match start_server(&self.tools, &self.dir, data_dir) {
                Ok(()) => return Ok(port),
                Err(e)
                    if e.to_string().contains("could not bind")
                        || e.to_string().contains("already in use") =>
                {
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| ClusterError::Setup("no free port found".to_string())))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            if node.data_dir.join("postmaster.pid").exists() {
                let dir = node.data_dir.to_string_lossy().into_owned();
                // Errors are ignored: the directory is removed below either way, and the
                // process reaper catches anything left running.
                let _ = self.tools.run(
                    "pg_ctl",
                    &self.dir,
                    &[
                        "stop",
                        "-s",
                        "-w",
                        "-m",
                        "immediate",
                        "-t",
                        "30",
                        "-D",
                        &dir,
                    ],
                );
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Starts the server in `data_dir` and waits until it accepts connections; on failure the
/// error carries the end of the server log.
fn start_server(tools: &Tools, cwd: &Path, data_dir: &Path) -> Result<(), ClusterError> {
    let data = data_dir.to_string_lossy().into_owned();
    let log = data_dir.join(LOG_FILE).to_string_lossy().into_owned();
    let timeout = SERVER_TIMEOUT.as_secs().to_string();
    tools
        .run(
            "pg_ctl",
            cwd,
            &["start", "-s", "-w", "-t", &timeout, "-D", &data, "-l", &log],
        )
        .map(drop)
        .map_err(|e| match e {
            ClusterError::Command {
                command,
                status,
                detail,
            } => ClusterError::Command {
                command,
                status,
                detail: format!(
                    "{detail}\n--- server log ---\n{}",
                    log_tail(Path::new(&log))
                ),
            },
            other => other,
        })
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Polls `cond` every [`POLL`] until it is true or `timeout` passes.
fn poll_until(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool, ClusterError>,
) -> Result<(), ClusterError> {
    let start = Instant::now();
    loop {
        if cond()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(ClusterError::Timeout {
                what: what.to_string(),
                waited: timeout,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Creates a fresh directory for the cluster that the server's OS user owns and can reach.
fn make_cluster_dir(tools: &Tools) -> Result<PathBuf, ClusterError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut candidates = vec![std::env::temp_dir()];
    if tools.run_as.is_some() && candidates[0] != Path::new("/tmp") {
        candidates.push(PathBuf::from("/tmp"));
    }
    let mut reasons = Vec::new();
    for base in candidates {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "pgfresh-cluster-{}-{}-{nanos:08x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir)
            .map_err(|e| ClusterError::io(format!("creating {}", dir.display()), e))?;
        match prepare_dir(tools, &dir) {
            Ok(()) => return Ok(dir),
            Err(e) => {
                reasons.push(e.to_string());
                let _ = fs::remove_dir_all(&dir);
            }
        }
    }
    Err(ClusterError::Setup(reasons.join("; ")))
}

fn prepare_dir(tools: &Tools, dir: &Path) -> Result<(), ClusterError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| ClusterError::io(format!("setting permissions on {}", dir.display()), e))?;
    let Some(user) = &tools.run_as else {
        return Ok(());
    };
    let (uid, gid) = process::user_ids(user)?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .map_err(|e| ClusterError::io(format!("giving {} to {user}", dir.display()), e))?;
    // The user must be able to reach the directory through every parent.
    let mut check = std::process::Command::new("runuser");
    check.args(["-u", user, "--", "test", "-w"]).arg(dir);
    process::output(&mut check, "runuser test -w").map_err(|_| {
        ClusterError::Setup(format!(
            "the OS user {user} cannot reach {}; point TMPDIR at a directory it can traverse",
            dir.display()
        ))
    })?;
    Ok(())
}

/// A loopback port that was free a moment ago and that this process has not handed out yet.
fn free_port() -> Result<u16, ClusterError> {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..50 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| ClusterError::io("binding a probe socket on 127.0.0.1", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| ClusterError::io("reading the probe socket's port", e))?
            .port();
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    Err(ClusterError::Setup(
        "no unused loopback port found".to_string(),
    ))
}

fn base_conf(dir: &Path, opts: &ClusterOptions) -> String {
    let encryption = match opts.auth {
        AuthMethod::Md5 => "md5",
        AuthMethod::Trust | AuthMethod::ScramSha256 => "scram-sha-256",
    };
    let mut conf = format!(
        "\n# pgfresh local cluster\n\
         listen_addresses = '127.0.0.1'\n\
         unix_socket_directories = '{}'\n\
         fsync = off\n\
         full_page_writes = off\n\
         wal_level = logical\n\
         hot_standby = on\n\
         max_wal_senders = 10\n\
         wal_keep_size = '256MB'\n\
         hot_standby_feedback = on\n\
         wal_receiver_status_interval = '1s'\n\
         shared_buffers = '32MB'\n\
         max_connections = 200\n\
         max_prepared_transactions = 10\n\
         password_encryption = '{encryption}'\n\
         logging_collector = off\n",
        sql_literal_body(&dir.to_string_lossy())
    );
    for line in &opts.extra_conf {
        conf.push_str(line);
        conf.push('\n');
    }
    // Per-node settings (port, name) come last so they win.
    conf.push_str(&format!("include_if_exists = '{NODE_CONF}'\n"));
    conf
}

fn hba_conf(auth: AuthMethod) -> String {
    let m = auth.hba_keyword();
    format!(
        "# pgfresh local cluster\n\
         local all all trust\n\
         host all all 127.0.0.1/32 {m}\n\
         host replication all 127.0.0.1/32 {m}\n"
    )
}

fn write_file(path: &Path, text: &str, append: bool) -> Result<(), ClusterError> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| ClusterError::io(format!("opening {}", path.display()), e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| ClusterError::io(format!("writing {}", path.display()), e))
}

/// A value for a libpq `key=value` string, single-quoted with `\` and `'` escaped.
fn conninfo_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('\'');
    for c in v.chars() {
        if c == '\'' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('\'');
    s
}

/// The inside of a standard SQL string literal (quotes doubled).
fn sql_literal_body(v: &str) -> String {
    v.replace('\'', "''")
}

/// A double-quoted SQL identifier.
fn quote_ident(v: &str) -> String {
    format!("\"{}\"", v.replace('"', "\"\""))
}

/// The processes whose parent is `pid` (from `/proc`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            // `pid (comm) state ppid ...`; comm may hold spaces, so split after the `)`.
            fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Sends `SIG<name>` to `pids` with the shell's `kill` (no package needed beyond `sh`).
fn signal(pids: &[u32], name: &str) -> Result<(), ClusterError> {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let line = format!("kill -{name} {}", list.join(" "));
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-c", &line]);
    process::output(&mut cmd, &line).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(conninfo_value("a b'c\\"), "'a b\\'c\\\\'");
        assert_eq!(sql_literal_body("it's"), "it''s");
        assert_eq!(quote_ident("My\"Db"), "\"My\"\"Db\"");
    }

    #[test]
    fn hba_uses_the_method_for_tcp_and_replication() {
        let hba = hba_conf(AuthMethod::Md5);
        assert!(hba.contains("local all all trust"));
        assert!(hba.contains("host all all 127.0.0.1/32 md5"));
        assert!(hba.contains("host replication all 127.0.0.1/32 md5"));
    }

    #[test]
    fn conf_has_extra_lines_before_node_include() {
        let opts = ClusterOptions {
            extra_conf: vec!["work_mem = '8MB'".to_string()],
            auth: AuthMethod::Md5,
            ..ClusterOptions::default()
        };
        let conf = base_conf(Path::new("/tmp/x"), &opts);
        let extra = conf.find("work_mem").unwrap();
        let include = conf.find("include_if_exists").unwrap();
        assert!(extra < include);
        assert!(conf.contains("password_encryption = 'md5'"));
        assert!(conf.contains("unix_socket_directories = '/tmp/x'"));
    }

    #[test]
    fn free_ports_are_distinct() {
        let a = free_port().unwrap();
        let b = free_port().unwrap();
        assert_ne!(a, b);
    }
}
