//! Positions in a shard, and Kinesis sequence numbers compared as the big integers they are.
//!
//! Kinesis sequence numbers are decimal strings of up to 129 digits (values up to and beyond
//! 2^128), so they do not fit a `u128` and must not be compared as strings ("9" > "10"). We keep
//! the canonical digits and order by length first, then lexically, which is numeric order.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A non-negative decimal integer of any size, as Kinesis uses for sequence numbers.
///
/// Kinesis sequence numbers are decimal strings of up to 129 digits (values up to and beyond
/// 2^128), so they fit no integer type and must not be compared as strings ("9" > "10"): this
/// type keeps the canonical digits and orders by length first, then lexically, which is numeric
/// order.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SequenceNumber(String);

impl SequenceNumber {
    /// Parses a decimal string. Leading zeros are dropped; anything but ASCII digits is rejected.
    pub fn parse(s: &str) -> Result<Self> {
        if s.is_empty() || s.len() > 256 || !all_digits(s) {
            return Err(Error::InvalidInput(format!(
                "sequence number must be 1 to 256 decimal digits, got {:?}",
                truncate(s)
            )));
        }
        let trimmed = s.trim_start_matches('0');
        Ok(SequenceNumber(if trimmed.is_empty() { "0".to_owned() } else { trimmed.to_owned() }))
    }

    /// The canonical decimal digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether every byte is an ASCII digit. Without an early exit, so the check of a 56-digit
/// Kinesis sequence number (one per record read) compiles to a few vector operations.
fn all_digits(s: &str) -> bool {
    s.bytes().fold(0u8, |bad, b| bad | u8::from(!b.is_ascii_digit())) == 0
}

fn truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

impl From<u64> for SequenceNumber {
    fn from(v: u64) -> Self {
        SequenceNumber(v.to_string())
    }
}

impl From<u128> for SequenceNumber {
    fn from(v: u128) -> Self {
        SequenceNumber(v.to_string())
    }
}

impl FromStr for SequenceNumber {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        SequenceNumber::parse(s)
    }
}

impl TryFrom<String> for SequenceNumber {
    type Error = Error;
    /// As [`SequenceNumber::parse`], keeping the string's buffer when it is canonical already
    /// (no leading zeros): a reader turning every record's sequence number into one does not
    /// copy it.
    fn try_from(s: String) -> Result<Self> {
        if !s.starts_with('0') && s.len() <= 256 && !s.is_empty() && all_digits(&s) {
            return Ok(SequenceNumber(s));
        }
        SequenceNumber::parse(&s)
    }
}

impl From<SequenceNumber> for String {
    fn from(s: SequenceNumber) -> String {
        s.0
    }
}

impl Ord for SequenceNumber {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.len().cmp(&other.0.len()).then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for SequenceNumber {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where in a shard to read from, or how far a lease has got.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Position {
    /// The oldest record still in the shard.
    TrimHorizon,
    /// Only records written after the reader opens.
    Latest,
    /// The first record at or after this wall-clock time, in milliseconds since the Unix epoch.
    AtTimestamp {
        /// Milliseconds since the Unix epoch.
        millis: i64,
    },
    /// Just after this record (a sub-sequence number addresses a record inside a KPL aggregate).
    Sequence {
        /// The Kinesis sequence number.
        seq: SequenceNumber,
        /// The index inside an aggregated record; 0 for plain records.
        #[serde(default)]
        sub: u64,
    },
    /// The shard is closed and every record in it has been processed.
    ShardEnd,
}

impl Position {
    /// A sequence position with sub-sequence 0.
    pub fn sequence(seq: impl Into<SequenceNumber>) -> Self {
        Position::Sequence { seq: seq.into(), sub: 0 }
    }

    /// Whether this is [`Position::ShardEnd`].
    pub fn is_shard_end(&self) -> bool {
        matches!(self, Position::ShardEnd)
    }

    /// How far along a shard this position is: starting points < records < shard end.
    fn rank(&self) -> u8 {
        match self {
            Position::TrimHorizon | Position::Latest | Position::AtTimestamp { .. } => 0,
            Position::Sequence { .. } => 1,
            Position::ShardEnd => 2,
        }
    }

