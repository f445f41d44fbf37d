//! Items to records and back: how a [`Lease`] and a [`WorkerRecord`] are stored as DynamoDB
//! attributes, and the `Corrupt` reasons for items that do not decode.
//!
//! Lease item (besides `pk`/`sk`, see [`layout`](crate::layout)):
//!
//! ```text
//! version     N   the compare-and-set token: random 63 bits, new on every write
//! epoch       N   fencing epoch
//! checkpoint  S   JSON of Position, e.g. {"kind":"sequence","seq":"4959…","sub":0}
//! parents     L   of S
//! attributes  M   of S
//! owner       S   absent when unowned
//! claim_by    S   } absent when there is no claim
//! claim_at    N   }
//! ```
//!
//! Worker item: `beat`, `updated_at_millis`, `lease_count`, `changes` (N), `load`, `capacity`
//! (N) when set (a missing `changes` reads as 0), and `lease_loads` (S: the published lease loads
//! as one text, a line `<load> <lease key>` per lease, see
//! `shardlease_core::store::encode_lease_loads`) when the worker publishes any: never an empty
//! string, and a missing one (also in items written before it existed) reads as none.
//!
//! Fleet signal item: `token` (N), the token last written (`1..=Version::MAX_RANDOM`).
//!
//! Attribute names are spelled out
//! (they count toward item size, but an operator reading the table in the console should not
//! need a decoder ring).

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;
use shardlease_core::store::{
    decode_lease_loads, encode_lease_loads, Claim, Lease, Version, WorkerRecord,
};
use shardlease_core::{LeaseKey, Position, WorkerId};
use tracing::debug;

use crate::layout::{PK, SK};

/// One DynamoDB item.
pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) const VERSION: &str = "version";
const EPOCH: &str = "epoch";
const CHECKPOINT: &str = "checkpoint";
const PARENTS: &str = "parents";
const ATTRIBUTES: &str = "attributes";
const OWNER: &str = "owner";
const CLAIM_BY: &str = "claim_by";
const CLAIM_AT: &str = "claim_at";
pub(crate) const BEAT: &str = "beat";
const UPDATED_AT: &str = "updated_at_millis";
const LEASE_COUNT: &str = "lease_count";
const LOAD: &str = "load";
const CAPACITY: &str = "capacity";
const CHANGES: &str = "changes";
const LEASE_LOADS: &str = "lease_loads";
const TOKEN: &str = "token";

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// The item for `lease` at `version`, under partition key `pk`.
pub(crate) fn lease_item(pk: &str, lease: &Lease, version: Version) -> Result<Item, String> {
    let checkpoint = serde_json::to_string(&lease.checkpoint)
        .map_err(|e| format!("cannot encode the checkpoint of lease {}: {e}", lease.key))?;
    let mut item = Item::new();
    item.insert(PK.into(), s(pk));
    item.insert(SK.into(), s(lease.key.as_str()));
    item.insert(VERSION.into(), n(version.0));
    item.insert(EPOCH.into(), n(lease.epoch.get()));
    item.insert(CHECKPOINT.into(), s(checkpoint));
    let parents = lease.parents.iter().map(|p| s(p.as_str())).collect();
    item.insert(PARENTS.into(), AttributeValue::L(parents));
    let attributes = lease.attributes.iter().map(|(k, v)| (k.clone(), s(v.clone()))).collect();
    item.insert(ATTRIBUTES.into(), AttributeValue::M(attributes));
    if let Some(owner) = &lease.owner {
        item.insert(OWNER.into(), s(owner.as_str()));
    }
    if let Some(claim) = &lease.claim {
        item.insert(CLAIM_BY.into(), s(claim.by.as_str()));
        item.insert(CLAIM_AT.into(), n(claim.at));
    }
    Ok(item)
}

