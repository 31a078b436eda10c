//! The analyses of the texts a session sent last, kept at hand: clients repeat the same
//! few statements, and those skip the shared analysis cache's lookup (and the literal
//! shape's allocation).

use std::collections::VecDeque;
use std::sync::Arc;

use pgfresh_sql::{Analysis, Analyzer, Keyed};

/// Texts (with their analyses) a session keeps at hand, newest first.
const RECENT_TEXTS: usize = 8;
/// Longer texts are not kept (a session's share of memory stays small).
const RECENT_TEXT_BYTES: usize = 2048;

#[derive(Default)]
pub(super) struct Texts {
    /// Texts, or literal shapes, and their analyses, newest first.
    recent: VecDeque<(Box<str>, Arc<Analysis>)>,
    /// The literal shape of the text being analysed (its buffer kept between texts).
    shape: String,
}

impl Texts {
    /// The analysis of the text `sql` as it came in a message, `None` when it is not
    /// UTF-8. A text the session sent lately needs no check: it was checked then.
    pub(super) fn analyze_bytes(
        &mut self,
        analyzer: &Analyzer,
        sql: &[u8],
    ) -> Option<Arc<Analysis>> {
        if let Some((_, a)) = self.recent.iter().find(|(t, _)| t.as_bytes() == sql) {
            return Some(a.clone());
        }
        Some(self.analyze(analyzer, std::str::from_utf8(sql).ok()?))
    }

    /// The text `sql` (its bytes up to a NUL, so a Parse's content will do) is one
    /// statement that ends transactions ([`super::state::exits_transaction`]).
    pub(super) fn exits_transaction(&mut self, analyzer: &Analyzer, sql: &[u8]) -> bool {
        let text = sql.split(|b| *b == 0).next().unwrap_or_default();
        self.analyze_bytes(analyzer, text)
            .is_some_and(|a| super::state::exits_transaction(&a))
    }

    /// The analysis of `sql`, from the session's recent texts or from `analyzer`.
    pub(super) fn analyze(&mut self, analyzer: &Analyzer, sql: &str) -> Arc<Analysis> {
        if let Some((_, a)) = self.recent.iter().find(|(t, _)| **t == *sql) {
            return a.clone();
        }
        // A text with literals is rarely sent again as it is (the next call carries other
        // values), but its literal shape is: the shape is kept instead (a shape starts
        // with a mark no text starts with, so the two never meet).
        let shape = pgfresh_sql::shape::literal_shape_into(sql, &mut self.shape)
            .then_some(self.shape.as_str());
        if let Some(s) = shape {
            if let Some((_, a)) = self.recent.iter().find(|(t, _)| **t == *s) {
                return a.clone();
            }
        }
        let (analysis, keyed) = analyzer.analyze_shaped(sql, shape);
        let key = match (keyed, shape) {
            (Keyed::Shape, Some(s)) => s,
            _ => sql,
        };
        if key.len() > RECENT_TEXT_BYTES {
            return analysis;
        }
        if self.recent.len() == RECENT_TEXTS {
            self.recent.pop_back();
        }
        self.recent.push_front((key.into(), analysis.clone()));
        analysis
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_shapes_are_kept_and_found_again() {
        let analyzer = Analyzer::new(Default::default());
        let mut texts = Texts::default();
        let a = texts.analyze(&analyzer, "SELECT * FROM t WHERE id = 1");
        // Another value: the same shape, the same analysis, without the shared cache.
        let hits = analyzer.cache_stats().hits;
        let b = texts.analyze(&analyzer, "SELECT * FROM t WHERE id = 2");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(analyzer.cache_stats().hits, hits);
        let c = texts.analyze(&analyzer, "SELECT * FROM t WHERE id = $1");
        let d = texts.analyze(&analyzer, "SELECT * FROM t WHERE id = $1");
        assert!(Arc::ptr_eq(&c, &d));
        assert_eq!(texts.recent.len(), 2);
        let e = texts.analyze_bytes(&analyzer, b"SELECT * FROM t WHERE id = $1");
        assert!(Arc::ptr_eq(&c, &e.expect("a text sent before")));
        assert!(texts
            .analyze_bytes(&analyzer, &[b'S', 0xff, 0xfe])
            .is_none());
        // A text whose analysis holds only for its own literals is kept as it is.
        texts.analyze(&analyzer, "SET search_path = 'a'");
        assert_eq!(&*texts.recent[0].0, "SET search_path = 'a'");
        for i in 0..2 * RECENT_TEXTS {
            texts.analyze(&analyzer, &format!("SELECT {i} FROM t{i}"));
        }
        assert_eq!(texts.recent.len(), RECENT_TEXTS);
    }
}