    /// Whether replacing `self` by `next` would move a checkpoint backwards. Starting points are
    /// interchangeable with each other, but once a record is checkpointed nothing before it is
    /// accepted, and nothing is accepted after `ShardEnd` but `ShardEnd`.
    pub fn would_regress_to(&self, next: &Position) -> bool {
        match (self, next) {
            (Position::Sequence { seq: a, sub: sa }, Position::Sequence { seq: b, sub: sb }) => {
                (b, sb) < (a, sa)
            }
            _ => next.rank() < self.rank(),
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::TrimHorizon => f.write_str("TRIM_HORIZON"),
            Position::Latest => f.write_str("LATEST"),
            Position::AtTimestamp { millis } => write!(f, "AT_TIMESTAMP({millis})"),
            Position::Sequence { seq, sub: 0 } => write!(f, "{seq}"),
            Position::Sequence { seq, sub } => write!(f, "{seq}.{sub}"),
            Position::ShardEnd => f.write_str("SHARD_END"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_owned_string_converts_exactly_as_parse_does() {
        let long = "1".repeat(257);
        for s in
            ["123", "0", "000", "0042", "", "12a", "-1", " 1", long.as_str(), "4959033827149025"]
        {
            let owned = SequenceNumber::try_from(s.to_owned());
            match SequenceNumber::parse(s) {
                Ok(p) => assert_eq!(
                    owned.map(|o| o.as_str().to_owned()).ok(),
                    Some(p.as_str().to_owned()),
                    "{s:?}"
                ),
                Err(_) => assert!(owned.is_err(), "{s:?} must be refused"),
            }
        }
    }

    #[test]
    fn sequence_numbers_order_numerically() {
        assert!(seq("9") < seq("10"));
        assert!(seq("0009") < seq("10"));
        assert_eq!(seq("000"), seq("0"));
        let two_128 = "340282366920938463463374607431768211456"; // 2^128, beyond u128
        let max_u128 = u128::MAX.to_string();
        assert!(seq(&max_u128) < seq(two_128));
        assert_eq!(SequenceNumber::from(u128::MAX), seq(&max_u128));
        let kinesis = "49590338271490256608559692538361571095921575989136588898";
        assert!(seq(kinesis) < seq("49590338271490256608559692538361571095921575989136588899"));
    }

    #[test]
    fn bad_sequence_numbers_are_rejected() {
        for bad in ["", "-1", "12a", " 1", "1.5", &"9".repeat(300)] {
            assert!(matches!(SequenceNumber::parse(bad), Err(Error::InvalidInput(_))), "{bad:?}");
        }
        assert!(serde_json::from_str::<SequenceNumber>("\"x1\"").is_err());
    }

    #[test]
    fn checkpoints_never_regress() {
        let a = Position::Sequence { seq: seq("100"), sub: 0 };
        let a2 = Position::Sequence { seq: seq("100"), sub: 2 };
        let b = Position::sequence(seq("99999999999999999999999999999999999999999"));
        let table = [
            (Position::TrimHorizon, a.clone(), false),
            (Position::Latest, Position::TrimHorizon, false),
            (a.clone(), a2.clone(), false),
            (a2.clone(), a.clone(), true),
            (a.clone(), b.clone(), false),
            (b.clone(), a.clone(), true),
            (a.clone(), Position::TrimHorizon, true),
            (a.clone(), a.clone(), false),
            (b.clone(), Position::ShardEnd, false),
            (Position::ShardEnd, b, true),
            (Position::ShardEnd, Position::ShardEnd, false),
        ];
        for (from, to, regress) in table {
            assert_eq!(from.would_regress_to(&to), regress, "{from} -> {to}");
        }
    }

    #[test]
    fn positions_round_trip_through_json() {
        for p in [
            Position::TrimHorizon,
            Position::Latest,
            Position::AtTimestamp { millis: 1_700_000_000_000 },
            Position::Sequence { seq: seq("12345678901234567890123456789012345678901"), sub: 3 },
            Position::ShardEnd,
        ] {
            let json = serde_json::to_string(&p).unwrap_or_default();
            let back: Position = serde_json::from_str(&json).unwrap_or(Position::Latest);
            assert_eq!(back, p, "{json}");
        }
    }
}
