//! Transaction mode: a unit's named statements mapped onto the server connection it
//! runs on.
//!
//! Clients keep their own statement names; on a server connection statements live
//! under pgfresh's names (`__pgfresh_N`), one per distinct content (query text and
//! parameter types, and the search_path and role set for the session, see
//! `resolution_scope`), shared by every client whose statement has that content. A Parse
//! of content the connection already has is not sent (its ParseComplete is made here,
//! in its turn); a Bind or Describe of a statement the connection lacks prepares it
//! first (that ParseComplete is swallowed); a client's Close of a statement is answered
//! here (the server statement stays for whoever uses it next). Each connection keeps at
//! most `max_prepared_statements`; the least recently used are closed first.
//!
//! The unit's expected replies ([`Expect`]) say, in order, which reply is forwarded,
//! swallowed or made here; `relay` follows them.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use pgfresh_wire::{build, non_utf8_text, parse_frontend, Frame, FrontendMessage};

use pgfresh_config::PoolMode;

use super::unit::{ClientUnit, ConnRecord, Expect, Undo};
use super::Session;
use crate::statements::{self, ServerName, StatementCache, PREFIX};

/// The messages to send for a unit and the replies they will get.
pub(super) struct Rewritten {
    /// The messages one after another, written straight into the session's reused
    /// buffer (`Session::rewrite_buf`): no frame of its own for each.
    pub frames: BytesMut,
    pub expect: VecDeque<Expect>,
}

/// What besides its content decides the relations a statement's names resolve to, as a
/// suffix of its cache key ([`statements::cache_key`]): the session's search_path and
/// role as replayed on the connection. Clients that set them differently do not share a
/// statement (the same text may name other tables; PostgreSQL plans it again under the
/// search_path in force, and refuses to run it when its result type changed).
fn resolution_scope(settings: &[(String, String)]) -> Vec<u8> {
    let mut scope = Vec::new();
    for (name, stmt) in settings {
        if ["search_path", "role", "session_authorization"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
        {
            scope.push(0);
            scope.extend_from_slice(stmt.as_bytes());
        }
    }
    scope
}

/// The name a Bind or Describe of the client's statement uses on the server, preparing
/// the statement there first if the connection lacks it.
fn server_statement(
    cache: &mut StatementCache,
    name: &[u8],
    resolved: Option<Bytes>,
    scope: &[u8],
    out: &mut Rewritten,
) -> Option<ServerName> {
    let Some(content) = resolved else {
        // Not a statement of this client's: the server answers that it does not exist,
        // and a name in pgfresh's own space never reaches another client's statement.
        return name.starts_with(PREFIX.as_bytes()).then(ServerName::prefix);
    };
    let key = statements::cache_key(&content, scope);
    let id = match cache.lookup(&key) {
        Some(id) => id,
        None => {
            let id = cache.insert(key.clone());
            statements::put_parse(&mut out.frames, ServerName::of(id).as_bytes(), &content);
            out.expect.push_back(Expect::Hidden {
                record: Some(ConnRecord::Prepared(key)),
            });
            id
        }
    };
    Some(ServerName::of(id))
}

/// A statement the client parses in `raw` and EXECUTEs later in the same batch runs
/// under the client's own name on the server: it is parsed so right after the client's
/// Parse (the client's message again, its reply swallowed), not ahead of the batch
/// (`Session::bring_up_to_date`), where a message in front of the Parse would find it.
/// Recorded with the connection's SQL-level statements (`ServerConn::sql_prepared`),
/// dropped at check-in like a PREPAREd one; skipped with the rest of the batch if the
/// client's Parse is refused.
fn copy_for_execute(
    unit: &ClientUnit,
    raw: &Bytes,
    name: &str,
    held: &mut crate::name_map::NameMap<u64>,
    out: &mut Rewritten,
) {
    let Some(hash) = unit.sql_executes.iter().find_map(|e| e.made_by(raw)) else {
        return;
    };
    let previous = held.get(name).copied();
    if previous == Some(hash) {
        return;
    }
    if previous.is_some() {
        out.frames.extend_from_slice(&build::close(b'S', name));
        out.expect.push_back(Expect::Hidden { record: None });
    }
    out.frames.extend_from_slice(raw);
    out.expect.push_back(Expect::Hidden {
        record: Some(ConnRecord::Sql {
            name: name.to_string(),
            previous,
        }),
    });
    held.insert(name.to_string(), hash);
}

/// A record of the connection's statements under client names back to `previous` for
/// `name` (`None`: it had none), after the message that changed it was skipped.
fn restore(record: &mut crate::name_map::NameMap<u64>, name: String, previous: Option<u64>) {
    match previous {
        Some(hash) => {
            record.insert(name, hash);
        }
        None => {
            record.remove(&name);
        }
    }
}

/// Whether a client's message may name a prepared statement: a Parse, a Bind, or a
/// Describe or Close of a statement (not of a portal).
fn names_statement(raw: &[u8]) -> bool {
    match raw.first() {
        Some(b'P' | b'B') => true,
        Some(b'D' | b'C') => raw.get(5) != Some(&b'P'),
        _ => false,
    }
}

/// Where a unit stands with the unnamed statement on its connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unnamed {
    /// What the connection holds is not the client's (another client's, or none).
    Foreign,
    /// The client parsed it in this unit.
    Parsed,
    /// The client's from an earlier unit, prepared here again.
    Prepared,
}

