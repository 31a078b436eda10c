//! The invariants checked after every session: a new client is served correctly, and
//! nothing of the session is left behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgfresh_wire::{build, parse_backend, BackendMessage, Frame, TxStatus};

use crate::client::Client;
use crate::harness::{Harness, RunningProxy, TRUST};

/// How long a fresh client may take to log in and get its answer, and how long a
/// closed session may take to be cleaned up. Both take about a millisecond.
const DEADLINE: Duration = Duration::from_secs(5);

/// A fresh client logs in, runs `SELECT '<nonce>'` and gets exactly its own answer:
/// one row with the nonce, `SELECT 1`, ReadyForQuery idle. A reply of an earlier
/// session left on a pooled server connection would show here.
pub async fn fresh_client_is_served(proxy: &RunningProxy) {
    static N: AtomicU64 = AtomicU64::new(0);
    let nonce = format!("check {}", N.fetch_add(1, Ordering::Relaxed));
    let mut c = Client::connect(proxy.addr, &TRUST, false, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("a fresh client cannot log in after the session: {e:?}"));
    c.pending = build::query(&format!("SELECT '{nonce}'")).to_vec();
    c.owed = 1;
    c.send(0).await;
    c.settle(DEADLINE).await;
    let got = c.take_received();
    let summary: Vec<String> = got.iter().map(describe).collect();
    let ok = matches!(
        &got[..],
        [t, d, cc, z] if t.tag == b'T'
            && d.tag == b'D' && data_row(d) == [Some(nonce.as_bytes().to_vec())]
            && matches!(parse_backend(cc), Ok(BackendMessage::CommandComplete { tag: "SELECT 1" }))
            && matches!(parse_backend(z), Ok(BackendMessage::ReadyForQuery(TxStatus::Idle)))
    );
    assert!(ok, "a fresh client asked for {nonce:?} and got {summary:?}");
    c.pending = build::terminate().to_vec();
    c.send(0).await;
}

/// Every session has ended (the proxies count no client) and every server connection
/// is back in its pool (none lent, nobody waiting).
pub async fn nothing_left_behind(h: &Harness) {
    let start = Instant::now();
    loop {
        let left: Vec<String> = h.proxies().iter().flat_map(|p| leftovers(p)).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "sessions left behind after {DEADLINE:?}: {left:?}"
        );
        // Not a tokio sleep: its 1 ms granularity would cost more than the cleanup takes.
        // This thread is not one of the runtime's workers, so blocking it holds up nothing.
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn leftovers(p: &RunningProxy) -> Vec<String> {
    let mut left = Vec::new();
    let clients = p.shared.client_count();
    if clients > 0 {
        left.push(format!("{clients} clients"));
    }
    for c in p.shared.pools.counts() {
        if c.lent > 0 || c.waiting > 0 {
            left.push(format!(
                "node {} pool: {} lent, {} waiting",
                c.node, c.lent, c.waiting
            ));
        }
    }
    left
}

/// The values of a DataRow (`None` for NULL).
fn data_row(f: &Frame) -> Vec<Option<Vec<u8>>> {
    let b = f.body();
    let mut values = Vec::new();
    let mut at = 2;
    let n = b.get(..2).map_or(0, |c| i16::from_be_bytes([c[0], c[1]]));
    for _ in 0..n {
        let Some(len) = b.get(at..at + 4) else {
            break;
        };
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        if len < 0 {
            values.push(None);
            continue;
        }
        let end = at + len as usize;
        values.push(b.get(at..end).map(<[u8]>::to_vec));
        at = end;
    }
    values
}

fn describe(f: &Frame) -> String {
    match parse_backend(f) {
        Ok(BackendMessage::ErrorResponse(e)) => format!("Error {:?} {:?}", e.code, e.message),
        Ok(m) => format!("{m:?}"),
        Err(e) => format!("{:?}: {e}", f.tag as char),
    }
}
