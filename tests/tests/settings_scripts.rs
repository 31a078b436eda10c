//! A client's session settings through pgfresh are those PostgreSQL gives it on one
//! connection. Scripts of SET, RESET, `set_config`, transactions, savepoints and errors,
//! drawn from a small seeded generator (the same seeds every run), run step by step on a
//! direct session to the primary (the reference) and through pgfresh: in session mode,
//! where statements land on several nodes, and in transaction mode, where clients take
//! turns on few server connections, each with its own values, so a setting that leaks
//! from one client to another shows as a wrong value. Every step's outcome (message tags,
//! rows, errors, notices, reported parameters, transaction status) must be the
//! reference's.
//!
//! Steps are simple Queries, some pipelined (sent at once), and half the clients log in
//! with startup parameters. Each mismatch fails its test with the seed, the mode, the
//! client, the step and every step run before it, with both outcomes: the same seed
//! gives the same scripts and the same turns every run. The named tests below the
//! generator are the scripts it found pgfresh wrong on, reduced.

use pgfresh_tests::raw::{cstr, msg};
use pgfresh_tests::*;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// Transaction mode, `pool_size` connections per node.
fn tx_config(pool_size: usize) -> String {
    format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = {pool_size}\n",
        config_text("")
    )
}

fn query(sql: &str) -> Vec<u8> {
    msg(b'Q', &cstr(sql))
}

/// One exchange's outcome as the client sees it: the message tags, every value of the
/// DataRows, each error's and notice's SQLSTATE and message, each reported parameter, and
/// the final transaction status.
fn outcome(messages: &[(u8, Vec<u8>)]) -> String {
    let mut out = String::from_utf8_lossy(&raw::tags(messages)).into_owned();
    for (tag, body) in messages {
        match tag {
            b'D' => {
                let columns = u16::from_be_bytes(body[..2].try_into().unwrap());
                let mut at = 2;
                let mut values = Vec::new();
                for _ in 0..columns {
                    let len = i32::from_be_bytes(body[at..at + 4].try_into().unwrap());
                    at += 4;
                    match usize::try_from(len) {
                        Ok(l) => {
                            values.push(String::from_utf8_lossy(&body[at..at + l]).into_owned());
                            at += l;
                        }
                        Err(_) => values.push("NULL".into()),
                    }
                }
                out.push_str(&format!(" row=[{}]", values.join("|")));
            }
            b'E' | b'N' => {
                let field = |k: u8| {
                    body.split(|x| *x == 0)
                        .find_map(|f| f.strip_prefix(&[k]))
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .unwrap_or_default()
                };
                let what = if *tag == b'E' { "error" } else { "notice" };
                out.push_str(&format!(" {what}={}:{}", field(b'C'), field(b'M')));
            }
            b'S' => {
                let mut parts = body.split(|x| *x == 0);
                let name = String::from_utf8_lossy(parts.next().unwrap_or_default());
                let value = String::from_utf8_lossy(parts.next().unwrap_or_default());
                out.push_str(&format!(" param={name}={value}"));
            }
            b'Z' => out.push_str(&format!(" status={}", body[0] as char)),
            _ => {}
        }
    }
    out
}

/// Sends `sql` as a simple Query and reads up to its ReadyForQuery; its outcome (no
/// answer within 20 s is one too, so that a run that waits forever says where).
/// A step of several lines is a pipeline: a Query per line, sent at once, and their
/// outcomes one after the other.
async fn step<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, sql: &str) -> String {
    let queries: Vec<u8> = sql.lines().flat_map(query).collect();
    s.write_all(&queries).await.unwrap();
    let answers = async {
        let mut outcomes = Vec::new();
        for _ in sql.lines() {
            outcomes.push(outcome(&raw::read_until(s, b'Z').await));
        }
        outcomes.join(" / ")
    };
    match tokio::time::timeout(std::time::Duration::from_secs(20), answers).await {
        Ok(outcomes) => outcomes,
        Err(_) => "no answer within 20 s".into(),
    }
}

