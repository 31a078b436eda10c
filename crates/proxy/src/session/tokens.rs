//! Position tokens: read-after-write across sessions, services and proxies.
//!
//! - **Getting one.** With `pgfresh.track_commit_lsn` on, every commit that wrote is
//!   followed by ParameterStatus `pgfresh.commit_lsn` = `TLI/X/Y`: the primary's timeline
//!   and a WAL position at or past the commit (the LSN probe pgfresh pipelines after
//!   commits). The commit's ReadyForQuery is held until the probe answers, so the token
//!   is there when the driver returns from COMMIT. `SHOW pgfresh.commit_lsn` answers the
//!   last one without a round trip.
//! - **Using one.** `pgfresh.min_lsn` (a session setting, or the startup option) and
//!   `/* pgfresh:min_lsn=TLI/X/Y */` (one statement): reads go only to nodes that have
//!   replayed the position — after `replica_wait_ms`, the primary, or with
//!   `on_stale = "error"` SQLSTATE PF001. A token of an older timeline is translated
//!   through the primary's timeline history (see `translate`).
//!
//! Both settings are ordinary (placeholder) settings for the server too, so they follow
//! the session's settings rules: recorded once confirmed and committed, replayed, reset
//! by `RESET ALL` / `DISCARD ALL`. A malformed token is refused before it is sent.

use pgfresh_balancer::Translation;
use pgfresh_lsn::Lsn;
use pgfresh_sql::HintLsn;
use pgfresh_wire::build;

use super::settings::{SettingChange, StmtEvent};
use super::unit::ClientUnit;
use super::Session;
use crate::error::ProxyError;
use crate::router::TokenNeed;

pub const TRACK: &str = "pgfresh.track_commit_lsn";
pub const MIN_LSN: &str = "pgfresh.min_lsn";
pub const COMMIT_LSN: &str = "pgfresh.commit_lsn";

/// The session's tokens.
#[derive(Debug, Default)]
pub struct Tokens {
    /// `pgfresh.track_commit_lsn`.
    pub track: bool,
    /// `pgfresh.min_lsn`.
    pub min: Option<HintLsn>,
    /// The last commit position reported, as sent (`TLI/X/Y`).
    pub last: Option<String>,
    /// A commit's ReadyForQuery held until its position probe answers.
    pub held_ready: Option<pgfresh_wire::TxStatus>,
}

/// Parse a token: `TLI/X/Y`, or `X/Y` (the current timeline).
pub fn parse_token(value: &str) -> Result<HintLsn, ProxyError> {
    let v = value.trim().trim_matches('\'');
    match pgfresh_lsn::parse_token_or_lsn(v) {
        Ok(pgfresh_lsn::TokenOrLsn::Token(p)) => Ok(HintLsn {
            timeline: Some(p.tli()),
            lsn: p.lsn(),
        }),
        Ok(pgfresh_lsn::TokenOrLsn::Lsn(lsn)) => Ok(HintLsn {
            timeline: None,
            lsn,
        }),
        Err(e) => Err(ProxyError::InvalidToken(e.to_string())),
    }
}

/// `on`/`off` as PostgreSQL reads booleans.
fn parse_bool(value: &str) -> Option<bool> {
    match value
        .trim()
        .trim_matches('\'')
        .to_ascii_lowercase()
        .as_str()
    {
        "on" | "true" | "yes" | "1" | "t" | "y" => Some(true),
        "off" | "false" | "no" | "0" | "f" | "n" => Some(false),
        _ => None,
    }
}

impl Tokens {
    /// A startup option or a confirmed setting.
    pub fn set(&mut self, name: &str, value: Option<&str>) -> Result<(), ProxyError> {
        match name {
            TRACK => {
                self.track = match value {
                    None => false,
                    Some(v) => parse_bool(v).ok_or_else(|| {
                        ProxyError::InvalidToken(format!(
                            "invalid value for {TRACK}: \"{v}\" (expected on or off)"
                        ))
                    })?,
                };
            }
            MIN_LSN => {
                self.min = match value.map(str::trim).filter(|v| !v.is_empty() && *v != "''") {
                    None => None,
                    Some(v) => Some(parse_token(v)?),
                };
            }
            _ => {}
        }
        Ok(())
    }

