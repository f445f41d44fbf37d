//! KPL aggregation: the format the Kinesis Producer Library packs many user records into one
//! Kinesis record with, and its reverse.
//!
//! An aggregated record is the 4 magic bytes `F3 89 9A C2`, a protobuf `AggregatedRecord` (tables
//! of partition keys and explicit hash keys, then the user records, each pointing into the
//! tables), and the 16-byte MD5 of that protobuf. A record without the magic bytes is a plain
//! record. A record with them whose digest, protobuf or table indices do not check out is
//! **malformed**: the reader delivers it as the raw record (with a warning) rather than dropping
//! data it cannot interpret.
//!
//! User records get sub-sequence numbers: their index in the aggregate. A user record whose hash
//! key (its explicit hash key, or the MD5 of its partition key) lies outside the hash range of the
//! shard being read is **out of range**: [`deaggregate`] returns it like any other and names its
//! index, and the reader delivers it (and counts it). The aggregate was routed by its own
//! partition key, so its user records exist only in the shard it landed on: producers that pack
//! records with different partition keys into one aggregate (the kinesis-aggregation libraries,
//! Lambda producers) put most of them "out of range", and skipping them, as the KCL does, loses
//! them for good.
//!
//! [`aggregate`] builds aggregates the way the KPL does; producers and tests use it.

use bytes::Bytes;
use md5::{Digest, Md5};
use prost::Message;
use shardlease_core::HashRange;

/// The magic prefix of a KPL aggregated record.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

const DIGEST_LEN: usize = 16;

/// The protobuf body of an aggregated record (field numbers as the KPL defines them).
#[derive(Clone, PartialEq, Message)]
struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    explicit_hash_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<AggregatedEntry>,
}

/// One user record inside an aggregate.
#[derive(Clone, PartialEq, Message)]
struct AggregatedEntry {
    #[prost(uint64, required, tag = "1")]
    partition_key_index: u64,
    #[prost(uint64, optional, tag = "2")]
    explicit_hash_key_index: Option<u64>,
    #[prost(bytes = "bytes", required, tag = "3")]
    data: Bytes,
    #[prost(message, repeated, tag = "4")]
    tags: Vec<Tag>,
}

/// A tag on a user record (carried by the format; shardlease does not use it).
#[derive(Clone, PartialEq, Message)]
struct Tag {
    #[prost(string, required, tag = "1")]
    key: String,
    #[prost(string, optional, tag = "2")]
    value: Option<String>,
}

/// A user record for [`aggregate`], or one taken out of an aggregate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserRecord {
    /// The user record's partition key.
    pub partition_key: String,
    /// The explicit hash key (a decimal 128-bit integer), if the producer set one.
    pub explicit_hash_key: Option<String>,
    /// The payload.
    pub data: Bytes,
}

/// What [`deaggregate`] found in one Kinesis record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deaggregated {
    /// Not an aggregate (no magic prefix): deliver as is.
    Plain,
    /// An aggregate: every user record with its index (sub-sequence number) in the aggregate.
    Records {
        /// The user records, in order, each with its index.
        records: Vec<(u64, UserRecord)>,
        /// The indices of the user records whose hash key lies outside the shard's hash range
        /// (none when no range was given).
        out_of_range: Vec<u64>,
    },
    /// Looks like an aggregate but does not check out; deliver the raw record. Says why.
    Malformed(String),
}

/// The hash key Kinesis routes a partition key by: the MD5 of its UTF-8 bytes, as a big-endian
/// 128-bit integer.
pub fn partition_key_hash(partition_key: &str) -> u128 {
    let digest: [u8; 16] = Md5::digest(partition_key.as_bytes()).into();
    u128::from_be_bytes(digest)
}

