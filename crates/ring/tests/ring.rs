//! The ring runtime against real sockets: echo, lost wake-ups, cancellation, errors.

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use pgfresh_ring::{sleep, spawn, turn_now, Runtime, TcpListener, TcpStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Serves echo on a new listener; returns its address.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind(local()).unwrap();
    let addr = listener.local_addr().unwrap();
    spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            spawn(async move {
                let mut s = s;
                let mut buf = vec![0u8; 8192];
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn many_connections_echo_many_rounds() {
    let rt = Runtime::new(256).unwrap();
    rt.block_on(async {
        let addr = echo_server();
        let mut clients = Vec::new();
        for c in 0..16u32 {
            clients.push(spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                for round in 0..200u32 {
                    let msg = format!("client {c} round {round}");
                    s.write_all(msg.as_bytes()).await.unwrap();
                    let mut back = vec![0u8; msg.len()];
                    s.read_exact(&mut back).await.unwrap();
                    assert_eq!(back, msg.as_bytes());
                }
                c
            }));
        }
        let mut done = Vec::new();
        for h in clients {
            done.push(h.await);
        }
        assert_eq!(done, (0..16).collect::<Vec<_>>());
    });
}

#[test]
fn a_read_future_dropped_by_a_select_loses_nothing() {
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async {
        let addr = echo_server();
        let s = TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::new();
        let mut sent = Vec::new();
        for i in 0..50u8 {
            // The receive is posted, then its future dropped when the timer wins.
            let mut timer = pin!(sleep(Duration::from_micros(50)));
            let mut readable = pin!(s.readable());
            poll_fn(|cx| {
                if readable.as_mut().poll(cx).is_ready() || timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                Poll::Pending
            })
            .await;
            s.try_write(&[i]).unwrap();
            sent.push(i);
            drain(&s, &mut got);
        }
        while got.len() < sent.len() {
            s.readable().await.unwrap();
            drain(&s, &mut got);
        }
        assert_eq!(got, sent);
    });
}

/// Everything `s` receives until the peer closes.
async fn read_to_end(s: &TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        s.readable().await.unwrap();
        match s.try_read_buf(&mut got) {
            Ok(0) => return got,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
}

fn drain(s: &TcpStream, into: &mut Vec<u8>) {
    loop {
        match s.try_read_buf(into) {
            Ok(0) => panic!("echo server closed"),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn more_than_the_send_limit_goes_out_whole_and_in_order() {
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(local()).unwrap();
        let addr = listener.local_addr().unwrap();
        let total = 4 * pgfresh_ring_limit() + 12_345;
        let reader = spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut all = Vec::new();
            let mut chunk = vec![0u8; 1000];
            // (The writer meets a full queue whatever this does: it queues without
            // yielding until `try_write` answers WouldBlock.)
            loop {
                let n = s.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return all;
                }
                all.extend_from_slice(&chunk[..n]);
            }
        });
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut would_block = 0;
        let mut at = 0;
        while at < data.len() {
            match s.try_write(&data[at..(at + 70_000).min(data.len())]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    would_block += 1;
                    s.writable().await.unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        }
        s.shutdown().await.unwrap();
        assert_eq!(s.unsent(), 0);
        let got = reader.await;
        assert!(would_block > 0, "the queue never filled");
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes reordered or changed");
    });
}

fn pgfresh_ring_limit() -> usize {
    pgfresh_ring::SEND_LIMIT
}

#[test]
fn end_of_stream_and_refused_connections_are_reported() {
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(local()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"bye").await.unwrap();
            s.flush().await.unwrap();
            drop(s);
        });
        let s = TcpStream::connect(addr).await.unwrap();
        server.await;
        assert_eq!(read_to_end(&s).await, b"bye");

        // A port bound and never listened on refuses.
        let held = std::net::TcpListener::bind(local()).unwrap();
        let port = held.local_addr().unwrap().port();
        drop(held);
        let refused = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).await;
        assert_eq!(
            refused.unwrap_err().kind(),
            io::ErrorKind::ConnectionRefused
        );
    });
}

