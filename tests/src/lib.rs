//! Test harness: one real primary + 2 streaming standbys per test binary
//! ([`LocalCluster::shared`]), and pgfresh proxies started in-process on port 0 in
//! front of it.
//!
//! Each test gets its own tables (see [`unique`]); tests that need another
//! configuration start their own proxy with [`start_proxy`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pgfresh_config::ConfigHandle;
use pgfresh_localcluster::LocalCluster;
use pgfresh_proxy::Proxy;
pub use pgfresh_proxy::Stop;

pub use pgfresh_localcluster;

pub mod admin;
pub mod exchange;
pub mod gate;
pub mod pki;

/// Password of the cluster's `app` role (see `LocalCluster::shared`).
pub const APP_PASSWORD: &str = "app-secret";

/// The runtime proxies run on, separate from the tests' own runtimes.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        // PGFRESH_TEST_LOG=debug shows the proxy's logs (routing decisions included).
        if let Ok(filter) = std::env::var("PGFRESH_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("pgfresh-test-proxy")
            .build()
            .expect("test runtime")
    })
}

/// Every standby replays `ms` behind while this lives; back to 0 when dropped, also when
/// the test panics (the cluster is shared by the whole test binary).
pub struct ApplyDelay;

impl ApplyDelay {
    pub fn set(ms: u64) -> ApplyDelay {
        let guard = ApplyDelay;
        for i in 1..cluster().nodes().len() {
            cluster().set_apply_delay(i, ms).expect("set apply delay");
        }
        guard
    }
}

impl Drop for ApplyDelay {
    fn drop(&mut self) {
        for i in 1..cluster().nodes().len() {
            let _ = cluster().set_apply_delay(i, 0);
        }
    }
}

/// Every standby of the shared cluster stops replaying while this lives
/// (`pg_wal_replay_pause()`: no record after the call is applied); replay resumes when
/// it is dropped, also when the test panics.
pub struct ReplayPause;

impl ReplayPause {
    pub fn all() -> ReplayPause {
        let guard = ReplayPause;
        for i in 1..cluster().nodes().len() {
            cluster().pause_replay(i).expect("pause replay");
        }
        guard
    }

    /// Each standby's replay position now (stopped while the pause lives).
    pub fn positions(&self) -> Vec<pgfresh_recency::Lsn> {
        (1..cluster().nodes().len())
            .map(|i| {
                cluster()
                    .psql(i, "postgres", "SELECT pg_last_wal_replay_lsn()")
                    .expect("replay position")
                    .parse()
                    .expect("an LSN")
            })
            .collect()
    }
}

impl Drop for ReplayPause {
    fn drop(&mut self) {
        for i in 1..cluster().nodes().len() {
            let _ = cluster().resume_replay(i);
        }
    }
}

/// The shared cluster, with `app` owning the public schema of database `app`.
pub fn cluster() -> &'static LocalCluster {
    static READY: OnceLock<()> = OnceLock::new();
    let c = LocalCluster::shared();
    READY.get_or_init(|| {
        c.psql(
            0,
            "app",
            "ALTER DATABASE app OWNER TO app; ALTER SCHEMA public OWNER TO app;",
        )
        .expect("grant app the public schema");
    });
    c
}

/// A running proxy; stopped when dropped.
pub struct ProxyHandle {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub config_path: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<Stop>>,
    done: Option<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
    pub shared: std::sync::Arc<pgfresh_proxy::Shared>,
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(Stop::Fast);
        }
        if let Some(done) = self.done.take() {
            let _ = done.lock().map(|d| d.recv_timeout(Duration::from_secs(30)));
        }
    }
}

/// The default config for tests, with `extra` TOML appended to `[routing]`.
pub fn config_text(routing_extra: &str) -> String {
    config_text_for(cluster(), routing_extra)
}

