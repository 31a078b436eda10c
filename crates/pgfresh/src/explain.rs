//! `pgfresh explain SQL`: the analysis and the routing decision, without a cluster.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use pgfresh_config::Config;
use pgfresh_proxy::router::{decide, RouteCtx, SessionView, Target};
use pgfresh_recency::{RecencyConfig, RecencyMap, SystemClock};
use pgfresh_sql::{analyze_uncached, FunctionPolicy};

pub fn explain(config_path: &Path, sql: &str) -> ExitCode {
    // The config is optional: without one, defaults apply.
    let config = pgfresh_config::load_file(config_path).unwrap_or_else(|_| {
        pgfresh_config::parse_str(
            "[[nodes]]\nname = \"primary\"\nhost = \"127.0.0.1\"\nport = 5432\n",
        )
        .unwrap_or_else(|e| panic!("built-in default config is invalid: {e}"))
    });
    let analysis = analyze_uncached(sql);
    println!("kind:         {}", analysis.kind.as_str());
    if let Some(err) = &analysis.error {
        println!("parse error:  {err}");
    }
    let names = |v: &[pgfresh_sql::RelName]| {
        v.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("reads:        {}", names(&analysis.reads));
    println!("writes:       {}", names(&analysis.writes));
    let funcs = analysis
        .functions
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    println!("functions:    {funcs}");
    let mp = analysis
        .must_primary
        .iter()
        .map(|m| format!("{m:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!("must_primary: {mp}");
    if let Some(h) = &analysis.hint {
        println!("hint:         {h:?}");
    }
    if let Some(m) = &analysis.min_lsn_hint {
        let tli = m.timeline.map(|t| format!("{t}/")).unwrap_or_default();
        println!("min_lsn hint: {tli}{} (not routed on yet)", m.lsn);
    }
    for (i, s) in analysis.statements.iter().enumerate() {
        let mut extra = String::new();
        if let Some(tx) = &s.tx {
            extra.push_str(&format!(" tx={tx:?}"));
        }
        if let Some(se) = &s.session {
            extra.push_str(&format!(" session={se:?}"));
        }
        println!("statement {}: {}{}", i + 1, s.kind.as_str(), extra);
    }
    let d = route(&config, &analysis);
    let target = match d.target {
        Target::Primary => "primary".to_string(),
        Target::Current => "the node the session is using (primary when none)".to_string(),
        Target::Replica { required: None } => "a replica inside the lag thresholds".to_string(),
        Target::Replica { required: Some(l) } => format!("a replica that has replayed {l}"),
        Target::Node(n) => format!("node {n}, which holds what the statement uses"),
    };
    println!("route:        {target}");
    match d.reason.detail() {
        Some(detail) => println!("reason:       {} ({detail})", d.reason.as_str()),
        None => println!("reason:       {}", d.reason.as_str()),
    }
    println!("note:         an autocommit statement in a fresh session, with no relation hot");
    ExitCode::SUCCESS
}

fn route(config: &Config, analysis: &pgfresh_sql::Analysis) -> pgfresh_proxy::router::Decision {
    let recency = RecencyMap::new(
        RecencyConfig {
            ttl_ms: config.routing.recent_access_ttl_ms,
            max_ttl_ms: config.routing.recent_access_max_ttl_ms,
            cold_start_ms: 0,
            ..RecencyConfig::default()
        },
        Arc::new(SystemClock::new()),
    );
    let policy = FunctionPolicy::from_lists(
        &config.routing.write_function_list,
        &config.routing.read_only_function_list,
    )
    .unwrap_or_default();
    let ctx = RouteCtx {
        routing: &config.routing,
        policy: &policy,
        oracle: None,
        recency: &recency,
        database: "postgres",
        deps: None,
    };
    decide(&[analysis], &SessionView::default(), &ctx)
}
