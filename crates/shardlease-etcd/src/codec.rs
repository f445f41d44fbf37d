//! The encoding of the values this store writes: JSON documents with a format number, readable
//! with `etcdctl get` and open to new fields.
//!
//! ```text
//! lease:  {"format":1,"version":8051934172,"key":"shard-1","owner":"w1","epoch":3,
//!          "checkpoint":{"kind":"sequence","seq":"4959…","sub":0},"parents":[],"claim":null,
//!          "attributes":{}}
//! worker: {"format":1,"id":"w1","beat":17,"updated_at_millis":…,"lease_count":4,…}
//! fleet signal: {"format":1,"token":5813290917448120}
//! ```
//!
//! `version` is the record's [`Version`]: drawn at random by the writer for every write and
//! stored in the value, so it never repeats for a key, even after etcd was restored from a
//! snapshot and its revisions went back (see the crate docs). A value with another `format`, or
//! one that does not decode, is reported as `Corrupt` for that record only.

use shardlease_core::store::VersionedLease;
use shardlease_core::Epoch;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shardlease_core::store::{Claim, Lease, Version, WorkerRecord};
use shardlease_core::{LeaseKey, Position, WorkerId};

/// The format number this version of the crate writes and reads.
pub const FORMAT: u32 = 1;

// The lease document's fields are spelled out (no `#[serde(flatten)]`, which buffers the whole
// document first): every worker decodes every lease write its watch delivers, twice (before and
// after), so decoding must be cheap.
#[derive(Serialize)]
struct LeaseOut<'a> {
    format: u32,
    version: u64,
    key: &'a LeaseKey,
    owner: &'a Option<WorkerId>,
    epoch: u64,
    checkpoint: &'a Position,
    parents: &'a [LeaseKey],
    claim: &'a Option<Claim>,
    attributes: &'a BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct LeaseIn {
    format: u32,
    version: u64,
    key: LeaseKey,
    owner: Option<WorkerId>,
    epoch: u64,
    checkpoint: Position,
    #[serde(default)]
    parents: Vec<LeaseKey>,
    #[serde(default)]
    claim: Option<Claim>,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct FleetSignalDoc {
    format: u32,
    token: u64,
}

#[derive(Serialize)]
struct WorkerOut<'a> {
    format: u32,
    #[serde(flatten)]
    record: &'a WorkerRecord,
}

#[derive(Deserialize)]
struct WorkerIn {
    format: u32,
    #[serde(flatten)]
    record: WorkerRecord,
}

