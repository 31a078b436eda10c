//! A watchdog process that tears a cluster down after this process exits.
//!
//! Statics are never dropped, so a cluster held in one (see
//! [`crate::LocalCluster::shared`]) would outlive the test process. Each cluster therefore
//! starts a small shell loop in its own process group that waits for this process to end,
//! stops every server still running in the cluster directory (SIGQUIT: immediate shutdown)
//! and removes the directory. For a cluster that was dropped normally it finds nothing left
//! to do.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

const SCRIPT: &str = r#"
while kill -0 "$1" 2>/dev/null; do sleep 1; done
for f in "$2"/node*/postmaster.pid; do
  [ -f "$f" ] && kill -QUIT "$(head -n 1 "$f")" 2>/dev/null
done
n=0
while [ "$n" -lt 50 ] && ls "$2"/node*/postmaster.pid >/dev/null 2>&1; do
  sleep 0.2; n=$((n+1))
done
rm -rf "$2"
"#;

/// Starts the watchdog for the cluster in `dir`. Failing to start it is not fatal: the
/// cluster still cleans up on drop.
pub(crate) fn spawn(dir: &Path) {
    let spawned = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("pgfresh-cluster-reaper")
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C aimed at the tests does not stop the cleanup.
        .process_group(0)
        .spawn();
    // The child is deliberately not waited for; it outlives this process.
    drop(spawned);
}
