//! Measures the memory one cache entry really takes (resident-set growth while filling the
//! cache with distinct statements) and compares it with the weigher's estimate.
//!
//! Run with `cargo run --release -p pgfresh-sql --example cache_memory`. Each statement shape is
//! measured in a child process of its own (Linux only: reads `/proc/self/statm`).

use pgfresh_sql::{entry_weight, Analyzer, AnalyzerOptions};

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

// `{i}` is in an identifier: texts that differ only in literal values share one entry.
const SHAPES: &[&str] = &[
    "SELECT abalance FROM pgbench_accounts WHERE aid = $1 AND c{i} > 0",
    "SELECT o.id, c.name FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.id{i} = $1",
    "WITH d AS (DELETE FROM queue WHERE id{i} = $1 RETURNING *) INSERT INTO archive SELECT * FROM d",
];

/// Fills a fresh cache with `n` distinct texts of one shape and prints the per-entry figures.
/// Runs in its own process so that memory freed by earlier measurements does not hide growth.
fn measure(shape: &str, n: u64) {
    const WARM: u64 = 2_000;
    let analyzer = Analyzer::new(AnalyzerOptions {
        cache_max_entries: n * 2,
        cache_max_bytes: 1 << 40,
    });
    let texts: Vec<String> = (0..n + WARM)
        .map(|i| shape.replace("{i}", &i.to_string()))
        .collect();
    // Warm the allocator with the parser's temporary allocations before measuring.
    for t in &texts[..WARM as usize] {
        analyzer.analyze(t);
    }
    let before = resident_bytes().unwrap_or(0);
    for t in &texts[WARM as usize..] {
        analyzer.analyze(t);
    }
    let after = resident_bytes().unwrap_or(0);
    let sample = analyzer.analyze(&texts[0]);
    let estimate = entry_weight(&texts[0], &sample);
    let measured = after.saturating_sub(before) / n;
    println!(
        "| `{shape}` | {} | {estimate} | {measured} |",
        texts[0].len()
    );
}

fn main() {
    const N: u64 = 200_000;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.get(1).and_then(|a| a.parse::<usize>().ok()) {
        measure(SHAPES[i], N);
        return;
    }
    println!("| statement shape | key bytes | weigher estimate (B/entry) | measured RSS growth (B/entry) |");
    println!("|---|---|---|---|");
    let exe = std::env::current_exe().expect("path of this executable");
    for i in 0..SHAPES.len() {
        let out = std::process::Command::new(&exe)
            .arg(i.to_string())
            .output()
            .expect("run measurement");
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
}