/// Packs user records into one aggregated record, as the KPL does (shared keys stored once).
pub fn aggregate(records: &[UserRecord]) -> Bytes {
    let mut body = AggregatedRecord::default();
    for r in records {
        let pk = index_of(&mut body.partition_key_table, &r.partition_key);
        let ehk =
            r.explicit_hash_key.as_ref().map(|k| index_of(&mut body.explicit_hash_key_table, k));
        body.records.push(AggregatedEntry {
            partition_key_index: pk,
            explicit_hash_key_index: ehk,
            data: r.data.clone(),
            tags: Vec::new(),
        });
    }
    let encoded = body.encode_to_vec();
    let digest: [u8; 16] = Md5::digest(&encoded).into();
    let mut out = Vec::with_capacity(MAGIC.len() + encoded.len() + DIGEST_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&encoded);
    out.extend_from_slice(&digest);
    Bytes::from(out)
}

fn index_of(table: &mut Vec<String>, key: &str) -> u64 {
    let i = table.iter().position(|k| k == key).unwrap_or_else(|| {
        table.push(key.to_owned());
        table.len() - 1
    });
    i as u64
}

/// Unpacks a Kinesis record's data. `range` is the hash range of the shard being read; the
/// indices of user records outside it are listed in `out_of_range` (none are when it is `None`).
pub fn deaggregate(data: &[u8], range: Option<&HashRange>) -> Deaggregated {
    unpack(data, |body| body, range)
}

/// [`deaggregate`] of a shared buffer: the user records' payloads are slices of `data`, not
/// copies (the reader's path).
pub(crate) fn deaggregate_shared(data: &Bytes, range: Option<&HashRange>) -> Deaggregated {
    unpack(data, |body| data.slice_ref(body), range)
}

/// Checks and decodes an aggregate; `buffer` turns the body into what the protobuf is decoded
/// from (a `Bytes` body lets the payloads share its memory).
fn unpack<'a, B: bytes::Buf>(
    data: &'a [u8],
    buffer: impl FnOnce(&'a [u8]) -> B,
    range: Option<&HashRange>,
) -> Deaggregated {
    if data.len() < MAGIC.len() || data[..MAGIC.len()] != MAGIC {
        return Deaggregated::Plain;
    }
    if data.len() < MAGIC.len() + DIGEST_LEN {
        return Deaggregated::Malformed("shorter than the magic bytes and a digest".into());
    }
    let (body, digest) = data[MAGIC.len()..].split_at(data.len() - MAGIC.len() - DIGEST_LEN);
    let actual: [u8; 16] = Md5::digest(body).into();
    if actual[..] != *digest {
        return Deaggregated::Malformed("MD5 digest does not match the body".into());
    }
    let decoded = match AggregatedRecord::decode(buffer(body)) {
        Ok(d) => d,
        Err(e) => return Deaggregated::Malformed(format!("protobuf body does not decode: {e}")),
    };
    let mut out = Vec::with_capacity(decoded.records.len());
    let mut out_of_range = Vec::new();
    for (i, entry) in decoded.records.into_iter().enumerate() {
        let Some(pk) = table_entry(&decoded.partition_key_table, entry.partition_key_index) else {
            return Deaggregated::Malformed(format!(
                "record {i} points past the partition key table"
            ));
        };
        let ehk = match entry.explicit_hash_key_index {
            None => None,
            Some(j) => match table_entry(&decoded.explicit_hash_key_table, j) {
                Some(k) => Some(k.to_owned()),
                None => {
                    return Deaggregated::Malformed(format!(
                        "record {i} points past the explicit hash key table"
                    ))
                }
            },
        };
        let hash = match &ehk {
            Some(k) => match k.parse::<u128>() {
                Ok(h) => h,
                Err(_) => {
                    return Deaggregated::Malformed(format!(
                        "record {i} has an explicit hash key that is not a 128-bit integer"
                    ))
                }
            },
            // The MD5 of the key is only needed for the out-of-range rule.
            None if range.is_none() => 0,
            None => partition_key_hash(pk),
        };
        if range.is_some_and(|r| hash < r.start || hash > r.end) {
            out_of_range.push(i as u64);
        }
        let user =
            UserRecord { partition_key: pk.to_owned(), explicit_hash_key: ehk, data: entry.data };
        out.push((i as u64, user));
    }
    Deaggregated::Records { records: out, out_of_range }
}

