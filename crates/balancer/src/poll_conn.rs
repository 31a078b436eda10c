//! The fast polls' own connection to a node: the monitor's login and each poll driven
//! straight over the socket ([`pgfresh_nodetls::ServerStream`], on the engine of the
//! thread that opens it), with the messages built once.
//!
//! A tokio-postgres client is two tasks (the client and its connection's driver) with a
//! channel each way, and a poll through it builds its Bind, a row object and a string; a
//! fast poll runs hundreds of times a second per standby while reads wait, so here a poll
//! is one write of a prebuilt Bind/Execute/Sync of a statement prepared at login, and its
//! answer is read off the socket by the polling task itself.

use bytes::{Bytes, BytesMut};
use pgfresh_lsn::Lsn;
use pgfresh_nodetls::{ServerStream, Tcp};
use pgfresh_wire::auth::{ClientLogin, LoginStep, Secret};
use pgfresh_wire::{build, parse_backend, BackendMessage, Decoded, Frame, Limits};

use crate::monitor::Login;
use crate::settings::{MonitorSettings, NodeSpec};

/// Statement names on the poll connection.
const REPLAY: &str = "pgfresh_replay";
const REPORTS: &str = "pgfresh_reports";

/// A logged-in connection with the polls' statements prepared.
pub(crate) struct PollConn {
    stream: ServerStream,
    rbuf: BytesMut,
    /// Bind, Execute and Sync of each poll's statement, built at login.
    replay: Bytes,
    reports: Bytes,
    pub(crate) login: Login,
}

impl PollConn {
    /// Connects to `spec` as the monitor user (TLS as the node's `server_tls_*` ask),
    /// logs in and prepares the two polls' SQL. No timeout here: the caller bounds the
    /// whole call.
    pub(crate) async fn open(
        spec: &NodeSpec,
        s: &MonitorSettings,
        replay_sql: &str,
        reports_sql: &str,
    ) -> Result<PollConn, String> {
        let tcp = Tcp::connect(&spec.host, spec.port)
            .await
            .map_err(|e| format!("connecting to {}:{}: {e}", spec.host, spec.port))?;
        let stream = pgfresh_nodetls::connect(tcp, &spec.tls, &spec.host).await?;
        let mut conn = PollConn {
            stream,
            rbuf: BytesMut::with_capacity(1024),
            replay: execute_of(REPLAY),
            reports: execute_of(REPORTS),
            login: Login::of(s),
        };
        conn.log_in(s).await?;
        let mut prepare = BytesMut::new();
        prepare.extend_from_slice(&build::parse(REPLAY, replay_sql, &[]));
        prepare.extend_from_slice(&build::parse(REPORTS, reports_sql, &[]));
        prepare.extend_from_slice(&build::sync());
        conn.exchange(&prepare, |_| Ok(()))
            .await
            .map_err(|e| format!("preparing the polls failed: {e}"))?;
        Ok(conn)
    }

    /// Neither closed by the node nor sent anything since its last answer (a node sends
    /// an idle connection nothing but a FATAL before it closes it: a restart,
    /// `idle_session_timeout`, a terminated backend).
    pub(crate) fn is_open(&mut self) -> bool {
        self.rbuf.is_empty() && self.stream.still_open()
    }

    /// The standby's `pg_last_wal_replay_lsn()` (`None` on a primary).
    pub(crate) async fn replay(&mut self) -> Result<Option<Lsn>, String> {
        let query = self.replay.clone();
        let mut lsn = None;
        self.exchange(&query, |row| {
            lsn = column(row, 0)?.map(parse_lsn).transpose()?;
            Ok(())
        })
        .await
        .map_err(|e| format!("replay poll failed: {e}"))?;
        Ok(lsn)
    }

    /// Every walsender's last report of its standby's replay: (process id, position).
    pub(crate) async fn reports(&mut self) -> Result<Vec<(i32, Lsn)>, String> {
        let query = self.reports.clone();
        let mut reports = Vec::new();
        self.exchange(&query, |row| {
            let pid = column(row, 0)?
                .and_then(|t| t.parse::<i32>().ok())
                .ok_or_else(|| "unexpected report poll result: no walsender pid".to_string())?;
            let lsn = column(row, 1)?
                .map(parse_lsn)
                .transpose()?
                .ok_or_else(|| "unexpected report poll result: no position".to_string())?;
            reports.push((pid, lsn));
            Ok(())
        })
        .await
        .map_err(|e| format!("report poll failed: {e}"))?;
        Ok(reports)
    }

