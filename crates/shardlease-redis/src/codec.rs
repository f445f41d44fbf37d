//! How leases and worker records are laid out as Redis hash fields, and read back.
//!
//! Every field is readable with `HGETALL` (numbers in decimal, structured fields as JSON), so an
//! operator can inspect and even repair a record by hand. Decoding never panics: a missing or
//! garbled field gives a reason string, which the store reports as `Error::Corrupt` (or a
//! `Listing::corrupt` entry) for that one record.
//!
//! Lease hash: `key`, `owner` (absent when unowned), `epoch`, `checkpoint` (JSON of `Position`,
//! e.g. `{"kind":"sequence","seq":"4959…","sub":0}`), `parents` (JSON array), `claim` (JSON
//! `{"by":…,"at":…}`, absent when none), `attributes` (JSON object), `version` (written by the
//! Lua scripts only). Worker hash: `id`, `beat`, `updated_at_millis`, `lease_count`, `changes`
//! (absent in records written before it existed: 0), `load` and `capacity` (absent when unset),
//! `lease_loads` (the published lease loads as one text, a line `<load> <lease key>` per lease,
//! see `shardlease_core::store::encode_lease_loads`; absent when there are none, and in records
//! written before it existed). Unknown fields are ignored, so later versions may add some.
//!
//! A record is decoded from a [`FieldSource`]: the whole hash of an `HGETALL` ([`Fields`]), or
//! the row of an `HMGET` of the fields the decoder reads ([`Row`], what listings read: half the
//! reply of an `HGETALL`, without the field names, and no map built per record).

use shardlease_core::Epoch;
use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use redis::Value;
use shardlease_core::store::{
    decode_lease_loads, encode_lease_loads, Claim, Lease, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{LeaseKey, Position};

/// The fields of one hash, as read.
pub(crate) type Fields = HashMap<String, String>;

/// A record's fields by name, whatever command read them.
pub(crate) trait FieldSource {
    /// The value of field `name`, `None` when the record has no such field.
    fn field(&self, name: &str) -> Option<&str>;
}

impl FieldSource for Fields {
    fn field(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

/// The values of the fields `names` of one hash, in that order, as an `HMGET` replied them
/// (`None` for a field the hash lacks).
pub(crate) struct Row<'a> {
    names: &'static [&'static str],
    values: Vec<Option<&'a str>>,
}

impl FieldSource for Row<'_> {
    fn field(&self, name: &str) -> Option<&str> {
        let i = self.names.iter().position(|n| *n == name)?;
        self.values.get(i).copied().flatten()
    }
}

/// The row of fields `names` in an `HMGET` reply; `None` when the reply has none of them (no
/// such hash, or a hash without any field the decoder reads, which only an `HGETALL` can tell
/// apart).
pub(crate) fn row_of<'a>(
    names: &'static [&'static str],
    v: &'a Value,
) -> Result<Option<Row<'a>>, String> {
    let Value::Array(items) = v else {
        return Err(format!("unexpected reply to a hash read: {v:?}"));
    };
    if items.len() != names.len() {
        return Err(format!(
            "the hash reply has {} values for {} fields",
            items.len(),
            names.len()
        ));
    }
    let mut values = Vec::with_capacity(names.len());
    for (name, item) in names.iter().zip(items) {
        values.push(match item {
            Value::Nil => None,
            other => Some(
                text(other)
                    .ok_or_else(|| format!("the value of field `{name}` is not UTF-8 text"))?,
            ),
        });
    }
    Ok(values.iter().any(Option::is_some).then_some(Row { names, values }))
}

/// Whether an `HMGET` reply of the fields `names` has none of them (what [`row_of`] answers with
/// `None`), without building the row.
pub(crate) fn lacks_every_field(names: &[&str], v: &Value) -> bool {
    matches!(v, Value::Array(items)
        if items.len() == names.len() && items.iter().all(|i| matches!(i, Value::Nil)))
}

/// Every field [`decode_lease`] reads, for an `HMGET`.
pub(crate) const LEASE_FIELDS: &[&str] = &[
    lease_field::KEY,
    lease_field::OWNER,
    lease_field::EPOCH,
    lease_field::CHECKPOINT,
    lease_field::PARENTS,
    lease_field::CLAIM,
    lease_field::ATTRIBUTES,
    lease_field::VERSION,
];