impl Unnamed {
    /// The name a Bind or Describe of the unnamed statement uses on the server (`None`:
    /// as it is). `resolved` is the client's unnamed statement as of the message, taken
    /// from the unit's references unless the unit parsed it: prepared here again first
    /// (the connection may have changed), or, where the client has none, the
    /// connection's closed first, so that the message fails as it would on the client's
    /// own connection instead of running another client's statement.
    fn server_name(
        &mut self,
        refs: &mut impl Iterator<Item = Option<Bytes>>,
        out: &mut Rewritten,
    ) -> Option<ServerName> {
        if *self == Unnamed::Parsed {
            return None;
        }
        let resolved = refs.next().flatten();
        if *self == Unnamed::Prepared {
            return None;
        }
        let Some(content) = resolved else {
            // The client has none: the connection's is closed first (whoever left it
            // has no use for it now), so the server answers as on the client's own
            // connection ("unnamed prepared statement does not exist").
            out.frames.extend_from_slice(&build::close(b'S', ""));
            out.expect.push_back(Expect::Hidden { record: None });
            return None;
        };
        statements::put_parse(&mut out.frames, b"", &content);
        out.expect.push_back(Expect::Hidden { record: None });
        *self = Unnamed::Prepared;
        None
    }
}

/// Transaction mode, a failed transaction: the portal a batch bound to a statement that
/// ends transactions (COMMIT, ROLLBACK: the server runs those there), and the text of the
/// unnamed statement the batch parsed.
#[derive(Default)]
struct Exits {
    portal: Option<Vec<u8>>,
    unnamed_text: Option<Bytes>,
}

impl Exits {
    /// A Bind of `portal` to a statement that ends transactions (`ends`), or not.
    fn bound(&mut self, portal: &[u8], ends: bool) {
        self.portal = ends.then(|| portal.to_vec());
    }

    /// `raw` is the Execute of that portal: the transaction ends with it.
    fn ends_transaction(&self, raw: &[u8]) -> bool {
        raw.first() == Some(&b'E')
            && self.portal.as_deref().is_some_and(|p| {
                raw.get(5..)
                    .and_then(|b| b.split(|c| *c == 0).next())
                    .is_some_and(|name| name == p)
            })
    }
}