    /// StartupMessage and the authentication the node asks for, up to ReadyForQuery.
    async fn log_in(&mut self, s: &MonitorSettings) -> Result<(), String> {
        let startup = build::startup(&[
            ("user", s.user.as_str()),
            ("database", s.database.as_str()),
            ("application_name", "pgfresh-monitor"),
        ]);
        self.send(&startup).await?;
        let mut login = ClientLogin::new(&s.user, Secret::Password(&s.password));
        loop {
            let frame = self.next_frame().await?;
            let msg = parse_backend(&frame).map_err(|e| e.to_string())?;
            match login.on_message(msg).map_err(|e| e.to_string())? {
                LoginStep::Send(reply) => self.send(&reply).await?,
                LoginStep::Ready(_) => return Ok(()),
                LoginStep::Parameter { .. } | LoginStep::Key(_) | LoginStep::Read => {}
            }
        }
    }

    /// Sends `messages` (ending in Sync) and reads up to their ReadyForQuery, handing
    /// each DataRow's body to `row`; the first error the node answers, in its words.
    async fn exchange(
        &mut self,
        messages: &[u8],
        mut row: impl FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        self.send(messages).await?;
        let mut failed = None;
        loop {
            let frame = self.next_frame().await?;
            match frame.tag {
                b'D' if failed.is_none() => {
                    if let Err(e) = row(frame.body()) {
                        failed = Some(e);
                    }
                }
                b'E' => {
                    if let BackendMessage::ErrorResponse(f) =
                        parse_backend(&frame).map_err(|e| e.to_string())?
                    {
                        failed.get_or_insert(format!(
                            "{} (SQLSTATE {})",
                            f.message.unwrap_or("error"),
                            f.code.unwrap_or("XX000")
                        ));
                    }
                }
                b'Z' => return failed.map_or(Ok(()), Err),
                _ => {}
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| format!("sending to the node: {e}"))
    }

    /// The next whole message from the node.
    async fn next_frame(&mut self) -> Result<Frame, String> {
        loop {
            match pgfresh_wire::decode_backend(&mut self.rbuf, &Limits::default())
                .map_err(|e| e.to_string())?
            {
                Decoded::Frame(f) => return Ok(f),
                Decoded::Incomplete { .. } => {
                    let n = self
                        .stream
                        .read_some(&mut self.rbuf)
                        .await
                        .map_err(|e| format!("reading from the node: {e}"))?;
                    if n == 0 {
                        return Err("the node closed the connection".into());
                    }
                }
            }
        }
    }
}

impl Drop for PollConn {
    /// Says goodbye as a client should (best effort: whatever the socket takes now).
    fn drop(&mut self) {
        let _ = self.stream.try_write(&build::terminate());
    }
}

/// Bind (no parameters, text results), Execute and Sync of `statement`.
fn execute_of(statement: &str) -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&build::bind("", statement, &[], &[], &[]));
    b.extend_from_slice(&build::execute("", 0));
    b.extend_from_slice(&build::sync());
    b.freeze()
}

/// Column `i` of a DataRow body as text (`None`: NULL).
fn column(body: &[u8], i: usize) -> Result<Option<&str>, String> {
    pgfresh_wire::backend::data_row_column(body, i)
        .map_err(|e| format!("a malformed row: {e}"))?
        .map(|v| std::str::from_utf8(v).map_err(|_| "a row that is not UTF-8".to_string()))
        .transpose()
}