/// A protocol 3.0 StartupMessage with `params` besides the user and database.
fn startup(user: &str, params: &[(String, String)]) -> Vec<u8> {
    let mut body = 196608u32.to_be_bytes().to_vec();
    for (k, v) in [("user", user), ("database", "app")]
        .into_iter()
        .chain(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    {
        body.extend(cstr(k));
        body.extend(cstr(v));
    }
    body.push(0);
    let mut v = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    v.extend(body);
    v
}

/// A session through `p` as the trusted test user, with startup `params`.
async fn proxied_session(p: &ProxyHandle, params: &[(String, String)]) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    s.write_all(&startup("app_trust", params)).await.unwrap();
    let login = raw::read_until(&mut s, b'Z').await;
    assert!(!raw::tags(&login).contains(&b'E'), "{}", outcome(&login));
    s
}

/// A session on the primary itself, over its Unix socket (trusted), as `app`, with
/// startup `params`.
async fn direct_session_with(params: &[(String, String)]) -> tokio::net::UnixStream {
    let mut s = tokio::net::UnixStream::connect(pgfresh_tests::exchange::primary_socket())
        .await
        .unwrap();
    s.write_all(&startup("app", params)).await.unwrap();
    let login = raw::read_until(&mut s, b'Z').await;
    assert!(!raw::tags(&login).contains(&b'E'), "{}", outcome(&login));
    s
}

/// Runs `steps` on the primary and through `p`; the outcomes through pgfresh must be
/// the primary's. Returns them.
async fn same_as_postgresql(p: &ProxyHandle, steps: &[&str]) -> Vec<String> {
    same_as_postgresql_with(p, &[], steps).await
}

/// As `same_as_postgresql`, both sessions started with these startup parameters.
async fn same_as_postgresql_with(
    p: &ProxyHandle,
    params: &[(&str, &str)],
    steps: &[&str],
) -> Vec<String> {
    let script = Script {
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        steps: steps.iter().map(|s| s.to_string()).collect(),
    };
    let order = vec![0; steps.len()];
    match run_clients(p, &[script], Schedule::Fixed(order)).await {
        Ok(outcomes) => outcomes.into_iter().next().unwrap(),
        Err(e) => panic!("{e}"),
    }
}

/// The observation step: every setting the scripts change, at once. A custom placeholder
/// a session never set is an error in `current_setting`, one that was set and reset is
/// empty: which it is depends on what the server connection ever ran (PostgreSQL cannot
/// forget a placeholder), so both read as empty.
fn observe(hint: &str) -> String {
    let columns: Vec<String> = GUCS
        .iter()
        .map(|g| match *g {
            CUSTOM => format!("coalesce(current_setting('{g}', true), '')"),
            g => format!("current_setting('{g}')"),
        })
        .collect();
    format!("{hint}SELECT {}", columns.join(", "))
}

const CUSTOM: &str = "pgfresh_test.k";

/// The settings the scripts change: none that pgfresh reads or manages itself (routing
/// settings, `default_transaction_*`, roles), and none whose value depends on the node.
const GUCS: [&str; 8] = [
    "search_path",
    "application_name",
    "statement_timeout",
    "work_mem",
    "DateStyle",
    "extra_float_digits",
    "TimeZone",
    CUSTOM,
];

const DATESTYLES: [&str; 6] = [
    "ISO, MDY",
    "SQL, DMY",
    "Postgres, YMD",
    "German, DMY",
    "ISO, DMY",
    "SQL, MDY",
];

/// xorshift64*: a small deterministic generator, the same sequence for a seed every run.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// An index into `weights`, drawn in proportion to them.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut r = self.below(total as usize) as u32;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        unreachable!()
    }
}

/// A value of setting `g` for client `client` of the run with `seed`: values of one
/// client are never another's where the setting has room for it.
fn value(g: &str, seed: u64, client: usize, rng: &mut Rng) -> String {
    let n = rng.below(1000);
    match g {
        "search_path" => format!("p{seed}c{client}n{n}"),
        "application_name" => format!("a{seed}c{client}n{n}"),
        "statement_timeout" => format!("{}", 100_000 + client * 10_000 + (n % 10) * 1000),
        "work_mem" => format!("{}kB", 1000 + client * 100 + n % 100),
        "DateStyle" => DATESTYLES[(client + n) % DATESTYLES.len()].to_string(),
        "extra_float_digits" => format!("{}", ((client * 5 + n) % 19) as i64 - 15),
        "TimeZone" => format!("Etc/GMT-{}", (client * 3 + n) % 12 + 1),
        _ => format!("k{seed}c{client}n{n}"),
    }
}

