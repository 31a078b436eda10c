//! Standbys' replay positions as the primary hears them.
//!
//! A standby's WAL receiver tells its upstream how far it has replayed with every stretch of
//! WAL it receives (and at least every `wal_receiver_status_interval` when nothing comes);
//! the primary shows the last report of each of its walsenders in
//! `pg_stat_get_wal_senders()`. A report is what the standby had replayed when it sent it,
//! so it never runs ahead of the standby: as safe a position as the standby's own
//! `pg_last_wal_replay_lsn()`. Under constant writes it trails that by about a millisecond
//! (docs/benchmarks.md, "A cheaper source of standby positions").
//!
//! So while reads wait on replay positions, the primary's monitor asks the primary for
//! every standby's report in one query each `replay_check_period`
//! ([`crate::monitor`]), instead of each standby being asked for its own. A report that
//! moves a standby's position counts as a fresh answer from that standby: its own fast
//! polls wait a period from then ([`crate::fast`]). When the reports stop moving (writes
//! stopped, and the standby will not report the replay of the last ones until its status
//! interval), its own polls take over again.
//!
//! Which walsender streams to which configured standby is worked out at each full poll
//! ([`map_senders`]), and only where it cannot be mistaken: the standby's WAL receiver
//! streams from the primary's configured host and port (a cascading standby does not),
//! and its replication slot, or failing one its application name, names exactly one of
//! the primary's streaming physical walsenders and no other configured standby. Anything
//! else (a hidden or ambiguous identity, names shared, a monitor role that may not see
//! the walsenders' positions) leaves that standby to its own polls. Reports are keyed by
//! the walsender's process id, so a standby that reconnects (a new walsender) is not
//! reported again until the next full poll has matched its new one.

use std::sync::{Arc, Mutex};

use crate::settings::NodeId;

/// How a standby's WAL receiver is known to its upstream, from its own full poll
/// (`pg_stat_wal_receiver`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReceiverIdent {
    /// The replication slot it streams from.
    pub(crate) slot: Option<String>,
    /// The application name it streams under (`application_name`, or the
    /// `fallback_application_name` of its `cluster_name`, from the connection string the
    /// receiver shows); `None` when that string cannot be read without doubt.
    pub(crate) app: Option<String>,
    /// The upstream it streams from.
    pub(crate) sender_host: Option<String>,
    pub(crate) sender_port: Option<u16>,
}

impl ReceiverIdent {
    /// From the columns of `pg_stat_wal_receiver` (all hidden, so `None`, from a monitor
    /// role without `pg_read_all_stats`).
    pub(crate) fn from_receiver(
        slot: Option<String>,
        conninfo: Option<&str>,
        sender_host: Option<String>,
        sender_port: Option<i32>,
    ) -> Option<ReceiverIdent> {
        let ident = ReceiverIdent {
            slot: slot.filter(|s| !s.is_empty()),
            app: conninfo.and_then(streamed_as),
            sender_host,
            sender_port: sender_port.and_then(|p| u16::try_from(p).ok()),
        };
        (ident.slot.is_some() || ident.app.is_some()).then_some(ident)
    }