#[test]
fn wakes_from_other_threads_reach_a_parked_loop() {
    let rt = Runtime::new(64).unwrap();
    // "PID/task/TID": this thread, which runs the ring's loop.
    let ring_thread = std::fs::read_link("/proc/thread-self").unwrap();
    rt.block_on(async {
        for _ in 0..100 {
            let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
            // Sent once the loop, which has nothing else to do, waits in the ring: only
            // the eventfd can wake it then.
            let ring_thread = ring_thread.clone();
            let t = std::thread::spawn(move || {
                wait_until_asleep(ring_thread);
                tx.send(7).unwrap();
            });
            assert_eq!(rx.await.unwrap(), 7);
            t.join().unwrap();
        }
        // A spawned task woken from another thread as well.
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let h = spawn(async move { rx.await.unwrap() + 1 });
        std::thread::spawn(move || tx.send(41).unwrap());
        assert_eq!(h.await, 42);
    });
}

/// Returns once `thread` (as `/proc/thread-self` names it) sleeps (the ring's loop, parked in
/// `io_uring_enter`: nothing else it does blocks).
fn wait_until_asleep(thread: std::path::PathBuf) {
    let path = std::path::Path::new("/proc").join(thread).join("stat");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stat = std::fs::read_to_string(&path).unwrap();
        // The state follows the command name, which is in parentheses.
        let state = stat.rsplit(')').next().unwrap().trim_start().chars().next();
        if state == Some('S') {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the ring's thread never slept: {stat}"
        );
        std::thread::yield_now();
    }
}

#[test]
fn timers_end_in_deadline_order_and_not_early() {
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let start = Instant::now();
        for ms in [30u64, 10, 20] {
            let tx = tx.clone();
            spawn(async move {
                sleep(Duration::from_millis(ms)).await;
                tx.send((ms, start.elapsed())).unwrap();
            });
        }
        drop(tx);
        let mut order = Vec::new();
        while let Some((ms, elapsed)) = rx.recv().await {
            assert!(elapsed >= Duration::from_millis(ms), "{ms} ms ended early");
            order.push(ms);
        }
        assert_eq!(order, vec![10, 20, 30]);
    });
}

#[test]
fn a_timer_fires_while_every_wait_is_ended_by_a_completion() {
    // A ping-pong with an echo server keeps a completion ready for (nearly) every wait of
    // the loop, before the timer's deadline and long after it: the timer must still fire.
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async {
        let addr = echo_server();
        let fired = std::rc::Rc::new(std::cell::Cell::new(false));
        let f = fired.clone();
        spawn(async move {
            sleep(Duration::from_millis(5)).await;
            f.set(true);
        });
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let mut rounds = 0u64;
        while !fired.get() {
            s.write_all(b"x").await.unwrap();
            s.read_exact(&mut buf).await.unwrap();
            rounds += 1;
            assert!(
                rounds < 2_000_000,
                "the timer did not fire in {rounds} rounds"
            );
        }
    });
}

/// Spins (no await, so within one turn of the ring) until `d` has passed.
fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[test]
fn the_turn_clock_is_read_once_a_turn_and_afresh_the_next() {
    let ms = Duration::from_millis(2);
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async move {
        let first = turn_now();
        spin(ms);
        assert_eq!(turn_now(), first, "the same turn gives the same instant");
        // A task spawned now runs in this turn's batch.
        let other = spawn(async { turn_now() }).await;
        assert_eq!(other, first, "another task in the same turn");
        sleep(ms).await;
        let after_sleep = turn_now();
        assert!(
            after_sleep >= first + 2 * ms,
            "a later turn reads the clock again"
        );
        spin(ms);
        assert_eq!(turn_now(), after_sleep);
    });
    // Off the ring: the clock itself.
    let a = turn_now();
    spin(ms);
    assert!(turn_now() >= a + ms);
}

