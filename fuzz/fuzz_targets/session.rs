//! A whole client session through pgfresh, against scripted PostgreSQL nodes (a
//! primary and a replica) in the same process. The input is a script (see
//! `pgfresh_fuzz::script`): messages well-formed or not, split at any point,
//! pipelined or read one batch at a time, cancel requests on a second connection.
//!
//! Findings: a panic anywhere (proxy tasks included: the harness aborts on any
//! panic); a reply that is not a sequence of well-formed server messages; after the
//! session, a fresh client that cannot log in or gets anything but its own answer;
//! a session or a lent server connection that outlives its client.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pgfresh_fuzz::script::Script;
use pgfresh_fuzz::{checks, harness, play};

fuzz_target!(|data: &[u8]| {
    let h = harness::get();
    let script = Script::decode(data);
    let proxy = h.proxy(script.flags.transaction_pool);
    h.rt.block_on(async {
        play::play(proxy.addr, &script).await;
        checks::fresh_client_is_served(proxy).await;
        checks::nothing_left_behind(h).await;
    });
});