    /// Follow committed setting changes.
    pub fn follow(&mut self, changes: &[SettingChange]) {
        for c in changes {
            match c {
                SettingChange::ResetAll => {
                    self.track = false;
                    self.min = None;
                }
                SettingChange::Set { name, value, .. } => {
                    // Values were checked before the statement was sent.
                    let _ = self.set(name, value.as_deref());
                }
                SettingChange::HoldCursor(_) | SettingChange::CloseCursor(_) => {}
            }
        }
    }
}

impl Session {
    /// Refuse a unit that names a malformed token (in a comment, or as the value of one
    /// of pgfresh's settings) before anything is sent.
    pub(super) fn check_tokens(&self, unit: &ClientUnit) -> Result<(), ProxyError> {
        if unit.parts.iter().any(|a| a.min_lsn_malformed) {
            let bad = unit
                .parts
                .iter()
                .flat_map(|a| &a.comments)
                .find(|c| c.to_ascii_lowercase().contains("min_lsn"))
                .cloned()
                .unwrap_or_default();
            return Err(ProxyError::InvalidToken(format!(
                "invalid position token in comment {bad}: expected pgfresh:min_lsn=TLI/X/Y, such as 1/0/16B3748"
            )));
        }
        for e in &unit.events {
            if let StmtEvent::Change(changes) = e {
                for c in changes {
                    if let SettingChange::Set { name, value, .. } = c {
                        Tokens::default().set(name, value.as_deref())?;
                    }
                }
            }
        }
        Ok(())
    }

    /// What the unit's tokens require of the node that serves it: the highest of the
    /// session's `pgfresh.min_lsn` and the statement's hints, translated to the primary's
    /// timeline.
    pub(super) fn token_need(&self, unit: &ClientUnit) -> TokenNeed {
        let mut token: Option<HintLsn> = self.tokens.min;
        for h in unit.parts.iter().filter_map(|a| a.min_lsn_hint) {
            if token.is_none_or(|t| h.lsn > t.lsn) {
                token = Some(h);
            }
        }
        let Some(token) = token else {
            return TokenNeed::None;
        };
        let view = self.shared.balancer.view();
        let current = view
            .primary
            .and_then(|p| view.node(p))
            .and_then(|n| n.timeline);
        let position = match token.timeline {
            None => return TokenNeed::Position(token.lsn),
            Some(t) if Some(t) == current => return TokenNeed::Position(token.lsn),
            Some(t) => match pgfresh_lsn::Position::new(t, token.lsn) {
                Some(p) => p,
                None => return TokenNeed::Primary("token_timeline_unknown"),
            },
        };
        match view.translate(&position) {
            Translation::Current(lsn) => TokenNeed::Position(lsn),
            Translation::Diverged { .. } => {
                metrics::counter!("pgfresh_token_reads_total", "outcome" => "diverged")
                    .increment(1);
                TokenNeed::Primary("token_diverged")
            }
            Translation::Unknown => {
                metrics::counter!("pgfresh_token_reads_total", "outcome" => "unknown_timeline")
                    .increment(1);
                TokenNeed::Primary("token_timeline_unknown")
            }
        }
    }

    /// A position probe answered on `node`: report the commit's position to a tracking
    /// session, then release the commit's ReadyForQuery.
    pub(super) fn report_commit_position(&mut self, node: usize, lsn: Option<Lsn>, report: bool) {
        if report {
            if let Some(lsn) = lsn {
                let view = self.shared.balancer.view();
                if let Some(tli) = view.node(node).and_then(|n| n.timeline) {
                    let token = format!("{tli}/{lsn}");
                    self.out.push(build::parameter_status(COMMIT_LSN, &token));
                    self.tokens.last = Some(token);
                }
            }
        }
        self.release_held_ready();
    }

    /// Forward what was held for a commit's position — the client output from the
    /// commit's CommandComplete on and its ReadyForQuery — once the probe answered (also
    /// when it failed or its connection was lost).
    pub(super) fn release_held_ready(&mut self) {
        self.out.release();
        if let Some(status) = self.tokens.held_ready.take() {
            self.out.push(build::ready_for_query(status));
        }
    }

    /// `SHOW pgfresh.commit_lsn`: the last position reported (empty before the first).
    pub(super) fn show_commit_lsn(&mut self) {
        let value = self.tokens.last.clone().unwrap_or_default();
        let mut out = bytes::BytesMut::new();
        crate::console::row_description(&mut out, &[COMMIT_LSN]);
        crate::console::data_row(&mut out, &[value]);
        out.extend_from_slice(&build::command_complete("SHOW"));
        out.extend_from_slice(&build::ready_for_query(self.tx.status()));
        self.out.push(&out);
    }
}
