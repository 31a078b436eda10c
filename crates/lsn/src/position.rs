//! Timeline-qualified WAL positions: the `TLI/X/Y` tokens applications carry.

use std::fmt;
use std::str::FromStr;

use crate::{parse_exact, Lsn};

/// A WAL position on a given timeline, written `TLI/X/Y`: the timeline id in decimal,
/// then the LSN in PostgreSQL's `X/Y` hexadecimal form, so two `/` in all:
/// `1/0/16B3748` is LSN `0/16B3748` on timeline 1 (a bare `1/16B3748` is an LSN, see
/// [`parse_token_or_lsn`]). The timeline is never 0 (PostgreSQL's timelines start at 1).
///
/// ```
/// use pgfresh_lsn::{Lsn, Position};
/// let p: Position = "2/0/3000060".parse().unwrap();
/// assert_eq!(p, Position::new(2, Lsn(0x300_0060)).unwrap());
/// assert_eq!(p.to_string(), "2/0/3000060");
/// assert!("00000002/0/3000060".parse::<Position>().is_err()); // leading zeros: hex or decimal?
/// ```
///
/// Equality is exact. The order (derived: timeline, then LSN, both as numbers) is a
/// total order for sorting and maps; it is WAL order only within one timeline. Whether a
/// position on one timeline is contained in another timeline depends on where the
/// timelines forked, which only the timeline history says (the balancer's
/// `ClusterView::translate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    tli: u32,
    lsn: Lsn,
}

impl Position {
    /// The position `lsn` on timeline `tli`; `None` for timeline 0, which does not exist.
    pub fn new(tli: u32, lsn: Lsn) -> Option<Position> {
        (tli != 0).then_some(Position { tli, lsn })
    }

    /// The timeline id (never 0).
    pub fn tli(self) -> u32 {
        self.tli
    }

    /// The WAL position on that timeline.
    pub fn lsn(self) -> Lsn {
        self.lsn
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tli, self.lsn)
    }
}

/// The text is not a position token (or, for [`parse_token_or_lsn`], not an LSN either).
///
/// Its message names the input, what was wrong and the expected form:
/// `invalid position token "abc": expected TLI/X/Y such as 1/0/16B3748 (no '/' separators)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid position token {input:?}: expected {expected} ({reason})")]
pub struct ParsePositionError {
    input: String,
    expected: &'static str,
    reason: &'static str,
}

impl ParsePositionError {
    /// The text that was rejected, as given.
    pub fn input(&self) -> &str {
        &self.input
    }

    /// What was wrong with it, in a few words (`timeline 0 does not exist`).
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

const EXPECT_TOKEN: &str = "TLI/X/Y such as 1/0/16B3748";
const EXPECT_EITHER: &str = "TLI/X/Y such as 1/0/16B3748, or X/Y such as 0/16B3748";

impl FromStr for Position {
    type Err = ParsePositionError;

    /// Strict `TLI/X/Y`: surrounding whitespace is ignored; anything else out of form is
    /// an error — missing or extra parts, a timeline that is not plain decimal (no sign, no
    /// leading zeros, which would read a WAL file name's hexadecimal `00000010` as ten), a
    /// timeline of 0 or past `u32`, LSN halves that are not 1 to 8 hexadecimal digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParsePositionError {
            input: s.to_string(),
            expected: EXPECT_TOKEN,
            reason,
        };
        let text = s.trim();
        match text.bytes().filter(|&b| b == b'/').count() {
            2 => {}
            0 => return Err(err("no '/' separators")),
            1 => return Err(err("missing the timeline or one LSN half")),
            _ => return Err(err("too many '/' separators")),
        }
        let (tli, lsn) = text
            .split_once('/')
            .ok_or_else(|| err("no '/' separators"))?;
        parse_parts(tli, lsn).map_err(err)
    }
}

fn parse_parts(tli: &str, lsn: &str) -> Result<Position, &'static str> {
    let tli = parse_tli(tli)?;
    let lsn = parse_exact(lsn).ok_or("the LSN halves must be 1 to 8 hexadecimal digits")?;
    Ok(Position { tli, lsn })
}