fn table_entry(table: &[String], index: u64) -> Option<&str> {
    usize::try_from(index).ok().and_then(|i| table.get(i)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(pk: &str, ehk: Option<&str>, data: &str) -> UserRecord {
        UserRecord {
            partition_key: pk.into(),
            explicit_hash_key: ehk.map(Into::into),
            data: Bytes::from(data.to_owned()),
        }
    }

    #[test]
    fn plain_records_are_not_aggregates() {
        assert_eq!(deaggregate(b"hello", None), Deaggregated::Plain);
        assert_eq!(deaggregate(b"", None), Deaggregated::Plain);
        assert_eq!(deaggregate(&MAGIC[..3], None), Deaggregated::Plain);
    }

    #[test]
    fn aggregates_round_trip_with_indices() {
        let records =
            vec![user("a", None, "one"), user("b", Some("42"), "two"), user("a", None, "three")];
        let packed = aggregate(&records);
        assert_eq!(packed[..4], MAGIC);
        let Deaggregated::Records { records: out, out_of_range } = deaggregate(&packed, None)
        else {
            panic!("not decoded")
        };
        let expected: Vec<(u64, UserRecord)> =
            records.into_iter().enumerate().map(|(i, r)| (i as u64, r)).collect();
        assert_eq!(out, expected);
        assert!(out_of_range.is_empty());
    }

    #[test]
    fn records_outside_the_shard_are_kept_and_named() {
        let records = vec![
            user("a", Some("10"), "in"),
            user("b", Some("1000"), "out"),
            user("c", Some("20"), "in"),
        ];
        let packed = aggregate(&records);
        let range = HashRange { start: 0, end: 100 };
        let Deaggregated::Records { records: out, out_of_range } =
            deaggregate(&packed, Some(&range))
        else {
            panic!("not decoded")
        };
        let all: Vec<u64> = out.iter().map(|(i, _)| *i).collect();
        assert_eq!(all, vec![0, 1, 2], "every user record is returned");
        assert_eq!(out_of_range, vec![1]);
        // Without an explicit key, the MD5 of the partition key decides.
        let h = partition_key_hash("pk");
        let packed = aggregate(&[user("pk", None, "x")]);
        let inside = HashRange { start: h, end: h };
        let outside = HashRange { start: h.wrapping_add(1), end: u128::MAX };
        assert!(matches!(
            deaggregate(&packed, Some(&inside)),
            Deaggregated::Records { records, out_of_range } if records.len() == 1 && out_of_range.is_empty()
        ));
        assert!(matches!(
            deaggregate(&packed, Some(&outside)),
            Deaggregated::Records { records, out_of_range } if records.len() == 1 && out_of_range == [0]
        ));
    }

    #[test]
    fn malformed_aggregates_are_reported_not_dropped() {
        let good = aggregate(&[user("a", None, "one")]).to_vec();
        let mut bad_digest = good.clone();
        let last = bad_digest.len() - 1;
        bad_digest[last] ^= 0xFF;
        assert!(matches!(deaggregate(&bad_digest, None), Deaggregated::Malformed(_)));
        let mut bad_body = MAGIC.to_vec();
        let junk = [0xFF_u8, 0xFF, 0xFF];
        bad_body.extend_from_slice(&junk);
        let digest: [u8; 16] = Md5::digest(junk).into();
        bad_body.extend_from_slice(&digest);
        assert!(matches!(deaggregate(&bad_body, None), Deaggregated::Malformed(_)));
        assert!(matches!(deaggregate(&MAGIC, None), Deaggregated::Malformed(_)));
        // An index past the table.
        let body = AggregatedRecord {
            partition_key_table: vec![],
            explicit_hash_key_table: vec![],
            records: vec![AggregatedEntry {
                partition_key_index: 3,
                explicit_hash_key_index: None,
                data: Bytes::new(),
                tags: vec![],
            }],
        }
        .encode_to_vec();
        let mut packed = MAGIC.to_vec();
        packed.extend_from_slice(&body);
        let digest: [u8; 16] = Md5::digest(&body).into();
        packed.extend_from_slice(&digest);
        assert!(matches!(deaggregate(&packed, None), Deaggregated::Malformed(_)));
    }

    #[test]
    fn partition_key_hash_is_md5_big_endian() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(partition_key_hash(""), 0xd41d8cd98f00b204e9800998ecf8427e);
    }
}