/// The kinds of step, with their weights outside a transaction, in one, and in one that
/// failed.
#[derive(Clone, Copy)]
enum Kind {
    Set,
    SetSession,
    SetLocal,
    SetDefault,
    Reset,
    ResetAll,
    SetConfig,
    SetConfigLocal,
    SetConfigTwice,
    Begin,
    BeginReadOnly,
    Commit,
    Rollback,
    Chain,
    Savepoint,
    RollbackTo,
    Release,
    Error,
    Multi,
    Pipeline,
    Primary,
    Observe,
}

const KINDS: [(Kind, [u32; 3]); 22] = [
    (Kind::Set, [5, 5, 1]),
    (Kind::SetSession, [1, 1, 0]),
    (Kind::SetLocal, [1, 2, 0]),
    (Kind::SetDefault, [1, 1, 0]),
    (Kind::Reset, [2, 2, 0]),
    (Kind::ResetAll, [1, 1, 0]),
    (Kind::SetConfig, [3, 3, 0]),
    (Kind::SetConfigLocal, [1, 2, 0]),
    (Kind::SetConfigTwice, [1, 1, 0]),
    (Kind::Begin, [3, 1, 0]),
    (Kind::BeginReadOnly, [2, 0, 0]),
    (Kind::Commit, [1, 3, 2]),
    (Kind::Rollback, [1, 3, 2]),
    (Kind::Chain, [0, 1, 1]),
    (Kind::Savepoint, [1, 3, 0]),
    (Kind::RollbackTo, [1, 3, 4]),
    (Kind::Release, [1, 2, 0]),
    (Kind::Error, [1, 2, 0]),
    (Kind::Multi, [2, 2, 0]),
    (Kind::Pipeline, [2, 2, 0]),
    (Kind::Primary, [1, 1, 0]),
    (Kind::Observe, [5, 4, 1]),
];

/// `SET name = value` in one of its spellings.
fn set(g: &str, seed: u64, client: usize, rng: &mut Rng) -> String {
    let v = value(g, seed, client, rng);
    match (g, rng.below(4)) {
        ("TimeZone", 0) => format!("SET TIME ZONE '{v}'"),
        ("search_path", 0) => format!("SET SCHEMA '{v}'"),
        (_, 1) => format!("SET {g} TO '{v}'"),
        _ => format!("SET {g} = '{v}'"),
    }
}

/// `set_config` of `g`, for the session or (`local`) the transaction; the flag in one of
/// the forms of a boolean literal.
fn set_config(g: &str, local: bool, seed: u64, client: usize, rng: &mut Rng) -> String {
    let flag = if local {
        ["true", "'t'", "'on'", "'TRUE'", "'yes'", "'1'"][rng.below(6)]
    } else {
        ["false", "'f'", "'off'", "'FALSE'", "'no'", "'0'"][rng.below(6)]
    };
    let v = value(g, seed, client, rng);
    format!("set_config('{g}', '{v}', {flag})")
}

/// A step that changes or shows settings without a transaction's control, for pipelines.
fn plain_step(seed: u64, client: usize, resettable: &[&str], rng: &mut Rng) -> String {
    let g = GUCS[rng.below(GUCS.len())];
    match rng.below(6) {
        0 | 1 => set(g, seed, client, rng),
        2 => format!("SELECT {}", set_config(g, false, seed, client, rng)),
        3 if !resettable.is_empty() => {
            format!("RESET {}", resettable[rng.below(resettable.len())])
        }
        4 => "SELECT 1/0".into(),
        _ => observe(["", "/* pgfresh:primary */ "][rng.below(2)]),
    }
}

