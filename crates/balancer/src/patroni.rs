//! Role and replication positions from a node's Patroni REST API instead of SQL polls.
//!
//! A node configured with a [`NodeSpec::patroni_url`](crate::NodeSpec::patroni_url) is
//! polled with `GET {patroni_url}/patroni`, Patroni's monitoring endpoint, every
//! `sr_check_period`. Its member status document is mapped into the same facts an SQL poll
//! yields, so health, roles, lag, eligibility and the choice of the primary work the same
//! way for both kinds of node, and a cluster may mix them.
//!
//! Fields read from the document (as described in Patroni's REST API documentation, section
//! "Monitoring endpoint", and emitted by its `get_postgresql_status`):
//!
//! * `state`: the PostgreSQL state as Patroni sees it. Anything but `"running"` (`starting`,
//!   `stopped`, `crashed`, `restarting`, ...) counts as a failed poll: the database does not
//!   serve queries, exactly as when an SQL poll cannot connect.
//! * `role`: `"primary"` (Patroni 4), `"master"` (earlier releases) or `"leader"` mean out of
//!   recovery; `"replica"` and `"standby_leader"` (the leader of a standby cluster) mean in
//!   recovery. Any other value is a failed poll.
//! * `xlog`: on a primary `{"location": N}`, its current WAL position; on a replica
//!   `{"received_location": N, "replayed_location": N, "replayed_timestamp": T, "paused": B}`.
//!   Positions are byte offsets (`pg_wal_lsn_diff(lsn, '0/0')`), which is exactly an
//!   [`Lsn`]'s value.
//! * `timeline`: the primary's timeline, or the timeline a replica receives.
//! * `replication_state` (Patroni 3.0.4 and later): the WAL receiver status, e.g.
//!   `"streaming"` or `"in archive recovery"`.
//!
//! A replica counts as streaming when `replication_state` is `"streaming"`; where Patroni is
//! too old to report it, when it reports a `received_location`. `replayed_timestamp` (the
//! commit time of the last replayed transaction) gives the replay age that dates a replica's
//! position when the primary's position history cannot (see [`crate::lag`]); it is measured
//! against the monitor's clock, so unlike the SQL poll it is subject to clock skew between
//! the hosts, and a timestamp in an unrecognised format simply leaves the age unknown.
//!
//! A poll that fails to connect, times out (`health_timeout`), gets a status other than
//! 2xx, or a body that is not such a document (missing `state`/`role`, a primary without
//! `xlog.location`, a replica without `xlog`, fields of the wrong type, more than
//! [`MAX_BODY`] bytes) is a failed poll, counted exactly like a failed SQL poll. The monitor
//! keeps one HTTP/1.1 keep-alive connection per node and opens a fresh one after a failure.
//!
//! Only plain `http://` URLs are supported: there is no TLS on this path, so the Patroni
//! REST API must be reachable without it (for example on a private network).

use std::error::Error as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::{Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use pgfresh_lsn::Lsn;
use serde::Deserialize;
use tokio::time::timeout;

use crate::settings::MonitorSettings;
use crate::state::Sample;

/// Largest member status document accepted; a real one is well under 4 KiB.
pub const MAX_BODY: usize = 256 * 1024;

/// The monitoring endpoint under a Patroni REST API base URL.
const STATUS_PATH: &str = "patroni";

/// Polls one node's Patroni REST API.
pub(crate) struct PatroniPoller {
    /// The status URL, or why the configured base URL is unusable (reported on every poll).
    url: Result<Uri, String>,
    client: Client<HttpConnector, Empty<Bytes>>,
    /// The connect timeout the client was built with; a settings change rebuilds it.
    connect_timeout: Duration,
}

impl PatroniPoller {
    pub(crate) fn new(base_url: &str, s: &MonitorSettings) -> PatroniPoller {
        PatroniPoller {
            url: status_url(base_url),
            client: build_client(s.connect_timeout),
            connect_timeout: s.connect_timeout,
        }
    }

    /// Forgets the kept-alive connection; the next poll opens a new one.
    pub(crate) fn reset(&mut self) {
        self.client = build_client(self.connect_timeout);
    }

    /// One poll: fetch the member status and map it.
    pub(crate) async fn poll(&mut self, s: &MonitorSettings) -> Result<Sample, String> {
        let url = self.url.clone()?;
        if s.connect_timeout != self.connect_timeout {
            self.connect_timeout = s.connect_timeout;
            self.reset();
        }
        let request = Request::get(url)
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|e| format!("building the request failed: {e}"))?;
        let body = timeout(s.health_timeout, fetch(&self.client, request))
            .await
            .map_err(|_| format!("poll timed out after {:?}", s.health_timeout))??;
        parse_status(&body, SystemTime::now())
    }
}