#[test]
fn a_runtime_dropped_with_tasks_waiting_on_sockets_frees_them() {
    for _ in 0..20 {
        let rt = Runtime::new(64).unwrap();
        let addr = rt.block_on(async {
            let listener = TcpListener::bind(local()).unwrap();
            let addr = listener.local_addr().unwrap();
            // Left waiting: a receive on each end of a connection nobody writes to. Each
            // task says so in the poll that posts its receive.
            let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
            spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                let _ = accepted_tx.send(());
                let _ = s.readable().await;
            });
            let s = TcpStream::connect(addr).await.unwrap();
            let (waiting_tx, waiting) = tokio::sync::oneshot::channel();
            spawn(async move {
                let _ = waiting_tx.send(());
                let _ = s.readable().await;
            });
            accepted.await.unwrap();
            waiting.await.unwrap();
            addr
        });
        drop(rt);
        // The listener went with its task: the port no longer accepts.
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}

#[test]
fn a_stream_used_from_another_thread_errs_there_and_closes_at_home() {
    let rt = Runtime::new(64).unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(local()).unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = spawn(async move { listener.accept().await.unwrap().0 });
        let s = TcpStream::connect(addr).await.unwrap();
        let peer = accepted.await;
        // Posted at home, then handed to another thread.
        let _ = s.try_read(&mut [0u8; 8]);
        let away = std::thread::spawn(move || {
            let w = s.try_write(b"x").unwrap_err();
            let r = s.try_read(&mut [0u8; 8]).unwrap_err();
            drop(s);
            (w.to_string(), r.to_string())
        })
        .join()
        .unwrap();
        assert!(
            away.0.contains("outside the thread of its runtime"),
            "{}",
            away.0
        );
        assert!(
            away.1.contains("outside the thread of its runtime"),
            "{}",
            away.1
        );
        // The drop was carried home: the receive was cancelled and the socket closed.
        assert!(read_to_end(&peer).await.is_empty(), "unexpected bytes");
    });
}

#[test]
fn tokio_timers_and_tasks_serve_a_ring_thread_that_entered_their_runtime() {
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _entered = tokio_rt.enter();
    let rt = Runtime::new(64).unwrap();
    let ring = rt.handle();
    rt.block_on(async move {
        let start = Instant::now();
        // The timer itself is under test: tokio's, fired on tokio's thread, waking this one.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(start.elapsed() >= Duration::from_millis(20));
        // A task on tokio's thread, awaited here; and one it starts back on the ring.
        let back = tokio::spawn(async move {
            let on_ring = ring.spawn(async { std::thread::current().id() });
            on_ring.await
        })
        .await
        .unwrap();
        assert_eq!(back, std::thread::current().id());
        // A timeout from tokio around a ring operation.
        let listener = TcpListener::bind(local()).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(30), listener.accept()).await;
        assert!(
            waited.is_err(),
            "nothing connected, so the accept must time out"
        );
    });
}

#[test]
fn the_runtime_counts_the_tasks_not_yet_ended() {
    let rt = Runtime::new(64).unwrap();
    let handle = rt.handle();
    rt.block_on(async move {
        assert_eq!(handle.tasks(), 0);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiting = spawn(async move {
            let _ = rx.await;
        });
        let done = spawn(async {});
        assert_eq!(handle.tasks(), 2);
        done.await;
        assert_eq!(handle.tasks(), 1);
        tx.send(()).unwrap();
        waiting.await;
        assert_eq!(handle.tasks(), 0);
    });
}

