//! A TCP relay in front of a node that can stop a server's replies at a chosen point: right
//! after the ReadyForQuery that follows a CommandComplete whose tag starts with a given
//! word (`UPDATE`, `COMMIT`), everything else that server connection sends is kept back
//! until the test opens the gate again. A proxy configured with the relay's port for the
//! node then has a commit's acknowledgement and not what it pipelined after it (its
//! position probe), for as long as the test needs, without timing luck.
//!
//! The relay answers a proxy's SSLRequest itself with `N` (it reads the plain protocol),
//! and runs on a thread of its own, so a test blocked in `start_proxy` while the proxy's
//! monitor logs in through it does not stall it.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The relay; it runs until the test binary ends.
pub struct Gate {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// The tag word the next stop waits for; taken by the connection that stops.
    armed: Mutex<Option<String>>,
    stopped: Notify,
    opened: Notify,
}

/// The protocol codes of SSLRequest and GSSENCRequest.
const ENCRYPTION_REQUESTS: [u32; 2] = [80_877_103, 80_877_104];

impl Gate {
    /// A relay to `127.0.0.1:target`, listening on a port of its own.
    pub fn in_front_of(target: u16) -> Gate {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let relay = shared.clone();
        std::thread::Builder::new()
            .name("test-gate".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the gate's runtime");
                rt.block_on(async move {
                    let listener = TcpListener::bind("127.0.0.1:0").await.expect("gate bind");
                    tx.send(listener.local_addr().expect("gate address").port())
                        .expect("gate port");
                    loop {
                        let Ok((client, _)) = listener.accept().await else {
                            continue;
                        };
                        tokio::spawn(serve(client, target, relay.clone()));
                    }
                });
            })
            .expect("the gate's thread");
        Gate {
            port: rx.recv().expect("the gate's port"),
            shared,
        }
    }

    /// The port a config names for the node.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The next server connection to send a CommandComplete whose tag starts with `word`
    /// stops right after the ReadyForQuery that follows it, until [`Gate::open`].
    pub fn close_after(&self, word: &str) {
        *self.shared.armed.lock().unwrap() = Some(word.to_string());
    }

    /// Waits until a server connection has stopped (see [`Gate::close_after`]).
    pub async fn stopped(&self) {
        self.shared.stopped.notified().await;
    }

    /// Lets the stopped connection go on.
    pub fn open(&self) {
        self.shared.opened.notify_one();
    }
}

/// Relays one connection: the client's bytes as they come, the server's message by
/// message.
async fn serve(mut client: TcpStream, target: u16, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
        return;
    };
    // A request for encryption first is refused here: the relay reads the plain protocol.
    let mut head = [0u8; 8];
    loop {
        if client.read_exact(&mut head).await.is_err() {
            return;
        }
        let code = u32::from_be_bytes(head[4..8].try_into().unwrap());
        if !ENCRYPTION_REQUESTS.contains(&code) {
            break;
        }
        if client.write_all(b"N").await.is_err() {
            return;
        }
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    if server_write.write_all(&head).await.is_err() {
        return;
    }
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    // Server to client, message by message.
    let mut stop_at_ready = None::<String>;
    loop {
        let mut header = [0u8; 5];
        if server_read.read_exact(&mut header).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
        let mut message = header.to_vec();
        message.resize(1 + len, 0);
        if server_read.read_exact(&mut message[5..]).await.is_err() {
            return;
        }
        if header[0] == b'C' {
            let mut armed = shared.armed.lock().unwrap();
            if armed
                .as_deref()
                .is_some_and(|word| message[5..].starts_with(word.as_bytes()))
            {
                stop_at_ready = armed.take();
            }
        }
        if client_write.write_all(&message).await.is_err() {
            return;
        }
        if header[0] == b'Z' && stop_at_ready.take().is_some() {
            shared.stopped.notify_one();
            shared.opened.notified().await;
        }
    }
}
