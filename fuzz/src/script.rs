//! A fuzz input read as a client session: one byte of flags, then operations. Every
//! length is one byte and every read past the end yields zeros, so any input is a
//! script and small mutations make small changes. `seeds/session.py` writes inputs in
//! this format.

use pgfresh_wire::build;

/// How the session starts and ends.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flags {
    /// Use the proxy in transaction pooling mode (else session mode).
    pub transaction_pool: bool,
    /// Send an SSLRequest before the StartupMessage.
    pub ssl_request: bool,
    /// Log in with md5 (else trust).
    pub md5: bool,
    /// Say Terminate before closing the socket (else just close it).
    pub terminate: bool,
}

/// One step of a session.
#[derive(Clone, Debug)]
pub enum Op {
    /// Bytes appended to what the client will send; `ready` when the message asks for a
    /// ReadyForQuery (Query, Sync).
    Message { bytes: Vec<u8>, ready: bool },
    /// A CancelRequest on a second connection, with the session's key (or a wrong one).
    Cancel { right_key: bool },
    /// Send what is pending, in writes of `chunk` bytes (0: one write).
    Send { chunk: usize },
    /// Send what is pending and read replies until they stop.
    Read,
}

#[derive(Clone, Debug, Default)]
pub struct Script {
    pub flags: Flags,
    pub ops: Vec<Op>,
}

/// Statement and portal names; the last one is a name pgfresh uses for its own
/// statements in transaction mode.
const NAMES: [&str; 4] = ["", "a", "b", "__pgfresh_1"];

/// Statements worth reaching quickly; a length byte with the high bit set picks one.
/// The fake server's markers (`fail`, `die`, `pg_sleep`, `series`) are among them.
const CANNED: &[&str] = &[
    "SELECT 1",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SELECT 'x' FROM t",
    "INSERT INTO t VALUES (1)",
    "UPDATE t SET a = 1 WHERE b = $1",
    "SELECT fail",
    "SELECT 'die'",
    "COMMIT -- die",
    "SELECT pg_sleep(1)",
    "COPY t FROM STDIN",
    "COPY t TO STDOUT",
    "SELECT generate_series(1, 10)",
    "SAVEPOINT s",
    "ROLLBACK TO SAVEPOINT s",
    "RELEASE s",
    "SET application_name = 'fuzz'",
    "SET search_path = x",
    "SET LOCAL work_mem = '1MB'",
    "RESET ALL",
    "DISCARD ALL",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
    "DEALLOCATE ALL",
    "LISTEN c",
    "SELECT * FROM t FOR UPDATE",
    "SELECT set_config('a.b', 'c', false)",
    "/* pgfresh:replica */ SELECT 1",
    "/* pgfresh:primary */ SELECT 2",
    "SET pgfresh.route = 'replica'",
    "SET pgfresh.track_commit_lsn = on",
    "SET pgfresh.min_lsn = '0/3000000'",
    "SHOW pgfresh.commit_lsn",
    "SELECT $1",
    "SELECT 1; SELECT 2",
    "BEGIN; INSERT INTO t VALUES (1); COMMIT",
    "BEGIN; SELECT fail; COMMIT",
    "START TRANSACTION READ ONLY",
    "CREATE TABLE t (a int)",
    "TRUNCATE t",
    "DO $$ BEGIN END $$",
    "",
    ";",
];

/// Reads the input front to back.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn done(&self) -> bool {
        self.0.is_empty()
    }

    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let (b, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        b.to_vec()
    }

    /// A length byte and that many bytes.
    fn blob(&mut self) -> Vec<u8> {
        let n = self.byte() as usize;
        self.bytes(n)
    }

    /// Text for a message: lossy UTF-8, cut at a NUL as the protocol would.
    fn text(&mut self) -> String {
        let b = self.blob();
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    /// SQL: canned when the length byte has its high bit set, else text.
    fn sql(&mut self) -> String {
        match self.0.first() {
            Some(&b) if b & 0x80 != 0 => {
                self.byte();
                CANNED[(b & 0x7f) as usize % CANNED.len()].to_string()
            }
            _ => self.text(),
        }
    }

    fn name(&mut self) -> &'static str {
        NAMES[self.byte() as usize % NAMES.len()]
    }

    fn kind(&mut self) -> u8 {
        if self.byte() & 1 == 0 {
            b'S'
        } else {
            b'P'
        }
    }
}

impl Script {
    pub fn decode(data: &[u8]) -> Script {
        let mut r = Reader(data);
        let f = r.byte();
        let flags = Flags {
            transaction_pool: f & 1 != 0,
            ssl_request: f & 2 != 0,
            md5: f & 4 != 0,
            terminate: f & 8 != 0,
        };
        let mut ops = Vec::new();
        while !r.done() {
            ops.push(op(&mut r));
        }
        Script { flags, ops }
    }
}

fn message(bytes: impl Into<Vec<u8>>) -> Op {
    Op::Message {
        bytes: bytes.into(),
        ready: false,
    }
}

fn op(r: &mut Reader) -> Op {
    match r.byte() % 16 {
        0 => Op::Message {
            bytes: build::query(&r.sql()).to_vec(),
            ready: true,
        },
        1 => {
            let name = r.name();
            let sql = r.sql();
            let types = vec![0; (r.byte() % 3) as usize];
            message(build::parse(name, &sql, &types).to_vec())
        }
        2 => bind(r),
        3 => {
            let kind = r.kind();
            message(build::describe(kind, r.name()).to_vec())
        }
        4 => {
            let portal = r.name();
            message(build::execute(portal, i32::from(r.byte() % 4)).to_vec())
        }
        5 => {
            let kind = r.kind();
            message(build::close(kind, r.name()).to_vec())
        }
        6 => Op::Message {
            bytes: build::sync().to_vec(),
            ready: true,
        },
        7 => message(build::flush().to_vec()),
        8 => message(build::copy_data(&r.blob()).to_vec()),
        9 => message(build::copy_done().to_vec()),
        10 => message(build::copy_fail(&r.text()).to_vec()),
        11 => message(build::terminate().to_vec()),
        12 => message(r.blob()),
        13 => Op::Cancel {
            right_key: r.byte() & 1 == 0,
        },
        14 => Op::Send {
            chunk: r.byte() as usize,
        },
        _ => Op::Read,
    }
}

/// Bind: portal, statement, up to 3 parameters (length 255 is NULL), result formats.
fn bind(r: &mut Reader) -> Op {
    let portal = r.name();
    let statement = r.name();
    let params: Vec<Option<Vec<u8>>> = (0..r.byte() % 4)
        .map(|_| match r.byte() {
            255 => None,
            n => Some(r.bytes(n as usize)),
        })
        .collect();
    let params: Vec<Option<&[u8]>> = params.iter().map(Option::as_deref).collect();
    let formats: &[i16] = match r.byte() % 4 {
        0 => &[],
        1 => &[1],
        2 => &[0],
        _ => &[0, 1],
    };
    message(build::bind(portal, statement, &[], &params, formats).to_vec())
}