/// Whether a unit needs no mapping at all: a complete batch (not continued after a Flush)
/// that names no statement and uses no unnamed statement of an earlier unit. Its replies
/// are all forwarded as they come.
pub(super) fn plain_unit(unit: &ClientUnit) -> bool {
    unit.synced
        && unit.statement_refs.is_empty()
        && unit.statement_undo.is_empty()
        && !unit.uses_statements.iter().any(String::is_empty)
        && !unit.parses.iter().any(|n| !n.is_empty())
}

impl Session {
    /// Map `unit`'s statements onto `node`'s connection (see the module comment).
    /// `refuse_at`: the place of the message a failed transaction must refuse where the
    /// connection lacks the statement it uses (`Session::refuses_first_use`); a Parse the
    /// server refuses goes in front of it.
    pub(super) fn rewrite_unit(
        &mut self,
        node: usize,
        unit: &ClientUnit,
        refuse_at: Option<usize>,
    ) -> Rewritten {
        let max = self.config.pool.max_prepared_statements;
        let mut out = Rewritten {
            frames: std::mem::take(&mut self.rewrite_buf),
            expect: VecDeque::with_capacity(unit.frames.len()),
        };
        let Some(leased) = self.backends[node].as_mut() else {
            super::send::append(&mut out.frames, &unit.frames);
            return out;
        };
        let (cache, held) = (&mut leased.conn.statements, &mut leased.conn.sql_prepared);
        let scope = resolution_scope(self.state.settings());
        let since = cache.begin_use();
        // In a failed transaction a prepared COMMIT or ROLLBACK the batch runs ends it:
        // what follows is mapped as outside one (`Exits`).
        let mut failed = matches!(self.tx, super::TxPhase::Failed);
        let mut exits = Exits::default();
        let mut unnamed = Unnamed::Foreign;
        let mut refs = unit.statement_refs.iter().cloned().peekable();
        let mut undos = unit.statement_undo.iter().cloned().map(Box::new);
        for (i, raw) in unit.frames.iter().enumerate() {
            if refuse_at == Some(i) {
                out.frames.extend_from_slice(&super::send::REFUSED_PARSE);
                out.expect.push_back(Expect::Hidden { record: None });
            }
            let client = Expect::client();
            if !names_statement(raw) {
                // Execute, Sync, Flush, and the Describe or Close of a portal: nothing to
                // map (and no need to read the message again).
                if failed && exits.ends_transaction(raw) {
                    failed = false;
                }
                if raw[0] == b'S' {
                    out.expect.push_back(Expect::Client {
                        parse: None,
                        sync: true,
                        undo: None,
                    });
                } else if raw[0] != b'H' {
                    out.expect.push_back(client);
                }
                out.frames.extend_from_slice(raw);
                continue;
            }
            // A Bind's names only: the message was checked whole when it came in.
            if let Some((portal, statement)) = (raw[0] == b'B')
                .then(|| statements::bind_names(raw))
                .flatten()
            {
                if failed {
                    let text = if statement.is_empty() && unnamed == Unnamed::Parsed {
                        exits.unnamed_text.clone()
                    } else {
                        refs.peek().cloned().flatten()
                    };
                    let ends = text
                        .is_some_and(|c| self.texts.exits_transaction(&self.shared.analyzer, &c));
                    exits.bound(portal, ends);
                }
                let name = if statement.is_empty() {
                    unnamed.server_name(&mut refs, &mut out)
                } else {
                    let resolved = refs.next().flatten();
                    server_statement(cache, statement, resolved, &scope, &mut out)
                };
                match name {
                    Some(n) => {
                        statements::put_bind_renamed(&mut out.frames, raw, portal, statement, &n)
                    }
                    None => out.frames.extend_from_slice(raw),
                }
                out.expect.push_back(client);
                continue;
            }
            let frame = Frame {
                tag: raw[0],
                raw: raw.clone(),
            };
            // A Parse whose text is not UTF-8 (see `Session::take_non_utf8`): only its
            // name is needed here, and the client's names never reach the server.
            let parsed = parse_frontend(&frame).or_else(|e| match non_utf8_text(&frame) {
                Some(t) if frame.tag == b'P' => Ok(FrontendMessage::Parse {
                    name: t.name,
                    sql: "",
                    param_types: Vec::new(),
                }),
                _ => Err(e),
            });
            match parsed {
                Ok(FrontendMessage::Parse { name, sql, .. }) if !name.is_empty() => {
                    // In a failed transaction the server parses a COMMIT or ROLLBACK (and
                    // then refuses a name in use, 42P05) where it refuses any other Parse.
                    let refused = failed
                        && !self
                            .texts
                            .exits_transaction(&self.shared.analyzer, sql.as_bytes());
                    let content = statements::parse_content(raw, name);
                    let key = statements::cache_key(&content, &scope);
                    let undo = undos.next();
                    let existing = undo
                        .as_ref()
                        .and_then(|u| u.previous.as_ref())
                        .map(|p| p.content.clone());
                    // One the client PREPAREd and closes later in the batch is the
                    // client's still (a Parse of the name between them changes nothing:
                    // the server refuses it).
                    let done = unit.statement_undo.len() - undos.len();
                    let closed_later = unit.statement_undo[done..]
                        .iter()
                        .any(|u| u.name == name && u.sql.is_some());
                    if (self.state.sql_prepared.contains_key(name) || closed_later)
                        && held.contains_key(name)
                    {
                        // A name the client PREPAREd, on the connection (`sql_executes`):
                        // the server refuses the Parse as PostgreSQL does (42P05), and
                        // the client's statement is taken back (undo).
                        out.frames.extend_from_slice(raw);
                        out.expect.push_back(Expect::Client {
                            parse: None,
                            sync: false,
                            undo,
                        });
                    } else if existing.is_some() && refused {
                        // In a failed transaction PostgreSQL parses the text (a syntax
                        // error, 42601), then refuses the Parse (25P02) before it looks at
                        // the name: the text goes under pgfresh's prefix, without putting
                        // the existing statement there first (that Parse would be refused
                        // ahead of it). The client's statement stays as it was (undo).
                        statements::put_parse(
                            &mut out.frames,
                            ServerName::prefix().as_bytes(),
                            &content,
                        );
                        out.expect.push_back(Expect::Client {
                            parse: None,
                            sync: false,
                            undo,
                        });
                    } else if let Some(existing) = existing {
                        // The client already has a statement by that name: PostgreSQL
                        // answers 42P05 and skips the rest of the batch. Parse under the
                        // existing statement's server name, which the server refuses
                        // just so; the client's statement stays as it was (undo).
                        let server = server_statement(
                            cache,
                            name.as_bytes(),
                            Some(existing),
                            &scope,
                            &mut out,
                        )
                        .unwrap_or_else(ServerName::prefix);
                        statements::put_parse(&mut out.frames, server.as_bytes(), &content);
                        out.expect.push_back(Expect::Client {
                            parse: None,
                            sync: false,
                            undo,
                        });
                    } else if let Some(id) = cache.lookup(&key).filter(|_| refused) {
                        // In a failed transaction the server refuses any Parse (25P02)
                        // before it looks at the name: sent under the statement's server
                        // name, and refused just so, not answered here.
                        statements::put_parse(
                            &mut out.frames,
                            ServerName::of(id).as_bytes(),
                            &content,
                        );
                        out.expect.push_back(Expect::Client {
                            parse: None,
                            sync: false,
                            undo,
                        });
                    } else if cache.lookup(&key).is_some() {
                        out.expect.push_back(Expect::Synth {
                            reply: build::parse_complete(),
                            undo,
                        });
                    } else {
                        let id = cache.insert(key.clone());
                        statements::put_parse(
                            &mut out.frames,
                            ServerName::of(id).as_bytes(),
                            &content,
                        );
                        out.expect.push_back(Expect::Client {
                            parse: Some(key),
                            sync: false,
                            undo,
                        });
                    }
                    copy_for_execute(unit, raw, name, held, &mut out);
                }
                Ok(FrontendMessage::Parse { .. }) => {
                    unnamed = Unnamed::Parsed;
                    if failed {
                        exits.unnamed_text = Some(statements::parse_content(raw, ""));
                    }
                    out.frames.extend_from_slice(raw);
                    // A leading one is never skipped and has no undo (`unnamed_first`).
                    let leading = i == 0 && unit.unnamed_first;
                    out.expect.push_back(Expect::Client {
                        parse: None,
                        sync: false,
                        undo: if leading { None } else { undos.next() },
                    });
                }
                Ok(FrontendMessage::Describe { kind: b'S', name }) => {
                    let server = if name.is_empty() {
                        unnamed.server_name(&mut refs, &mut out)
                    } else {
                        let resolved = refs.next().flatten();
                        server_statement(cache, name.as_bytes(), resolved, &scope, &mut out)
                    };
                    match server {
                        Some(n) => statements::put_statement_message(&mut out.frames, b'D', &n),
                        None => out.frames.extend_from_slice(raw),
                    }
                    out.expect.push_back(client);
                }
                Ok(FrontendMessage::Close { kind: b'S', name }) if !name.is_empty() => {
                    let undo = undos.next();
                    if undo.as_ref().is_some_and(|u| u.sql.is_some()) {
                        // A statement the client PREPAREd, under its own name on the
                        // connection if anywhere: the server drops it (a Close never
                        // fails), and a Parse of the name after it is not refused.
                        out.frames.extend_from_slice(raw);
                        out.expect.push_back(Expect::Client {
                            parse: None,
                            sync: false,
                            undo,
                        });
                    } else {
                        if let Some(previous) = held.remove(name) {
                            // A copy an EXECUTE put here under the client's name goes
                            // too, or a Bind of the name after the Close would run it.
                            out.frames.extend_from_slice(&build::close(b'S', name));
                            out.expect.push_back(Expect::Hidden {
                                record: Some(ConnRecord::Sql {
                                    name: name.to_string(),
                                    previous: Some(previous),
                                }),
                            });
                        }
                        out.expect.push_back(Expect::Synth {
                            reply: build::close_complete(),
                            undo,
                        });
                    }
                }
                Ok(FrontendMessage::Close { kind: b'S', .. }) => {
                    // The unnamed statement (a named one is answered above).
                    unnamed = Unnamed::Foreign;
                    out.frames.extend_from_slice(raw);
                    out.expect.push_back(Expect::Client {
                        parse: None,
                        sync: false,
                        undo: undos.next(),
                    });
                }
                Ok(FrontendMessage::Sync) => {
                    out.frames.extend_from_slice(raw);
                    out.expect.push_back(Expect::Client {
                        parse: None,
                        sync: true,
                        undo: None,
                    });
                }
                Ok(FrontendMessage::Flush) => out.frames.extend_from_slice(raw),
                _ => {
                    out.frames.extend_from_slice(raw);
                    out.expect.push_back(client);
                }
            }
        }
        let evicted = cache.evict_over(max, since);
        if !evicted.is_empty() {
            // Closed first: none of them is used by this unit.
            metrics::counter!("pgfresh_prepared_statements_evicted_total")
                .increment(evicted.len() as u64);
            let mut frames = BytesMut::with_capacity(out.frames.len() + 32 * evicted.len());
            for (id, _) in &evicted {
                statements::put_statement_message(&mut frames, b'C', &ServerName::of(*id));
            }
            for (id, content) in evicted.into_iter().rev() {
                out.expect.push_front(Expect::Hidden {
                    record: Some(ConnRecord::Evicted { id, content }),
                });
            }
            // (The unit's messages after them, in the reused buffer: a rare path, copied.)
            frames.extend_from_slice(&out.frames);
            out.frames.clear();
            out.frames.extend_from_slice(&frames);
        }
        out
    }