    /// The name the primary knows it by: its slot, or its application name.
    fn key(&self) -> Option<Key<'_>> {
        match (&self.slot, &self.app) {
            (Some(slot), _) => Some(Key::Slot(slot)),
            (None, Some(app)) => Some(Key::App(app)),
            (None, None) => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key<'a> {
    Slot(&'a str),
    App(&'a str),
}

/// The application name in a WAL receiver's connection string as `pg_stat_wal_receiver`
/// shows it (`keyword=value` pairs separated by spaces, values unquoted): the explicit
/// `application_name`, else the `fallback_application_name`. `None` when a value may
/// hold a space (a word without `=`: the pairs cannot be told apart without doubt).
pub(crate) fn streamed_as(conninfo: &str) -> Option<String> {
    let mut explicit = None;
    let mut fallback = None;
    for word in conninfo.split(' ').filter(|w| !w.is_empty()) {
        let (key, value) = word.split_once('=')?;
        match key {
            "application_name" => explicit = Some(value),
            "fallback_application_name" => fallback = Some(value),
            _ => {}
        }
    }
    explicit
        .or(fallback)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// One of the primary's walsenders streaming physical replication (from its full poll).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sender {
    pub(crate) pid: i32,
    pub(crate) app: String,
    pub(crate) slot: Option<String>,
}

/// The primary's walsenders matched to configured standbys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SenderMap {
    /// (walsender process id, the standby it streams to).
    pub(crate) by_pid: Vec<(i32, NodeId)>,
}

impl SenderMap {
    /// The standby walsender `pid` streams to.
    pub(crate) fn node_of(&self, pid: i32) -> Option<NodeId> {
        self.by_pid.iter().find(|(p, _)| *p == pid).map(|(_, n)| *n)
    }
}

/// Matches the primary's `senders` to the configured `standbys` (see the module's
/// documentation): a standby is matched only when its receiver streams from
/// `primary_host:primary_port`, and its slot (or, without one, its application name)
/// names exactly one sender and no other standby.
pub(crate) fn map_senders(
    primary_host: &str,
    primary_port: u16,
    senders: &[Sender],
    standbys: &[(NodeId, ReceiverIdent)],
) -> SenderMap {
    let mut by_pid = Vec::new();
    for (id, ident) in standbys {
        let streams_from_primary = ident.sender_host.as_deref() == Some(primary_host)
            && ident.sender_port == Some(primary_port);
        let Some(key) = ident.key().filter(|_| streams_from_primary) else {
            continue;
        };
        let shared = standbys
            .iter()
            .any(|(other, o)| other != id && o.key() == Some(key));
        if shared {
            continue;
        }
        let mut matching = senders.iter().filter(|s| match key {
            Key::Slot(slot) => s.slot.as_deref() == Some(slot),
            // Without a slot of its own: a sender on a slot is someone else.
            Key::App(app) => s.slot.is_none() && s.app == app,
        });
        if let (Some(sender), None) = (matching.next(), matching.next()) {
            by_pid.push((sender.pid, *id));
        }
    }
    by_pid.sort_unstable();
    SenderMap { by_pid }
}

/// What the monitors know of it: each standby's identity from its own polls, and the
/// map the primary's last full poll made from them.
#[derive(Default)]
pub(crate) struct Reports {
    state: Mutex<ReportsState>,
}

#[derive(Default)]
struct ReportsState {
    /// Indexed by [`NodeId`]; `None`: not a standby, or not identifiable.
    idents: Vec<Option<ReceiverIdent>>,
    /// The primary that made it, and the map.
    map: Option<(NodeId, Arc<SenderMap>)>,
}

impl Reports {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReportsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Node `id`'s last poll: its receiver's identity, if it is a standby that has one.
    pub(crate) fn note_receiver(&self, id: NodeId, ident: Option<ReceiverIdent>) {
        let mut s = self.lock();
        if s.idents.len() <= id {
            s.idents.resize(id + 1, None);
        }
        s.idents[id] = ident;
    }

    /// The primary `primary` (at `host:port`) streams to `senders`: matches them to the
    /// standbys' identities and keeps the map. Returns the map when it changed.
    pub(crate) fn remap(
        &self,
        primary: NodeId,
        host: &str,
        port: u16,
        senders: &[Sender],
    ) -> Option<Arc<SenderMap>> {
        let mut s = self.lock();
        let standbys: Vec<(NodeId, ReceiverIdent)> = s
            .idents
            .iter()
            .enumerate()
            .filter(|(id, _)| *id != primary)
            .filter_map(|(id, i)| Some((id, i.clone()?)))
            .collect();
        let map = map_senders(host, port, senders, &standbys);
        let unchanged = s
            .map
            .as_ref()
            .is_some_and(|(p, m)| *p == primary && **m == map);
        if unchanged {
            return None;
        }
        let map = Arc::new(map);
        s.map = Some((primary, map.clone()));
        Some(map)
    }

    /// `primary` no longer says who its senders stream to (it failed a poll, left the
    /// primary role, or reports are switched off): its map is gone. True if there was one.
    pub(crate) fn forget(&self, primary: NodeId) -> bool {
        let mut s = self.lock();
        if s.map.as_ref().is_some_and(|(p, _)| *p == primary) {
            s.map = None;
            return true;
        }
        false
    }

    /// The map `primary`'s last full poll made, if it made one.
    pub(crate) fn map_of(&self, primary: NodeId) -> Option<Arc<SenderMap>> {
        match &self.lock().map {
            Some((p, m)) if *p == primary && !m.by_pid.is_empty() => Some(m.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(slot: Option<&str>, app: Option<&str>) -> ReceiverIdent {
        ReceiverIdent {
            slot: slot.map(str::to_string),
            app: app.map(str::to_string),
            sender_host: Some("10.0.0.1".into()),
            sender_port: Some(5432),
        }
    }

    fn sender(pid: i32, app: &str, slot: Option<&str>) -> Sender {
        Sender {
            pid,
            app: app.into(),
            slot: slot.map(str::to_string),
        }
    }

    #[test]
    fn the_application_name_comes_from_the_receivers_connection_string() {
        let shown = "user=postgres passfile=/root/.pgpass channel_binding=prefer \
                     dbname=replication host=127.0.0.1 port=5432 \
                     fallback_application_name=node1 sslmode=prefer";
        assert_eq!(streamed_as(shown).as_deref(), Some("node1"));
        // An explicit name wins, wherever it stands.
        let both = "application_name=replica_a host=h fallback_application_name=node1";
        assert_eq!(streamed_as(both).as_deref(), Some("replica_a"));
        let both = "fallback_application_name=node1 application_name=replica_a";
        assert_eq!(streamed_as(both).as_deref(), Some("replica_a"));
        // None at all, an empty one, or a string that may hold a value with a space.
        assert_eq!(streamed_as("host=h port=5432"), None);
        assert_eq!(streamed_as("application_name= host=h"), None);
        assert_eq!(streamed_as("application_name=node one host=h"), None);
        assert_eq!(streamed_as(""), None);
    }

    #[test]
    fn an_identity_needs_a_slot_or_a_name() {
        assert_eq!(ReceiverIdent::from_receiver(None, None, None, None), None);
        assert_eq!(
            ReceiverIdent::from_receiver(Some(String::new()), Some("host=h"), None, None),
            None
        );
        let i = ReceiverIdent::from_receiver(
            Some("s1".into()),
            Some("application_name=a"),
            Some("h".into()),
            Some(5432),
        )
        .unwrap();
        assert_eq!(i.key(), Some(Key::Slot("s1")));
        assert_eq!(i.sender_port, Some(5432));
    }

    #[test]
    fn standbys_are_matched_by_slot_or_by_a_name_no_one_else_has() {
        let senders = [
            sender(100, "node1", None),
            sender(200, "walreceiver", Some("slot_b")),
            sender(300, "node3", None),
        ];
        let standbys = [
            (1, ident(None, Some("node1"))),
            (2, ident(Some("slot_b"), Some("node2"))),
            (3, ident(None, Some("node3"))),
        ];
        let map = map_senders("10.0.0.1", 5432, &senders, &standbys);
        assert_eq!(map.by_pid, vec![(100, 1), (200, 2), (300, 3)]);
        assert_eq!(map.node_of(200), Some(2));
        assert_eq!(map.node_of(999), None);
    }

    #[test]
    fn anything_that_could_be_mistaken_is_left_unmatched() {
        // Two walsenders under the standby's name (an unconfigured standby, a tool).
        let senders = [sender(100, "node1", None), sender(101, "node1", None)];
        let map = map_senders(
            "10.0.0.1",
            5432,
            &senders,
            &[(1, ident(None, Some("node1")))],
        );
        assert!(map.by_pid.is_empty());
        // Two configured standbys under one name (no cluster_name: both "walreceiver").
        let senders = [sender(100, "walreceiver", None)];
        let standbys = [
            (1, ident(None, Some("walreceiver"))),
            (2, ident(None, Some("walreceiver"))),
        ];
        assert!(map_senders("10.0.0.1", 5432, &senders, &standbys)
            .by_pid
            .is_empty());
        // A standby without a slot does not take a walsender on a slot of the same name.
        let senders = [sender(100, "node1", Some("other"))];
        let map = map_senders(
            "10.0.0.1",
            5432,
            &senders,
            &[(1, ident(None, Some("node1")))],
        );
        assert!(map.by_pid.is_empty());
        // A slot no walsender streams from.
        let senders = [sender(100, "node1", None)];
        let map = map_senders(
            "10.0.0.1",
            5432,
            &senders,
            &[(1, ident(Some("gone"), Some("node1")))],
        );
        assert!(map.by_pid.is_empty());
    }

    #[test]
    fn a_standby_streaming_from_elsewhere_is_not_matched() {
        // A cascading standby under the same name as one of the primary's.
        let senders = [sender(100, "node1", None)];
        let mut cascading = ident(None, Some("node1"));
        cascading.sender_host = Some("10.0.0.2".into());
        assert!(
            map_senders("10.0.0.1", 5432, &senders, &[(1, cascading.clone())])
                .by_pid
                .is_empty()
        );
        cascading.sender_host = Some("10.0.0.1".into());
        cascading.sender_port = Some(5433);
        assert!(
            map_senders("10.0.0.1", 5432, &senders, &[(1, cascading.clone())])
                .by_pid
                .is_empty()
        );
        // Upstream hidden (no pg_read_all_stats): not matched either.
        cascading.sender_port = None;
        assert!(map_senders("10.0.0.1", 5432, &senders, &[(1, cascading)])
            .by_pid
            .is_empty());
    }

    #[test]
    fn the_map_follows_the_primary_that_made_it() {
        let r = Reports::default();
        r.note_receiver(1, Some(ident(None, Some("node1"))));
        r.note_receiver(0, None);
        let senders = [sender(100, "node1", None)];
        let made = r.remap(0, "10.0.0.1", 5432, &senders).expect("a new map");
        assert_eq!(made.by_pid, vec![(100, 1)]);
        // The same again: unchanged.
        assert!(r.remap(0, "10.0.0.1", 5432, &senders).is_none());
        assert_eq!(r.map_of(0).unwrap().by_pid, vec![(100, 1)]);
        // Another node's map is not this one's.
        assert!(r.map_of(1).is_none());
        assert!(!r.forget(1));
        assert!(r.forget(0));
        assert!(r.map_of(0).is_none());
        // The standby reconnected under a new walsender: matched anew.
        let made = r
            .remap(0, "10.0.0.1", 5432, &[sender(101, "node1", None)])
            .expect("changed");
        assert_eq!(made.node_of(101), Some(1));
        assert_eq!(made.node_of(100), None);
        // The standby is no longer identifiable: nothing is matched.
        r.note_receiver(1, None);
        let made = r
            .remap(0, "10.0.0.1", 5432, &[sender(101, "node1", None)])
            .expect("changed");
        assert!(made.by_pid.is_empty());
        assert!(r.map_of(0).is_none());
    }
}
