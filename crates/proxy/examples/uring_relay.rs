//! What a proxy's system calls cost, measured: a byte relay like `bare_relay` (no parsing,
//! no routing, no pooling, one server connection per client), but on one io_uring instead
//! of epoll and a runtime. Each turn makes one `io_uring_enter` that both hands the kernel
//! every receive and send the last completions called for and waits for the next
//! completion, so with several clients busy one system call stands for the four a
//! statement costs on epoll (two `recvfrom`, two `sendto`). `bench/pgbench-compare.sh`
//! (target `uring-relay`) sets its CPU a statement beside PgBouncer's and the tokio relay's.
//!
//!   cargo run --release -p pgfresh-proxy --example uring_relay -- LISTEN_ADDR SERVER_ADDR
//!
//! Linux 6.1 or later (single issuer, deferred task work).

// The ring takes raw buffer pointers: each buffer stays in its boxed connection, unmoved,
// until every operation that names it has completed (`Pair::ops`).
#![allow(unsafe_code)]

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use io_uring::{opcode, squeue, types, IoUring};

const BUF: usize = 64 * 1024;
const ACCEPT: u64 = u64::MAX;

/// The two directions of a relayed connection.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    /// Bytes from the client to the server.
    Up = 0,
    /// Bytes from the server to the client.
    Down = 1,
}

/// What a completion is for, in its user data: the pair, the direction and the step.
#[derive(Clone, Copy)]
enum Step {
    Recv = 0,
    Send = 1,
}

fn tag(pair: usize, side: Side, step: Step) -> u64 {
    ((pair as u64) << 2) | ((side as u64) << 1) | step as u64
}

fn untag(data: u64) -> (usize, Side, Step) {
    let side = if data & 2 == 0 { Side::Up } else { Side::Down };
    let step = if data & 1 == 0 {
        Step::Recv
    } else {
        Step::Send
    };
    ((data >> 2) as usize, side, step)
}

/// One direction: what was received and how much of it was sent on.
struct Flow {
    buf: Box<[u8]>,
    len: usize,
    sent: usize,
}

struct Pair {
    client: TcpStream,
    server: TcpStream,
    flows: [Flow; 2],
    /// Operations submitted and not completed: the pair is dropped only at zero.
    ops: u32,
    closing: bool,
}

impl Pair {
    /// The socket a direction reads from and the one it writes to.
    fn ends(&self, side: Side) -> (i32, i32) {
        let (c, s) = (self.client.as_raw_fd(), self.server.as_raw_fd());
        match side {
            Side::Up => (c, s),
            Side::Down => (s, c),
        }
    }

    fn recv(&mut self, id: usize, side: Side) -> squeue::Entry {
        let (from, _) = self.ends(side);
        let f = &mut self.flows[side as usize];
        self.ops += 1;
        opcode::Recv::new(types::Fd(from), f.buf.as_mut_ptr(), BUF as u32)
            .build()
            .user_data(tag(id, side, Step::Recv))
    }

    fn send(&mut self, id: usize, side: Side) -> squeue::Entry {
        let (_, to) = self.ends(side);
        let f = &self.flows[side as usize];
        self.ops += 1;
        let rest = &f.buf[f.sent..f.len];
        opcode::Send::new(types::Fd(to), rest.as_ptr(), rest.len() as u32)
            .build()
            .user_data(tag(id, side, Step::Send))
    }

    fn close(&mut self) {
        self.closing = true;
        let _ = self.client.shutdown(std::net::Shutdown::Both);
        let _ = self.server.shutdown(std::net::Shutdown::Both);
    }
}

struct Relay {
    ring: IoUring,
    listener: TcpListener,
    server: String,
    pairs: Vec<Option<Box<Pair>>>,
    /// Entries to submit at the next turn (the queue may be full when they are made).
    pending: Vec<squeue::Entry>,
}

impl Relay {
    fn accept(&self) -> squeue::Entry {
        opcode::Accept::new(
            types::Fd(self.listener.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build()
        .user_data(ACCEPT)
    }

    fn run(&mut self) -> io::Result<()> {
        self.pending.push(self.accept());
        loop {
            {
                let mut sq = self.ring.submission();
                while let Some(e) = self.pending.last() {
                    // SAFETY: every buffer an entry names lives in a boxed pair that is
                    // kept until the entry's completion (see `Pair::ops`).
                    if unsafe { sq.push(e) }.is_err() {
                        break;
                    }
                    self.pending.pop();
                }
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (data, result) in done {
                if data == ACCEPT {
                    self.accepted(result);
                } else {
                    self.completed(data, result);
                }
            }
        }
    }

    fn accepted(&mut self, fd: i32) {
        self.pending.push(self.accept());
        if fd < 0 {
            return;
        }
        use std::os::fd::FromRawFd;
        // SAFETY: the accept completion hands over a new socket that nothing else owns.
        let client = unsafe { TcpStream::from_raw_fd(fd) };
        let Ok(server) = TcpStream::connect(&self.server) else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let flow = || Flow {
            buf: vec![0u8; BUF].into_boxed_slice(),
            len: 0,
            sent: 0,
        };
        let mut pair = Box::new(Pair {
            client,
            server,
            flows: [flow(), flow()],
            ops: 0,
            closing: false,
        });
        let id = match self.pairs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.pairs.push(None);
                self.pairs.len() - 1
            }
        };
        self.pending.push(pair.recv(id, Side::Up));
        self.pending.push(pair.recv(id, Side::Down));
        self.pairs[id] = Some(pair);
    }

    fn completed(&mut self, data: u64, result: i32) {
        let (id, side, step) = untag(data);
        let Some(pair) = self.pairs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        pair.ops -= 1;
        if pair.closing || result <= 0 {
            if !pair.closing {
                pair.close();
            }
            if pair.ops == 0 {
                self.pairs[id] = None;
            }
            return;
        }
        let n = result as usize;
        let next = match step {
            Step::Recv => {
                let f = &mut pair.flows[side as usize];
                f.len = n;
                f.sent = 0;
                pair.send(id, side)
            }
            Step::Send => {
                let f = &mut pair.flows[side as usize];
                f.sent += n;
                if f.sent < f.len {
                    pair.send(id, side)
                } else {
                    pair.recv(id, side)
                }
            }
        };
        self.pending.push(next);
    }
}

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(server)) = (args.next(), args.next()) else {
        eprintln!("usage: uring_relay LISTEN_ADDR SERVER_ADDR");
        std::process::exit(2);
    };
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(1024)?;
    let mut relay = Relay {
        ring,
        listener: TcpListener::bind(&listen)?,
        server,
        pairs: Vec::new(),
        pending: Vec::new(),
    };
    relay.run()
}