    /// Replies made here that are now due: the front unit's leading [`Expect::Synth`]
    /// entries (everything before them has been answered). A unit sent again after a
    /// replica failed skips the ones the client already has. After an error none is due:
    /// the server skips to the Sync, and the messages they answer are skipped with it
    /// (their entries are taken at the ReadyForQuery, see `expect_reply`).
    pub(super) fn collect_due(&mut self) {
        let Some(u) = self.inflight.front_mut().filter(|u| !u.error) else {
            return;
        };
        while matches!(u.expect.front(), Some(Expect::Synth { .. })) {
            let Some(Expect::Synth { reply, .. }) = u.expect.pop_front() else {
                break;
            };
            if u.skip_acks > 0 {
                u.skip_acks -= 1;
                continue;
            }
            u.acks += 1;
            self.due.push(reply);
        }
    }

    /// The reply `tag` (not an ErrorResponse, see [`Session::skip_to_sync`]) from `node`
    /// completes the front unit's next expected message. Returns true when the reply
    /// answers a message pgfresh added and is swallowed. At the ReadyForQuery the entries
    /// still in front of the Sync's are those of a continuation sent after an error,
    /// which the server skipped: what they would have done did not happen (see `skipped`).
    pub(super) fn expect_reply(&mut self, node: usize, tag: u8) -> bool {
        if !matches!(
            tag,
            b'1' | b'2' | b'3' | b'n' | b'T' | b'C' | b'I' | b's' | b'Z'
        ) {
            return false;
        }
        let Some(u) = self.inflight.front_mut().filter(|u| !u.expect.is_empty()) else {
            return false;
        };
        if tag == b'Z' {
            if u.expect.front().is_some_and(Expect::is_sync) {
                // The usual ReadyForQuery: its Sync's is all that is left.
                u.expect.pop_front();
                return false;
            }
            let undo = self.skip_entries(node, false, true);
            self.undo_client(undo);
            return false;
        }
        let entry = u.expect.pop_front();
        if matches!(u.expect.front(), Some(Expect::Synth { .. })) {
            self.collect_due();
        }
        match entry {
            Some(Expect::Hidden { .. }) => true,
            Some(Expect::Client {
                undo: Some(undo), ..
            }) if tag == b'3' && undo.sql.is_some() => {
                // The client's Close of a statement it PREPAREd completed: the
                // connection holds it no more.
                if let Some(l) = self.backends[node].as_mut() {
                    l.conn.sql_prepared.remove(&undo.name);
                }
                false
            }
            _ => false,
        }
    }