/// The test config for any cluster made like the shared one (role `app`).
pub fn config_text_for(c: &LocalCluster, routing_extra: &str) -> String {
    let (su, su_pw) = c.superuser();
    // The schema check is off unless a test turns it on: after the DDL tests run through
    // the shared proxy, a check would mark the whole database at a moment no test
    // controls, and reads the test expects on a replica would go to the primary.
    let check = if routing_extra.contains("dependency_check_ms") {
        ""
    } else {
        "dependency_check_ms = 0\n"
    };
    // PGFRESH_TEST_IO_ENGINE=epoll or io_uring picks the tests' proxies' engine (default:
    // pgfresh's own, `auto`).
    let engine = std::env::var("PGFRESH_TEST_IO_ENGINE")
        .map(|e| format!("io_engine = \"{e}\"\n"))
        .unwrap_or_default();
    let mut text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nclient_login_timeout_ms = 10000\n{engine}\n\
         [monitor]\nuser = \"{su}\"\npassword = \"{su_pw}\"\nsr_check_period_ms = 50\n\n\
         [routing]\ncold_start_ms = 0\n{check}{routing_extra}\n\n"
    );
    for (i, n) in c.nodes().iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"pg{i}\"\nhost = \"127.0.0.1\"\nport = {}\n\n",
            n.port
        ));
    }
    text.push_str(&format!(
        "[[users]]\nname = \"app\"\npassword = \"{APP_PASSWORD}\"\n\n\
         [[users]]\nname = \"app_md5\"\npassword = \"md5-pass\"\nauth = \"md5\"\nserver_user = \"app\"\nserver_password = \"{APP_PASSWORD}\"\n\n\
         [[users]]\nname = \"app_trust\"\nauth = \"trust\"\nserver_user = \"app\"\nserver_password = \"{APP_PASSWORD}\"\n\n\
         [[users]]\nname = \"admin\"\npassword = \"admin-pass\"\nadmin = true\nserver_user = \"{su}\"\nserver_password = \"{su_pw}\"\n"
    ));
    text
}

/// A private primary + 2 standbys (with role `app` owning database `app`), for tests that
/// break their cluster (failover, promotion).
pub fn private_cluster() -> LocalCluster {
    let c = LocalCluster::start(pgfresh_localcluster::ClusterOptions {
        users: vec![("app".into(), APP_PASSWORD.into())],
        databases: vec!["app".into()],
        ..pgfresh_localcluster::ClusterOptions::default()
    })
    .expect("private cluster");
    c.psql(
        0,
        "app",
        "ALTER DATABASE app OWNER TO app; ALTER SCHEMA public OWNER TO app;",
    )
    .expect("grant app the public schema");
    c
}

/// Standby `i` of `c` stops receiving WAL (its `primary_conninfo` emptied); returns once
/// its WAL receiver is gone.
pub async fn cut_off_standby(c: &LocalCluster, i: usize) {
    c.psql(i, "postgres", "ALTER SYSTEM SET primary_conninfo = ''")
        .expect("empty primary_conninfo");
    c.psql(i, "postgres", "SELECT pg_reload_conf()")
        .expect("reload");
    eventually("standby cut off", Duration::from_secs(60), || {
        c.psql(i, "postgres", "SELECT count(*) FROM pg_stat_wal_receiver")
            .is_ok_and(|n| n == "0")
    })
    .await;
}

/// A connection straight to node `i`, past every pgfresh.
pub async fn direct_to(i: usize, user: &str, password: &str, db: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={db}",
            node_port(i)
        ),
        tokio_postgres::NoTls,
    )
    .await
    .expect("direct connection");
    tokio::spawn(conn);
    c
}

