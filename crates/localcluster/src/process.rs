//! Running the PostgreSQL tools, as an unprivileged user when the caller is root.
//!
//! PostgreSQL refuses to run its server as root. When this process is root, every
//! server-side tool (`initdb`, `pg_ctl`, `pg_basebackup`, `psql`) is run as the
//! `postgres` OS user through `runuser`, in a directory that user owns.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::error::ClusterError;

/// Environment variables that would silently change where the tools connect or what they do.
const PG_ENV: &[&str] = &[
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGDATABASE",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGOPTIONS",
    "PGSSLMODE",
    "PGDATA",
    "PGTARGETSESSIONATTRS",
    "PGAPPNAME",
];

/// The OS account the server processes run as, when this process is root.
pub(crate) const SERVER_OS_USER: &str = "postgres";

/// Runs PostgreSQL tools from one bin directory, switching user when needed.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub(crate) bin_dir: PathBuf,
    /// `Some(user)` when running as root: tools run as that user via `runuser`.
    pub(crate) run_as: Option<String>,
}

impl Tools {
    /// Finds the server binaries and decides whether to switch user.
    pub(crate) fn discover() -> Result<Tools, ClusterError> {
        let bin_dir = find_bin_dir()?;
        let run_as = if is_root()? {
            Some(SERVER_OS_USER.to_string())
        } else {
            None
        };
        Ok(Tools { bin_dir, run_as })
    }

    /// A command for the tool `name` from the bin directory, wrapped in `runuser` when root.
    pub(crate) fn command(&self, name: &str, cwd: &Path) -> Command {
        let tool = self.bin_dir.join(name);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(tool);
                c
            }
            None => Command::new(tool),
        };
        for var in PG_ENV {
            cmd.env_remove(var);
        }
        cmd.current_dir(cwd).stdin(Stdio::null());
        cmd
    }

    /// Runs a tool to completion and returns its standard output; fails on a non-zero exit.
    pub(crate) fn run(
        &self,
        name: &str,
        cwd: &Path,
        args: &[&str],
    ) -> Result<String, ClusterError> {
        let mut cmd = self.command(name, cwd);
        cmd.args(args);
        let out = output(&mut cmd, &describe(name, args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Runs `cmd`, capturing output, and turns a failed exit into [`ClusterError::Command`].
pub(crate) fn output(cmd: &mut Command, described: &str) -> Result<Output, ClusterError> {
    let out = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| ClusterError::io(format!("running `{described}`"), e))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(ClusterError::Command {
            command: described.to_string(),
            status: out.status.to_string(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// A readable command line with any `password=...` value masked.
pub(crate) fn describe(name: &str, args: &[&str]) -> String {
    let mut s = name.to_string();
    for a in args {
        s.push(' ');
        if a.contains("password=") {
            s.push_str("<conninfo>");
        } else {
            s.push_str(a);
        }
    }
    s
}

fn find_bin_dir() -> Result<PathBuf, ClusterError> {
    if let Some(dir) = std::env::var_os("PGFRESH_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let out = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            ClusterError::Setup(format!(
                "`pg_config --bindir` could not be run ({e}); install the PostgreSQL server \
                 packages or set PGFRESH_PG_BINDIR"
            ))
        })?;
    if !out.status.success() {
        return Err(ClusterError::Setup(format!(
            "`pg_config --bindir` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !dir.join("initdb").exists() || !dir.join("pg_ctl").exists() {
        return Err(ClusterError::Setup(format!(
            "{} has no initdb/pg_ctl; install the PostgreSQL server package or set PGFRESH_PG_BINDIR",
            dir.display()
        )));
    }
    Ok(dir)
}

/// True when the effective user is root (answered once per process).
pub(crate) fn is_root() -> Result<bool, ClusterError> {
    static ROOT: OnceLock<bool> = OnceLock::new();
    if let Some(r) = ROOT.get() {
        return Ok(*r);
    }
    let uid = id_number(&["-u"])?;
    Ok(*ROOT.get_or_init(|| uid == 0))
}

/// Numeric uid and gid of an OS user.
pub(crate) fn user_ids(user: &str) -> Result<(u32, u32), ClusterError> {
    let uid = id_number(&["-u", user]).map_err(|e| {
        ClusterError::Setup(format!(
            "running as root needs the unprivileged OS user `{user}` to run the servers: {e}"
        ))
    })?;
    let gid = id_number(&["-g", user])?;
    Ok((uid, gid))
}

fn id_number(args: &[&str]) -> Result<u32, ClusterError> {
    let out = output(
        Command::new("id").args(args).stdin(Stdio::null()),
        &describe("id", args),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .map_err(|_| ClusterError::Setup(format!("`id {}` printed {text:?}", args.join(" "))))
}