    /// An ErrorResponse (body `body`) for the front unit's next expected reply, as the
    /// client is to read it: a Parse of a name the client has is refused under the server
    /// name of the client's statement (see `rewrite_unit`), and PostgreSQL's error names
    /// the client's statement (its undo says which). `None`: the server's error as it is.
    pub(super) fn error_for_client(&self, body: &[u8]) -> Option<Bytes> {
        let u = self.inflight.front()?;
        let Some(Expect::Client {
            parse: None,
            sync: false,
            undo: Some(undo),
        }) = u.expect.front()
        else {
            return None;
        };
        if undo.name.is_empty() {
            return None;
        }
        statements::error_naming(body, &undo.name)
    }

    /// An ErrorResponse from `node` for the front unit: the server skips to the Sync, so
    /// the entries in front of the Sync's are taken, the first the refused message's.
    /// Returns what the refused and skipped messages changed in the client's statements,
    /// for the caller to take back (unless the unit runs again elsewhere).
    pub(super) fn skip_to_sync(&mut self, node: usize) -> Vec<Undo> {
        let undo = self.skip_entries(node, true, false);
        self.collect_due();
        undo
    }

    /// Takes the front unit's entries in front of its Sync's (and the Sync's too, with
    /// `sync`), undoing what they changed on the connection; returns what they changed in
    /// the client's statements. `refused`: the first is the message the server refused.
    fn skip_entries(&mut self, node: usize, refused: bool, sync: bool) -> Vec<Undo> {
        let Some(u) = self.inflight.front_mut().filter(|u| !u.expect.is_empty()) else {
            return Vec::new();
        };
        let mut skipped = Vec::new();
        while u.expect.front().is_some_and(|e| !e.is_sync()) {
            skipped.extend(u.expect.pop_front());
        }
        if sync {
            u.expect.pop_front();
        }
        if skipped.is_empty() {
            // The usual ReadyForQuery: nothing in front of its Sync.
            return Vec::new();
        }
        self.skipped(node, skipped, refused)
    }

