//! Leases and worker records to and from SQL columns, dialect-neutral.
//!
//! Reading goes through a raw form ([`RawLease`], [`RawWorker`]) holding each column as the
//! driver decoded it (or why it could not), so one decoder serves all three dialects and a bad
//! column becomes a [`CorruptRecord`] naming the column, never a panic.
//!
//! Versions: every create and update writes a fresh random version ([`new_version`]), a
//! positive `BIGINT`. A counter would repeat its numbers after the database is restored from a
//! backup; random versions never repeat for a key (see `Version`), with no counter row to touch.

use shardlease_core::Epoch;
use std::collections::BTreeMap;

use shardlease_core::store::{
    decode_lease_loads, encode_lease_loads, Claim, CorruptRecord, Lease, Version, VersionedLease,
    WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Position, Result, SequenceNumber, WorkerId};
use sqlx::{ColumnIndex, Decode, Row, Type};

/// Longest namespace, lease key or worker id, in characters (a `VARCHAR(255)` on MySQL; the same
/// limit everywhere, so a store can move between dialects).
pub(crate) const MAX_NAME_CHARS: usize = 255;

/// A fresh version for a write, as the `BIGINT` to store: random in `1..=i64::MAX`, and never
/// `replacing` (the version an update replaces). See `Version::random`.
pub(crate) fn new_version(replacing: Option<Version>) -> i64 {
    let v = match replacing {
        Some(previous) => Version::random_other_than(previous),
        None => Version::random(),
    };
    // `Version::random` stays within `1..=i64::MAX`; the fallback is unreachable.
    i64::try_from(v.0).unwrap_or(i64::MAX)
}

/// Checks a namespace, lease key or worker id against what every dialect can store.
pub(crate) fn check_name(what: &str, s: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(Error::InvalidInput(format!("{what} must not contain NUL characters")));
    }
    let chars = s.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(Error::InvalidInput(format!(
            "{what} is {chars} characters long; the SQL store keeps at most {MAX_NAME_CHARS}"
        )));
    }
    Ok(())
}

fn to_i64(what: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| {
        Error::InvalidInput(format!("{what} {v} does not fit the SQL store's BIGINT column"))
    })
}

/// The column values of a lease, ready to bind.
pub(crate) struct LeaseColumns<'a> {
    pub(crate) owner: Option<&'a str>,
    pub(crate) epoch: i64,
    pub(crate) checkpoint_kind: &'static str,
    pub(crate) checkpoint_seq: Option<&'a str>,
    pub(crate) checkpoint_sub: Option<i64>,
    pub(crate) checkpoint_millis: Option<i64>,
    pub(crate) parents: String,
    pub(crate) claim_by: Option<&'a str>,
    pub(crate) claim_at: Option<i64>,
    pub(crate) attributes: String,
    pub(crate) updated_at_millis: i64,
}

/// Encodes `lease` (its key is bound separately). Fails with `InvalidInput` for a value no
/// dialect could store.
pub(crate) fn encode_lease(lease: &Lease) -> Result<LeaseColumns<'_>> {
    check_name("lease key", lease.key.as_str())?;
    if let Some(owner) = &lease.owner {
        check_name("owner", owner.as_str())?;
    }
    if let Some(claim) = &lease.claim {
        check_name("claimant", claim.by.as_str())?;
    }
    let PositionColumns { checkpoint_kind, checkpoint_seq, checkpoint_sub, checkpoint_millis } =
        encode_position(&lease.checkpoint)?;
    let parents = serde_json::to_string(&lease.parents)
        .map_err(|e| Error::InvalidInput(format!("parents cannot be encoded: {e}")))?;
    let attributes = serde_json::to_string(&lease.attributes)
        .map_err(|e| Error::InvalidInput(format!("attributes cannot be encoded: {e}")))?;
    Ok(LeaseColumns {
        owner: lease.owner.as_ref().map(WorkerId::as_str),
        epoch: to_i64("epoch", lease.epoch.get())?,
        checkpoint_kind,
        checkpoint_seq,
        checkpoint_sub,
        checkpoint_millis,
        parents,
        claim_by: lease.claim.as_ref().map(|c| c.by.as_str()),
        claim_at: lease.claim.as_ref().map(|c| to_i64("claim epoch", c.at.get())).transpose()?,
        attributes,
        updated_at_millis: now_millis(),
    })
}

/// The four checkpoint columns of a position, ready to bind.
pub(crate) struct PositionColumns<'a> {
    pub(crate) checkpoint_kind: &'static str,
    pub(crate) checkpoint_seq: Option<&'a str>,
    pub(crate) checkpoint_sub: Option<i64>,
    pub(crate) checkpoint_millis: Option<i64>,
}

