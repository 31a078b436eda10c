//! Plays a [`Script`] as one client session against a proxy.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pgfresh_wire::{build, CancelKey, Frame};

use crate::client::{self, Client};
use crate::harness::{MD5, TRUST};
use crate::script::{Op, Script};

/// How long a read waits for the next bytes while replies are owed. The fake nodes
/// answer at once and the proxy relays in about a millisecond, so this is only spent
/// where no answer comes (a batch without Sync, a Query the server ignores after an
/// error in the batch before it, a Sync swallowed by COPY). A wait cut short on a busy
/// machine only leaves replies for a later read.
const IDLE: Duration = Duration::from_millis(5);

/// Logs in as the script says, runs its operations, reads what is left, and closes
/// (after Terminate when the script says so).
pub async fn play(proxy: SocketAddr, script: &Script) {
    let login = if script.flags.md5 { &MD5 } else { &TRUST };
    let mut c = Client::connect(
        proxy,
        login,
        script.flags.ssl_request,
        Duration::from_secs(5),
    )
    .await
    .unwrap_or_else(|e| panic!("the proxy refused the session's login: {e:?}"));
    for op in &script.ops {
        if c.closed {
            break;
        }
        match op {
            Op::Message { bytes, ready } => {
                c.pending.extend_from_slice(bytes);
                c.owed += usize::from(*ready);
            }
            Op::Send { chunk } => c.send(*chunk).await,
            Op::Read => {
                c.send(0).await;
                c.settle(IDLE).await;
            }
            Op::Cancel { right_key } => {
                c.send(0).await;
                if let Some(key) = c.key {
                    client::cancel(proxy, cancel_key(key, *right_key)).await;
                }
            }
        }
        trace(op, &c.take_received());
    }
    // Read what is still on its way, to check its framing too.
    c.send(0).await;
    c.settle(IDLE).await;
    if script.flags.terminate && !c.closed {
        c.pending = build::terminate().to_vec();
        c.send(0).await;
    }
}

/// With `PGFRESH_FUZZ_TRACE` set, prints each operation and what came back during it,
/// to read what a crashing input does.
fn trace(op: &Op, received: &[Frame]) {
    static ON: OnceLock<Option<Instant>> = OnceLock::new();
    let Some(start) =
        ON.get_or_init(|| std::env::var_os("PGFRESH_FUZZ_TRACE").map(|_| Instant::now()))
    else {
        return;
    };
    eprintln!("{:>6} ms > {op:?}", start.elapsed().as_millis());
    for f in received {
        eprintln!(
            "< {} {:?}",
            f.tag as char,
            String::from_utf8_lossy(f.body())
        );
    }
}

fn cancel_key(key: CancelKey, right: bool) -> CancelKey {
    if right {
        key
    } else {
        CancelKey {
            pid: key.pid,
            secret: key.secret ^ 1,
        }
    }
}
