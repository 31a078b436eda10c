//! Feeds arbitrary bytes to the SQL analyzer, as strict UTF-8 (the protocol path) and as lossy
//! UTF-8 (so invalid sequences still reach the parser as text). The analyzer must never panic,
//! must be deterministic, and must never call unparseable text a read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgfresh_sql::{analyze_bytes, analyze_uncached, Kind};

fn check(sql: &str) {
    let a = analyze_uncached(sql);
    match a.kind {
        Kind::Unclassified => assert!(a.error.is_some(), "unclassified without a message"),
        _ => {
            assert!(a.error.is_none(), "classified with an error");
            assert!(!a.statements.is_empty(), "classified without statements");
        }
    }
    for s in &a.statements {
        assert!(s.text_range.0 <= s.text_range.1 && s.text_range.1 <= sql.len());
        assert!(a.kind >= s.kind, "combined verdict below a statement's");
    }
    assert_eq!(a, analyze_uncached(sql), "analysis is not deterministic");
}

fuzz_target!(|data: &[u8]| {
    let strict = analyze_bytes(data);
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(strict, analyze_uncached(text));
        check(text);
    } else {
        assert_eq!(strict.kind, Kind::Unclassified);
        check(&String::from_utf8_lossy(data));
    }
});
