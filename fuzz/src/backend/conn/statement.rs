//! Running one statement, and the COPY FROM STDIN that may follow.

use pgfresh_wire::bytes::Bytes;
use pgfresh_wire::{build, parse_frontend, FrontendMessage, TxStatus};

use super::{Conn, Flow, Step, ABORTED, SLEEP};
use crate::backend::msg::{self, Column, Value};
use crate::backend::sql::{self, Outcome, TxEffect};

impl Conn {
    /// Runs one statement: `portal` names the portal of an Execute (whose rows may be
    /// limited to `limit`, 0 = all); `None` is a statement of a simple Query.
    pub(super) async fn statement(
        &mut self,
        text: &str,
        formats: &[i16],
        limit: usize,
        portal: Option<&str>,
    ) -> Step {
        if self.tx == TxStatus::Failed && !sql::ends_transaction(text) {
            self.error("25P02", ABORTED.into(), false);
            return Step::Failed;
        }
        match sql::run(text, self.role) {
            Outcome::Rows { columns, rows } => self.rows(&columns, rows, formats, limit, portal),
            Outcome::Command { tag, effect } => return self.command(text, tag, effect),
            Outcome::Error { code, message } => {
                self.error(code, message, sql::ends_transaction(text));
                return Step::Failed;
            }
            Outcome::Die => {
                let m = "terminating connection due to administrator command";
                self.push(msg::fatal("57P01", m));
                return Step::Close;
            }
            Outcome::CopyIn => {
                self.push(msg::copy_response(b'G'));
                return Step::CopyIn;
            }
            Outcome::CopyOut => {
                self.push(msg::copy_response(b'H'));
                self.push(build::copy_data(b"1\n"));
                self.push(build::copy_data(b"2\n"));
                self.push(build::copy_done());
                self.push(build::command_complete("COPY 2"));
            }
            Outcome::Sleep => return self.sleep(formats, portal).await,
            Outcome::Empty => self.push(build::empty_query_response()),
        }
        Step::Done
    }

    fn rows(
        &mut self,
        columns: &[Column],
        rows: Vec<Vec<Value>>,
        formats: &[i16],
        limit: usize,
        portal: Option<&str>,
    ) {
        if portal.is_none() {
            self.push(msg::row_description(columns, formats));
        }
        let sent = portal
            .and_then(|p| self.portals.get(p))
            .map_or(0, |p| p.sent);
        let left = rows.len().saturating_sub(sent);
        let n = if limit > 0 { left.min(limit) } else { left };
        for row in rows.iter().skip(sent).take(n) {
            self.push(msg::data_row(row, formats));
        }
        if let Some(p) = portal.and_then(|p| self.portals.get_mut(p)) {
            p.sent += n;
        }
        if n < left {
            self.push(Bytes::from_static(b"s\0\0\0\x04")); // PortalSuspended
        } else {
            self.push(build::command_complete(&format!("SELECT {n}")));
        }
    }

    fn command(&mut self, text: &str, tag: String, effect: TxEffect) -> Step {
        let idle = self.tx == TxStatus::Idle;
        let mut tag = tag;
        match effect {
            TxEffect::None => {}
            TxEffect::Begin => {
                if !idle {
                    self.push(msg::warning(
                        "25001",
                        "there is already a transaction in progress",
                    ));
                    self.send_now = true;
                }
                self.tx = TxStatus::InTransaction;
            }
            TxEffect::Commit | TxEffect::Rollback => {
                if idle {
                    self.push(msg::warning("25P01", "there is no transaction in progress"));
                    self.send_now = true;
                } else if self.tx == TxStatus::Failed {
                    tag = "ROLLBACK".into();
                }
                self.tx = TxStatus::Idle;
            }
            TxEffect::RollbackTo | TxEffect::Savepoint if idle => {
                let m = format!("{tag} can only be used in transaction blocks");
                self.error("25P01", m, false);
                return Step::Failed;
            }
            TxEffect::RollbackTo => self.tx = TxStatus::InTransaction,
            TxEffect::Savepoint => {}
        }
        if tag == "SET" && text.to_ascii_uppercase().contains("APPLICATION_NAME") {
            // A reported setting: the server tells the client its new value.
            let value = sql::first_literal(text).unwrap_or("");
            self.push(build::parameter_status("application_name", value));
        }
        self.push(build::command_complete(&tag));
        Step::Done
    }

    /// `pg_sleep`: one row after a short while, or ERROR 57014 when a CancelRequest for
    /// this connection arrives first.
    async fn sleep(&mut self, formats: &[i16], portal: Option<&str>) -> Step {
        let cancel = self.cancel.clone();
        tokio::select! {
            _ = cancel.notified() => {
                self.error("57014", "canceling statement due to user request".into(), false);
                Step::Failed
            }
            _ = tokio::time::sleep(SLEEP) => {
                let columns = [Column { name: "pg_sleep", oid: msg::TEXT }];
                self.rows(&columns, vec![vec![Value::Text(String::new())]], formats, 0, portal);
                Step::Done
            }
        }
    }

    pub(super) async fn copy_message(&mut self, frame: &pgfresh_wire::Frame) -> Flow {
        let Some(copy) = self.copy.as_mut() else {
            return Flow::Continue;
        };
        let simple = copy.simple;
        match parse_frontend(frame) {
            Ok(FrontendMessage::CopyData(d)) => {
                copy.rows += d.iter().filter(|&&b| b == b'\n').count();
                return Flow::Continue;
            }
            // Ignored during COPY, as PostgreSQL does, for the convenience of drivers.
            Ok(FrontendMessage::Flush | FrontendMessage::Sync) => return Flow::Continue,
            Ok(FrontendMessage::CopyDone) => {
                let rows = copy.rows;
                self.copy = None;
                self.push(build::command_complete(&format!("COPY {rows}")));
                if simple {
                    return self.run_queued().await;
                }
                return Flow::Continue;
            }
            Ok(FrontendMessage::CopyFail { message }) => {
                let m = format!("COPY from stdin failed: {message}");
                self.copy = None;
                self.error("57014", m, false);
            }
            _ => {
                let m = format!(
                    "unexpected message type 0x{:02X} during COPY from stdin",
                    frame.tag
                );
                self.copy = None;
                self.error("08P01", m, false);
            }
        }
        if simple {
            self.queued.clear();
            self.ready().await;
        } else {
            self.skipping = true;
        }
        Flow::Continue
    }
}
