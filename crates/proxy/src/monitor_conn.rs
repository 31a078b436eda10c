//! pgfresh's own connections to a node as the `[monitor]` user (catalog reads: function
//! volatility, dependencies; lost-commit checks) or as `[auth] auth_user` (`auth_query`).
//! Never taken from the client pools.

use std::sync::Arc;
use std::time::Duration;

use crate::context::Shared;

/// An open connection; [`MonitorConn::close`] ends it.
pub struct MonitorConn {
    pub client: tokio_postgres::Client,
    task: tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
}

impl MonitorConn {
    /// Connect to `node` (or the primary when `None`) as the monitor user, to database
    /// `db` (default: `[monitor] database`). Errors carry the server's own message and
    /// SQLSTATE, or the I/O reason, and name the address.
    pub async fn open(
        shared: &Shared,
        node: Option<usize>,
        db: Option<&str>,
        application: &str,
    ) -> Result<MonitorConn, String> {
        let config = shared.config.snapshot();
        let monitor = &config.monitor;
        let db = db.unwrap_or(&monitor.database);
        Self::open_as(
            shared,
            node,
            db,
            application,
            &monitor.user,
            &monitor.password,
        )
        .await
    }

    /// As [`MonitorConn::open`] to the primary, with every notification the connection
    /// receives (after a `LISTEN` on it) waking `heard` (coalesced: one wake-up may stand
    /// for several notifications).
    pub async fn open_listening(
        shared: &Shared,
        db: &str,
        application: &str,
        heard: Arc<tokio::sync::Notify>,
    ) -> Result<MonitorConn, String> {
        let config = shared.config.snapshot();
        let m = &config.monitor;
        Self::connect(
            shared,
            None,
            db,
            application,
            &m.user,
            &m.password,
            Some(heard),
        )
        .await
    }

    /// As [`MonitorConn::open`], logging in as `user` with `password`.
    pub async fn open_as(
        shared: &Shared,
        node: Option<usize>,
        db: &str,
        application: &str,
        user: &str,
        password: &str,
    ) -> Result<MonitorConn, String> {
        Self::connect(shared, node, db, application, user, password, None).await
    }

    async fn connect(
        shared: &Shared,
        node: Option<usize>,
        db: &str,
        application: &str,
        user: &str,
        password: &str,
        heard: Option<Arc<tokio::sync::Notify>>,
    ) -> Result<MonitorConn, String> {
        let config = shared.config.snapshot();
        let node = match node {
            Some(n) => n,
            None => shared.balancer.primary().ok_or("no primary is known")?,
        };
        let view = shared.balancer.view();
        let spec = &view.node(node).ok_or("node not configured")?.spec;
        let address = format!("{}:{}", spec.host, spec.port);
        let tls = spec.tls.clone();
        let mut pg = tokio_postgres::Config::new();
        pg.host(&spec.host)
            .port(spec.port)
            .user(user)
            .password(password)
            .dbname(db)
            .application_name(application)
            .connect_timeout(Duration::from_millis(config.monitor.connect_timeout_ms));
        drop(view);
        let c = pgfresh_nodetls::pg::connect(&mut pg, &tls)
            .await
            .map_err(|e| {
                format!(
                    "connect to {address}: {}",
                    pgfresh_balancer::describe_connect_error(&e)
                )
            })?;
        let task = match heard {
            None => tokio::spawn(c.connection),
            Some(heard) => {
                let mut connection = c.connection;
                tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => {
                                heard.notify_one();
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => return Err(e),
                            None => return Ok(()),
                        }
                    }
                })
            }
        };
        Ok(MonitorConn {
            client: c.client,
            task,
        })
    }

    /// Close the connection and wait for it to end.
    pub async fn close(self) {
        drop(self.client);
        let _ = self.task.await;
    }
}