/// The item for a worker's heartbeat record, under partition key `pk`.
pub(crate) fn worker_item(pk: &str, record: &WorkerRecord) -> Item {
    let mut item = Item::new();
    item.insert(PK.into(), s(pk));
    item.insert(SK.into(), s(record.id.as_str()));
    item.insert(BEAT.into(), n(record.beat));
    item.insert(UPDATED_AT.into(), n(record.updated_at_millis));
    item.insert(LEASE_COUNT.into(), n(record.lease_count));
    item.insert(CHANGES.into(), n(record.changes));
    if let Some(load) = record.load {
        if storable(load) {
            item.insert(LOAD.into(), n(load));
        } else {
            debug!(worker = %record.id, load, "load figure outside DynamoDB's number range; not stored");
        }
    }
    if let Some(capacity) = record.capacity {
        item.insert(CAPACITY.into(), n(capacity));
    }
    // A heartbeat puts the whole item, so leaving the attribute out removes it.
    if !record.lease_loads.is_empty() {
        item.insert(LEASE_LOADS.into(), s(encode_lease_loads(&record.lease_loads)));
    }
    item
}

/// The fleet signal's item holding `token`, under partition key `pk` and sort key `sk`.
pub(crate) fn fleet_signal_item(pk: &str, sk: &str, token: Version) -> Item {
    let mut item = Item::new();
    item.insert(PK.into(), s(pk));
    item.insert(SK.into(), s(sk));
    item.insert(TOKEN.into(), n(token.0));
    item
}

/// Decodes the fleet signal's item: its token; the reason when it cannot be decoded.
pub(crate) fn decode_fleet_signal(item: &Item) -> Result<Version, String> {
    let token = number(item, TOKEN)?;
    if token == 0 || token > Version::MAX_RANDOM {
        return Err(format!(
            "attribute `{TOKEN}` ({token}) is not a token (1..={})",
            Version::MAX_RANDOM
        ));
    }
    Ok(Version(token))
}

/// Whether DynamoDB can hold `x` as a number (finite, magnitude within 1e-130..1e126).
fn storable(x: f64) -> bool {
    x == 0.0 || (x.is_finite() && x.abs() < 9.9e125 && x.abs() > 1e-130)
}

/// The sort key of an item, as a listing's corrupt entry names it.
pub(crate) fn item_key(item: &Item) -> String {
    match item.get(SK) {
        Some(AttributeValue::S(k)) => k.clone(),
        Some(_) => "<sort key is not a string>".to_owned(),
        None => "<no sort key>".to_owned(),
    }
}

