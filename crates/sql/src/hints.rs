//! Routing hints in comments.
//!
//! A hint is a word of any comment of the text, wherever the comment stands (before, inside
//! or after the statement):
//!
//! - `pgfresh:primary`, `pgfresh:replica`, `pgfresh:min_lsn=TLI/X/Y` (or `X/Y`), as in
//!   `/* pgfresh:primary */` or `-- pgfresh:replica`;
//! - the sqlcommenter form, a comma-separated `key='value'` list with URL-encoded values, as
//!   ORMs and tracing libraries append it: `/*action='list',pgfresh='replica'*/`,
//!   `/*pgfresh='min_lsn%3D1%2F0%2F16B3748'*/`.
//!
//! Keys and values are matched without regard to ASCII case. Comment markers inside string
//! literals are not comments (the caller passes the comments PostgreSQL's own scanner found),
//! so `SELECT '/* pgfresh:primary */'` carries no hint. When both a primary and a replica
//! hint appear, primary wins; of several `min_lsn` hints the highest position counts.

use percent_encoding::percent_decode_str;

use crate::model::{HintLsn, RouteHint};

/// The hints found in a text's comments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hints {
    pub route: Option<RouteHint>,
    pub min_lsn: Option<HintLsn>,
    /// A `min_lsn=` hint whose position does not parse (the statement must fail).
    pub bad_min_lsn: bool,
}

enum Hint {
    Route(RouteHint),
    MinLsn(HintLsn),
    BadMinLsn,
}

impl Hints {
    fn add(&mut self, hint: Hint) {
        match hint {
            Hint::Route(RouteHint::Primary) => self.route = Some(RouteHint::Primary),
            Hint::Route(RouteHint::Replica) => {
                self.route.get_or_insert(RouteHint::Replica);
            }
            Hint::MinLsn(m) => {
                if self.min_lsn.is_none_or(|old| m.lsn > old.lsn) {
                    self.min_lsn = Some(m);
                }
            }
            Hint::BadMinLsn => self.bad_min_lsn = true,
        }
    }
}

/// The hints in `comments` (each verbatim, with its `/* */` or `--`).
pub(crate) fn hints_in<'a>(comments: impl IntoIterator<Item = &'a str>) -> Hints {
    let mut hints = Hints::default();
    for c in comments {
        let body = c
            .strip_prefix("/*")
            .map(|b| b.strip_suffix("*/").unwrap_or(b))
            .or_else(|| c.strip_prefix("--"))
            .unwrap_or(c);
        for word in body.split(|c: char| c.is_whitespace() || c == ',' || c == ';') {
            if let Some(h) = word_hint(word) {
                hints.add(h);
            }
        }
    }
    hints
}

/// `pgfresh:VALUE`, or sqlcommenter's `pgfresh='VALUE'` (quoted, URL-encoded).
fn word_hint(word: &str) -> Option<Hint> {
    if let Some(v) = strip_prefix_ci(word, "pgfresh:") {
        return value_hint(v);
    }
    let v = strip_prefix_ci(word, "pgfresh=")?;
    let v = v
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or(v);
    let v = v.replace("\\'", "'");
    let v = percent_decode_str(&v).decode_utf8().ok()?;
    value_hint(&v)
}

fn value_hint(v: &str) -> Option<Hint> {
    if v.eq_ignore_ascii_case("primary") {
        Some(Hint::Route(RouteHint::Primary))
    } else if v.eq_ignore_ascii_case("replica") {
        Some(Hint::Route(RouteHint::Replica))
    } else {
        let pos = strip_prefix_ci(v, "min_lsn=")?;
        Some(parse_hint_lsn(pos).map_or(Hint::BadMinLsn, Hint::MinLsn))
    }
}

/// `TLI/X/Y` (timeline in decimal, as PostgreSQL prints timeline ids) or `X/Y`, parsed
/// strictly by [`pgfresh_lsn::parse_token_or_lsn`].
pub fn parse_hint_lsn(s: &str) -> Option<HintLsn> {
    match pgfresh_lsn::parse_token_or_lsn(s).ok()? {
        pgfresh_lsn::TokenOrLsn::Token(p) => Some(HintLsn {
            timeline: Some(p.tli()),
            lsn: p.lsn(),
        }),
        pgfresh_lsn::TokenOrLsn::Lsn(lsn) => Some(HintLsn {
            timeline: None,
            lsn,
        }),
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgfresh_lsn::Lsn;

    fn route(c: &str) -> Option<RouteHint> {
        hints_in([c]).route
    }

    #[test]
    fn words_and_sqlcommenter() {
        use RouteHint::{Primary, Replica};
        let cases: &[(&str, Option<RouteHint>)] = &[
            ("/* pgfresh:primary */", Some(Primary)),
            ("-- PGFRESH:REPLICA", Some(Replica)),
            ("/*pgfresh:replica*/", Some(Replica)),
            ("/* app=web, pgfresh:primary; */", Some(Primary)),
            ("/* app=web */", None),
            ("/* pgfresh:elsewhere */", None),
            ("/* xpgfresh:primary */", None),
            ("/*pgfresh='primary'*/", Some(Primary)),
            ("/*pgfresh='Replica'*/", Some(Replica)),
            ("/*pgfresh=primary*/", Some(Primary)),
            (
                "/*action='list',pgfresh='replica',traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01'*/",
                Some(Replica),
            ),
            (
                "/*controller='index',framework='django%3A4.2',pgfresh='primar%79'*/",
                Some(Primary),
            ),
            ("/*pgfresh='%ZZ'*/", None),
            ("/*route='pgfresh:primary'*/", None),
        ];
        for (c, want) in cases {
            assert_eq!(route(c), *want, "{c}");
        }
    }

    #[test]
    fn primary_wins() {
        let h = hints_in(["/* pgfresh:replica */", "/*pgfresh='primary'*/"]);
        assert_eq!(h.route, Some(RouteHint::Primary));
        let h = hints_in(["/* pgfresh:primary pgfresh:replica */"]);
        assert_eq!(h.route, Some(RouteHint::Primary));
    }

    #[test]
    fn min_lsn() {
        let h = hints_in(["/* pgfresh:min_lsn=1/0/16B3748 */"]);
        assert_eq!(
            h.min_lsn,
            Some(HintLsn {
                timeline: Some(1),
                lsn: Lsn(0x16B_3748)
            })
        );
        assert_eq!(h.route, None);
        let h = hints_in([
            "/*pgfresh='min_lsn%3D2%2F1%2FA0'*/",
            "-- pgfresh:min_lsn=0/B0",
        ]);
        assert_eq!(
            h.min_lsn,
            Some(HintLsn {
                timeline: Some(2),
                lsn: Lsn((1 << 32) | 0xA0)
            })
        );
        for bad in [
            "/* pgfresh:min_lsn= */",
            "/* pgfresh:min_lsn=1/2/3/4 */",
            "/* pgfresh:min_lsn=x/0/1 */",
            "/* pgfresh:min_lsn=G/1 */",
        ] {
            let h = hints_in([bad]);
            assert_eq!(h.min_lsn, None, "{bad}");
            assert!(h.bad_min_lsn, "{bad} must be reported, not ignored");
        }
    }
}
