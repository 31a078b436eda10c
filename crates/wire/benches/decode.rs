//! Cost of framing and inspecting the messages on the proxy's hot path.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pgfresh_wire::bytes::{Bytes, BytesMut};
use pgfresh_wire::{
    build, decode_backend, decode_frontend, parse_backend, parse_frontend, BackendMessage, Decoded,
    FrontendMessage, Limits, TxStatus,
};

/// One extended-protocol round as pgbench -M prepared sends it.
fn client_batch() -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&build::bind("", "P_0", &[0], &[Some(b"12345")], &[]));
    b.extend_from_slice(&build::describe(b'P', ""));
    b.extend_from_slice(&build::execute("", 0));
    b.extend_from_slice(&build::sync());
    b.freeze()
}

/// A server reply: row description, 10 rows, completion, ready.
fn server_reply() -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&[b'T', 0, 0, 0, 33, 0, 1]);
    b.extend_from_slice(b"abalance\0\0\0\0\0\0\0\0\0\0\x17\0\x04\xff\xff\xff\xff\0\0");
    for _ in 0..10 {
        b.extend_from_slice(&[b'D', 0, 0, 0, 15, 0, 1, 0, 0, 0, 5]);
        b.extend_from_slice(b"-4711");
    }
    b.extend_from_slice(&build::command_complete("SELECT 10"));
    b.extend_from_slice(&build::ready_for_query(TxStatus::Idle));
    b.freeze()
}

fn bench(c: &mut Criterion) {
    let limits = Limits::default();
    let batch = client_batch();
    let mut g = c.benchmark_group("frontend");
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("decode+parse pgbench prepared batch", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(&batch[..]);
            let mut syncs = 0;
            while let Ok(Decoded::Frame(f)) = decode_frontend(&mut buf, &limits) {
                if let Ok(FrontendMessage::Sync) = parse_frontend(&f) {
                    syncs += 1;
                }
            }
            syncs
        })
    });
    g.finish();

    let reply = server_reply();
    let mut check = BytesMut::from(&reply[..]);
    let mut frames = 0;
    while let Ok(Decoded::Frame(_)) = decode_backend(&mut check, &limits) {
        frames += 1;
    }
    assert_eq!(
        (frames, check.len()),
        (13, 0),
        "benchmark input is well framed"
    );
    let mut g = c.benchmark_group("backend");
    g.throughput(Throughput::Bytes(reply.len() as u64));
    g.bench_function("decode+parse 10-row reply", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(&reply[..]);
            let mut ready = 0;
            while let Ok(Decoded::Frame(f)) = decode_backend(&mut buf, &limits) {
                if let Ok(BackendMessage::ReadyForQuery(_)) = parse_backend(&f) {
                    ready += 1;
                }
            }
            ready
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