/// Every field [`decode_worker`] reads, for an `HMGET`.
pub(crate) const WORKER_FIELDS: &[&str] = &[
    worker_field::ID,
    worker_field::BEAT,
    worker_field::UPDATED_AT_MILLIS,
    worker_field::LEASE_COUNT,
    worker_field::CHANGES,
    worker_field::LOAD,
    worker_field::CAPACITY,
    worker_field::LEASE_LOADS,
];

/// Field names of a lease hash.
pub(crate) mod lease_field {
    /// The lease key, repeated inside the record so `HGETALL` is self-describing.
    pub const KEY: &str = "key";
    /// The owner's worker id; absent when unowned.
    pub const OWNER: &str = "owner";
    /// The fencing epoch.
    pub const EPOCH: &str = "epoch";
    /// The checkpoint, JSON of `Position`.
    pub const CHECKPOINT: &str = "checkpoint";
    /// The parent lease keys, JSON array.
    pub const PARENTS: &str = "parents";
    /// The pending claim, JSON; absent when none.
    pub const CLAIM: &str = "claim";
    /// Extension attributes, JSON object.
    pub const ATTRIBUTES: &str = "attributes";
    /// The record's version, written by the Lua scripts.
    pub const VERSION: &str = "version";
}

/// Field names of a worker hash.
pub(crate) mod worker_field {
    /// The worker id.
    pub const ID: &str = "id";
    /// The heartbeat counter.
    pub const BEAT: &str = "beat";
    /// Wall-clock time of the heartbeat.
    pub const UPDATED_AT_MILLIS: &str = "updated_at_millis";
    /// Leases held.
    pub const LEASE_COUNT: &str = "lease_count";
    /// Ownership changes the worker made (see `WorkerRecord::changes`).
    pub const CHANGES: &str = "changes";
    /// Optional load figure.
    pub const LOAD: &str = "load";
    /// Optional advertised capacity.
    pub const CAPACITY: &str = "capacity";
    /// The published lease loads, `encode_lease_loads` text; absent when there are none.
    pub const LEASE_LOADS: &str = "lease_loads";
}

/// The field/value pairs of `lease`, without `version` (the scripts add it).
pub(crate) fn lease_fields(lease: &Lease) -> Result<Vec<(&'static str, String)>, String> {
    use lease_field::*;
    let json = |what: &str, r: serde_json::Result<String>| {
        r.map_err(|e| format!("cannot encode the {what} of lease {}: {e}", lease.key))
    };
    let mut out = Vec::with_capacity(8);
    out.push((KEY, lease.key.as_str().to_owned()));
    if let Some(owner) = &lease.owner {
        out.push((OWNER, owner.as_str().to_owned()));
    }
    out.push((EPOCH, lease.epoch.to_string()));
    out.push((CHECKPOINT, json("checkpoint", serde_json::to_string(&lease.checkpoint))?));
    out.push((PARENTS, json("parents", serde_json::to_string(&lease.parents))?));
    if let Some(claim) = &lease.claim {
        out.push((CLAIM, json("claim", serde_json::to_string(claim))?));
    }
    out.push((ATTRIBUTES, json("attributes", serde_json::to_string(&lease.attributes))?));
    Ok(out)
}

/// The field/value pairs of a worker record.
pub(crate) fn worker_fields(record: &WorkerRecord) -> Vec<(&'static str, String)> {
    use worker_field::*;
    let mut out = vec![
        (ID, record.id.as_str().to_owned()),
        (BEAT, record.beat.to_string()),
        (UPDATED_AT_MILLIS, record.updated_at_millis.to_string()),
        (LEASE_COUNT, record.lease_count.to_string()),
        (CHANGES, record.changes.to_string()),
    ];
    if let Some(load) = record.load {
        // `Display` of f64 is the shortest string that parses back to the same value.
        out.push((LOAD, load.to_string()));
    }
    if let Some(capacity) = record.capacity {
        out.push((CAPACITY, capacity.to_string()));
    }
    // The heartbeat script replaces the whole hash, so leaving the field out removes it.
    if !record.lease_loads.is_empty() {
        out.push((LEASE_LOADS, encode_lease_loads(&record.lease_loads)));
    }
    out
}

