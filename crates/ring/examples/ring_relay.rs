//! What a task-per-client loop costs on this runtime: a byte relay like `uring_relay`
//! (no parsing, one server connection per client), but written as pgfresh's session loop
//! is, one async task a client that waits for either side to have bytes, then reads and
//! writes without waiting. Set beside the hand-written `uring_relay` it says what the
//! executor adds; beside PgBouncer, what a session loop on the ring starts from.
//! `bench/pgbench-compare.sh` runs it as the target `ring-exec-relay`.
//!
//!   cargo run --release -p pgfresh-ring --example ring_relay -- LISTEN_ADDR SERVER_ADDR

use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::task::Poll;

use pgfresh_ring::{spawn, Runtime, TcpListener, TcpStream};

/// Moves what `from` received to `to`; `false` once `from` has closed.
fn pass(from: &TcpStream, to: &TcpStream, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    match from.try_read_buf(buf) {
        Ok(0) => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
        Err(e) => return Err(e),
    }
    let mut at = 0;
    while at < buf.len() {
        at += to.try_write(&buf[at..])?;
    }
    Ok(true)
}

async fn relay(client: TcpStream, server: SocketAddr) -> io::Result<()> {
    let server = TcpStream::connect(server).await?;
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        poll_fn(|cx| {
            let c = client.poll_read_ready(cx).is_ready();
            let s = server.poll_read_ready(cx).is_ready();
            if c || s {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        if !pass(&client, &server, &mut buf)? || !pass(&server, &client, &mut buf)? {
            return Ok(());
        }
        // Never more than the send queue's bound in flight: a client that stops reading
        // holds its relay here rather than growing its queue.
        if client.unsent() >= pgfresh_ring::SEND_LIMIT {
            client.writable().await?;
        }
        if server.unsent() >= pgfresh_ring::SEND_LIMIT {
            server.writable().await?;
        }
    }
}

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(server)) = (args.next(), args.next()) else {
        eprintln!("usage: ring_relay LISTEN_ADDR SERVER_ADDR");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().map_err(io::Error::other)?;
    let server: SocketAddr = server.parse().map_err(io::Error::other)?;
    let rt = Runtime::new(1024)?;
    rt.block_on(async move {
        let listener = TcpListener::bind(listen)?;
        loop {
            let (client, _) = listener.accept().await?;
            spawn(async move {
                if let Err(e) = relay(client, server).await {
                    eprintln!("ring_relay: {e}");
                }
            });
        }
    })
}
