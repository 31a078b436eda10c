//! Helpers for tests of the admin side: a small HTTP/1.1 client for the admin API,
//! config-file edits, the admin console through psql, and Prometheus text lookups.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use pgfresh_proxy::admin::samples;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::*;

/// A response from the admin listener.
pub struct HttpReply {
    pub status: u16,
    pub body: String,
}

impl HttpReply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`).
pub async fn http(
    admin: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> HttpReply {
    let mut sock = TcpStream::connect(admin).await.expect("connect admin");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method == "PUT" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    sock.write_all(req.as_bytes()).await.expect("send request");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut raw))
        .await
        .expect("admin answered in time")
        .expect("read response");
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("header/body separator");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "admin replies carry a Content-Length"
    );
    HttpReply {
        status,
        body: body.to_string(),
    }
}

pub async fn get_json(p: &ProxyHandle, path: &str, token: Option<&str>) -> Value {
    let r = http(p.admin, "GET", path, token, None).await;
    assert_eq!(r.status, 200, "GET {path}: {}", r.body);
    r.json()
}

pub async fn status(p: &ProxyHandle) -> Value {
    get_json(p, "/v1/status", None).await
}

/// Replace the config file the way editors and config managers do: write a temp
/// file next to it, then rename it over the original.
pub fn write_config(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).expect("write temp config");
    std::fs::rename(&tmp, path).expect("rename config into place");
}

/// The port of the node that served the statement, and the row count of `table` there.
pub async fn served_by(c: &tokio_postgres::Client, table: &str) -> (u16, i64) {
    let row = crate::simple_row(
        c,
        &format!("SELECT inet_server_port(), (SELECT count(*) FROM {table})"),
    )
    .await;
    (
        row.get(0).and_then(|v| v.parse().ok()).expect("port"),
        row.get(1).and_then(|v| v.parse().ok()).expect("count"),
    )
}

pub fn primary_port(s: &Value) -> u16 {
    let name = s["primary"].as_str().expect("a primary");
    s["nodes"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == name))
        .and_then(|n| n["port"].as_u64())
        .expect("primary port") as u16
}

/// A table that exists on every node, so a read of it can run anywhere.
pub async fn replicated_table(c: &tokio_postgres::Client, prefix: &str) -> String {
    let t = unique(prefix);
    c.batch_execute(&format!("CREATE TABLE {t}(id int)"))
        .await
        .expect("create table");
    for i in 1..cluster().nodes().len() {
        cluster()
            .wait_caught_up(i, Duration::from_secs(30))
            .expect("standby caught up");
    }
    t
}

pub fn proxy_with_ttl(ttl: u64) -> (ProxyHandle, String) {
    // These tests are about the TTL: positions learned by LSN routing would let hot
    // reads leave the primary early, so it is off here (tests/tests/routing.rs covers it).
    let text = config_text(&format!(
        "recent_access_ttl_ms = {ttl}\nlsn_routing = false"
    ));
    (start_proxy(&text), text)
}

pub fn reload_count(s: &Value, result: &str) -> u64 {
    s["config_reloads"][result].as_u64().expect("reload count")
}

pub fn metric_sum(text: &str, name: &str, label: Option<(&str, &str)>) -> f64 {
    samples(text, name)
        .into_iter()
        .filter(|(l, _)| label.is_none_or(|(k, v)| l.get(k).map(String::as_str) == Some(v)))
        .map(|(_, v)| v)
        .sum()
}

/// Poll `/v1/status` every 20 ms until `done` holds (a minute at most); returns it.
pub async fn wait_status(
    p: &ProxyHandle,
    token: Option<&str>,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = get_json(p, "/v1/status", token).await;
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run psql against the proxy's console; returns (success, stdout, stderr).
pub fn console(
    p: &ProxyHandle,
    user: &str,
    password: &str,
    commands: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(pg_bin("psql"));
    cmd.env_clear()
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .args(["-X", "-A", "-F", "|", "-t", "-v", "ON_ERROR_STOP=1"])
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &p.addr.port().to_string(),
            "-U",
            user,
            "-d",
            "pgfresh",
        ]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("run psql");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn console_ok(p: &ProxyHandle, command: &str) -> (Vec<Vec<String>>, String) {
    let (ok, out, err) = console(p, "admin", "admin-pass", &[command]);
    assert!(ok, "{command}: {err}");
    let rows = out
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect();
    (rows, err)
}
