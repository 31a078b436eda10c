//! The floor of a tokio proxy: a byte relay with no parsing, no routing and no pooling
//! (one server connection per client, `copy_bidirectional`), on the same single-threaded
//! runtime pgfresh runs by default. `bench/statement-cost.sh -r` counts its instructions a
//! statement and `bench/pgbench-compare.sh` (target `relay`) its CPU a statement, beside
//! pgfresh's and PgBouncer's.
//!
//!   cargo run --release -p pgfresh-proxy --example bare_relay -- LISTEN_ADDR SERVER_ADDR

use tokio::net::{TcpListener, TcpStream};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(server)) = (args.next(), args.next()) else {
        eprintln!("usage: bare_relay LISTEN_ADDR SERVER_ADDR");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(&listen).await?;
        loop {
            let (mut client, _) = listener.accept().await?;
            let server = server.clone();
            tokio::spawn(async move {
                let Ok(mut upstream) = TcpStream::connect(&server).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    })
}