fn required<'a, F: FieldSource + ?Sized>(fields: &'a F, name: &str) -> Result<&'a str, String> {
    fields.field(name).ok_or_else(|| format!("field `{name}` is missing"))
}

fn number<T: FromStr, F: FieldSource + ?Sized>(fields: &F, name: &str) -> Result<T, String> {
    let raw = required(fields, name)?;
    raw.parse().map_err(|_| format!("field `{name}` is not a valid number: {}", excerpt(raw)))
}

fn optional_number<T: FromStr, F: FieldSource + ?Sized>(
    fields: &F,
    name: &str,
) -> Result<Option<T>, String> {
    match fields.field(name) {
        None => Ok(None),
        Some(_) => number(fields, name).map(Some),
    }
}

fn json<T: serde::de::DeserializeOwned>(raw: &str, name: &str) -> Result<T, String> {
    serde_json::from_str(raw)
        .map_err(|e| format!("field `{name}` is not valid JSON for it ({e}): {}", excerpt(raw)))
}

/// At most 60 characters of a stored value, for messages.
fn excerpt(raw: &str) -> String {
    let mut s: String = raw.chars().take(60).collect();
    if s.len() < raw.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// Decodes the lease stored under `key`.
pub(crate) fn decode_lease<F: FieldSource + ?Sized>(
    key: &str,
    fields: &F,
) -> Result<VersionedLease, String> {
    use lease_field::*;
    let stored_key = required(fields, KEY)?;
    if stored_key != key {
        return Err(format!("field `key` says {} but the record is {key:?}", excerpt(stored_key)));
    }
    let owner = match fields.field(OWNER) {
        None => None,
        Some("") => return Err("field `owner` is empty".to_owned()),
        Some(o) => Some(o.into()),
    };
    let claim: Option<Claim> = match fields.field(CLAIM) {
        None => None,
        Some(raw) => Some(json(raw, CLAIM)?),
    };
    let parents: Vec<LeaseKey> = json(required(fields, PARENTS)?, PARENTS)?;
    let attributes: BTreeMap<String, String> = json(required(fields, ATTRIBUTES)?, ATTRIBUTES)?;
    let checkpoint: Position = json(required(fields, CHECKPOINT)?, CHECKPOINT)?;
    let lease = Lease {
        key: key.into(),
        owner,
        epoch: Epoch(number(fields, EPOCH)?),
        checkpoint,
        parents,
        claim,
        attributes,
    };
    Ok(VersionedLease::new(lease, Version(number(fields, VERSION)?)))
}

/// Decodes the worker record stored under `id`.
pub(crate) fn decode_worker<F: FieldSource + ?Sized>(
    id: &str,
    fields: &F,
) -> Result<WorkerRecord, String> {
    use worker_field::*;
    let stored = required(fields, ID)?;
    if stored != id {
        return Err(format!("field `id` says {} but the record is {id:?}", excerpt(stored)));
    }
    let lease_loads = match fields.field(LEASE_LOADS) {
        // Absent when there are none, and in records written before the field existed.
        None => Vec::new(),
        Some(raw) => decode_lease_loads(raw).map_err(|e| {
            format!("field `{LEASE_LOADS}` is not lease loads ({e}): {}", excerpt(raw))
        })?,
    };
    Ok(WorkerRecord {
        id: id.into(),
        beat: number(fields, BEAT)?,
        updated_at_millis: number(fields, UPDATED_AT_MILLIS)?,
        lease_count: number(fields, LEASE_COUNT)?,
        load: optional_number(fields, LOAD)?,
        capacity: optional_number(fields, CAPACITY)?,
        // Absent in records written before the field existed.
        changes: optional_number(fields, CHANGES)?.unwrap_or(0),
        lease_loads,
    })
}

/// A string out of a reply value (bulk or simple string).
pub(crate) fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        Value::Okay => Some("OK"),
        _ => None,
    }
}