fn build_client(connect_timeout: Duration) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout.max(Duration::from_millis(1))));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(connector)
}

async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    request: Request<Empty<Bytes>>,
) -> Result<Bytes, String> {
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("request failed: {}", error_chain(&e)))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("reading the response failed: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("unexpected HTTP status {status}"));
    }
    Ok(body)
}

/// An error with its causes, for the node's `last_error`.
fn error_chain(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `{base}/patroni` for an `http://host:port[/prefix]` base URL.
pub(crate) fn status_url(base: &str) -> Result<Uri, String> {
    let base = base.trim();
    let uri: Uri = base
        .parse()
        .map_err(|e| format!("invalid Patroni URL {base:?}: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "Patroni URL {base:?}: https is not supported, use http"
            ))
        }
        _ => return Err(format!("Patroni URL {base:?} must start with http://")),
    }
    if uri.authority().is_none() {
        return Err(format!("Patroni URL {base:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("Patroni URL {base:?} must not have a query"));
    }
    let prefix = uri.path().trim_end_matches('/');
    format!(
        "http://{}{prefix}/{STATUS_PATH}",
        uri.authority().map(|a| a.as_str()).unwrap_or_default()
    )
    .parse()
    .map_err(|e| format!("invalid Patroni URL {base:?}: {e}"))
}

/// The member status document of `GET /patroni` (unknown fields are ignored).
#[derive(Debug, Deserialize)]
struct MemberStatus {
    state: Option<String>,
    role: Option<String>,
    xlog: Option<Xlog>,
    timeline: Option<u64>,
    replication_state: Option<String>,
}

/// `xlog`: `location` on a primary, the other fields on a replica.
#[derive(Debug, Deserialize)]
struct Xlog {
    location: Option<u64>,
    received_location: Option<u64>,
    replayed_location: Option<u64>,
    replayed_timestamp: Option<String>,
    paused: Option<bool>,
}

/// Maps a member status document to a poll sample; `now` dates `replayed_timestamp`.
pub(crate) fn parse_status(body: &[u8], now: SystemTime) -> Result<Sample, String> {
    let status: MemberStatus = serde_json::from_slice(body)
        .map_err(|e| format!("unexpected Patroni status document: {e}"))?;
    match status.state.as_deref() {
        Some("running") => {}
        Some(other) => return Err(format!("Patroni reports PostgreSQL {other:?}")),
        None => return Err("Patroni status has no \"state\"".to_string()),
    }
    let role = status
        .role
        .as_deref()
        .ok_or_else(|| "Patroni status has no \"role\"".to_string())?;
    let in_recovery = match role {
        "primary" | "master" | "leader" => false,
        "replica" | "standby_leader" => true,
        other => return Err(format!("unrecognised Patroni role {other:?}")),
    };
    let xlog = status
        .xlog
        .ok_or_else(|| "Patroni status has no \"xlog\"".to_string())?;
    let timeline = status.timeline.and_then(|t| u32::try_from(t).ok());
    if !in_recovery {
        let location = xlog
            .location
            .ok_or_else(|| "Patroni status of a primary has no \"xlog.location\"".to_string())?;
        return Ok(Sample {
            in_recovery: false,
            current_lsn: Some(Lsn(location)),
            replay_lsn: None,
            receive_lsn: None,
            paused: false,
            replay_age_ms: None,
            receiver_status: None,
            timeline,
            control_timeline: None,
            tls: None,
        });
    }
    let streaming = match status.replication_state.as_deref() {
        Some(state) => state == "streaming",
        None => xlog.received_location.is_some(),
    };
    let receiver_status = if streaming {
        Some("streaming".to_string())
    } else {
        status.replication_state
    };
    let replay_age_ms = xlog
        .replayed_timestamp
        .as_deref()
        .and_then(parse_timestamp_ms)
        .and_then(|at| {
            let now_ms = i64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
            now_ms.checked_sub(at)
        });
    Ok(Sample {
        in_recovery: true,
        current_lsn: None,
        replay_lsn: xlog.replayed_location.map(Lsn),
        receive_lsn: xlog.received_location.map(Lsn),
        paused: xlog.paused.unwrap_or(false),
        replay_age_ms,
        receiver_status,
        timeline,
        control_timeline: None,
        tls: None,
    })
}

/// Milliseconds since the Unix epoch of a timestamp as Patroni prints it:
/// `YYYY-MM-DD HH:MM:SS[.fraction]` (or with `T`) followed by a UTC offset (`+02:00`,
/// `+0200`, `+02`), `Z`, or ` UTC`/` GMT`. Zone abbreviations other than UTC/GMT are
/// ambiguous and give `None`.
pub(crate) fn parse_timestamp_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    let b = text.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i64> {
        let s = text.get(from..from + len)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b' ' | b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (hour, minute, second) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let len = frac.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 {
            return None;
        }
        let ms_digits = &frac[..len.min(3)];
        millis = ms_digits.parse::<i64>().ok()? * 10_i64.pow(3 - ms_digits.len() as u32);
        rest = &frac[len..];
    }
    let offset_s = parse_offset(rest.trim_start())?;
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Some(seconds * 1000 + millis)
}

