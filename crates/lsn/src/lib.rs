//! PostgreSQL write-ahead-log positions.
//!
//! An LSN is a 64-bit byte position in the WAL stream. PostgreSQL prints it as two
//! hexadecimal halves, `X/Y` (`16/B374D848`). Comparing the text form is wrong
//! (`9/0` > `10/0` as strings), so every comparison and difference in pgfresh goes
//! through [`Lsn`], which orders as the integer it is.
//!
//! A [`Position`] adds the timeline: the position tokens applications carry are
//! `TLI/X/Y` (`1/16B3748`: timeline 1 in decimal, then the LSN). After a promotion
//! the new primary writes on a new timeline that shares the old one's WAL only up to
//! the switch point, so an LSN alone no longer says which write it names.
//! [`parse_token_or_lsn`] accepts either form.

use std::fmt;
use std::str::FromStr;

mod position;

pub use position::{parse_token_or_lsn, ParsePositionError, Position, TokenOrLsn};

/// A WAL position. `Lsn(0)` is PostgreSQL's `InvalidXLogRecPtr` (`0/0`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid position `0/0`.
    pub const INVALID: Lsn = Lsn(0);

    /// True for `0/0`, which PostgreSQL uses for "unknown".
    pub fn is_invalid(self) -> bool {
        self.0 == 0
    }

    /// Bytes from `other` up to `self`; zero when `other` is at or past `self`.
    ///
    /// `primary.bytes_ahead_of(replica)` is a replica's lag in bytes. It never goes
    /// negative: a replica that reports a position past the primary's (a stale primary
    /// reading) is simply "not behind".
    pub fn bytes_ahead_of(self, other: Lsn) -> u64 {
        self.0.saturating_sub(other.0)
    }
}

/// The text could not be read as `X/Y`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {0:?}: expected two hexadecimal halves like 16/B374D848")]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_exact(s.trim()).ok_or_else(|| ParseLsnError(s.to_string()))
    }
}

/// `X/Y` with nothing around it: two halves of 1 to 8 hexadecimal digits. One pass over
/// the bytes: positions are read for every poll, sample and probe.
pub(crate) fn parse_exact(s: &str) -> Option<Lsn> {
    let mut halves = [0u32; 2];
    let mut digits = [0u8; 2];
    let mut half = 0;
    for &b in s.as_bytes() {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b'/' if half == 0 => {
                half = 1;
                continue;
            }
            _ => return None,
        };
        if digits[half] == 8 {
            return None;
        }
        digits[half] += 1;
        halves[half] = (halves[half] << 4) | u32::from(d);
    }
    (half == 1 && digits[0] > 0 && digits[1] > 0)
        .then(|| Lsn((u64::from(halves[0]) << 32) | u64::from(halves[1])))
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_round_trip() {
        for text in ["0/0", "0/1", "16/B374D848", "FFFFFFFF/FFFFFFFF", "1/0"] {
            let lsn: Lsn = text.parse().unwrap();
            assert_eq!(lsn.to_string(), text);
        }
        assert_eq!("16/B374D848".parse::<Lsn>().unwrap(), Lsn(0x16_B374_D848));
        assert_eq!("a/b".parse::<Lsn>().unwrap().to_string(), "A/B");
        assert_eq!("00000000/00000001".parse::<Lsn>().unwrap(), Lsn(1));
        assert_eq!(" 1/0\n".parse::<Lsn>().unwrap(), Lsn(1 << 32));
    }

    #[test]
    fn orders_numerically_not_as_text() {
        let nine: Lsn = "9/0".parse().unwrap();
        let ten: Lsn = "10/0".parse().unwrap();
        assert!(nine < ten);
        assert!("0/FFFFFFFF".parse::<Lsn>().unwrap() < "1/0".parse::<Lsn>().unwrap());
    }

    #[test]
    fn lag_never_negative() {
        let primary = Lsn(1000);
        let replica = Lsn(400);
        assert_eq!(primary.bytes_ahead_of(replica), 600);
        // The inverted subtraction must not wrap around or go negative.
        assert_eq!(replica.bytes_ahead_of(primary), 0);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "/",
            "1/",
            "/1",
            "1",
            "g/0",
            "1/2/3",
            "123456789/0",
            "-1/0",
            "1 /0",
            "0/123456789",
            "+1/0",
            "1/0 0",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
    }
}
