//! The extended query protocol: Parse, Bind, Describe, Execute.

use pgfresh_wire::{build, TxStatus};

use super::{Conn, CopyIn, Flow, Portal, Prepared, Step};
use crate::backend::msg;
use crate::backend::sql;

impl Conn {
    pub(super) fn parse(&mut self, name: &str, text: &str, typed: usize) {
        if self.tx == TxStatus::Failed && !sql::ends_transaction(text) {
            return self.aborted();
        }
        if !name.is_empty() && self.statements.contains_key(name) {
            let m = format!("prepared statement \"{name}\" already exists");
            return self.extended_error("42P05", m);
        }
        let params = sql::parameter_count(text).max(typed);
        let prepared = Prepared {
            sql: text.to_string(),
            params,
        };
        self.statements.insert(name.to_string(), prepared);
        self.push(build::parse_complete());
    }

    pub(super) fn bind(&mut self, portal: &str, statement: &str, given: usize, formats: Vec<i16>) {
        let Some(s) = self.statements.get(statement) else {
            let m = format!("prepared statement \"{statement}\" does not exist");
            return self.extended_error("26000", m);
        };
        if given != s.params {
            let m = format!(
                "bind message supplies {given} parameters, but prepared statement \"{statement}\" requires {}",
                s.params
            );
            return self.extended_error("08P01", m);
        }
        if self.tx == TxStatus::Failed && !sql::ends_transaction(&s.sql) {
            return self.aborted();
        }
        if !portal.is_empty() && self.portals.contains_key(portal) {
            let m = format!("cursor \"{portal}\" already exists");
            return self.extended_error("42P03", m);
        }
        if let Some(f) = formats.iter().find(|f| !matches!(f, 0 | 1)) {
            return self.extended_error("22023", format!("unsupported format code: {f}"));
        }
        let p = Portal {
            sql: s.sql.clone(),
            formats,
            sent: 0,
        };
        self.portals.insert(portal.to_string(), p);
        self.push(build::bind_complete());
    }

    pub(super) fn describe(&mut self, kind: u8, name: &str) {
        let (text, formats, params) = if kind == b'S' {
            let Some(s) = self.statements.get(name) else {
                let m = format!("prepared statement \"{name}\" does not exist");
                return self.extended_error("26000", m);
            };
            (s.sql.clone(), Vec::new(), Some(s.params))
        } else {
            let Some(p) = self.portals.get(name) else {
                return self.extended_error("34000", format!("portal \"{name}\" does not exist"));
            };
            (p.sql.clone(), p.formats.clone(), None)
        };
        if let Some(n) = params {
            self.push(msg::parameter_description(n));
        }
        match sql::columns(&text.to_ascii_uppercase()) {
            Some(columns) => self.push(msg::row_description(&columns, &formats)),
            None => self.push(build::no_data()),
        }
    }

    pub(super) async fn execute(&mut self, name: &str, max_rows: i32) -> Flow {
        let Some(p) = self.portals.get(name) else {
            self.extended_error("34000", format!("portal \"{name}\" does not exist"));
            return Flow::Continue;
        };
        let (text, formats) = (p.sql.clone(), p.formats.clone());
        let limit = usize::try_from(max_rows).unwrap_or(0);
        match self.statement(&text, &formats, limit, Some(name)).await {
            Step::Done => {}
            Step::Failed => self.skipping = true,
            Step::CopyIn => {
                self.copy = Some(CopyIn {
                    simple: false,
                    rows: 0,
                });
                let _ = self.send().await;
            }
            Step::Close => return Flow::Close,
        }
        Flow::Continue
    }
}
