//! The two KCL lease-table schemas, read into one shape. A KCL row is a DynamoDB item; this file
//! knows which attributes each KCL writes and what their values mean, and nothing about DynamoDB
//! calls or shardlease stores, so the mapping can be tested on plain values.
//!
//! - **Java KCL 2.x/3.x**: `leaseKey` (the shard id, or `account:stream:creationEpoch:shardId` for
//!   a multi-stream application), `checkpoint` (a sequence number or one of the sentinels
//!   `TRIM_HORIZON`, `LATEST`, `SHARD_END`, `AT_TIMESTAMP`), `checkpointSubSequenceNumber`,
//!   `parentShardId` (a string set), `leaseOwner`, `leaseCounter` (moved by every renewal),
//!   `ownerSwitchesSinceCheckpoint`; rows whose `entityType` is not a lease are not leases.
//! - **vmware-go-kcl**: `ShardID`, `Checkpoint` (a sequence number or `SHARD_END`; absent before
//!   the first checkpoint, when the application's initial position applies), `AssignedTo`,
//!   `LeaseTimeout` (moved by every renewal), `ParentShardId` (one string).

use std::collections::BTreeMap;
use std::fmt;

/// One attribute value, as far as the import needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attr {
    /// A string.
    S(String),
    /// A number, in DynamoDB's decimal text.
    N(String),
    /// A string set.
    Ss(Vec<String>),
    /// Anything else (kept only to say what it was).
    Other(&'static str),
}

/// A DynamoDB item: attribute name to value.
pub type Item = BTreeMap<String, Attr>;

/// Which KCL wrote the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Schema {
    /// The Java KCL 2.x/3.x (`leaseKey`, `checkpoint`, `leaseCounter`...).
    Java,
    /// vmware-go-kcl (`ShardID`, `Checkpoint`, `LeaseTimeout`...).
    Go,
}

impl Schema {
    /// The partition key attribute of the schema's table.
    pub fn key_attribute(self) -> &'static str {
        match self {
            Schema::Java => JAVA_KEY,
            Schema::Go => GO_KEY,
        }
    }

    /// The attribute a live KCL worker keeps moving.
    pub fn renewal_attribute(self) -> &'static str {
        match self {
            Schema::Java => "leaseCounter",
            Schema::Go => "LeaseTimeout",
        }
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schema::Java => "java (KCL 2.x/3.x)",
            Schema::Go => "go (vmware-go-kcl)",
        })
    }
}

const JAVA_KEY: &str = "leaseKey";
const GO_KEY: &str = "ShardID";

/// The schema the rows were written in: the one whose key attribute they carry. `None` when no
/// row names either; an error when rows of both are present.
pub fn detect(items: &[Item]) -> Result<Option<Schema>, String> {
    let java = items.iter().filter(|i| i.contains_key(JAVA_KEY)).count();
    let go = items.iter().filter(|i| i.contains_key(GO_KEY)).count();
    match (java, go) {
        (0, 0) => Ok(None),
        (_, 0) => Ok(Some(Schema::Java)),
        (0, _) => Ok(Some(Schema::Go)),
        (j, g) => Err(format!(
            "the table holds {j} row(s) with a Java KCL `{JAVA_KEY}` and {g} with a vmware-go-kcl \
             `{GO_KEY}`: pass --schema java or --schema go"
        )),
    }
}

/// A KCL checkpoint, as the table holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KclCheckpoint {
    /// `TRIM_HORIZON`: never checkpointed, starts at the oldest record.
    TrimHorizon,
    /// `LATEST`: never checkpointed, starts at the newest record.
    Latest,
    /// `AT_TIMESTAMP`: never checkpointed, starts at the application's timestamp, which the
    /// table does not hold.
    AtTimestamp,
    /// `SHARD_END`: the shard was processed to its end.
    ShardEnd,
    /// No checkpoint yet (vmware-go-kcl): the application's initial position applies.
    None,
    /// The last record processed: its sequence number, and for the Java KCL its sub-sequence
    /// number (the user record's index inside a KPL aggregate; 0 for a plain record). `None`
    /// for vmware-go-kcl, which resumes after the whole Kinesis record.
    Sequence {
        /// The sequence number, as written.
        seq: String,
        /// The sub-sequence number (Java only).
        sub: Option<u64>,
    },
}

/// A row of the table that is a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KclLease {
    /// The row's key as the KCL wrote it.
    pub kcl_key: String,
    /// The stream part of a multi-stream key (`account:stream:creationEpoch:shardId`).
    pub stream: Option<String>,
    /// The shard id: the shardlease lease key.
    pub shard: String,
    /// The checkpoint.
    pub checkpoint: KclCheckpoint,
    /// Parent shard ids.
    pub parents: Vec<String>,
    /// The KCL worker holding it, if any.
    pub owner: Option<String>,
    /// What a live owner keeps moving (`leaseCounter` / `LeaseTimeout`), as text.
    pub renewal: Option<String>,
}