/// The first row `sql` returns over the simple protocol (panics on an error or no row).
pub async fn simple_row(c: &tokio_postgres::Client, sql: &str) -> tokio_postgres::SimpleQueryRow {
    c.simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

/// The value of one sample of this process's metrics, `series` written with its labels as
/// Prometheus prints them (`name{label="value"}`); 0 when absent.
pub fn metric_value(series: &str) -> f64 {
    pgfresh_proxy::admin::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A file of this test replaced by something that does not load: wait until pgfresh read
/// and refused it (`errors`, a metric_value series, went up).
pub async fn replace_with_garbage(path: &std::path::Path, garbage: &str, errors: &str) {
    let before = metric_value(errors);
    std::fs::write(path, garbage).unwrap();
    eventually(
        "the broken file was read and refused",
        Duration::from_secs(30),
        || metric_value(errors) > before,
    )
    .await;
}

/// Raw protocol frames, for tests that speak the wire protocol byte for byte.
pub mod raw {
    /// A frame: type byte, length, body.
    pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    /// A NUL-terminated string.
    pub fn cstr(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    /// A protocol 3.0 StartupMessage.
    pub fn startup(user: &str, db: &str) -> Vec<u8> {
        let mut body = 196608u32.to_be_bytes().to_vec();
        for s in ["user", user, "database", db] {
            body.extend_from_slice(&cstr(s));
        }
        body.push(0);
        let mut v = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        v.extend_from_slice(&body);
        v
    }

    /// Read whole messages until one with `tag` arrives (30 s at most); returns every
    /// message read as (tag, body).
    pub async fn read_until(
        s: &mut (impl tokio::io::AsyncRead + Unpin),
        tag: u8,
    ) -> Vec<(u8, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        loop {
            let mut head = [0u8; 5];
            tokio::time::timeout(std::time::Duration::from_secs(30), s.read_exact(&mut head))
                .await
                .expect("the proxy answered")
                .expect("read header");
            let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
            let mut body = vec![0u8; len - 4];
            s.read_exact(&mut body).await.expect("read body");
            out.push((head[0], body));
            if head[0] == tag {
                return out;
            }
        }
    }

    /// The tags of `messages`.
    pub fn tags(messages: &[(u8, Vec<u8>)]) -> Vec<u8> {
        messages.iter().map(|(t, _)| *t).collect()
    }

    /// The batch libpq's `PQexecParams` sends (and pgbench `-M extended`, node-postgres and
    /// psycopg without prepared statements): Parse and Bind of the unnamed statement and
    /// portal, Describe of the portal, Execute, Sync, text parameters.
    pub fn exec_params(sql: &str, values: &[&str]) -> Vec<u8> {
        unnamed_batch(sql, values, b'P')
    }

    /// The same batch with a Describe of `kind`: `P` the portal, `S` the statement (as
    /// tokio-postgres' `query_typed` sends it).
    pub fn unnamed_batch(sql: &str, values: &[&str], kind: u8) -> Vec<u8> {
        let mut parse = cstr("");
        parse.extend_from_slice(&cstr(sql));
        parse.extend_from_slice(&0u16.to_be_bytes());
        let mut out = msg(b'P', &parse);
        out.extend(bind("", values));
        out.extend(msg(b'D', &[kind, 0]));
        out.extend(execute());
        out.extend(msg(b'S', &[]));
        out
    }

    /// Bind of `statement` to the unnamed portal, text parameters and results.
    pub fn bind(statement: &str, values: &[&str]) -> Vec<u8> {
        let mut body = cstr("");
        body.extend_from_slice(&cstr(statement));
        body.extend_from_slice(&0u16.to_be_bytes());
        body.extend_from_slice(&(values.len() as u16).to_be_bytes());
        for v in values {
            body.extend_from_slice(&(v.len() as i32).to_be_bytes());
            body.extend_from_slice(v.as_bytes());
        }
        body.extend_from_slice(&0u16.to_be_bytes());
        msg(b'B', &body)
    }

    /// Execute of the unnamed portal, all rows.
    pub fn execute() -> Vec<u8> {
        let mut body = cstr("");
        body.extend_from_slice(&0i32.to_be_bytes());
        msg(b'E', &body)
    }

    /// The first text value of the first DataRow among `messages`.
    pub fn first_value(messages: &[(u8, Vec<u8>)]) -> String {
        let (_, row) = messages.iter().find(|(t, _)| *t == b'D').expect("a row");
        let len = i32::from_be_bytes(row[2..6].try_into().unwrap()) as usize;
        String::from_utf8_lossy(&row[6..6 + len]).into_owned()
    }

    /// A session logged in through `addr` as the trusted test user, ready for queries.
    pub async fn connect(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&startup("app_trust", "app")).await.unwrap();
        read_until(&mut s, b'Z').await;
        s
    }
}

/// Start a proxy with this full config text (listen addresses are replaced by port 0),
/// and wait until its monitor has seen a primary and every standby in the read pool.
pub fn start_proxy(text: &str) -> ProxyHandle {
    let p = start_proxy_unready(text);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Ready when the monitor has seen a primary and every standby in the read pool.
    let standbys = p.shared.config.snapshot().nodes.len().saturating_sub(1);
    loop {
        let view = p.shared.balancer.view();
        if view.primary.is_some() && view.nodes.iter().filter(|n| n.eligible).count() == standbys {
            return p;
        }
        if Instant::now() >= deadline {
            // Some tests start a proxy whose standbys stay out on purpose; the others fail
            // later, and this line says why.
            let nodes: Vec<String> = view
                .nodes
                .iter()
                .map(|n| {
                    format!(
                        "{} {:?} eligible={} {:?}",
                        n.spec.name, n.role, n.eligible, n.ineligible_reason
                    )
                })
                .collect();
            eprintln!(
                "start_proxy: after 60 s, primary {:?} and not every standby in the read pool: {}",
                view.primary,
                nodes.join("; ")
            );
            return p;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// Start a proxy without waiting for its monitor (for tests of a proxy that cannot
/// reach its nodes).
pub fn start_proxy_unready(text: &str) -> ProxyHandle {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pgfresh.toml");
    std::fs::write(&path, text).expect("write config");
    let handle = ConfigHandle::open(&path).expect("valid test config");
    let rt = runtime();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin = std::net::TcpListener::bind("127.0.0.1:0").expect("bind admin");
    listener.set_nonblocking(true).expect("nonblocking");
    admin.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let admin_addr = admin.local_addr().expect("admin addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<Stop>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (shared_tx, shared_rx) = std::sync::mpsc::channel();
    let path_for_watch = path.clone();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let admin = tokio::net::TcpListener::from_std(admin).expect("admin listener");
        let proxy = Proxy::new(handle.clone());
        let _ = shared_tx.send(proxy.shared.clone());
        // Reload on file edits, as `pgfresh run` does.
        let shared = proxy.shared.clone();
        let _watch = pgfresh_config::FileWatch::start(
            &path_for_watch,
            Duration::from_millis(50),
            move || {
                let _ = pgfresh_proxy::reload_config(&shared, "file");
            },
        );
        proxy
            .run(listener, Some(admin), async move {
                stop_rx.await.unwrap_or(Stop::Fast)
            })
            .await;
        let _ = done_tx.send(());
    });
    let shared = shared_rx.recv().expect("proxy started");
    let proxy = &shared.config.snapshot().proxy;
    if proxy.io_engine == pgfresh_config::IoEngine::IoUring {
        assert!(
            shared.ring.is_some(),
            "io_engine = \"io_uring\" asked for, but the ring could not be set up (see the log)"
        );
    } else if proxy.io_engine.wants_ring(proxy.worker_threads) && shared.ring.is_none() {
        // `auto` fell back: the tests run on epoll only, which the run should show.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "pgfresh-tests: no io_uring on this machine; the proxies run on epoll \
                 (set PGFRESH_TEST_IO_ENGINE=io_uring to make that an error)"
            )
        });
    }
    ProxyHandle {
        addr,
        admin: admin_addr,
        config_path: path,
        _dir: dir,
        stop: Some(stop_tx),
        done: Some(std::sync::Mutex::new(done_rx)),
        shared,
    }
}

/// The proxy with the default test config, shared by the tests of one binary.
pub fn proxy() -> &'static ProxyHandle {
    static P: OnceLock<ProxyHandle> = OnceLock::new();
    P.get_or_init(|| start_proxy(&config_text("")))
}