/// A script of 8 to 20 steps for client `client`, ending outside a transaction with an
/// observation. What the generator knows of the transaction (whether one is open, has
/// failed, its savepoints) only weighs the draws: each step's outcome is compared whatever
/// it is. A step of several lines is a pipeline: its queries are sent at once.
///
/// A client that logged in with `startup` parameters resets them (`RESET` or `SET … TO
/// DEFAULT` of one, `RESET ALL`, `DISCARD ALL`) only outside a transaction and not in a
/// pipeline: PostgreSQL returns such a setting to the value of the startup packet, and
/// pgfresh, whose server connections did not log in with the client's parameters, brings
/// that value back before the client's next unit (see
/// `reset_returns_a_setting_to_its_startup_value`); within the unit that reset it (the
/// rest of its transaction, a query pipelined behind it) the server's default shows.
fn script(seed: u64, client: usize, startup: &[(String, String)], rng: &mut Rng) -> Vec<String> {
    let given = |g: &str| {
        startup.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case(g) || (k == "options" && v.contains(&format!("-c {g}=")))
        })
    };
    // In a transaction or a pipeline; outside them, every one.
    let resettable: Vec<&str> = GUCS.into_iter().filter(|g| !given(g)).collect();
    let len = 8 + rng.below(13);
    let (mut in_tx, mut failed) = (false, false);
    let mut savepoints: Vec<&str> = Vec::new();
    let mut steps = Vec::new();
    let guc = |rng: &mut Rng| GUCS[rng.below(GUCS.len())];
    // Unquoted names fold to lower case: `S1` is `s1`, `"S1"` is another.
    let names = ["s1", "S1", "\"s1\"", "s2", "\"S1\""];
    while steps.len() < len - 1 {
        let column = match (in_tx, failed) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        let weights: Vec<u32> = KINDS.iter().map(|(_, w)| w[column]).collect();
        let s = match KINDS[rng.weighted(&weights)].0 {
            Kind::Set => set(guc(rng), seed, client, rng),
            Kind::SetSession => {
                let g = guc(rng);
                format!("SET SESSION {g} = '{}'", value(g, seed, client, rng))
            }
            Kind::SetLocal => {
                let g = guc(rng);
                format!("SET LOCAL {g} = '{}'", value(g, seed, client, rng))
            }
            Kind::SetDefault | Kind::Reset if in_tx && resettable.is_empty() => observe(""),
            kind @ (Kind::SetDefault | Kind::Reset) => {
                let from = if in_tx { &resettable[..] } else { &GUCS[..] };
                let g = from[rng.below(from.len())];
                match kind {
                    Kind::SetDefault => format!("SET {g} TO DEFAULT"),
                    _ => format!("RESET {g}"),
                }
            }
            Kind::ResetAll if in_tx && !startup.is_empty() => observe(""),
            Kind::ResetAll => {
                if in_tx || rng.below(3) > 0 {
                    "RESET ALL".into()
                } else {
                    "DISCARD ALL".into()
                }
            }
            kind @ (Kind::SetConfig | Kind::SetConfigLocal) => {
                let local = matches!(kind, Kind::SetConfigLocal);
                format!("SELECT {}", set_config(guc(rng), local, seed, client, rng))
            }
            Kind::SetConfigTwice => {
                let (a, b) = (guc(rng), guc(rng));
                let (la, lb) = (rng.below(3) == 0, rng.below(3) == 0);
                format!(
                    "SELECT {}, {}",
                    set_config(a, la, seed, client, rng),
                    set_config(b, lb, seed, client, rng)
                )
            }
            Kind::Begin => {
                (in_tx, failed) = (true, failed && in_tx);
                savepoints.clear();
                [
                    "BEGIN",
                    "START TRANSACTION",
                    "BEGIN ISOLATION LEVEL REPEATABLE READ",
                ][rng.below(3)]
                .into()
            }
            Kind::BeginReadOnly => {
                (in_tx, failed) = (true, false);
                savepoints.clear();
                "BEGIN READ ONLY".into()
            }
            Kind::Commit => {
                (in_tx, failed) = (false, false);
                ["COMMIT", "END"][rng.below(2)].into()
            }
            Kind::Rollback => {
                (in_tx, failed) = (false, false);
                ["ROLLBACK", "ABORT"][rng.below(2)].into()
            }
            Kind::Chain => {
                failed = false;
                savepoints.clear();
                ["COMMIT AND CHAIN", "ROLLBACK AND CHAIN"][rng.below(2)].into()
            }
            Kind::Savepoint => {
                let name = names[rng.below(names.len())];
                if in_tx && !failed {
                    savepoints.push(name);
                }
                format!("SAVEPOINT {name}")
            }
            kind @ (Kind::RollbackTo | Kind::Release) => {
                // Mostly one that exists.
                let name = match savepoints.len() {
                    n if n > 0 && rng.below(4) > 0 => savepoints[rng.below(n)],
                    _ => names[rng.below(names.len())],
                };
                let word = ["SAVEPOINT ", ""][rng.below(2)];
                if matches!(kind, Kind::RollbackTo) {
                    failed = false;
                    format!("ROLLBACK TO {word}{name}")
                } else {
                    format!("RELEASE {word}{name}")
                }
            }
            Kind::Error => {
                failed = in_tx;
                ["SELECT 1/0", "SET statement_timeout = 'bogus'"][rng.below(2)].into()
            }
            Kind::Multi => {
                let (a, b) = (guc(rng), guc(rng));
                let first = set(a, seed, client, rng);
                match rng.below(3) {
                    0 => format!("{first}; {}", set(b, seed, client, rng)),
                    1 => format!(
                        "{first}; SELECT {}",
                        set_config(b, false, seed, client, rng)
                    ),
                    _ => {
                        failed = in_tx;
                        format!("{first}; SELECT 1/0")
                    }
                }
            }
            Kind::Pipeline => {
                let n = 2 + rng.below(2);
                let lines: Vec<String> = (0..n)
                    .map(|_| plain_step(seed, client, &resettable, rng))
                    .collect();
                failed |= in_tx && lines.iter().any(|l| l.contains("1/0"));
                lines.join("\n")
            }
            Kind::Primary => "/* pgfresh:primary */ SELECT 1".into(),
            Kind::Observe => match rng.below(4) {
                0 => observe("/* pgfresh:primary */ "),
                // Not the placeholder: whether SHOW knows it depends on what the
                // connection ever ran (see `observe`).
                1 => format!("SHOW {}", GUCS[rng.below(GUCS.len() - 1)]),
                _ => observe(""),
            },
        };
        steps.push(s);
    }
    if in_tx {
        steps.push(["COMMIT", "ROLLBACK"][rng.below(2)].into());
    }
    steps.push(observe(""));
    steps
}