/// The field map of an `HGETALL` reply (a flat array in RESP2, a map in RESP3). An empty reply
/// (the key does not exist) gives an empty map.
pub(crate) fn fields_of(v: &Value) -> Result<Fields, String> {
    let pair = |k: &Value, v: &Value| -> Result<(String, String), String> {
        let name = text(k).ok_or_else(|| "a field name is not UTF-8 text".to_owned())?;
        let value =
            text(v).ok_or_else(|| format!("the value of field `{name}` is not UTF-8 text"))?;
        Ok((name.to_owned(), value.to_owned()))
    };
    match v {
        Value::Nil => Ok(Fields::new()),
        Value::Array(items) => {
            if items.len() % 2 != 0 {
                return Err("the hash reply has an odd number of items".to_owned());
            }
            items.chunks_exact(2).map(|kv| pair(&kv[0], &kv[1])).collect()
        }
        Value::Map(items) => items.iter().map(|(k, v)| pair(k, v)).collect(),
        other => Err(format!("unexpected reply to a hash read: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use shardlease_core::store::LeaseLoad;
    use shardlease_core::SequenceNumber;

    fn as_fields(pairs: Vec<(&'static str, String)>, version: u64) -> Fields {
        let mut f: Fields = pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        f.insert("version".into(), version.to_string());
        f
    }

    fn full_lease() -> Lease {
        let mut lease = Lease::new(
            "stream/shardId-000000000007",
            Position::Sequence {
                seq: SequenceNumber::parse(
                    "49590338271490256608559692538361571095921575989136588898",
                )
                .unwrap(),
                sub: 3,
            },
        )
        .with_parents(["a".into(), "b".into()]);
        lease.owner = Some("worker-1".into());
        lease.epoch = Epoch(42);
        lease.claim = Some(Claim { by: "worker-2".into(), at: Epoch(42) });
        lease.attributes.insert("hash_range".into(), "0-99".into());
        lease
    }

    #[test]
    fn leases_round_trip() {
        for lease in [full_lease(), Lease::new("plain", Position::TrimHorizon)] {
            let fields = as_fields(lease_fields(&lease).unwrap(), 17);
            let VersionedLease { lease: back, version: v } =
                decode_lease(lease.key.as_str(), &fields).unwrap();
            assert_eq!((back, v), (lease, Version(17)));
        }
        let plain = as_fields(lease_fields(&Lease::new("p", Position::Latest)).unwrap(), 1);
        assert!(!plain.contains_key("owner") && !plain.contains_key("claim"));
        assert_eq!(plain["checkpoint"], r#"{"kind":"latest"}"#);
        assert_eq!(plain["parents"], "[]");
    }

    #[test]
    fn bad_lease_fields_are_reasons_not_panics() {
        let good = as_fields(lease_fields(&full_lease()).unwrap(), 3);
        let key = full_lease().key;
        let cases: Vec<(&str, Option<&str>, &str)> = vec![
            ("epoch", None, "`epoch` is missing"),
            ("epoch", Some("-1"), "not a valid number"),
            ("version", Some("x"), "not a valid number"),
            ("version", None, "`version` is missing"),
            ("checkpoint", Some("{not json"), "not valid JSON"),
            ("checkpoint", Some(r#"{"kind":"sequence","seq":"12a"}"#), "not valid JSON"),
            ("parents", Some("\"a\""), "not valid JSON"),
            ("claim", Some("{}"), "not valid JSON"),
            ("attributes", None, "`attributes` is missing"),
            ("key", Some("other"), "says"),
            ("owner", Some(""), "empty"),
        ];
        for (field, value, want) in cases {
            let mut f = good.clone();
            match value {
                Some(v) => f.insert(field.into(), v.into()),
                None => f.remove(field),
            };
            let err = decode_lease(key.as_str(), &f).unwrap_err();
            assert!(err.contains(want), "{field}={value:?}: {err}");
        }
    }

    #[test]
    fn workers_round_trip() {
        let mut w = WorkerRecord::new("w-1".into(), 9);
        w.lease_count = 3;
        w.load = Some(0.1 + 0.2);
        w.capacity = Some(10);
        let f: Fields = worker_fields(&w).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        assert_eq!(decode_worker("w-1", &f).unwrap(), w);
        let mut bad = f.clone();
        bad.insert("beat".into(), "many".into());
        assert!(decode_worker("w-1", &bad).unwrap_err().contains("beat"));
        assert!(decode_worker("w-2", &f).unwrap_err().contains("says"));
    }

    #[test]
    fn lease_loads_are_one_field_absent_when_empty() {
        let mut w = WorkerRecord::new("w-1".into(), 9);
        let fields = |w: &WorkerRecord| -> Fields {
            worker_fields(w).into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
        };
        assert!(!fields(&w).contains_key("lease_loads"), "no loads: no field");
        w.lease_loads = vec![
            LeaseLoad::new("stream a/shard 1", 0.25),
            LeaseLoad::new("s/2", 1.5e-7),
            LeaseLoad::new("s 3", 0.0),
        ];
        let f = fields(&w);
        assert_eq!(f["lease_loads"].lines().count(), 3);
        let back = decode_worker("w-1", &f).unwrap().lease_loads;
        assert_eq!(back.len(), 3);
        for (a, b) in w.lease_loads.iter().zip(&back) {
            assert_eq!(a.key, b.key);
            assert!((a.load - b.load).abs() <= a.load * 1e-5, "{} vs {}", a.load, b.load);
        }
        // Absent (a record from before the field existed) or empty: no loads.
        let mut old = f.clone();
        old.remove("lease_loads");
        assert!(decode_worker("w-1", &old).unwrap().lease_loads.is_empty());
        old.insert("lease_loads".into(), String::new());
        assert!(decode_worker("w-1", &old).unwrap().lease_loads.is_empty());
        for bad in ["0.5", "x s/1", "-1 s/1", "NaN s"] {
            let mut garbled = f.clone();
            garbled.insert("lease_loads".into(), bad.into());
            let err = decode_worker("w-1", &garbled).unwrap_err();
            assert!(err.contains("`lease_loads`"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn hmget_rows_decode_like_whole_hashes() {
        let lease = full_lease();
        let fields = as_fields(lease_fields(&lease).unwrap(), 5);
        let reply = Value::Array(
            LEASE_FIELDS
                .iter()
                .map(|n| fields.get(*n).map_or(Value::Nil, |v| Value::BulkString(v.clone().into())))
                .collect(),
        );
        let row = row_of(LEASE_FIELDS, &reply).unwrap().unwrap();
        let key = lease.key.as_str();
        assert_eq!(decode_lease(key, &row).unwrap(), decode_lease(key, &fields).unwrap());
        assert!(!lacks_every_field(LEASE_FIELDS, &reply));
        let none = Value::Array(vec![Value::Nil; LEASE_FIELDS.len()]);
        assert!(lacks_every_field(LEASE_FIELDS, &none));
        assert!(row_of(LEASE_FIELDS, &none).unwrap().is_none());
        let mut binary = vec![Value::Nil; LEASE_FIELDS.len()];
        binary[1] = Value::BulkString(vec![0xff]);
        let err = row_of(LEASE_FIELDS, &Value::Array(binary)).err().unwrap();
        assert!(err.contains("`owner` is not UTF-8"), "{err}");
        assert!(row_of(LEASE_FIELDS, &Value::Array(vec![Value::Nil])).is_err());
        assert!(row_of(LEASE_FIELDS, &Value::Int(1)).is_err());
    }

    #[test]
    fn hash_replies_of_both_protocols_decode() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![b("a"), b("1"), b("b"), b("2")]);
        let resp3 = Value::Map(vec![(b("a"), b("1")), (b("b"), b("2"))]);
        assert_eq!(fields_of(&resp2).unwrap(), fields_of(&resp3).unwrap());
        assert!(fields_of(&Value::Array(vec![])).unwrap().is_empty());
        assert!(fields_of(&Value::Array(vec![b("a")])).is_err());
        assert!(fields_of(&Value::Array(vec![b("a"), Value::BulkString(vec![0xff])])).is_err());
        assert!(fields_of(&Value::Int(3)).is_err());
    }
}