/// Encodes a position as its `checkpoint_*` columns.
pub(crate) fn encode_position(position: &Position) -> Result<PositionColumns<'_>> {
    let (checkpoint_kind, checkpoint_seq, checkpoint_sub, checkpoint_millis) = match position {
        Position::TrimHorizon => ("trim_horizon", None, None, None),
        Position::Latest => ("latest", None, None, None),
        Position::AtTimestamp { millis } => ("at_timestamp", None, None, Some(*millis)),
        Position::Sequence { seq, sub } => {
            ("sequence", Some(seq.as_str()), Some(to_i64("sub-sequence number", *sub)?), None)
        }
        Position::ShardEnd => ("shard_end", None, None, None),
    };
    Ok(PositionColumns { checkpoint_kind, checkpoint_seq, checkpoint_sub, checkpoint_millis })
}

/// Decodes the `checkpoint_*` columns of a row (`Err` names the column at fault).
pub(crate) fn decode_position(
    kind: Col<String>,
    seq: Col<String>,
    sub: Col<i64>,
    millis: Col<i64>,
) -> std::result::Result<Position, String> {
    let kind = required("checkpoint_kind", kind)?;
    Ok(match kind.as_str() {
        "trim_horizon" => Position::TrimHorizon,
        "latest" => Position::Latest,
        "shard_end" => Position::ShardEnd,
        "at_timestamp" => Position::AtTimestamp { millis: required("checkpoint_millis", millis)? },
        "sequence" => {
            let digits = required("checkpoint_seq", seq)?;
            let seq = SequenceNumber::parse(&digits)
                .map_err(|e| format!("column checkpoint_seq: {e}"))?;
            let sub = match optional("checkpoint_sub", sub)? {
                Some(sub) => unsigned("checkpoint_sub", sub)?,
                None => 0,
            };
            Position::Sequence { seq, sub }
        }
        other => {
            return Err(format!(
                "column checkpoint_kind has unknown value {:?}",
                other.chars().take(40).collect::<String>()
            ))
        }
    })
}

/// The column values of a worker record, ready to bind.
pub(crate) struct WorkerColumns<'a> {
    pub(crate) worker_id: &'a str,
    pub(crate) beat: i64,
    pub(crate) updated_at_millis: i64,
    pub(crate) lease_count: i64,
    pub(crate) load: Option<f64>,
    pub(crate) capacity: Option<i64>,
    pub(crate) changes: i64,
    /// The published lease loads as one text (`encode_lease_loads`); NULL when there are none.
    pub(crate) lease_loads: Option<String>,
}

/// Encodes a worker record. A load that is not a finite number is stored as NULL (SQLite cannot
/// keep NaN, and MySQL rejects it); so is an empty list of lease loads.
pub(crate) fn encode_worker(record: &WorkerRecord) -> Result<WorkerColumns<'_>> {
    check_name("worker id", record.id.as_str())?;
    Ok(WorkerColumns {
        worker_id: record.id.as_str(),
        beat: to_i64("beat", record.beat)?,
        updated_at_millis: to_i64("updated_at_millis", record.updated_at_millis)?,
        lease_count: i64::from(record.lease_count),
        load: record.load.filter(|l| l.is_finite()),
        capacity: record.capacity.map(i64::from),
        changes: to_i64("changes", record.changes)?,
        lease_loads: if record.lease_loads.is_empty() {
            None
        } else {
            Some(encode_lease_loads(&record.lease_loads))
        },
    })
}

fn now_millis() -> i64 {
    i64::try_from(shardlease_core::store::now_millis()).unwrap_or(i64::MAX)
}

/// One column as the driver decoded it, or why it could not.
pub(crate) type Col<T> = std::result::Result<Option<T>, String>;

/// Column `index` of `row`, decoded as an optional `T`.
pub(crate) fn col<'r, R, T>(row: &'r R, index: usize) -> Col<T>
where
    R: Row,
    usize: ColumnIndex<R>,
    Option<T>: Decode<'r, R::Database> + Type<R::Database>,
{
    row.try_get::<Option<T>, usize>(index).map_err(|e| e.to_string())
}

/// A lease row as the driver returned it.
pub(crate) struct RawLease {
    key: Col<String>,
    owner: Col<String>,
    epoch: Col<i64>,
    version: Col<i64>,
    checkpoint_kind: Col<String>,
    checkpoint_seq: Col<String>,
    checkpoint_sub: Col<i64>,
    checkpoint_millis: Col<i64>,
    parents: Col<String>,
    claim_by: Col<String>,
    claim_at: Col<i64>,
    attributes: Col<String>,
}