    /// Messages the server skipped or refused never happened: the statements their
    /// Parses would have prepared are not on the connection, those their Closes would
    /// have closed still are (unless their Parse was skipped too: a continuation closes
    /// what the batch prepared before it). Returns the client's Parses and Closes among
    /// them, in order, to take back from its statements; a refused Parse of the unnamed
    /// statement (`refused`, the first entry) leaves none (PostgreSQL drops the old one
    /// before it parses).
    fn skipped(&mut self, node: usize, entries: Vec<Expect>, refused: bool) -> Vec<Undo> {
        let mut undone: Vec<Undo> = Vec::new();
        let mut never_prepared: Vec<Bytes> = Vec::new();
        for (i, e) in entries.into_iter().enumerate() {
            let (record, undo) = match e {
                Expect::Client { parse, undo, .. } => (parse.map(ConnRecord::Prepared), undo),
                Expect::Hidden { record } => (record, None),
                Expect::Synth { undo, .. } => (None, undo),
            };
            if let Some(u) = undo.as_ref().filter(|_| self.mode == PoolMode::Session) {
                // Session mode recorded the client's Parse or Close as done on the
                // connection (`prepare_statements`); what the server holds under the name
                // is now unknown (a refused Parse of the unnamed statement drops it, a
                // skipped one keeps the old, pgfresh's own Parse ahead of a refused one
                // made it): the next unit that uses the name closes it there and parses
                // the client's statement again. Kept, the record could pass for the
                // client's statement once the client parses the same text again on
                // another node.
                if let Some(l) = self.backends[node].as_mut() {
                    l.conn
                        .prepared
                        .insert(u.name.clone(), super::state::UNKNOWN_STATEMENT);
                }
            }
            undone.extend(undo.map(|u| {
                let mut u = *u;
                if refused && i == 0 && u.name.is_empty() {
                    u.previous = None;
                }
                u
            }));
            let Some(l) = self.backends[node].as_mut() else {
                continue;
            };
            match record {
                Some(ConnRecord::Prepared(content)) => {
                    l.conn.statements.remove(&content);
                    never_prepared.push(content);
                }
                Some(ConnRecord::Evicted { id, content }) if !never_prepared.contains(&content) => {
                    l.conn.statements.restore(id, content);
                }
                Some(ConnRecord::Named { name, previous }) => {
                    restore(&mut l.conn.prepared, name, previous)
                }
                Some(ConnRecord::Sql { name, previous }) => {
                    restore(&mut l.conn.sql_prepared, name, previous)
                }
                // Its Parse was skipped as well: it was never on the connection.
                Some(ConnRecord::Evicted { .. }) | None => {}
            }
        }
        undone
    }

    /// The client's Parses and Closes in `undo` (in the order they were read) did not
    /// happen: its statements go back to what they were before them.
    pub(super) fn undo_client(&mut self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            if let Some(sql) = u.sql {
                self.state.sql_prepared.insert(u.name.clone(), sql);
            }
            match u.previous {
                Some(p) => self.state.prepared.insert(u.name, p),
                None => self.state.prepared.remove(&u.name),
            };
        }
    }
}
