//! Real client programs through pgfresh: psql (including COPY of 100k rows both ways)
//! and pgbench in all three query modes with zero failed transactions.

use std::process::Command;

use pgfresh_tests::*;

fn run(bin: &str, args: &[&str], stdin: Option<&str>) -> String {
    let p = proxy();
    let mut cmd = Command::new(pg_bin(bin));
    cmd.args(args).envs(p.libpq_env());
    let out = if let Some(input) = stdin {
        use std::io::Write;
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    } else {
        cmd.output().unwrap()
    };
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\n{stdout}\n{stderr}"
    );
    stdout + &stderr
}

fn psql(sql: &str) -> String {
    run("psql", &["-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql], None)
        .trim()
        .to_string()
}

#[test]
fn psql_copy_100k_rows_in_and_out() {
    let t = unique("pcopy");
    psql(&format!("CREATE TABLE {t}(id int, v text)"));
    let mut data = String::with_capacity(3_000_000);
    for i in 0..100_000 {
        data.push_str(&format!("{i}\trow number {i}\n"));
    }
    run(
        "psql",
        &[
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            &format!("\\copy {t} FROM STDIN"),
        ],
        Some(&data),
    );
    let sum_in = psql(&format!("/* pgfresh:primary */ SELECT md5(string_agg(id || E'\\t' || v, E'\\n' ORDER BY id)) FROM {t}"));
    let out = run(
        "psql",
        &[
            "-XAtq",
            "-c",
            &format!("\\copy (SELECT * FROM {t} ORDER BY id) TO STDOUT"),
        ],
        None,
    );
    assert_eq!(out, data, "COPY OUT differs from what went in");
    // The same checksum computed by the server over what it stored, and over what came
    // back out through the proxy (loaded again into a second table).
    let t2 = unique("pcopy2");
    psql(&format!("CREATE TABLE {t2}(id int, v text)"));
    run(
        "psql",
        &[
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            &format!("\\copy {t2} FROM STDIN"),
        ],
        Some(&out),
    );
    let sum_out = psql(&format!("/* pgfresh:primary */ SELECT md5(string_agg(id || E'\\t' || v, E'\\n' ORDER BY id)) FROM {t2}"));
    assert_eq!(sum_in, sum_out, "checksums of the rows copied in and out");
    assert_eq!(
        psql(&format!("/* pgfresh:primary */ SELECT count(*) FROM {t2}")),
        "100000"
    );
}

#[test]
fn psql_meta_commands_and_errors() {
    let t = unique("pmeta");
    psql(&format!("CREATE TABLE {t}(id int primary key)"));
    let out = run("psql", &["-X", "-c", &format!("\\d {t}")], None);
    assert!(out.contains("id"), "{out}");
    // An error is reported and the next command in the same session works.
    let out = Command::new(pg_bin("psql"))
        .args([
            "-XAtq",
            "-c",
            "SELECT * FROM no_such_table",
            "-c",
            "SELECT 5",
        ])
        .envs(proxy().libpq_env())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("no_such_table") && text.contains('5'),
        "{text}"
    );
}

#[test]
fn pgbench_all_query_modes_without_failures() {
    // pgbench's own tables, in a database of their own so the tests stay independent.
    let c = cluster();
    c.psql(0, "postgres", "DROP DATABASE IF EXISTS bench")
        .unwrap();
    c.psql(0, "postgres", "CREATE DATABASE bench OWNER app")
        .unwrap();
    let pgbench = |args: &[&str]| proxy().pgbench("bench", args);
    pgbench(&["-i", "-s", "1", "-q"]);
    for mode in ["simple", "extended", "prepared"] {
        for extra in [&["-S"][..], &["-N"][..], &[][..]] {
            let mut args = vec!["-M", mode, "-c", "4", "-j", "2", "-t", "200"];
            args.extend_from_slice(extra);
            let text = pgbench(&args);
            assert!(
                text.contains("number of failed transactions: 0"),
                "{args:?}:\n{text}"
            );
            assert!(
                text.contains("number of transactions actually processed: 800/800"),
                "{args:?}:\n{text}"
            );
        }
    }
}