/// Reads a row selected with [`LEASE_COLUMNS`](crate::dialect::LEASE_COLUMNS).
pub(crate) fn read_lease<R>(row: &R) -> RawLease
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
{
    RawLease {
        key: col(row, 0),
        owner: col(row, 1),
        epoch: col(row, 2),
        version: col(row, 3),
        checkpoint_kind: col(row, 4),
        checkpoint_seq: col(row, 5),
        checkpoint_sub: col(row, 6),
        checkpoint_millis: col(row, 7),
        parents: col(row, 8),
        claim_by: col(row, 9),
        claim_at: col(row, 10),
        attributes: col(row, 11),
    }
}

fn required<T>(name: &str, c: Col<T>) -> std::result::Result<T, String> {
    match c {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(format!("column {name} is NULL")),
        Err(e) => Err(format!("column {name}: {e}")),
    }
}

fn optional<T>(name: &str, c: Col<T>) -> std::result::Result<Option<T>, String> {
    c.map_err(|e| format!("column {name}: {e}"))
}

fn unsigned(name: &str, v: i64) -> std::result::Result<u64, String> {
    u64::try_from(v).map_err(|_| format!("column {name} is negative ({v})"))
}

/// Decodes the `token` column of a fleet signal row: a positive `BIGINT`.
pub(crate) fn decode_token(token: Col<i64>) -> std::result::Result<Version, String> {
    let token = required("token", token)?;
    match unsigned("token", token)? {
        0 => Err("column token is 0 (tokens start at 1)".to_owned()),
        t => Ok(Version(t)),
    }
}

impl RawLease {
    /// The row's version, when that column decoded.
    pub(crate) fn version(&self) -> Option<i64> {
        self.version.as_ref().ok().copied().flatten()
    }

    /// The row's key, when that column decoded.
    pub(crate) fn key(&self) -> Option<&str> {
        self.key.as_ref().ok().and_then(Option::as_deref)
    }

    /// Decodes the row. `fallback_key` names the record when even its key column is unreadable.
    pub(crate) fn decode(
        self,
        fallback_key: &str,
    ) -> std::result::Result<VersionedLease, CorruptRecord> {
        let key = self.key().map_or_else(|| fallback_key.to_owned(), str::to_owned);
        self.decode_inner().map_err(|reason| CorruptRecord { key, reason })
    }

    fn decode_inner(self) -> std::result::Result<VersionedLease, String> {
        let key = required("lease_key", self.key)?;
        let owner = optional("owner", self.owner)?.map(WorkerId::from);
        let epoch = Epoch(unsigned("epoch", required("epoch", self.epoch)?)?);
        let version = required("version", self.version)?;
        if version <= 0 {
            return Err(format!("column version must be positive, got {version}"));
        }
        let checkpoint = decode_position(
            self.checkpoint_kind,
            self.checkpoint_seq,
            self.checkpoint_sub,
            self.checkpoint_millis,
        )?;
        let parents: Vec<LeaseKey> = serde_json::from_str(&required("parents", self.parents)?)
            .map_err(|e| format!("column parents is not a JSON array of strings: {e}"))?;
        let claim =
            match (optional("claim_by", self.claim_by)?, optional("claim_at", self.claim_at)?) {
                (None, None) => None,
                (Some(by), Some(at)) => {
                    Some(Claim { by: WorkerId::from(by), at: Epoch(unsigned("claim_at", at)?) })
                }
                _ => {
                    return Err("columns claim_by and claim_at must be both NULL or both set".into())
                }
            };
        let attributes: BTreeMap<String, String> =
            serde_json::from_str(&required("attributes", self.attributes)?)
                .map_err(|e| format!("column attributes is not a JSON object of strings: {e}"))?;
        let lease = Lease {
            key: LeaseKey::from(key),
            owner,
            epoch,
            checkpoint,
            parents,
            claim,
            attributes,
        };
        Ok(VersionedLease::new(lease, Version(version.unsigned_abs())))
    }
}

/// A worker row as the driver returned it.
pub(crate) struct RawWorker {
    id: Col<String>,
    beat: Col<i64>,
    updated_at_millis: Col<i64>,
    lease_count: Col<i64>,
    load: Col<f64>,
    capacity: Col<i64>,
    changes: Col<i64>,
    lease_loads: Col<String>,
}

/// Reads a row selected with [`WORKER_COLUMNS`](crate::dialect::WORKER_COLUMNS).
pub(crate) fn read_worker<R>(row: &R) -> RawWorker
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Option<f64>: Decode<'r, R::Database> + Type<R::Database>,
{
    RawWorker {
        id: col(row, 0),
        beat: col(row, 1),
        updated_at_millis: col(row, 2),
        lease_count: col(row, 3),
        load: col(row, 4),
        capacity: col(row, 5),
        changes: col(row, 6),
        lease_loads: col(row, 7),
    }
}