impl ProxyHandle {
    /// Ask the proxy to stop as `how` says, without waiting.
    pub fn request_stop(&mut self, how: Stop) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(how);
        }
    }

    /// True once the proxy's run loop has returned.
    pub fn has_stopped(&self) -> bool {
        self.done
            .as_ref()
            .and_then(|d| d.lock().ok().map(|d| d.try_recv().is_ok()))
            .unwrap_or(true)
    }

    pub fn conninfo(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={db} connect_timeout=10",
            self.addr.port()
        )
    }

    /// A tokio-postgres client through the proxy as `app`.
    pub async fn connect(&self) -> tokio_postgres::Client {
        self.connect_as("app", APP_PASSWORD, "app")
            .await
            .expect("connect through pgfresh")
    }

    /// A client as `app` with startup `options` (e.g. `-c pgfresh.track_commit_lsn=on`).
    pub async fn connect_with_options(&self, options: &str) -> tokio_postgres::Client {
        let conninfo = format!(
            "{} options='{options}'",
            self.conninfo("app", APP_PASSWORD, "app")
        );
        let (c, conn) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
            .await
            .expect("connect through pgfresh with options");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        c
    }

    pub async fn connect_as(
        &self,
        user: &str,
        password: &str,
        db: &str,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, conn) =
            tokio_postgres::connect(&self.conninfo(user, password, db), tokio_postgres::NoTls)
                .await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    /// Run pgbench through the proxy against database `db`; its output. The test fails
    /// with the output when pgbench does.
    pub fn pgbench(&self, db: &str, args: &[&str]) -> String {
        let out = std::process::Command::new(pg_bin("pgbench"))
            .args(args)
            .envs(self.libpq_env())
            .env("PGDATABASE", db)
            .output()
            .expect("run pgbench");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "pgbench {args:?}:\n{text}");
        text
    }

    /// Environment and arguments for psql/pgbench against the proxy.
    pub fn libpq_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PGHOST", "127.0.0.1".into()),
            ("PGPORT", self.addr.port().to_string()),
            ("PGUSER", "app".into()),
            ("PGPASSWORD", APP_PASSWORD.into()),
            ("PGDATABASE", "app".into()),
        ]
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
}