/// What one client runs: its startup parameters, then its steps.
#[derive(Clone, Default)]
struct Script {
    params: Vec<(String, String)>,
    steps: Vec<String>,
}

/// Startup parameters for client `client`, for half the clients: some settings given as
/// parameters of their own, some as `-c` options (the client's values, as for SET).
fn startup_params(seed: u64, client: usize, rng: &mut Rng) -> Vec<(String, String)> {
    if rng.below(2) == 0 {
        return Vec::new();
    }
    let mut params = Vec::new();
    let mut options = Vec::new();
    for g in GUCS {
        if rng.below(3) > 0 {
            continue;
        }
        let v = value(g, seed, client, rng);
        if rng.below(2) == 0 {
            params.push((g.to_string(), v));
        } else {
            options.push(format!("-c {g}={}", v.replace(' ', "\\ ")));
        }
    }
    if !options.is_empty() {
        params.push(("options".into(), options.join(" ")));
    }
    params
}

/// Which client takes the next step.
enum Schedule {
    /// Drawn from the generator among the clients that may go on.
    Random(Rng),
    /// A client's index per step.
    Fixed(Vec<usize>),
}

/// One client of a run: its script, its direct session on the primary and its session
/// through pgfresh.
struct Client {
    script: Vec<String>,
    done: usize,
    direct: tokio::net::UnixStream,
    proxied: tokio::net::TcpStream,
    /// In a transaction after its last step (PostgreSQL's status).
    in_tx: bool,
    outcomes: Vec<String>,
}