/// The value of a lease record at `version`.
pub fn encode_lease(lease: &Lease, version: Version) -> Vec<u8> {
    // Serializing plain data to a Vec cannot fail; an empty value would decode as corrupt.
    let doc = LeaseOut {
        format: FORMAT,
        version: version.0,
        key: &lease.key,
        owner: &lease.owner,
        epoch: lease.epoch.get(),
        checkpoint: &lease.checkpoint,
        parents: &lease.parents,
        claim: &lease.claim,
        attributes: &lease.attributes,
    };
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// Decodes a lease record stored under `key`; the error says why it is corrupt.
pub fn decode_lease(key: &str, value: &[u8]) -> Result<VersionedLease, String> {
    let doc: LeaseIn =
        serde_json::from_slice(value).map_err(|e| format!("not a lease document: {e}"))?;
    if doc.format != FORMAT {
        return Err(format!("unknown format {} (this version reads {FORMAT})", doc.format));
    }
    if doc.key.as_str() != key {
        return Err(format!("the document names lease {:?}", doc.key.as_str()));
    }
    let lease = Lease {
        key: doc.key,
        owner: doc.owner,
        epoch: Epoch(doc.epoch),
        checkpoint: doc.checkpoint,
        parents: doc.parents,
        claim: doc.claim,
        attributes: doc.attributes,
    };
    Ok(VersionedLease::new(lease, Version(doc.version)))
}

/// The value of a worker record.
pub fn encode_worker(record: &WorkerRecord) -> Vec<u8> {
    serde_json::to_vec(&WorkerOut { format: FORMAT, record }).unwrap_or_default()
}

/// Decodes a worker record stored under `id`; the error says why it is corrupt.
pub fn decode_worker(id: &str, value: &[u8]) -> Result<WorkerRecord, String> {
    let doc: WorkerIn =
        serde_json::from_slice(value).map_err(|e| format!("not a worker document: {e}"))?;
    if doc.format != FORMAT {
        return Err(format!("unknown format {} (this version reads {FORMAT})", doc.format));
    }
    if doc.record.id.as_str() != id {
        return Err(format!("the document names worker {:?}", doc.record.id.as_str()));
    }
    Ok(doc.record)
}

/// The value of the fleet signal holding `token`.
pub fn encode_fleet_signal(token: Version) -> Vec<u8> {
    serde_json::to_vec(&FleetSignalDoc { format: FORMAT, token: token.0 }).unwrap_or_default()
}

/// Decodes the fleet signal's value; the error says why it is corrupt (a token outside
/// `1..=Version::MAX_RANDOM` included: no writer stores one).
pub fn decode_fleet_signal(value: &[u8]) -> Result<Version, String> {
    let doc: FleetSignalDoc =
        serde_json::from_slice(value).map_err(|e| format!("not a fleet signal document: {e}"))?;
    if doc.format != FORMAT {
        return Err(format!("unknown format {} (this version reads {FORMAT})", doc.format));
    }
    if !(1..=Version::MAX_RANDOM).contains(&doc.token) {
        return Err(format!("token {} is out of range", doc.token));
    }
    Ok(Version(doc.token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_and_workers_round_trip() {
        let mut lease = Lease::new("s/1", Position::TrimHorizon);
        lease.owner = Some(WorkerId::new("w1"));
        lease.epoch = Epoch(9);
        lease.claim = Some(Claim { by: WorkerId::new("w2"), at: Epoch(9) });
        lease.attributes.insert("a".into(), "b".into());
        let v = Version(u64::MAX >> 1);
        let bytes = encode_lease(&lease, v);
        assert_eq!(decode_lease("s/1", &bytes), Ok(VersionedLease::new(lease, v)));
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("{\"format\":1,\"version\":"), "{text}");

        let w = WorkerRecord::new(WorkerId::new("w1"), 5);
        assert_eq!(decode_worker("w1", &encode_worker(&w)), Ok(w));
    }

    #[test]
    fn fleet_signals_round_trip_and_bad_ones_are_corrupt() {
        for token in [Version(1), Version(42), Version(Version::MAX_RANDOM)] {
            assert_eq!(decode_fleet_signal(&encode_fleet_signal(token)), Ok(token));
        }
        let text = String::from_utf8(encode_fleet_signal(Version(7))).unwrap();
        assert_eq!(text, r#"{"format":1,"token":7}"#);
        assert!(decode_fleet_signal(b"\xff not json").is_err());
        assert!(decode_fleet_signal(br#"{"format":2,"token":7}"#).unwrap_err().contains("format"));
        assert!(decode_fleet_signal(br#"{"format":1,"token":0}"#).is_err());
        assert!(decode_fleet_signal(br#"{"format":1,"token":-3}"#).is_err());
        assert!(decode_fleet_signal(br#"{"format":1}"#).is_err());
    }

    #[test]
    fn garbage_other_formats_and_misplaced_documents_are_corrupt() {
        let lease = Lease::new("k", Position::Latest);
        assert!(decode_lease("k", b"\xff not json").is_err());
        assert!(decode_lease("other", &encode_lease(&lease, Version(1))).is_err());
        let v2 = String::from_utf8(encode_lease(&lease, Version(1)))
            .unwrap()
            .replace("\"format\":1", "\"format\":2");
        assert!(decode_lease("k", v2.as_bytes()).unwrap_err().contains("format 2"));
        assert!(decode_worker("w", b"{}").is_err());
    }

    #[test]
    fn lease_loads_round_trip_and_are_left_out_when_empty() {
        use shardlease_core::store::LeaseLoad;
        let mut w = WorkerRecord::new(WorkerId::new("w1"), 5);
        let text = String::from_utf8(encode_worker(&w)).unwrap();
        assert!(!text.contains("lease_loads"), "{text}");
        w.load = Some(0.75);
        w.lease_loads = vec![
            LeaseLoad::new("stream a/shard 1", 0.25),
            LeaseLoad::new("s/2", 1.5e-7),
            LeaseLoad::new("s 3", 0.0),
        ];
        assert_eq!(decode_worker("w1", &encode_worker(&w)), Ok(w.clone()), "exact through JSON");
        // A document from before the field existed: no loads.
        let old = br#"{"format":1,"id":"w1","beat":5,"updated_at_millis":1,"lease_count":0}"#;
        assert_eq!(decode_worker("w1", old).map(|r| r.lease_loads), Ok(Vec::new()));
        let bad = br#"{"format":1,"id":"w1","beat":5,"updated_at_millis":1,"lease_count":0,
            "lease_loads":"0.5 k"}"#;
        assert!(decode_worker("w1", bad).is_err());
    }
}