/// Seconds east of UTC of a zone suffix.
fn parse_offset(zone: &str) -> Option<i64> {
    match zone {
        "Z" | "UTC" | "GMT" | "+00" | "-00" => return Some(0),
        _ => {}
    }
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let hm: String = zone[1..].chars().filter(|c| *c != ':').collect();
    if !hm.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (h, m) = match hm.len() {
        2 => (hm.parse::<i64>().ok()?, 0),
        4 => (hm[..2].parse::<i64>().ok()?, hm[2..].parse::<i64>().ok()?),
        _ => return None,
    };
    if h > 23 || m > 59 {
        return None;
    }
    Some(sign * (h * 3600 + m * 60))
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    // 2023-07-06 11:12:00 UTC.
    const T0_MS: u64 = 1_688_641_920_000;

    #[test]
    fn primary_document() {
        let body =
            br#"{"state": "running", "postmaster_start_time": "2023-07-06 13:12:00.595118+02:00",
            "role": "primary", "server_version": 160002, "xlog": {"location": 67108960},
            "timeline": 3, "dcs_last_seen": 1688642069,
            "patroni": {"version": "4.0.4", "scope": "batman"}}"#;
        let s = parse_status(body, at(T0_MS)).unwrap();
        assert_eq!(
            s,
            Sample {
                in_recovery: false,
                current_lsn: Some(Lsn(67_108_960)),
                replay_lsn: None,
                receive_lsn: None,
                paused: false,
                replay_age_ms: None,
                receiver_status: None,
                timeline: Some(3),
                control_timeline: None,
                tls: None,
            }
        );
        // Older releases call the primary "master".
        let old =
            br#"{"state": "running", "role": "master", "xlog": {"location": 5}, "timeline": 1}"#;
        assert_eq!(
            parse_status(old, at(T0_MS)).unwrap().current_lsn,
            Some(Lsn(5))
        );
    }

    #[test]
    fn replica_document() {
        let body = br#"{"state": "running", "role": "replica", "server_version": 150003,
            "xlog": {"received_location": 335544480, "replayed_location": 335544000,
                     "replayed_timestamp": "2023-07-06 13:11:59.500+02:00", "paused": false},
            "timeline": 12, "replication_state": "streaming"}"#;
        let s = parse_status(body, at(T0_MS)).unwrap();
        assert_eq!(
            s,
            Sample {
                in_recovery: true,
                current_lsn: None,
                replay_lsn: Some(Lsn(335_544_000)),
                receive_lsn: Some(Lsn(335_544_480)),
                paused: false,
                replay_age_ms: Some(500),
                receiver_status: Some("streaming".into()),
                timeline: Some(12),
                control_timeline: None,
                tls: None,
            }
        );
    }

    #[test]
    fn paused_and_archive_recovery_replicas() {
        let paused = br#"{"state": "running", "role": "replica",
            "xlog": {"received_location": 900, "replayed_location": 700,
                     "replayed_timestamp": null, "paused": true}, "timeline": 2}"#;
        let s = parse_status(paused, at(T0_MS)).unwrap();
        assert!(s.in_recovery && s.paused);
        assert_eq!(s.replay_lsn, Some(Lsn(700)));
        assert_eq!(s.replay_age_ms, None);
        // No replication_state (older Patroni): a received location means streaming.
        assert_eq!(s.receiver_status.as_deref(), Some("streaming"));

        let archive = br#"{"state": "running", "role": "replica",
            "xlog": {"received_location": 900, "replayed_location": 900, "paused": false},
            "timeline": 2, "replication_state": "in archive recovery"}"#;
        let s = parse_status(archive, at(T0_MS)).unwrap();
        assert_eq!(s.receiver_status.as_deref(), Some("in archive recovery"));

        let standby_leader = br#"{"state": "running", "role": "standby_leader",
            "xlog": {"replayed_location": 900}}"#;
        let s = parse_status(standby_leader, at(T0_MS)).unwrap();
        assert!(s.in_recovery && !s.paused);
        assert_eq!(
            s.receiver_status, None,
            "nothing received, no receiver state"
        );
        assert_eq!((s.receive_lsn, s.timeline), (None, None));
    }

    #[test]
    fn missing_fields_fail_the_poll() {
        for (body, why) in [
            (
                &br#"{"role": "primary", "xlog": {"location": 1}}"#[..],
                "state",
            ),
            (br#"{"state": "running", "xlog": {"location": 1}}"#, "role"),
            (br#"{"state": "running", "role": "primary"}"#, "xlog"),
            (
                br#"{"state": "running", "role": "primary", "xlog": {}}"#,
                "xlog.location",
            ),
            (br#"{"state": "running", "role": "replica"}"#, "xlog"),
            (
                br#"{"state": "running", "role": "uninitialized", "xlog": {}}"#,
                "role",
            ),
        ] {
            let e = parse_status(body, at(T0_MS)).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
        // Patroni answers only the state (and role) when PostgreSQL is not running.
        let e = parse_status(br#"{"state": "stopped", "role": "replica"}"#, at(T0_MS));
        assert_eq!(e.unwrap_err(), "Patroni reports PostgreSQL \"stopped\"");
    }

    #[test]
    fn garbage_fails_the_poll() {
        for body in [
            &b""[..],
            b"<html>502 Bad Gateway</html>",
            b"[1, 2]",
            b"null",
            br#"{"state": "running", "role": "primary", "xlog": {"location": "0/5000"}}"#,
            br#"{"state": "running", "role": "primary", "xlog": {"location": -1}}"#,
            br#"{"state": 1, "role": "primary", "xlog": {"location": 1}}"#,
            br#"{"state": "running", "role": "replica", "xlog": {"paused": "no"}}"#,
            br#"{"state": "running", "role": "primary", "xlog": {"location": 1}"#,
        ] {
            assert!(
                parse_status(body, at(T0_MS)).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn timestamps() {
        let t0 = T0_MS as i64;
        for (text, want) in [
            ("2023-07-06 11:12:00 UTC", Some(t0)),
            ("2023-07-06 11:12:00.250 UTC", Some(t0 + 250)),
            ("2023-07-06 13:12:00.595118+02:00", Some(t0 + 595)),
            ("2023-07-06T11:12:00.5Z", Some(t0 + 500)),
            ("2023-07-06 06:42:00-0430", Some(t0)),
            ("2023-07-06 13:12:00+02", Some(t0)),
            ("1970-01-01 00:00:00+00", Some(0)),
            ("2000-02-29 00:00:00Z", Some(951_782_400_000)),
            ("1969-12-31 23:59:59Z", Some(-1000)),
            ("2023-07-06 13:12:00 CEST", None),
            ("2023-07-06 13:12:00", None),
            ("2023-13-06 11:12:00Z", None),
            ("2023-07-06 11:12Z", None),
            ("2023-07-06 11:12:00.Z", None),
            ("garbage", None),
            ("", None),
        ] {
            assert_eq!(parse_timestamp_ms(text), want, "{text}");
        }
    }

    #[test]
    fn status_urls() {
        let ok = |base: &str| status_url(base).unwrap().to_string();
        assert_eq!(ok("http://127.0.0.1:8008"), "http://127.0.0.1:8008/patroni");
        assert_eq!(ok("http://db1:8008/"), "http://db1:8008/patroni");
        assert_eq!(ok("http://lb/pg/node1/"), "http://lb/pg/node1/patroni");
        assert!(status_url("https://db1:8008")
            .unwrap_err()
            .contains("https"));
        assert!(status_url("db1:8008").is_err());
        assert!(status_url("http://db1:8008?x=1").is_err());
        assert!(status_url("not a url").is_err());
    }
}