/// Runs each script on a direct session of its own and through `p`, one step at a time in
/// the order `schedule` gives; the outcomes through pgfresh must be the primary's.
/// Returns each client's outcomes, or what differs first, with everything that ran up to
/// it.
///
/// In transaction mode a client in a transaction holds a server connection, which a step
/// of another client may be waiting for, and clients here take one step at a time: while
/// one is in a transaction only it goes on with `pool_size = 1`, and the others do not
/// begin one (with `pool_size = 2` one connection of each node stays free).
async fn run_clients(
    p: &ProxyHandle,
    scripts: &[Script],
    mut schedule: Schedule,
) -> Result<Vec<Vec<String>>, String> {
    let pool_size = p.shared.config.snapshot().pool.pool_size;
    let transaction_mode =
        p.shared.config.snapshot().pool.pool_mode == pgfresh_config::PoolMode::Transaction;
    let mut clients = Vec::new();
    for s in scripts {
        clients.push(Client {
            script: s.steps.clone(),
            done: 0,
            direct: direct_session_with(&s.params).await,
            proxied: proxied_session(p, &s.params).await,
            in_tx: false,
            outcomes: Vec::new(),
        });
    }
    let mut history: Vec<(usize, usize)> = Vec::new();
    let mut fixed = 0;
    loop {
        let in_tx = clients.iter().position(|c| c.in_tx);
        let may: Vec<usize> = (0..clients.len())
            .filter(|&i| clients[i].done < clients[i].script.len())
            .filter(|&i| match in_tx {
                Some(t) if transaction_mode && t != i => {
                    let next = &clients[i].script[clients[i].done];
                    pool_size > 1 && !next.starts_with("BEGIN") && !next.starts_with("START")
                }
                _ => true,
            })
            .collect();
        let i = match &mut schedule {
            Schedule::Random(rng) => match may.len() {
                0 => break,
                n => may[rng.below(n)],
            },
            Schedule::Fixed(order) => match order.get(fixed) {
                Some(i) => {
                    fixed += 1;
                    *i
                }
                None => break,
            },
        };
        let c = &mut clients[i];
        let sql = &c.script[c.done];
        let (want, got) = tokio::join!(step(&mut c.direct, sql), step(&mut c.proxied, sql));
        history.push((i, c.done));
        c.done += 1;
        c.in_tx = !want.ends_with("status=I");
        c.outcomes.push(want.clone());
        if got != want {
            let mut text = String::new();
            for (ci, s) in scripts.iter().enumerate() {
                if !s.params.is_empty() {
                    text.push_str(&format!(
                        "  client {ci} startup parameters: {:?}\n",
                        s.params
                    ));
                }
            }
            for (k, &(ci, si)) in history.iter().enumerate() {
                let last = k + 1 == history.len();
                let shown = if last { "" } else { &clients[ci].outcomes[si] };
                text.push_str(&format!(
                    "  client {ci} step {si}: {}    {shown}\n",
                    clients[ci].script[si].replace('\n', "  >>  ")
                ));
            }
            return Err(format!(
                "client {i}, step {}: pgfresh differs from PostgreSQL\n\
                 steps so far, every client (with PostgreSQL's outcome):\n{text}\
                 PostgreSQL: {want}\n   pgfresh: {got}",
                history.last().unwrap().1
            ));
        }
    }
    Ok(clients.into_iter().map(|c| c.outcomes).collect())
}