impl RawWorker {
    /// Decodes the row.
    pub(crate) fn decode(self) -> std::result::Result<WorkerRecord, CorruptRecord> {
        let key = match &self.id {
            Ok(Some(id)) => id.clone(),
            _ => "<worker with an unreadable worker_id>".to_owned(),
        };
        self.decode_inner().map_err(|reason| CorruptRecord { key, reason })
    }

    fn decode_inner(self) -> std::result::Result<WorkerRecord, String> {
        let id = WorkerId::from(required("worker_id", self.id)?);
        let beat = unsigned("beat", required("beat", self.beat)?)?;
        let updated_at_millis =
            unsigned("updated_at_millis", required("updated_at_millis", self.updated_at_millis)?)?;
        let lease_count = required("lease_count", self.lease_count)?;
        let lease_count = u32::try_from(lease_count)
            .map_err(|_| format!("column lease_count is out of range ({lease_count})"))?;
        let load = optional("load_figure", self.load)?;
        let capacity = optional("capacity", self.capacity)?
            .map(|c| u32::try_from(c).map_err(|_| format!("column capacity is out of range ({c})")))
            .transpose()?;
        let changes = unsigned("changes", required("changes", self.changes)?)?;
        // NULL in rows written before the column existed (schema 3), or by older workers.
        let lease_loads = match optional("lease_loads", self.lease_loads)? {
            Some(text) => {
                decode_lease_loads(&text).map_err(|e| format!("column lease_loads: {e}"))?
            }
            None => Vec::new(),
        };
        Ok(WorkerRecord {
            id,
            beat,
            updated_at_millis,
            lease_count,
            load,
            capacity,
            changes,
            lease_loads,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use shardlease_core::store::LeaseLoad;

    #[test]
    fn new_versions_are_positive_and_never_the_replaced_one() {
        for _ in 0..1000 {
            assert!(new_version(None) > 0);
            let v = new_version(Some(Version(7)));
            assert!(v > 0 && v != 7);
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("k", "shardId-000000000001").is_ok());
        assert!(check_name("k", "").is_ok());
        assert!(check_name("k", &"ü".repeat(255)).is_ok());
        assert!(matches!(check_name("k", &"a".repeat(256)), Err(Error::InvalidInput(_))));
        assert!(matches!(check_name("k", "a\0b"), Err(Error::InvalidInput(_))));
    }

    #[test]
    fn lease_columns_are_readable() {
        let mut lease = Lease::new("k", Position::Sequence { seq: 42u64.into(), sub: 3 });
        lease.parents = vec!["p1".into(), "p2".into()];
        lease.claim = Some(Claim { by: "w2".into(), at: Epoch(7) });
        lease.attributes.insert("hash".into(), "0-9".into());
        let c = encode_lease(&lease).unwrap();
        assert_eq!(c.checkpoint_kind, "sequence");
        assert_eq!((c.checkpoint_seq, c.checkpoint_sub), (Some("42"), Some(3)));
        assert_eq!(c.parents, r#"["p1","p2"]"#);
        assert_eq!(c.attributes, r#"{"hash":"0-9"}"#);
        assert_eq!((c.claim_by, c.claim_at), (Some("w2"), Some(7)));
        lease.epoch = Epoch(u64::MAX);
        assert!(matches!(encode_lease(&lease), Err(Error::InvalidInput(_))));
    }

    fn raw() -> RawLease {
        RawLease {
            key: Ok(Some("k".into())),
            owner: Ok(Some("w1".into())),
            epoch: Ok(Some(3)),
            version: Ok(Some(5 << 31)),
            checkpoint_kind: Ok(Some("sequence".into())),
            checkpoint_seq: Ok(Some("0012".into())),
            checkpoint_sub: Ok(Some(1)),
            checkpoint_millis: Ok(None),
            parents: Ok(Some("[]".into())),
            claim_by: Ok(None),
            claim_at: Ok(None),
            attributes: Ok(Some("{}".into())),
        }
    }

    #[test]
    fn good_rows_decode() {
        let VersionedLease { lease, version } = raw().decode("k").unwrap();
        assert_eq!(version, Version(1 << 33 | 1 << 31));
        assert_eq!(lease.checkpoint, Position::Sequence { seq: 12u64.into(), sub: 1 });
        assert_eq!(lease.owner, Some("w1".into()));
    }

    #[test]
    fn bad_rows_are_corrupt_not_panics() {
        let cases: Vec<(RawLease, &str)> = vec![
            (RawLease { epoch: Ok(Some(-1)), ..raw() }, "epoch is negative"),
            (RawLease { epoch: Err("mismatched types".into()), ..raw() }, "column epoch"),
            (RawLease { version: Ok(Some(0)), ..raw() }, "version must be positive"),
            (RawLease { checkpoint_kind: Ok(Some("bogus".into())), ..raw() }, "unknown value"),
            (RawLease { checkpoint_seq: Ok(Some("12x".into())), ..raw() }, "checkpoint_seq"),
            (RawLease { checkpoint_seq: Ok(None), ..raw() }, "checkpoint_seq is NULL"),
            (RawLease { parents: Ok(Some("not json".into())), ..raw() }, "parents"),
            (RawLease { attributes: Ok(Some("[1]".into())), ..raw() }, "attributes"),
            (RawLease { claim_by: Ok(Some("w".into())), ..raw() }, "claim_by and claim_at"),
            (RawLease { key: Ok(None), ..raw() }, "lease_key is NULL"),
        ];
        for (row, want) in cases {
            let bad = row.decode("fallback").unwrap_err();
            assert!(bad.reason.contains(want), "{want}: {}", bad.reason);
        }
        let bad = RawLease { key: Err("bad".into()), ..raw() }.decode("fallback").unwrap_err();
        assert_eq!(bad.key, "fallback");
    }

    #[test]
    fn workers_decode_or_are_corrupt() {
        let raw = || RawWorker {
            id: Ok(Some("w".into())),
            beat: Ok(Some(4)),
            updated_at_millis: Ok(Some(5)),
            lease_count: Ok(Some(6)),
            load: Ok(Some(0.5)),
            capacity: Ok(None),
            changes: Ok(Some(9)),
            lease_loads: Ok(None),
        };
        let w = raw().decode().unwrap();
        assert_eq!((w.beat, w.lease_count, w.load, w.capacity), (4, 6, Some(0.5), None));
        assert_eq!(w.changes, 9);
        let bad = RawWorker { changes: Ok(Some(-1)), ..raw() }.decode().unwrap_err();
        assert!(bad.reason.contains("changes"), "{}", bad.reason);
        let bad = RawWorker { lease_count: Ok(Some(-6)), ..raw() }.decode().unwrap_err();
        assert_eq!(bad.key, "w");
        assert!(bad.reason.contains("lease_count"), "{}", bad.reason);
        let mut record = WorkerRecord::new("w".into(), 1);
        record.load = Some(f64::NAN);
        assert_eq!(encode_worker(&record).unwrap().load, None);
    }

    #[test]
    fn lease_loads_round_trip_through_their_column() {
        let mut record = WorkerRecord::new("w".into(), 1);
        assert_eq!(encode_worker(&record).unwrap().lease_loads, None, "no loads: NULL");
        record.lease_loads = vec![
            LeaseLoad::new("stream a/shard 1", 0.25),
            LeaseLoad::new("s/2", 1.5e-7),
            LeaseLoad::new("s 3", 0.0),
        ];
        let text = encode_worker(&record).unwrap().lease_loads.unwrap();
        let raw = |lease_loads: Col<String>| RawWorker {
            id: Ok(Some("w".into())),
            beat: Ok(Some(1)),
            updated_at_millis: Ok(Some(5)),
            lease_count: Ok(Some(3)),
            load: Ok(None),
            capacity: Ok(None),
            changes: Ok(Some(0)),
            lease_loads,
        };
        let back = raw(Ok(Some(text))).decode().unwrap().lease_loads;
        assert_eq!(back.len(), 3);
        for (a, b) in record.lease_loads.iter().zip(&back) {
            assert_eq!(a.key, b.key);
            assert!((a.load - b.load).abs() <= a.load * 1e-5, "{} vs {}", a.load, b.load);
        }
        // NULL (a row from before schema 3) and the empty text are no loads.
        assert!(raw(Ok(None)).decode().unwrap().lease_loads.is_empty());
        assert!(raw(Ok(Some(String::new()))).decode().unwrap().lease_loads.is_empty());
        for bad in ["0.5", "x s/1", "-1 s/1"] {
            let bad = raw(Ok(Some(bad.into()))).decode().unwrap_err();
            assert_eq!(bad.key, "w");
            assert!(bad.reason.contains("column lease_loads"), "{}", bad.reason);
        }
        let bad = raw(Err("mismatched types".into())).decode().unwrap_err();
        assert!(bad.reason.contains("column lease_loads"), "{}", bad.reason);
    }
}