/// A name unique to this test process and call, for tables.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// How often the polling helpers check their condition.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Poll `f` until it returns true or the deadline passes.
pub async fn eventually(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    poll(what, timeout, || std::future::ready(f().then_some(()))).await
}

/// Poll the asynchronous `check` until it yields a value, at most `timeout`; the test
/// fails naming `what` when the deadline passes.
pub async fn poll<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

impl ProxyHandle {
    /// Poll until none of `tables` (unqualified, database `app`) is hot any more.
    pub async fn wait_cold(&self, tables: &[&str]) {
        let keys: Vec<pgfresh_recency::RelKey<'_>> = tables
            .iter()
            .map(|t| pgfresh_recency::RelKey::unqualified(t))
            .collect();
        let recency = self.shared.recency.clone();
        eventually(
            "written tables to leave the recency window",
            Duration::from_secs(120),
            || !recency.lookup("app", &keys).is_hot(),
        )
        .await;
    }
}

/// Poll until every standby of `cluster` has replayed the primary's current position,
/// read through the proxy client `c` (a primary-hinted query).
pub async fn wait_replicated_on(cluster: &LocalCluster, c: &tokio_postgres::Client) {
    let lsn: String = c
        .query_one(
            "/* pgfresh:primary */ SELECT pg_current_wal_lsn()::text",
            &[],
        )
        .await
        .expect("primary position")
        .get(0);
    let position = format!("'{lsn}'::pg_lsn");
    eventually("standby replay", Duration::from_secs(60), || {
        standbys_replayed(cluster, &position)
    })
    .await;
}

/// Whether every standby of `cluster` has replayed `position` (a `pg_lsn` expression),
/// asked of each directly.
pub fn standbys_replayed(cluster: &LocalCluster, position: &str) -> bool {
    let sql = format!("SELECT pg_last_wal_replay_lsn() >= {position}");
    (1..cluster.nodes().len()).all(|i| cluster.psql(i, "app", &sql).is_ok_and(|s| s == "t"))
}

impl ProxyHandle {
    /// A new table with one row, replicated to both standbys of the shared cluster and
    /// out of the recency window: reads of it may go to any replica.
    pub async fn cold_table(&self, c: &tokio_postgres::Client, prefix: &str) -> String {
        let t = unique(prefix);
        c.batch_execute(&format!(
            "CREATE TABLE {t}(id int); INSERT INTO {t} VALUES (1)"
        ))
        .await
        .expect("create table");
        wait_replicated_on(cluster(), c).await;
        self.wait_cold(&[&t]).await;
        t
    }
}

/// Port of node `i` of the shared cluster.
pub fn node_port(i: usize) -> u16 {
    cluster().port(i)
}

/// Path of a PostgreSQL client binary (psql, pgbench) next to the server binaries
/// or on PATH.
pub fn pg_bin(name: &str) -> PathBuf {
    let candidate = cluster().bin_dir().join(name);
    if candidate.exists() {
        candidate
    } else {
        PathBuf::from(name)
    }
}

/// Login roles with these (name, password) pairs on the shared cluster (allowed to
/// connect to database `app`), returning once every standby has them.
pub async fn login_roles(roles: &[(&str, &str)]) {
    let c = cluster();
    for (name, password) in roles {
        c.psql(
            0,
            "postgres",
            &format!(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN \
                   CREATE ROLE {name} LOGIN PASSWORD '{password}'; END IF; END $$; \
                 GRANT CONNECT ON DATABASE app TO {name};"
            ),
        )
        .unwrap();
    }
    let names: Vec<String> = roles.iter().map(|(n, _)| format!("'{n}'")).collect();
    let count = format!(
        "SELECT count(*) FROM pg_roles WHERE rolname IN ({})",
        names.join(", ")
    );
    let want = roles.len().to_string();
    for i in 1..3 {
        let (count, want) = (&count, &want);
        poll(
            "the standbys have the roles",
            Duration::from_secs(30),
            || async move { (c.psql(i, "postgres", count).unwrap().trim() == want).then_some(()) },
        )
        .await;
    }
}
