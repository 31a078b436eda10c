//! Exchanges with PostgreSQL's own session and with pgfresh side by side: the frames a
//! client sends, one step (ending in one ReadyForQuery) at a time, and the outcome of
//! each as the client sees it, for tests that compare the two message for message.

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::raw::{self, cstr, msg};

/// The test config in transaction mode, one server connection per node (clients share
/// them), with `routing` appended to `[routing]`.
pub fn tx_config(routing: &str) -> String {
    format!(
        "{}\n[pool]\npool_mode = \"transaction\"\npool_size = 1\n",
        crate::config_text(routing)
    )
}

/// Parse of `sql` as statement `name`, no parameter types.
pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = cstr(name);
    b.extend(cstr(sql));
    b.extend(0u16.to_be_bytes());
    msg(b'P', &b)
}

/// Bind of `statement` to the unnamed portal, no parameters, then Execute.
pub fn bind_execute(statement: &str) -> Vec<u8> {
    [raw::bind(statement, &[]), raw::execute()].concat()
}

pub fn sync() -> Vec<u8> {
    msg(b'S', &[])
}

pub fn query(sql: &str) -> Vec<u8> {
    msg(b'Q', &cstr(sql))
}

/// Close of a statement, `S` kind.
pub fn close_statement(name: &str) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.extend(cstr(name));
    msg(b'C', &b)
}

/// Describe of `kind` (`S` a statement, `P` a portal) named `name`.
pub fn describe(kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend(cstr(name));
    msg(b'D', &b)
}

/// One exchange's outcome as the client sees it: the message tags, the values of the
/// DataRows, each error's SQLSTATE and message, and the final transaction status.
pub fn outcome(messages: &[(u8, Vec<u8>)]) -> String {
    let mut out = String::from_utf8_lossy(&raw::tags(messages)).into_owned();
    for (tag, body) in messages {
        match tag {
            b'D' => {
                let len = i32::from_be_bytes(body[2..6].try_into().unwrap());
                let v = usize::try_from(len)
                    .map(|l| String::from_utf8_lossy(&body[6..6 + l]).into_owned())
                    .unwrap_or_else(|_| "NULL".into());
                out.push_str(&format!(" row={v}"));
            }
            b'E' => {
                let field = |k: u8| {
                    body.split(|x| *x == 0)
                        .find_map(|f| f.strip_prefix(&[k]))
                        .map(|c| String::from_utf8_lossy(c).into_owned())
                        .unwrap_or_default()
                };
                out.push_str(&format!(" error={}:{}", field(b'C'), field(b'M')));
            }
            b'Z' => out.push_str(&format!(" status={}", body[0] as char)),
            _ => {}
        }
    }
    out
}

/// Sends each step and reads up to its ReadyForQuery; the outcome of each.
pub async fn run<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, steps: &[Vec<u8>]) -> Vec<String> {
    let mut outcomes = Vec::new();
    for step in steps {
        s.write_all(step).await.unwrap();
        outcomes.push(outcome(&raw::read_until(s, b'Z').await));
    }
    outcomes
}

/// The primary's Unix socket, where the shared cluster trusts `app`.
pub fn primary_socket() -> std::path::PathBuf {
    let c = crate::cluster();
    let dir = c
        .data_dir(0)
        .parent()
        .expect("the cluster's directory")
        .to_owned();
    dir.join(format!(".s.PGSQL.{}", c.port(0)))
}

/// A session on the primary itself, over its Unix socket (trusted), as `app`.
pub async fn direct_session() -> tokio::net::UnixStream {
    let mut s = tokio::net::UnixStream::connect(primary_socket())
        .await
        .unwrap();
    s.write_all(&raw::startup("app", "app")).await.unwrap();
    raw::read_until(&mut s, b'Z').await;
    s
}