/// Decodes a lease item; the reason when it cannot be decoded.
pub(crate) fn decode_lease(item: &Item) -> Result<VersionedLease, String> {
    let key = string(item, SK)?;
    let version = Version(number(item, VERSION)?);
    let epoch = Epoch(number(item, EPOCH)?);
    let checkpoint_json = string(item, CHECKPOINT)?;
    let checkpoint: Position = serde_json::from_str(&checkpoint_json)
        .map_err(|e| format!("attribute `{CHECKPOINT}` is not a position: {e}"))?;
    let parents = match item.get(PARENTS) {
        None => Vec::new(),
        Some(AttributeValue::L(list)) => list
            .iter()
            .map(|v| match v {
                AttributeValue::S(p) => Ok(LeaseKey::from(p.as_str())),
                _ => Err(format!("attribute `{PARENTS}` holds an element that is not a string")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(format!("attribute `{PARENTS}` is not a list (L)")),
    };
    let attributes = match item.get(ATTRIBUTES) {
        None => BTreeMap::new(),
        Some(AttributeValue::M(map)) => map
            .iter()
            .map(|(k, v)| match v {
                AttributeValue::S(v) => Ok((k.clone(), v.clone())),
                _ => Err(format!("attribute `{ATTRIBUTES}.{k}` is not a string")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(format!("attribute `{ATTRIBUTES}` is not a map (M)")),
    };
    let owner = optional_string(item, OWNER)?.map(WorkerId::from);
    let claim = match (optional_string(item, CLAIM_BY)?, item.contains_key(CLAIM_AT)) {
        (Some(by), true) => {
            Some(Claim { by: WorkerId::from(by), at: Epoch(number(item, CLAIM_AT)?) })
        }
        (None, false) => None,
        _ => return Err(format!("attributes `{CLAIM_BY}` and `{CLAIM_AT}` must come together")),
    };
    let lease =
        Lease { key: LeaseKey::from(key), owner, epoch, checkpoint, parents, claim, attributes };
    Ok(VersionedLease::new(lease, version))
}

/// Decodes a worker item; the reason when it cannot be decoded.
pub(crate) fn decode_worker(item: &Item) -> Result<WorkerRecord, String> {
    let id = string(item, SK)?;
    let load = match item.get(LOAD) {
        None => None,
        Some(AttributeValue::N(x)) => {
            Some(x.parse::<f64>().map_err(|e| format!("attribute `{LOAD}` ({x}): {e}"))?)
        }
        Some(_) => return Err(format!("attribute `{LOAD}` is not a number (N)")),
    };
    let capacity = match item.get(CAPACITY) {
        None => None,
        Some(_) => Some(
            u32::try_from(number(item, CAPACITY)?)
                .map_err(|_| format!("attribute `{CAPACITY}` does not fit 32 bits"))?,
        ),
    };
    let changes = match item.get(CHANGES) {
        None => 0, // written before the field existed
        Some(_) => number(item, CHANGES)?,
    };
    // Absent when the worker publishes none, and in items written before the field existed.
    let lease_loads = match optional_string(item, LEASE_LOADS)? {
        None => Vec::new(),
        Some(text) => decode_lease_loads(&text)
            .map_err(|e| format!("attribute `{LEASE_LOADS}` is not lease loads: {e}"))?,
    };
    Ok(WorkerRecord {
        id: WorkerId::from(id),
        changes,
        beat: number(item, BEAT)?,
        updated_at_millis: number(item, UPDATED_AT)?,
        lease_count: u32::try_from(number(item, LEASE_COUNT)?)
            .map_err(|_| format!("attribute `{LEASE_COUNT}` does not fit 32 bits"))?,
        load,
        capacity,
        lease_loads,
    })
}

fn string(item: &Item, name: &str) -> Result<String, String> {
    optional_string(item, name)?.ok_or_else(|| format!("attribute `{name}` is missing"))
}

fn optional_string(item: &Item, name: &str) -> Result<Option<String>, String> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::S(v)) => Ok(Some(v.clone())),
        Some(_) => Err(format!("attribute `{name}` is not a string (S)")),
    }
}

fn number(item: &Item, name: &str) -> Result<u64, String> {
    match item.get(name) {
        None => Err(format!("attribute `{name}` is missing")),
        Some(AttributeValue::N(v)) => v
            .parse()
            .map_err(|_| format!("attribute `{name}` ({v}) is not a non-negative 64-bit integer")),
        Some(_) => Err(format!("attribute `{name}` is not a number (N)")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use shardlease_core::store::LeaseLoad;

    #[test]
    fn leases_round_trip() {
        let mut lease = Lease::new("shardId-1", Position::sequence(u128::MAX))
            .with_parents([LeaseKey::from("p1"), LeaseKey::from("p2")]);
        lease.owner = Some("w1".into());
        lease.epoch = Epoch(1_700_000_000_000);
        lease.claim = Some(Claim { by: "w2".into(), at: lease.epoch });
        lease.attributes.insert("hash".into(), "0-9".into());
        let item = lease_item("ns/leases", &lease, Version(i64::MAX as u64)).unwrap();
        assert_eq!(
            decode_lease(&item).unwrap(),
            VersionedLease::new(lease, Version(i64::MAX as u64))
        );
        let bare = Lease::new("k", Position::TrimHorizon);
        let item = lease_item("ns/leases", &bare, Version(1)).unwrap();
        assert!(!item.contains_key(OWNER) && !item.contains_key(CLAIM_BY));
        assert_eq!(decode_lease(&item).unwrap(), VersionedLease::new(bare, Version(1)));
    }

    #[test]
    fn workers_round_trip() {
        let mut w = WorkerRecord::new("w".into(), WorkerRecord::first_beat());
        assert_eq!(decode_worker(&worker_item("ns/workers", &w)).unwrap(), w);
        w.load = Some(0.1 + 0.2);
        w.capacity = Some(7);
        w.changes = 12;
        assert_eq!(decode_worker(&worker_item("ns/workers", &w)).unwrap(), w);
        w.load = Some(f64::NAN);
        assert_eq!(decode_worker(&worker_item("ns/workers", &w)).unwrap().load, None);
    }

    #[test]
    fn fleet_signals_round_trip_and_bad_ones_name_the_attribute() {
        for token in [Version(1), Version(Version::MAX_RANDOM), Version::random()] {
            let item = fleet_signal_item("ns/fleet", "signal", token);
            assert_eq!(decode_fleet_signal(&item).unwrap(), token);
        }
        let good = fleet_signal_item("ns/fleet", "signal", Version(5));
        for bad in [Some(s("5")), Some(n(-1)), Some(n(0)), Some(n(u64::MAX)), None] {
            let mut item = good.clone();
            match bad {
                Some(v) => item.insert(TOKEN.into(), v),
                None => item.remove(TOKEN),
            };
            let reason = decode_fleet_signal(&item).unwrap_err();
            assert!(reason.contains(TOKEN), "{reason}");
        }
    }

    #[test]
    fn lease_loads_are_one_string_absent_when_empty() {
        let mut w = WorkerRecord::new("w".into(), 3);
        assert!(!worker_item("ns/workers", &w).contains_key(LEASE_LOADS), "never an empty S");
        w.lease_loads = vec![
            LeaseLoad::new("stream a/shard 1", 0.25),
            LeaseLoad::new("s/2", 1.5e-7),
            LeaseLoad::new("s 3", 0.0),
        ];
        let item = worker_item("ns/workers", &w);
        assert!(
            matches!(item.get(LEASE_LOADS), Some(AttributeValue::S(t)) if t.lines().count() == 3)
        );
        let back = decode_worker(&item).unwrap().lease_loads;
        assert_eq!(back.len(), 3);
        for (a, b) in w.lease_loads.iter().zip(&back) {
            assert_eq!(a.key, b.key);
            assert!((a.load - b.load).abs() <= a.load * 1e-5, "{} vs {}", a.load, b.load);
        }
        // Missing (an item from before the attribute existed): no loads.
        let mut old = item.clone();
        old.remove(LEASE_LOADS);
        assert!(decode_worker(&old).unwrap().lease_loads.is_empty());
        for bad in [s("0.5"), s("x s/1"), s("-1 s/1"), n(3)] {
            let mut garbled = item.clone();
            garbled.insert(LEASE_LOADS.into(), bad);
            let reason = decode_worker(&garbled).unwrap_err();
            assert!(reason.contains(LEASE_LOADS), "{reason}");
        }
    }

    #[test]
    fn wrong_types_and_missing_attributes_name_the_attribute() {
        let lease = Lease::new("k", Position::Latest);
        let good = lease_item("p", &lease, Version(3)).unwrap();
        let cases: [(&str, Option<AttributeValue>); 5] = [
            (EPOCH, Some(s("three"))),
            (EPOCH, None),
            (CHECKPOINT, Some(s("{nope"))),
            (VERSION, Some(n(-1))),
            (PARENTS, Some(s("p1"))),
        ];
        for (name, value) in cases {
            let mut item = good.clone();
            match value {
                Some(v) => item.insert(name.into(), v),
                None => item.remove(name),
            };
            let reason = decode_lease(&item).unwrap_err();
            assert!(reason.contains(name), "{name}: {reason}");
        }
        let mut item = good;
        item.insert(CLAIM_AT.into(), n(1));
        assert!(decode_lease(&item).unwrap_err().contains(CLAIM_BY));
        assert_eq!(item_key(&item), "k");
    }
}
