//! One logged-in connection of the fake server: simple and extended query protocol,
//! COPY, transaction status, cancellation. Output is buffered and sent where PostgreSQL
//! sends it (ReadyForQuery, Flush, the start of COPY FROM STDIN, errors and notices,
//! 8 KiB), so the proxy sees the same batching it would see from a real server.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use pgfresh_wire::bytes::{Bytes, BytesMut};
use pgfresh_wire::{
    build, decode_frontend, parse_frontend, Decoded, FrameError, FrontendMessage, Limits, TxStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

mod extended;
mod statement;

use super::msg;
use super::sql::{self, Role};

/// How long `pg_sleep` runs when nobody cancels it.
const SLEEP: Duration = Duration::from_millis(20);

const ABORTED: &str =
    "current transaction is aborted, commands ignored until end of transaction block";

/// PostgreSQL sends its output buffer when it holds this much.
const SEND_AT: usize = 8192;

struct Prepared {
    sql: String,
    params: usize,
}

struct Portal {
    sql: String,
    formats: Vec<i16>,
    /// Rows already returned (a row limit suspended the portal).
    sent: usize,
}

/// COPY FROM STDIN in progress.
struct CopyIn {
    /// Started by a simple Query (its remaining statements run after it).
    simple: bool,
    rows: usize,
}

/// What a statement left behind.
enum Step {
    Done,
    Failed,
    CopyIn,
    /// The server ends the session.
    Close,
}

/// Whether the connection goes on.
enum Flow {
    Continue,
    Close,
}

pub struct Conn {
    role: Role,
    stream: TcpStream,
    rbuf: BytesMut,
    out: BytesMut,
    /// An error or notice is in `out`: PostgreSQL sends those at once.
    send_now: bool,
    tx: TxStatus,
    statements: HashMap<String, Prepared>,
    portals: HashMap<String, Portal>,
    /// After an error in an extended-query batch, everything up to Sync is ignored.
    skipping: bool,
    copy: Option<CopyIn>,
    /// Statements of a simple Query still to run after a COPY.
    queued: VecDeque<String>,
    /// Woken by a CancelRequest with this connection's key.
    cancel: Arc<Notify>,
}

impl Conn {
    pub fn new(role: Role, stream: TcpStream, rbuf: BytesMut, cancel: Arc<Notify>) -> Conn {
        Conn {
            role,
            stream,
            rbuf,
            out: BytesMut::new(),
            send_now: false,
            tx: TxStatus::Idle,
            statements: HashMap::new(),
            portals: HashMap::new(),
            skipping: false,
            copy: None,
            queued: VecDeque::new(),
            cancel,
        }
    }

    /// Serve until the client terminates, breaks the protocol or goes away.
    pub async fn serve(mut self) -> std::io::Result<()> {
        loop {
            match decode_frontend(&mut self.rbuf, &Limits::default()) {
                Ok(Decoded::Frame(f)) => {
                    let flow = self.handle(&f).await;
                    if self.send_now || self.out.len() >= SEND_AT {
                        self.send().await?;
                    }
                    if let Flow::Close = flow {
                        return self.send().await;
                    }
                }
                Ok(Decoded::Incomplete { .. }) => {
                    if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                        return Ok(());
                    }
                }
                Err(e) => {
                    self.push(msg::fatal("08P01", e.to_string()));
                    return self.send().await;
                }
            }
        }
    }

    fn push(&mut self, b: Bytes) {
        self.out.extend_from_slice(&b);
    }

    async fn send(&mut self) -> std::io::Result<()> {
        self.send_now = false;
        let out = self.out.split();
        self.stream.write_all(&out).await
    }

    /// ReadyForQuery, sent at once.
    async fn ready(&mut self) {
        if self.tx == TxStatus::Idle {
            // Portals end with their transaction.
            self.portals.clear();
        }
        self.push(build::ready_for_query(self.tx));
        let _ = self.send().await;
    }

    async fn handle(&mut self, frame: &pgfresh_wire::Frame) -> Flow {
        if self.copy.is_some() {
            return self.copy_message(frame).await;
        }
        if self.skipping && frame.tag != b'S' {
            return Flow::Continue;
        }
        let message = match parse_frontend(frame) {
            Ok(m) => m,
            Err(FrameError::UnknownTag(t)) => {
                self.push(msg::fatal(
                    "08P01",
                    format!("invalid frontend message type {t}"),
                ));
                return Flow::Close;
            }
            Err(_) if matches!(frame.tag, b'Q' | b'F') => {
                self.error("08P01", "invalid message format".into(), false);
                self.ready().await;
                return Flow::Continue;
            }
            Err(_) => {
                self.extended_error("08P01", "invalid message format".into());
                return Flow::Continue;
            }
        };
        match message {
            FrontendMessage::Query { sql } => return self.simple_query(sql).await,
            FrontendMessage::Parse {
                name,
                sql,
                param_types,
            } => self.parse(name, sql, param_types.len()),
            FrontendMessage::Bind {
                portal,
                statement,
                params,
            } => self.bind(
                portal,
                statement,
                params.len(),
                params.result_formats().collect(),
            ),
            FrontendMessage::Describe { kind, name } => self.describe(kind, name),
            FrontendMessage::Execute { portal, max_rows } => {
                return self.execute(portal, max_rows).await
            }
            FrontendMessage::Close { kind, name } => {
                match kind {
                    b'S' => self.statements.remove(name).map(drop),
                    _ => self.portals.remove(name).map(drop),
                };
                self.push(build::close_complete());
            }
            FrontendMessage::Sync => {
                self.skipping = false;
                self.ready().await;
            }
            FrontendMessage::Flush => {
                let _ = self.send().await;
            }
            // Outside COPY these are ignored, as PostgreSQL does (the tail of a failed COPY).
            FrontendMessage::CopyData(_)
            | FrontendMessage::CopyDone
            | FrontendMessage::CopyFail { .. } => {}
            FrontendMessage::Terminate => return Flow::Close,
            FrontendMessage::FunctionCall => {
                self.error("42883", "function does not exist".into(), false);
                self.ready().await;
            }
            FrontendMessage::Password(_) => {
                self.push(msg::fatal("08P01", "invalid frontend message type 112"));
                return Flow::Close;
            }
        }
        Flow::Continue
    }

    async fn simple_query(&mut self, text: &str) -> Flow {
        let statements = sql::split(text);
        if statements.is_empty() {
            self.push(build::empty_query_response());
        }
        self.queued = statements.into_iter().map(str::to_string).collect();
        self.run_queued().await
    }

    /// Runs the queued statements of a simple Query; ReadyForQuery ends it unless a COPY
    /// now waits for data.
    async fn run_queued(&mut self) -> Flow {
        while let Some(s) = self.queued.pop_front() {
            match self.statement(&s, &[], 0, None).await {
                Step::Done => {}
                Step::Failed => self.queued.clear(),
                Step::CopyIn => {
                    self.copy = Some(CopyIn {
                        simple: true,
                        rows: 0,
                    });
                    let _ = self.send().await;
                    return Flow::Continue;
                }
                Step::Close => return Flow::Close,
            }
        }
        self.ready().await;
        Flow::Continue
    }

    /// An ERROR: a transaction block in progress is now failed, unless the statement
    /// ended it (a failing COMMIT still ends the transaction).
    fn error(&mut self, code: &'static str, message: String, ended: bool) {
        self.push(msg::error(code, message));
        self.send_now = true;
        self.tx = match self.tx {
            _ if ended => TxStatus::Idle,
            TxStatus::Idle => TxStatus::Idle,
            _ => TxStatus::Failed,
        };
    }

    /// An ERROR in an extended-query message: the rest of the batch is ignored.
    fn extended_error(&mut self, code: &'static str, message: String) {
        self.error(code, message, false);
        self.skipping = true;
    }

    fn aborted(&mut self) {
        self.extended_error("25P02", ABORTED.into());
    }
}