fn parse_tli(s: &str) -> Result<u32, &'static str> {
    if s.is_empty() {
        return Err("the timeline is missing");
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the timeline must be a decimal number");
    }
    if s == "0" {
        return Err("timeline 0 does not exist");
    }
    if s.starts_with('0') {
        return Err("the timeline must be decimal without leading zeros");
    }
    s.parse::<u32>()
        .map_err(|_| "the timeline is larger than 4294967295")
}

/// What a client-carried position says: a position on a named timeline, or a bare LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenOrLsn {
    /// `TLI/X/Y`: the position on that timeline.
    Token(Position),
    /// `X/Y` without a timeline: taken to be on the timeline current when it is used
    /// (the primary's). It cannot tell a write lost in a failover from one that was
    /// kept; tokens with a timeline can.
    Lsn(Lsn),
}

impl From<Position> for TokenOrLsn {
    fn from(p: Position) -> Self {
        TokenOrLsn::Token(p)
    }
}

impl From<Lsn> for TokenOrLsn {
    fn from(l: Lsn) -> Self {
        TokenOrLsn::Lsn(l)
    }
}

/// Reads a client-carried position: `TLI/X/Y` ([`Position`], by the same strict rules as
/// its `FromStr`) or a bare `X/Y` ([`Lsn`], 1 to 8 hexadecimal digits per half), told
/// apart by the number of `/`. Surrounding whitespace is ignored.
///
/// ```
/// use pgfresh_lsn::{parse_token_or_lsn, Lsn, Position, TokenOrLsn};
/// assert_eq!(
///     parse_token_or_lsn("3/0/3000060").unwrap(),
///     TokenOrLsn::Token(Position::new(3, Lsn(0x300_0060)).unwrap())
/// );
/// assert_eq!(parse_token_or_lsn(" 0/3000060 ").unwrap(), TokenOrLsn::Lsn(Lsn(0x300_0060)));
/// assert!(parse_token_or_lsn("3").is_err());
/// ```
pub fn parse_token_or_lsn(s: &str) -> Result<TokenOrLsn, ParsePositionError> {
    let err = |reason| ParsePositionError {
        input: s.to_string(),
        expected: EXPECT_EITHER,
        reason,
    };
    let text = s.trim();
    match text.bytes().filter(|&b| b == b'/').count() {
        0 => Err(err("no '/' separators")),
        1 => parse_exact(text)
            .map(TokenOrLsn::Lsn)
            .ok_or_else(|| err("the LSN halves must be 1 to 8 hexadecimal digits")),
        2 => {
            let (tli, lsn) = text
                .split_once('/')
                .ok_or_else(|| err("no '/' separators"))?;
            parse_parts(tli, lsn).map(TokenOrLsn::Token).map_err(err)
        }
        _ => Err(err("too many '/' separators")),
    }
}

impl serde::Serialize for Position {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Position {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pos(tli: u32, lsn: u64) -> Position {
        Position::new(tli, Lsn(lsn)).unwrap()
    }

    #[test]
    fn parses_and_formats() {
        assert_eq!(
            "1/0/16B3748".parse::<Position>().unwrap(),
            pos(1, 0x16B_3748)
        );
        assert_eq!(
            " 2/0/3000060\n".parse::<Position>().unwrap(),
            pos(2, 0x300_0060)
        );
        assert_eq!(
            "4294967295/FFFFFFFF/FFFFFFFF".parse::<Position>().unwrap(),
            pos(u32::MAX, u64::MAX)
        );
        assert_eq!("12/a/b".parse::<Position>().unwrap().to_string(), "12/A/B");
        for text in [
            "1/0/0",
            "1/0/16B3748",
            "37/16/B374D848",
            "4294967295/FFFFFFFF/FFFFFFFF",
        ] {
            assert_eq!(text.parse::<Position>().unwrap().to_string(), text);
        }
        assert_eq!(Position::new(0, Lsn(1)), None);
        let p = pos(7, 0x10);
        assert_eq!((p.tli(), p.lsn()), (7, Lsn(0x10)));
    }