/// A row: a lease, or why it is not one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Row {
    /// A lease.
    Lease(KclLease),
    /// Not a lease (another entity type, no key): its key (or a description) and why.
    NotALease {
        /// The row's key, or a description when it has none.
        key: String,
        /// Why it is skipped.
        why: String,
    },
    /// A lease that cannot be read: its key and what is wrong.
    Bad {
        /// The row's key.
        key: String,
        /// What is wrong.
        why: String,
    },
}

fn string(item: &Item, name: &str) -> Result<Option<String>, String> {
    match item.get(name) {
        None => Ok(None),
        Some(Attr::S(s)) => Ok(Some(s.clone())),
        Some(Attr::N(n)) => Ok(Some(n.clone())),
        Some(other) => Err(format!("`{name}` is {}, not a string", kind(other))),
    }
}

fn number(item: &Item, name: &str) -> Result<Option<u64>, String> {
    match item.get(name) {
        None => Ok(None),
        Some(Attr::N(n) | Attr::S(n)) => n
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("`{name}` is {n:?}, not a non-negative integer")),
        Some(other) => Err(format!("`{name}` is {}, not a number", kind(other))),
    }
}

fn strings(item: &Item, name: &str) -> Result<Vec<String>, String> {
    match item.get(name) {
        None => Ok(Vec::new()),
        Some(Attr::Ss(v)) => Ok(v.clone()),
        Some(Attr::S(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Attr::S(s)) => Ok(vec![s.clone()]),
        Some(other) => Err(format!("`{name}` is {}, not a string set", kind(other))),
    }
}

fn kind(a: &Attr) -> &'static str {
    match a {
        Attr::S(_) => "a string",
        Attr::N(_) => "a number",
        Attr::Ss(_) => "a string set",
        Attr::Other(k) => k,
    }
}

/// The parts of a Java multi-stream lease key `account:stream:creationEpoch:shardId`, or `None`
/// for a plain shard id.
pub fn split_multi_stream(key: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = key.split(':').collect();
    match parts.as_slice() {
        [_account, stream, epoch, shard]
            if !stream.is_empty()
                && !shard.is_empty()
                && epoch.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some(((*stream).to_owned(), (*shard).to_owned()))
        }
        _ => None,
    }
}

/// Reads one row in `schema`.
pub fn read_row(schema: Schema, item: &Item) -> Row {
    match schema {
        Schema::Java => read_java(item),
        Schema::Go => read_go(item),
    }
}

fn read_java(item: &Item) -> Row {
    let key = match string(item, JAVA_KEY) {
        Ok(Some(k)) => k,
        Ok(None) => {
            return Row::NotALease {
                key: describe(item),
                why: format!("no `{JAVA_KEY}` attribute"),
            }
        }
        Err(why) => return Row::Bad { key: describe(item), why },
    };
    if let Some(Attr::S(t)) = item.get("entityType") {
        if !t.eq_ignore_ascii_case("lease") {
            return Row::NotALease { key, why: format!("entityType {t:?} is not a lease") };
        }
    }
    let bad = |why: String| Row::Bad { key: key.clone(), why };
    let (stream, shard) = match split_multi_stream(&key) {
        Some((stream, shard)) => (Some(stream), shard),
        None => (None, key.clone()),
    };
    // A multi-stream row also carries `shardId`; it wins over the key's last part.
    let shard = match string(item, "shardId") {
        Ok(Some(s)) if stream.is_some() && !s.is_empty() => s,
        Ok(_) => shard,
        Err(why) => return bad(why),
    };
    let sub = match number(item, "checkpointSubSequenceNumber") {
        Ok(s) => s.unwrap_or(0),
        Err(why) => return bad(why),
    };
    let checkpoint = match string(item, "checkpoint") {
        Ok(Some(c)) => match c.as_str() {
            "TRIM_HORIZON" => KclCheckpoint::TrimHorizon,
            "LATEST" => KclCheckpoint::Latest,
            "AT_TIMESTAMP" => KclCheckpoint::AtTimestamp,
            "SHARD_END" => KclCheckpoint::ShardEnd,
            _ => KclCheckpoint::Sequence { seq: c, sub: Some(sub) },
        },
        Ok(None) => return bad("no `checkpoint` attribute".into()),
        Err(why) => return bad(why),
    };
    let parents = match strings(item, "parentShardId") {
        // A multi-stream lease names its parents by shard id; a composite one is cut to its shard.
        Ok(p) => p.into_iter().map(|p| split_multi_stream(&p).map_or(p, |(_, s)| s)).collect(),
        Err(why) => return bad(why),
    };
    let owner = match string(item, "leaseOwner") {
        Ok(o) => o.filter(|o| !o.is_empty()),
        Err(why) => return bad(why),
    };
    let renewal = match string(item, "leaseCounter") {
        Ok(r) => r,
        Err(why) => return bad(why),
    };
    Row::Lease(KclLease { kcl_key: key, stream, shard, checkpoint, parents, owner, renewal })
}