/// Runs the generated scripts of `seeds` through `p`, `clients` clients per seed, and
/// fails with every seed whose run differs from PostgreSQL.
async fn differential(p: &ProxyHandle, mode: &str, seeds: std::ops::Range<u64>, clients: usize) {
    let mut failures = Vec::new();
    let mut steps = 0;
    for seed in seeds.clone() {
        let mut rng = Rng::new(seed);
        let scripts: Vec<Script> = (0..clients)
            .map(|c| {
                let params = startup_params(seed, c, &mut rng);
                let steps = script(seed, c, &params, &mut rng);
                Script { params, steps }
            })
            .collect();
        steps += scripts.iter().map(|s| s.steps.len()).sum::<usize>();
        if let Err(e) = run_clients(p, &scripts, Schedule::Random(rng)).await {
            failures.push((seed, e));
        }
    }
    let seeds_failed: Vec<u64> = failures.iter().map(|(s, _)| *s).collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds differ in {mode} ({steps} steps): {seeds_failed:?}\n\n{}",
        failures.len(),
        seeds.end - seeds.start,
        failures
            .iter()
            .take(3)
            .map(|(seed, e)| format!("seed {seed}, {mode}, {e}"))
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

/// Session mode: one client, its statements routed to the primary and the standbys, the
/// settings replayed wherever they land.
#[tokio::test]
async fn generated_scripts_in_session_mode() {
    let p = start_proxy(&config_text(""));
    differential(&p, "session mode", 1..601, 1).await;
}

/// Transaction mode, one connection per node: two clients take turns on it.
#[tokio::test]
async fn generated_scripts_two_clients_on_one_connection() {
    let p = start_proxy(&tx_config(1));
    differential(
        &p,
        "transaction mode, pool_size 1, 2 clients",
        1001..1601,
        2,
    )
    .await;
}

/// Transaction mode, two connections per node: four clients take turns on them.
#[tokio::test]
async fn generated_scripts_four_clients_on_two_connections() {
    let p = start_proxy(&tx_config(2));
    differential(
        &p,
        "transaction mode, pool_size 2, 4 clients",
        2001..2301,
        4,
    )
    .await;
}

/// What `current_setting` answers for these settings, on whatever node a read goes to.
fn shown(names: &[&str]) -> String {
    let columns: Vec<String> = names
        .iter()
        .map(|n| format!("current_setting('{n}')"))
        .collect();
    format!("SELECT {}", columns.join(", "))
}

/// `set_config`'s third argument is a boolean, which PostgreSQL reads as it reads any
/// (`'TRUE'`, `'yes'`, `'1'`, `'on'`, a prefix like `'tru'`, any case, spaces around):
/// each of these is a setting of the transaction only, gone once it ends, and each of
/// `'FALSE'`, `'no'`, `'0'`, `'of'` is one of the session.
#[tokio::test]
async fn set_config_reads_its_flag_as_postgresql_reads_a_boolean() {
    let p = start_proxy(&config_text(""));
    let show = shown(&["work_mem"]);
    let mut steps = Vec::new();
    let (local, session) = (
        ["'TRUE'", "'yes'", "'1'", "' on '", "'tru'", "'Y'"],
        ["'FALSE'", "'no'", "'0'", "'of'", "'fal'", "' N'"],
    );
    for (i, flag) in local.iter().chain(&session).enumerate() {
        steps.push(format!(
            "SELECT set_config('work_mem', '{}kB', {flag})",
            1000 + i
        ));
        steps.push(show.clone());
    }
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let r = same_as_postgresql(&p, &steps).await;
    assert!(r[1].contains("row=[4MB]"), "{r:?}");
    assert!(r[13].contains("row=[1006kB]"), "{r:?}");
}

/// Every `set_config` of a statement changes its setting, in the order PostgreSQL calls
/// them (left to right in a select list): each non-local one is the session's after
/// the statement, and the last one of a name wins.
#[tokio::test]
async fn every_set_config_of_a_statement_is_kept() {
    let p = start_proxy(&config_text(""));
    let show = shown(&["work_mem", "statement_timeout", "application_name"]);
    let r = same_as_postgresql(
        &p,
        &[
            "SELECT set_config('work_mem', '1100kB', false), \
             set_config('statement_timeout', '101000', false), \
             set_config('application_name', 'local', true)",
            &show,
            "SELECT set_config('work_mem', '1200kB', false), set_config('work_mem', '1300kB', false)",
            &show,
            "BEGIN",
            "SELECT set_config('application_name', 'kept', false), \
             set_config('application_name', 'local', true)",
            "COMMIT",
            &show,
        ],
    )
    .await;
    assert!(r[1].contains("row=[1100kB|101s|]"), "{r:?}");
    assert!(r[7].contains("row=[1300kB|101s|kept]"), "{r:?}");
}

/// RESET, `SET … TO DEFAULT`, RESET ALL and DISCARD ALL return a setting the client's
/// startup packet gave (a parameter of its own, or a `-c` option) to that value, in
/// PostgreSQL: the startup packet makes the session's reset values; a reported parameter
/// is reported at that value, and not reported where it did not change. The server
/// connection logged in without the client's parameters (pgfresh replays them with SET),
/// so its reset returns them to the server's default: pgfresh reports the startup value
/// and replays the session's settings there before the client's next unit.
#[tokio::test]
async fn reset_returns_a_setting_to_its_startup_value() {
    let show = shown(&["application_name", "work_mem"]);
    for config in [config_text(""), tx_config(1)] {
        let p = start_proxy(&config);
        same_as_postgresql_with(
            &p,
            &[
                ("application_name", "app1"),
                ("options", "-c work_mem=1100kB"),
            ],
            &[
                "SET application_name = 'other'",
                "SET work_mem = '1200kB'",
                "RESET application_name",
                "SET work_mem TO DEFAULT",
                &show,
                "SET application_name = 'other'",
                "RESET ALL",
                &show,
                "DISCARD ALL",
                &show,
            ],
        )
        .await;
    }
}

/// A list-valued login parameter (asyncpg's `server_settings`, say) is the list the
/// client gave, not one quoted name: the server connection takes it as the startup packet
/// gives it, also when a reset brings it back.
#[tokio::test]
async fn a_list_valued_login_parameter_keeps_its_list() {
    let show = shown(&["search_path", "DateStyle"]);
    for config in [config_text(""), tx_config(1)] {
        let p = start_proxy(&config);
        let r = same_as_postgresql_with(
            &p,
            &[
                ("search_path", "login_path, public"),
                ("options", "-c DateStyle=SQL,\\ DMY"),
            ],
            &[&show, "SET search_path = public", "RESET ALL", &show],
        )
        .await;
        assert!(r[0].contains("row=[login_path, public|SQL, DMY"), "{r:?}");
    }
}