/// A stream dropped with bytes its peer never reads keeps its socket only for the
/// runtime's linger; then the rest is given up and the socket closes.
#[test]
fn a_stream_dropped_unsent_to_a_peer_that_stops_reading_closes_after_the_linger() {
    use std::os::fd::AsRawFd;
    let rt = Runtime::new(64).unwrap();
    rt.set_linger(Duration::from_millis(100));
    let listener = std::net::TcpListener::bind(local()).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.block_on(async {
        let s = TcpStream::connect(addr).await.unwrap();
        // Connected, never read from.
        let (_peer, _) = listener.accept().unwrap();
        let chunk = vec![7u8; 64 * 1024];
        // Until the kernel takes no more: the stream's queue is full and stays so.
        loop {
            match s.try_write(&chunk) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            let mut writable = pin!(s.writable());
            let mut stuck = pin!(sleep(Duration::from_millis(200)));
            let room = poll_fn(|cx| {
                if writable.as_mut().poll(cx).is_ready() {
                    Poll::Ready(true)
                } else if stuck.as_mut().poll(cx).is_ready() {
                    Poll::Ready(false)
                } else {
                    Poll::Pending
                }
            })
            .await;
            if !room {
                break;
            }
        }
        assert!(s.unsent() > 0);
        let fd = format!("/proc/self/fd/{}", s.as_raw_fd());
        let socket = std::fs::read_link(&fd).unwrap();
        drop(s);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::read_link(&fd).ok().as_ref() == Some(&socket) {
            assert!(
                Instant::now() < deadline,
                "the dropped stream's socket is still open"
            );
            sleep(Duration::from_millis(10)).await;
        }
    });
}

/// A stream dropped with bytes still queued, to a peer that reads them all: once they
/// went out and the socket closed, nothing of it is left on the runtime, however long
/// the linger.
#[test]
fn a_dropped_streams_bytes_going_out_leave_nothing_behind_before_the_linger() {
    let rt = Runtime::new(64).unwrap();
    rt.set_linger(Duration::from_secs(3600));
    let handle = rt.handle();
    let listener = std::net::TcpListener::bind(local()).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.block_on(async {
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        // Queued until the kernel takes no more (the peer does not read yet).
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0;
        while s.unsent() == 0 {
            match s.try_write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    sleep(Duration::from_millis(1)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        drop(s);
        // Only the linger's task is left; the peer now reads everything.
        assert_eq!(handle.tasks(), 1);
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut peer, &mut all).unwrap();
            all.len()
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while handle.tasks() > 0 {
            assert!(
                Instant::now() < deadline,
                "the linger's task outlived the stream"
            );
            sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(reader.join().unwrap(), written);
    });
}

#[test]
fn streams_are_named_by_their_index_in_the_ring_and_leave_it_when_dropped() {
    let rt = Runtime::new(64).unwrap();
    let before = rt.registered_sockets();
    let peers = rt.block_on(async {
        let listener = TcpListener::bind(local()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut peers = Vec::new();
        // More rounds than a table of the smallest usual open-files limit (1 024) has
        // entries: indexes are given back and used again.
        for round in 0..1500u32 {
            let (accepted, connected) = tokio::join!(listener.accept(), TcpStream::connect(addr));
            let (mut peer, mut s) = (accepted.unwrap().0, connected.unwrap());
            let msg = format!("round {round}");
            s.write_all(msg.as_bytes()).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            peer.read_exact(&mut back).await.unwrap();
            assert_eq!(back, msg.as_bytes());
            drop(s);
            // The table's reference does not keep the socket open: the peer sees the end.
            let mut rest = Vec::new();
            tokio::select! {
                r = peer.read_to_end(&mut rest) => r.unwrap(),
                () = sleep(Duration::from_secs(10)) => panic!("round {round}: the dropped stream's socket stayed open"),
            };
            assert!(rest.is_empty());
            if round < 3 {
                peers.push(peer);
            }
        }
        peers
    });
    // The three streams kept are in the table (unless the kernel gave the ring none).
    let kept = rt.registered_sockets() - before;
    assert!(kept == 3 || before == 0 && kept == 0, "{kept} in the table");
    rt.block_on(async {
        drop(peers);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rt.registered_sockets() > before && Instant::now() < deadline {
            sleep(Duration::from_millis(1)).await;
        }
    });
    assert_eq!(rt.registered_sockets(), before);
}