fn read_go(item: &Item) -> Row {
    let key = match string(item, GO_KEY) {
        Ok(Some(k)) => k,
        Ok(None) => {
            return Row::NotALease { key: describe(item), why: format!("no `{GO_KEY}` attribute") }
        }
        Err(why) => return Row::Bad { key: describe(item), why },
    };
    let bad = |why: String| Row::Bad { key: key.clone(), why };
    let checkpoint = match string(item, "Checkpoint") {
        Ok(Some(c)) if c == "SHARD_END" => KclCheckpoint::ShardEnd,
        Ok(Some(c)) if c.is_empty() => KclCheckpoint::None,
        Ok(Some(c)) => KclCheckpoint::Sequence { seq: c, sub: None },
        Ok(None) => KclCheckpoint::None,
        Err(why) => return bad(why),
    };
    let parents = match strings(item, "ParentShardId") {
        Ok(p) => p,
        Err(why) => return bad(why),
    };
    let owner = match string(item, "AssignedTo") {
        Ok(o) => o.filter(|o| !o.is_empty()),
        Err(why) => return bad(why),
    };
    let renewal = match string(item, "LeaseTimeout") {
        Ok(r) => r,
        Err(why) => return bad(why),
    };
    Row::Lease(KclLease {
        kcl_key: key.clone(),
        stream: None,
        shard: key,
        checkpoint,
        parents,
        owner,
        renewal,
    })
}

/// A row without its key attribute, named by its attributes' names.
fn describe(item: &Item) -> String {
    let names: Vec<&str> = item.keys().map(String::as_str).take(4).collect();
    format!("<row with {}>", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pairs: &[(&str, Attr)]) -> Item {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }
    fn s(v: &str) -> Attr {
        Attr::S(v.to_owned())
    }

    #[test]
    fn java_rows_read_with_sentinels_sub_sequences_and_parents() {
        let row = item(&[
            ("leaseKey", s("shardId-000000000002")),
            ("checkpoint", s("49590338271490256608559692538361571095921575989136588898")),
            ("checkpointSubSequenceNumber", Attr::N("3".into())),
            ("parentShardId", Attr::Ss(vec!["shardId-000000000000".into()])),
            ("leaseOwner", s("w1")),
            ("leaseCounter", Attr::N("17".into())),
        ]);
        let Row::Lease(l) = read_row(Schema::Java, &row) else { panic!("not a lease") };
        assert_eq!(l.shard, "shardId-000000000002");
        assert_eq!(
            l.checkpoint,
            KclCheckpoint::Sequence {
                seq: "49590338271490256608559692538361571095921575989136588898".into(),
                sub: Some(3)
            }
        );
        assert_eq!(l.parents, vec!["shardId-000000000000".to_owned()]);
        assert_eq!(l.renewal.as_deref(), Some("17"));
        for (text, cp) in [
            ("TRIM_HORIZON", KclCheckpoint::TrimHorizon),
            ("LATEST", KclCheckpoint::Latest),
            ("AT_TIMESTAMP", KclCheckpoint::AtTimestamp),
            ("SHARD_END", KclCheckpoint::ShardEnd),
        ] {
            let row = item(&[("leaseKey", s("k")), ("checkpoint", s(text))]);
            let Row::Lease(l) = read_row(Schema::Java, &row) else { panic!("{text}") };
            assert_eq!(l.checkpoint, cp);
        }
        let other = item(&[("leaseKey", s("x")), ("entityType", s("WORKER_METRICS"))]);
        assert!(matches!(read_row(Schema::Java, &other), Row::NotALease { .. }));
        let bad = item(&[("leaseKey", s("x")), ("checkpoint", Attr::Ss(vec![]))]);
        assert!(matches!(read_row(Schema::Java, &bad), Row::Bad { .. }));
    }

    #[test]
    fn multi_stream_keys_split() {
        assert_eq!(
            split_multi_stream("123456789012:orders:1700000000:shardId-000000000001"),
            Some(("orders".into(), "shardId-000000000001".into()))
        );
        assert_eq!(split_multi_stream("shardId-000000000001"), None);
        assert_eq!(split_multi_stream("a:b:notanumber:c"), None);
    }

    #[test]
    fn go_rows_read_and_schemas_are_detected() {
        let row = item(&[
            ("ShardID", s("shardId-000000000003")),
            ("Checkpoint", s("SHARD_END")),
            ("ParentShardId", s("shardId-000000000001")),
            ("LeaseTimeout", s("2026-01-01T00:00:00Z")),
        ]);
        let Row::Lease(l) = read_row(Schema::Go, &row) else { panic!("not a lease") };
        assert_eq!(l.checkpoint, KclCheckpoint::ShardEnd);
        assert_eq!(l.parents, vec!["shardId-000000000001".to_owned()]);
        let fresh = item(&[("ShardID", s("shardId-000000000004"))]);
        let Row::Lease(l) = read_row(Schema::Go, &fresh) else { panic!("not a lease") };
        assert_eq!(l.checkpoint, KclCheckpoint::None);
        assert_eq!(detect(std::slice::from_ref(&row)), Ok(Some(Schema::Go)));
        assert_eq!(detect(&[item(&[("leaseKey", s("a"))])]), Ok(Some(Schema::Java)));
        assert!(detect(&[row, item(&[("leaseKey", s("a"))])]).is_err());
        assert_eq!(detect(&[]), Ok(None));
    }
}