fn parse_lsn(text: &str) -> Result<Lsn, String> {
    text.parse::<Lsn>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use pgfresh_wire::{
        decode_frontend, decode_startup, ErrorResponse, ScramServer, ScramVerifier, TxStatus,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const USER: &str = "mon";
    const PASSWORD: &str = "s3cret";
    const LSN: &str = "0/3000060";

    #[derive(Clone, Copy)]
    enum Method {
        Cleartext,
        Md5,
        Scram,
    }

    struct Server {
        sock: TcpStream,
        buf: BytesMut,
    }

    impl Server {
        async fn frame(&mut self) -> Option<Frame> {
            loop {
                if let Ok(Decoded::Frame(f)) = decode_frontend(&mut self.buf, &Limits::default()) {
                    return Some(f);
                }
                if self.sock.read_buf(&mut self.buf).await.ok()? == 0 {
                    return None;
                }
            }
        }

        async fn send(&mut self, parts: &[Bytes]) {
            for p in parts {
                self.sock.write_all(p).await.unwrap();
            }
        }

        async fn refuse(&mut self) {
            let e = ErrorResponse::fatal(
                "28P01",
                format!("password authentication failed for user \"{USER}\""),
            );
            self.send(&[build::error_response(&e)]).await;
        }

        /// The login as `method` asks; false when the password was wrong (refused).
        async fn log_in(&mut self, method: Method) -> bool {
            loop {
                let startup = decode_startup(&mut self.buf, &Limits::default()).unwrap();
                if matches!(startup, Decoded::Frame(_)) {
                    break;
                }
                self.sock.read_buf(&mut self.buf).await.unwrap();
            }
            let ok = match method {
                Method::Cleartext => {
                    self.send(&[build::auth_cleartext()]).await;
                    let f = self.frame().await.unwrap();
                    f.body() == [PASSWORD.as_bytes(), b"\0"].concat()
                }
                Method::Md5 => {
                    let salt = [1, 2, 3, 4];
                    self.send(&[build::auth_md5(salt)]).await;
                    let f = self.frame().await.unwrap();
                    let want = pgfresh_wire::auth::md5_password_hash(USER, PASSWORD, salt);
                    f.body() == [want.as_bytes(), b"\0"].concat()
                }
                Method::Scram => {
                    let verifier = ScramVerifier::from_password(PASSWORD, b"pgfresh-salt", 4096);
                    let mut server = ScramServer::new(verifier, &mut rand::rng());
                    self.send(&[build::auth_sasl(&["SCRAM-SHA-256"])]).await;
                    let f = self.frame().await.unwrap();
                    let body = f.body();
                    let nul = body.iter().position(|&b| b == 0).unwrap();
                    let mechanism = std::str::from_utf8(&body[..nul]).unwrap();
                    let first = server.client_first(mechanism, &body[nul + 5..]).unwrap();
                    self.send(&[build::auth_sasl_continue(&first)]).await;
                    let f = self.frame().await.unwrap();
                    match server.client_final(f.body()) {
                        Ok(last) => {
                            self.send(&[build::auth_sasl_final(&last)]).await;
                            true
                        }
                        Err(_) => false,
                    }
                }
            };
            if !ok {
                self.refuse().await;
                return false;
            }
            let ready = build::ready_for_query(TxStatus::Idle);
            self.send(&[
                build::authentication_ok(),
                build::parameter_status("server_version", "15.0"),
                ready,
            ])
            .await;
            true
        }

        /// Answers the polls: `failing` makes the replay poll's statement fail.
        async fn serve(&mut self, failing: bool) {
            let ready = build::ready_for_query(TxStatus::Idle);
            let mut answer = Vec::new();
            while let Some(f) = self.frame().await {
                match f.tag {
                    b'P' => answer.push(build::parse_complete()),
                    b'B' => {
                        answer.push(build::bind_complete());
                        let body = f.body();
                        let statement =
                            &body[1..body[1..].iter().position(|&b| b == 0).unwrap() + 1];
                        if statement == REPLAY.as_bytes() && failing {
                            let e = ErrorResponse::error("55000", "recovery is not in progress");
                            answer = vec![build::error_response(&e)];
                        } else if statement == REPLAY.as_bytes() {
                            answer.push(data_row(&[Some(LSN)]));
                            answer.push(build::command_complete("SELECT 1"));
                        } else {
                            answer.push(data_row(&[Some("4242"), Some(LSN)]));
                            answer.push(data_row(&[Some("4243"), Some("0/2000000")]));
                            answer.push(build::command_complete("SELECT 2"));
                        }
                    }
                    b'S' => {
                        answer.push(ready.clone());
                        self.send(&answer).await;
                        answer.clear();
                    }
                    b'X' => return,
                    _ => {}
                }
            }
        }
    }

    fn data_row(columns: &[Option<&str>]) -> Bytes {
        let mut body = BytesMut::new();
        body.put_i16(columns.len() as i16);
        for c in columns {
            match c {
                Some(v) => {
                    body.put_i32(v.len() as i32);
                    body.put_slice(v.as_bytes());
                }
                None => body.put_i32(-1),
            }
        }
        let mut b = BytesMut::new();
        b.put_u8(b'D');
        b.put_i32(body.len() as i32 + 4);
        b.put_slice(&body);
        b.freeze()
    }

    /// A node on a local port that logs one client in as `method` and answers its polls
    /// (`failing`: the replay poll fails), or with `close` closes it after the login.
    async fn node(method: Method, failing: bool) -> (NodeSpec, tokio::task::JoinHandle<bool>) {
        node_then(method, failing, false).await
    }

    async fn node_then(
        method: Method,
        failing: bool,
        close: bool,
    ) -> (NodeSpec, tokio::task::JoinHandle<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            let mut s = Server {
                sock,
                buf: BytesMut::new(),
            };
            if !s.log_in(method).await {
                return false;
            }
            if close {
                // The prepare's answer, then a FATAL and the end, as an idle session
                // timing out gets.
                let _ = s.frame().await;
                let _ = s.frame().await;
                let _ = s.frame().await;
                let ready = build::ready_for_query(TxStatus::Idle);
                s.send(&[build::parse_complete(), build::parse_complete(), ready])
                    .await;
                let e = ErrorResponse::fatal(
                    "57P05",
                    "terminating connection due to idle-session timeout",
                );
                s.send(&[build::error_response(&e)]).await;
                return true;
            }
            s.serve(failing).await;
            true
        });
        let spec = NodeSpec {
            name: "pg1".into(),
            host: "127.0.0.1".into(),
            port,
            weight: 1,
            patroni_url: None,
            tls: std::sync::Arc::new(pgfresh_nodetls::Settings {
                mode: pgfresh_nodetls::Mode::Disable,
                ..Default::default()
            }),
        };
        (spec, served)
    }

    fn settings(password: &str) -> MonitorSettings {
        MonitorSettings {
            user: USER.into(),
            password: password.into(),
            ..MonitorSettings::default()
        }
    }

    async fn open(spec: &NodeSpec, password: &str) -> Result<PollConn, String> {
        PollConn::open(spec, &settings(password), "SELECT 1", "SELECT 2").await
    }

    #[tokio::test]
    async fn each_login_method_the_node_asks_for_answers_the_polls() {
        for method in [Method::Cleartext, Method::Md5, Method::Scram] {
            let (spec, served) = node(method, false).await;
            let mut c = open(&spec, PASSWORD).await.unwrap();
            let lsn: Lsn = LSN.parse().unwrap();
            assert_eq!(c.replay().await.unwrap(), Some(lsn));
            assert_eq!(
                c.reports().await.unwrap(),
                vec![(4242, lsn), (4243, "0/2000000".parse().unwrap())]
            );
            assert_eq!(
                c.replay().await.unwrap(),
                Some(lsn),
                "again on the same connection"
            );
            drop(c);
            // The connection said goodbye: the node's loop ended at the Terminate.
            assert!(served.await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_connection_the_node_closed_while_idle_is_not_open() {
        let (spec, served) = node(Method::Scram, false).await;
        let mut c = open(&spec, PASSWORD).await.unwrap();
        assert!(c.is_open());
        drop(c);
        assert!(served.await.unwrap());

        let (spec, served) = node_then(Method::Md5, false, true).await;
        let mut c = open(&spec, PASSWORD).await.unwrap();
        assert!(served.await.unwrap());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.is_open() {
            assert!(
                std::time::Instant::now() < deadline,
                "the closed connection still looks open"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_refused_login_and_a_failed_poll_say_why_in_the_nodes_words() {
        for method in [Method::Cleartext, Method::Md5, Method::Scram] {
            let (spec, served) = node(method, false).await;
            let Err(e) = open(&spec, "wrong").await else {
                panic!("a wrong password must not log in");
            };
            assert!(
                e.contains("password authentication failed for user \"mon\"")
                    && e.contains("28P01"),
                "{e}"
            );
            assert!(!served.await.unwrap());
        }
        let (spec, _served) = node(Method::Md5, true).await;
        let mut c = open(&spec, PASSWORD).await.unwrap();
        let e = c.replay().await.unwrap_err();
        assert_eq!(
            e,
            "replay poll failed: recovery is not in progress (SQLSTATE 55000)"
        );
        // The connection is still in step: the next poll gets its own answer.
        assert_eq!(c.reports().await.unwrap().len(), 2);
    }
}