    #[test]
    fn rejects_malformed_tokens_with_the_expected_form() {
        for (bad, reason) in [
            ("", "no '/' separators"),
            ("abc", "no '/' separators"),
            ("1/16B3748", "missing the timeline or one LSN half"),
            ("1/2/3/4", "too many '/' separators"),
            ("/0/1", "the timeline is missing"),
            ("0/0/1", "timeline 0 does not exist"),
            (
                "01/0/1",
                "the timeline must be decimal without leading zeros",
            ),
            (
                "00000002/0/1",
                "the timeline must be decimal without leading zeros",
            ),
            ("A/0/1", "the timeline must be a decimal number"),
            ("+1/0/1", "the timeline must be a decimal number"),
            ("-1/0/1", "the timeline must be a decimal number"),
            (
                " 1/0/1x",
                "the LSN halves must be 1 to 8 hexadecimal digits",
            ),
            ("x1/0/1", "the timeline must be a decimal number"),
            ("1 /0/1", "the timeline must be a decimal number"),
            ("1/ 0/1", "the LSN halves must be 1 to 8 hexadecimal digits"),
            ("1/0/", "the LSN halves must be 1 to 8 hexadecimal digits"),
            ("1//1", "the LSN halves must be 1 to 8 hexadecimal digits"),
            (
                "1/123456789/0",
                "the LSN halves must be 1 to 8 hexadecimal digits",
            ),
            (
                "1/0/123456789",
                "the LSN halves must be 1 to 8 hexadecimal digits",
            ),
            ("4294967296/0/1", "the timeline is larger than 4294967295"),
            (
                "99999999999999999999/0/1",
                "the timeline is larger than 4294967295",
            ),
        ] {
            let e = bad.parse::<Position>().unwrap_err();
            assert_eq!(e.reason(), reason, "{bad:?}");
            assert_eq!(e.input(), bad);
            assert!(
                e.to_string()
                    .contains("expected TLI/X/Y such as 1/0/16B3748"),
                "{e}"
            );
        }
        assert_eq!(
            "abc".parse::<Position>().unwrap_err().to_string(),
            "invalid position token \"abc\": expected TLI/X/Y such as 1/0/16B3748 \
             (no '/' separators)"
        );
    }

    #[test]
    fn token_or_lsn() {
        assert_eq!(
            parse_token_or_lsn("1/0/16B3748").unwrap(),
            TokenOrLsn::Token(pos(1, 0x16B_3748))
        );
        assert_eq!(
            parse_token_or_lsn(" 1/16B3748 ").unwrap(),
            TokenOrLsn::Lsn(Lsn(0x1_016B_3748))
        );
        for bad in [
            "",
            "16B3748",
            "0/0/0",
            "1/x",
            "1/2/3/4",
            "01/0/1",
            "1/0/1 junk",
        ] {
            let e = parse_token_or_lsn(bad).unwrap_err();
            assert!(
                e.to_string()
                    .contains("expected TLI/X/Y such as 1/0/16B3748, or X/Y such as 0/16B3748"),
                "{e}"
            );
        }
    }

    #[test]
    fn orders_as_numbers() {
        assert!(pos(9, 0) < pos(10, 0));
        assert!(pos(1, 0xFFFF_FFFF) < pos(1, 0x1_0000_0000));
        assert!(pos(1, u64::MAX) < pos(2, 0));
    }

    #[test]
    fn serde_as_text() {
        let p = pos(3, 0x300_0060);
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"3/0/3000060\"");
        assert_eq!(
            serde_json::from_str::<Position>("\"3/0/3000060\"").unwrap(),
            p
        );
        let e = serde_json::from_str::<Position>("\"0/0/1\"").unwrap_err();
        assert!(e.to_string().contains("timeline 0 does not exist"), "{e}");
    }

    proptest! {
        #[test]
        fn round_trips(tli in 1u32.., lsn in any::<u64>()) {
            let p = pos(tli, lsn);
            let text = p.to_string();
            prop_assert_eq!(text.parse::<Position>().unwrap(), p);
            prop_assert_eq!(parse_token_or_lsn(&text).unwrap(), TokenOrLsn::Token(p));
            prop_assert_eq!(parse_token_or_lsn(&Lsn(lsn).to_string()).unwrap(), TokenOrLsn::Lsn(Lsn(lsn)));
            // Lower-case hex and surrounding whitespace read the same.
            let lower = format!("\t{}/{:x}/{:x} ", tli, lsn >> 32, lsn & 0xFFFF_FFFF);
            prop_assert_eq!(lower.parse::<Position>().unwrap(), p);
        }

        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = s.parse::<Position>();
            let _ = parse_token_or_lsn(&s);
        }
    }
}
