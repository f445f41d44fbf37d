//! From KCL leases to the shardlease leases an import writes, and what it does with each: create
//! it, leave it (the target already holds the same lease), report a conflict (the target holds a
//! different one, never overwritten), skip the row (not a lease, another stream) or refuse it
//! (a checkpoint that cannot be mapped). Pure: the caller reads the table and the target and
//! writes the leases; this file decides and prints.
//!
//! Checkpoints map one to one: a Java KCL checkpoint `(seq, sub)` names the last user record
//! processed, exactly what shardlease's `Position::Sequence { seq, sub }` means (the Kinesis
//! source resumes at `seq` and skips its user records up to `sub`). vmware-go-kcl records no
//! sub-sequence and resumes *after* the whole Kinesis record, so its checkpoint maps to every
//! user record of `seq` covered (`sub` = `i64::MAX`, shown as `all`). `SHARD_END` makes a
//! finished lease, so the children wait for nothing and start where their own leases say.
//!
//! Keys depend on the fleet the leases are for ([`Streams`]): a single-stream fleet reads bare
//! shard ids (a KCL multi-stream lease of the `--stream` keeps only its shard id); a multi-stream
//! fleet reads `stream/shardId`, made by core's [`qualify`] (the function the multi-stream source
//! keys its leases with), parents qualified by the same stream.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use shardlease::store::{Lease, VersionedLease};
use shardlease::{qualify, validate_stream_name, LeaseKey, Position, SequenceNumber};

use super::schema::{KclCheckpoint, KclLease, Row};

/// The sub-sequence number meaning "every user record of this Kinesis record": larger than any
/// aggregate's index, and the largest every store holds (SQL stores keep it in a BIGINT).
pub const WHOLE_RECORD: u64 = i64::MAX.unsigned_abs();

/// What the import does with a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Writes a new lease (dry run: would write it).
    Create,
    /// Wrote a new lease.
    Created,
    /// The target holds the same lease already: nothing to write.
    Unchanged,
    /// The target holds a different lease under that key: reported, never overwritten.
    Conflict,
    /// Not imported: not a lease, or a lease of another stream.
    Skipped,
    /// Cannot be imported as it is (see the note): the import writes nothing.
    Error,
}

impl Action {
    fn label(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Created => "created",
            Action::Unchanged => "unchanged",
            Action::Conflict => "conflict",
            Action::Skipped => "skipped",
            Action::Error => "error",
        }
    }
}

/// One row of the plan.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    /// The shardlease lease key (the shard id, or `stream/shardId` for a multi-stream fleet), or
    /// the KCL key of a row that is not imported.
    pub key: String,
    /// The row's key in the KCL table.
    pub kcl_key: String,
    /// The checkpoint as shardlease writes it (`None` for rows not imported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The sub-sequence number of a sequence checkpoint (`all`: the whole Kinesis record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_sequence: Option<String>,
    /// Parent shards, keyed as the lease is.
    pub parents: Vec<String>,
    /// The lease's state once imported: `finished`, `blocked on parent` or `unowned`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// What the import does.
    pub action: Action,
    /// Why, for anything but a plain create.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The KCL owner when the table was read (the import writes the lease unowned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kcl_owner: Option<String>,
    /// The lease to write.
    #[serde(skip)]
    pub lease: Option<Lease>,
}

/// Which leases the import writes, and under which keys: what the target fleet reads.
#[derive(Clone, Copy, Debug)]
pub enum Streams<'a> {
    /// A single-stream fleet: leases keyed by bare shard id. The KCL's multi-stream leases are
    /// skipped, but those of the stream named (`--stream`), which keep only their shard id.
    Single(Option<&'a str>),
    /// A multi-stream fleet (`--multi-stream`): the KCL's multi-stream leases keyed
    /// `stream/shardId`, of every stream in the table, or only of the streams named
    /// (`--stream`, repeatable) when some are. Single-stream leases are skipped.
    Multi(&'a [String]),
}

/// The inputs of a plan besides the rows.
pub struct Inputs<'a> {
    /// `--stream` and `--multi-stream`: which leases are imported, under which keys.
    pub streams: Streams<'a>,
    /// `--initial-position`: where leases without a recorded position start.
    pub initial: Option<&'a Position>,
    /// The target's leases now.
    pub target: &'a [VersionedLease],
    /// Keys of the target's records that cannot be decoded.
    pub target_corrupt: &'a BTreeSet<String>,
    /// The epoch new leases get.
    pub epoch: shardlease::Epoch,
}

/// The plan: every row, and what is in the target besides.
#[derive(Debug, Serialize)]
pub struct Plan {
    /// One entry per row, leases first in creation order (parents before children).
    pub entries: Vec<Entry>,
    /// Leases in the target that the import does not write (another key).
    pub foreign: Vec<String>,
}

impl Plan {
    /// How many entries have `action`.
    pub fn count(&self, action: Action) -> usize {
        self.entries.iter().filter(|e| e.action == action).count()
    }
}

/// The position a KCL checkpoint maps to, or why it cannot be mapped.
pub fn position_of(cp: &KclCheckpoint, initial: Option<&Position>) -> Result<Position, String> {
    match cp {
        KclCheckpoint::TrimHorizon => Ok(Position::TrimHorizon),
        KclCheckpoint::Latest => Ok(Position::Latest),
        KclCheckpoint::ShardEnd => Ok(Position::ShardEnd),
        KclCheckpoint::AtTimestamp => match initial {
            Some(p @ Position::AtTimestamp { .. }) => Ok(p.clone()),
            _ => Err("checkpoint AT_TIMESTAMP: the KCL keeps the timestamp in the \
                      application's configuration, not in the table; pass \
                      --initial-position 'AT_TIMESTAMP(MILLIS)' with the application's \
                      initialPositionInStream timestamp"
                .into()),
        },
        KclCheckpoint::None => initial.cloned().ok_or_else(|| {
            "no checkpoint yet: the KCL starts such a shard at the application's initial \
             position, which the table does not hold; pass --initial-position TRIM_HORIZON, \
             LATEST or 'AT_TIMESTAMP(MILLIS)' as the application configures it"
                .into()
        }),
        KclCheckpoint::Sequence { seq, sub } => {
            let seq = SequenceNumber::parse(seq)
                .map_err(|e| format!("checkpoint is not a sequence number or a sentinel: {e}"))?;
            Ok(Position::Sequence { seq, sub: sub.unwrap_or(WHOLE_RECORD) })
        }
    }
}

/// Whether `existing` is the lease the import would write: same checkpoint and parents (its
/// owner and epoch are the fleet's business).
pub fn same_lease(existing: &Lease, import: &Lease) -> bool {
    let set = |l: &Lease| l.parents.iter().cloned().collect::<BTreeSet<LeaseKey>>();
    existing.checkpoint == import.checkpoint && set(existing) == set(import)
}

/// Builds the plan from the table's rows and the target's leases.
pub fn build(rows: Vec<Row>, inputs: &Inputs<'_>) -> Plan {
    let mut leases: Vec<Entry> = Vec::new();
    let mut others: Vec<Entry> = Vec::new();
    for row in rows {
        match row {
            Row::NotALease { key, why } => others.push(skipped(key, why, None)),
            Row::Bad { key, why } => others.push(Entry {
                action: Action::Error,
                note: format!("cannot read this row: {why}"),
                ..skipped(key, String::new(), None)
            }),
            Row::Lease(l) => match left_out(&l, inputs.streams) {
                Some(why) => others.push(skipped(l.kcl_key.clone(), why, l.owner.clone())),
                None => leases.push(entry_of(&l, inputs)),
            },
        }
    }
    mark_duplicates(&mut leases);
    let target: HashMap<&str, &Lease> =
        inputs.target.iter().map(|v| (v.lease.key.as_str(), &v.lease)).collect();
    for e in &mut leases {
        let Some(lease) = &e.lease else { continue };
        if inputs.target_corrupt.contains(&e.key) {
            e.action = Action::Conflict;
            e.note = "the target's record under this key cannot be decoded".into();
        } else if let Some(existing) = target.get(e.key.as_str()) {
            if same_lease(existing, lease) {
                e.action = Action::Unchanged;
                e.note = "the target holds this lease already".into();
            } else {
                e.action = Action::Conflict;
                e.note = format!(
                    "the target holds it at {} with parents [{}]; left as it is",
                    existing.checkpoint,
                    join(existing.parents.iter().map(LeaseKey::as_str))
                );
            }
        }
    }
    states(&mut leases, &target);
    order(&mut leases);
    let planned: BTreeSet<&str> = leases.iter().map(|e| e.key.as_str()).collect();
    let mut foreign: Vec<String> = inputs
        .target
        .iter()
        .map(|v| v.lease.key.as_str())
        .chain(inputs.target_corrupt.iter().map(String::as_str))
        .filter(|k| !planned.contains(k))
        .map(str::to_owned)
        .collect();
    foreign.sort();
    foreign.dedup();
    leases.extend(others);
    Plan { entries: leases, foreign }
}

fn skipped(key: String, why: String, kcl_owner: Option<String>) -> Entry {
    Entry {
        kcl_key: key.clone(),
        key,
        checkpoint: None,
        sub_sequence: None,
        parents: Vec::new(),
        state: None,
        action: Action::Skipped,
        note: why,
        kcl_owner,
        lease: None,
    }
}

/// Why a lease is not imported for the fleet `streams` describes, if it is not.
fn left_out(l: &KclLease, streams: Streams<'_>) -> Option<String> {
    match (streams, l.stream.as_deref()) {
        (Streams::Single(None), Some(s)) => Some(format!(
            "multi-stream lease of stream {s}: pass --stream {s} or --multi-stream to import it"
        )),
        (Streams::Single(Some(want)), Some(s)) if s != want => {
            Some(format!("lease of stream {s}, not of --stream {want}"))
        }
        (Streams::Single(_), _) => None,
        (Streams::Multi(_), None) => Some(
            "single-stream lease (a bare shard id): the table does not say which stream it \
             reads; import it without --multi-stream, into a namespace of its own"
                .into(),
        ),
        (Streams::Multi(want), Some(s)) if !want.is_empty() && !want.iter().any(|w| w == s) => {
            Some(format!("lease of stream {s}, which no --stream names"))
        }
        (Streams::Multi(_), Some(_)) => None,
    }
}

/// The lease key and parent keys a lease is imported under: bare shard ids, or for a
/// multi-stream fleet `stream/shardId` as core's [`qualify`] makes them (the stream name checked
/// as core checks it: a name it would refuse cannot be a key's stream part).
pub fn keys_of(l: &KclLease, streams: Streams<'_>) -> Result<(String, Vec<String>), String> {
    match (streams, l.stream.as_deref()) {
        (Streams::Multi(_), Some(stream)) => {
            validate_stream_name(stream).map_err(|e| match e {
                shardlease::Error::Config(m) => {
                    format!("{m}: no multi-stream lease key can carry it")
                }
                other => other.to_string(),
            })?;
            let key = |shard: &str| qualify(stream, &LeaseKey::from(shard)).to_string();
            Ok((key(&l.shard), l.parents.iter().map(|p| key(p)).collect()))
        }
        _ => Ok((l.shard.clone(), l.parents.clone())),
    }
}

fn entry_of(l: &KclLease, inputs: &Inputs<'_>) -> Entry {
    let (key, parents) = match keys_of(l, inputs.streams) {
        Ok(k) => k,
        Err(why) => {
            return Entry {
                action: Action::Error,
                note: why,
                ..skipped(l.kcl_key.clone(), String::new(), l.owner.clone())
            }
        }
    };
    let mut e = Entry {
        key,
        kcl_key: l.kcl_key.clone(),
        checkpoint: None,
        sub_sequence: None,
        parents,
        state: None,
        action: Action::Create,
        note: String::new(),
        kcl_owner: l.owner.clone(),
        lease: None,
    };
    if l.kcl_key != e.key {
        e.note = format!("KCL key {}", l.kcl_key);
    }
    match position_of(&l.checkpoint, inputs.initial) {
        Ok(position) => {
            let (cp, sub) = show(&position);
            e.checkpoint = Some(cp);
            e.sub_sequence = sub;
            let mut lease = Lease::new(e.key.as_str(), position)
                .with_parents(e.parents.iter().map(|p| LeaseKey::from(p.as_str())));
            lease.epoch = inputs.epoch;
            e.lease = Some(lease);
        }
        Err(why) => {
            e.action = Action::Error;
            e.note = why;
        }
    }
    e
}

/// The checkpoint column and the sub-sequence column of a position.
fn show(p: &Position) -> (String, Option<String>) {
    match p {
        Position::Sequence { seq, sub: WHOLE_RECORD } => (seq.to_string(), Some("all".into())),
        Position::Sequence { seq, sub } => (seq.to_string(), Some(sub.to_string())),
        other => (other.to_string(), None),
    }
}

/// Two rows that map to one shardlease key cannot both be imported: in a multi-stream table, a
/// stream deleted and created again under its name (its old leases carry another creation
/// epoch), or streams of one name in two accounts.
fn mark_duplicates(leases: &mut [Entry]) {
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in leases.iter() {
        by_key.entry(e.key.clone()).or_default().push(e.kcl_key.clone());
    }
    for e in leases.iter_mut() {
        if let Some(keys) = by_key.get(&e.key).filter(|k| k.len() > 1) {
            e.action = Action::Error;
            e.lease = None;
            e.note = format!(
                "{} KCL leases map to lease key {}: {} (a stream deleted and created again \
                 under its name, or streams of one name in two accounts); remove the stale \
                 rows from the table",
                keys.len(),
                e.key,
                join(keys.iter().map(String::as_str))
            );
        }
    }
}

/// The state each lease has once imported, judged on the imported leases over the target's.
fn states(leases: &mut [Entry], target: &HashMap<&str, &Lease>) {
    let finished: HashMap<String, bool> = target
        .iter()
        .map(|(k, l)| ((*k).to_owned(), l.is_finished()))
        .chain(
            leases
                .iter()
                .filter(|e| e.action != Action::Conflict)
                .filter_map(|e| e.lease.as_ref().map(|l| (e.key.clone(), l.is_finished()))),
        )
        .collect();
    for e in leases.iter_mut() {
        let Some(lease) = &e.lease else { continue };
        e.state = Some(if lease.is_finished() {
            "finished"
        } else if e.parents.iter().any(|p| finished.get(p) == Some(&false)) {
            "blocked on parent"
        } else {
            "unowned"
        });
    }
}

/// Parents before children (by depth within the import), then by key.
fn order(leases: &mut [Entry]) {
    let parents: HashMap<String, Vec<String>> =
        leases.iter().map(|e| (e.key.clone(), e.parents.clone())).collect();
    let depth = |key: &str| {
        let mut d = 0usize;
        let mut level: Vec<&str> = vec![key];
        while d <= parents.len() {
            let next: Vec<&str> = level
                .iter()
                .filter_map(|k| parents.get(*k))
                .flatten()
                .map(String::as_str)
                .filter(|p| parents.contains_key(*p))
                .collect();
            if next.is_empty() {
                break;
            }
            level = next;
            d += 1;
        }
        d
    };
    let depths: HashMap<String, usize> =
        leases.iter().map(|e| (e.key.clone(), depth(&e.key))).collect();
    leases.sort_by(|a, b| {
        depths.get(&a.key).cmp(&depths.get(&b.key)).then_with(|| a.key.cmp(&b.key))
    });
}

fn join<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// The plan as a table.
pub fn table(plan: &Plan) -> String {
    let mut t = crate::output::table(&[
        "key",
        "checkpoint",
        "sub-seq",
        "parents",
        "state",
        "action",
        "note",
    ]);
    for e in &plan.entries {
        t.add_row(vec![
            e.key.clone(),
            e.checkpoint.clone().unwrap_or_else(|| "-".into()),
            e.sub_sequence.clone().unwrap_or_else(|| "-".into()),
            if e.parents.is_empty() {
                "-".into()
            } else {
                join(e.parents.iter().map(String::as_str))
            },
            e.state.unwrap_or("-").to_owned(),
            e.action.label().to_owned(),
            e.note.clone(),
        ]);
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardlease::Epoch;

    fn lease(shard: &str, cp: KclCheckpoint, parents: &[&str]) -> Row {
        Row::Lease(KclLease {
            kcl_key: shard.into(),
            stream: None,
            shard: shard.into(),
            checkpoint: cp,
            parents: parents.iter().map(|p| (*p).to_owned()).collect(),
            owner: None,
            renewal: None,
        })
    }

    fn inputs<'a>(target: &'a [VersionedLease], corrupt: &'a BTreeSet<String>) -> Inputs<'a> {
        Inputs {
            streams: Streams::Single(None),
            initial: None,
            target,
            target_corrupt: corrupt,
            epoch: Epoch(7),
        }
    }

    /// A Java multi-stream lease row: key `account:stream:creationEpoch:shardId`, parents by
    /// shard id, as the KCL writes them.
    fn multi(
        account: &str,
        stream: &str,
        created: u64,
        shard: &str,
        cp: KclCheckpoint,
        parents: &[&str],
    ) -> Row {
        Row::Lease(KclLease {
            kcl_key: format!("{account}:{stream}:{created}:{shard}"),
            stream: Some(stream.into()),
            shard: shard.into(),
            checkpoint: cp,
            parents: parents.iter().map(|p| (*p).to_owned()).collect(),
            owner: Some("kcl-worker".into()),
            renewal: Some("3".into()),
        })
    }

    fn versioned(lease: Lease) -> VersionedLease {
        VersionedLease { lease, version: shardlease::store::Version(1) }
    }

    /// Two streams' leases with a split in `orders` and a KPL sub-sequence in `clicks`, plus a
    /// single-stream lease that a multi-stream import cannot place.
    fn two_streams() -> Vec<Row> {
        let seq = |s: &str, sub| KclCheckpoint::Sequence { seq: s.into(), sub: Some(sub) };
        vec![
            multi("111", "orders", 1_700_000_000, "shardId-0", KclCheckpoint::ShardEnd, &[]),
            multi("111", "orders", 1_700_000_000, "shardId-1", seq("40", 0), &["shardId-0"]),
            multi("111", "orders", 1_700_000_000, "shardId-2", seq("41", 0), &[]),
            multi(
                "111",
                "orders",
                1_700_000_000,
                "shardId-3",
                KclCheckpoint::TrimHorizon,
                &["shardId-2"],
            ),
            multi("111", "clicks", 1_700_000_500, "shardId-0", seq("77", 3), &[]),
            lease("shardId-9", KclCheckpoint::Latest, &[]),
        ]
    }

    #[test]
    fn multi_stream_leases_are_keyed_stream_slash_shard_as_core_qualifies_them() {
        let empty = BTreeSet::new();
        let none: Vec<String> = Vec::new();
        let plan =
            build(two_streams(), &Inputs { streams: Streams::Multi(&none), ..inputs(&[], &empty) });
        let q = |stream: &str, shard: &str| qualify(stream, &LeaseKey::from(shard)).to_string();
        assert_eq!(q("orders", "shardId-1"), "orders/shardId-1");
        let by: HashMap<&str, &Entry> = plan.entries.iter().map(|e| (e.key.as_str(), e)).collect();
        assert_eq!(plan.count(Action::Create), 5, "{:?}", plan.entries);
        for (stream, shard, cp, parents, state) in [
            ("orders", "shardId-0", Position::ShardEnd, vec![], "finished"),
            (
                "orders",
                "shardId-1",
                Position::Sequence { seq: SequenceNumber::from(40u64), sub: 0 },
                vec![q("orders", "shardId-0")],
                "unowned",
            ),
            (
                "orders",
                "shardId-3",
                Position::TrimHorizon,
                vec![q("orders", "shardId-2")],
                "blocked on parent",
            ),
            (
                "clicks",
                "shardId-0",
                Position::Sequence { seq: SequenceNumber::from(77u64), sub: 3 },
                vec![],
                "unowned",
            ),
        ] {
            let key = q(stream, shard);
            let e = by.get(key.as_str()).unwrap_or_else(|| panic!("no {key}: {:?}", by.keys()));
            let l = e.lease.as_ref().unwrap_or_else(|| panic!("{key} has no lease"));
            assert_eq!(l.key.as_str(), key);
            assert_eq!(l.checkpoint, cp, "{key}");
            let got: Vec<String> = l.parents.iter().map(LeaseKey::to_string).collect();
            assert_eq!(got, parents, "{key}");
            assert_eq!(e.parents, parents, "{key}");
            assert_eq!(e.state, Some(state), "{key}");
            assert!(e.note.contains(&e.kcl_key), "{key}: the note names the KCL key");
            assert_eq!(e.kcl_owner.as_deref(), Some("kcl-worker"));
            assert_eq!(l.owner, None, "{key} must be imported unowned");
        }
        // Parents before children within the import.
        let at = |k: &str| plan.entries.iter().position(|e| e.key == k);
        assert!(at("orders/shardId-0") < at("orders/shardId-1"));
        assert!(at("orders/shardId-2") < at("orders/shardId-3"));
        // The bare lease cannot be placed in a stream: skipped and said why.
        let bare = by.get("shardId-9").unwrap_or_else(|| panic!("{:?}", by.keys()));
        assert_eq!(bare.action, Action::Skipped);
        assert!(bare.note.contains("without --multi-stream"), "{}", bare.note);

        // Without --multi-stream the same table imports nothing of the streams, and says how.
        let single = build(two_streams(), &inputs(&[], &empty));
        assert_eq!(single.count(Action::Create), 1);
        assert!(single
            .entries
            .iter()
            .filter(|e| e.action == Action::Skipped)
            .all(|e| e.note.contains("--multi-stream")));
    }

    #[test]
    fn multi_stream_import_keeps_only_the_named_streams_and_compares_with_the_target() {
        let empty = BTreeSet::new();
        let clicks = vec!["clicks".to_owned()];
        let plan = build(
            two_streams(),
            &Inputs { streams: Streams::Multi(&clicks), ..inputs(&[], &empty) },
        );
        let created: Vec<&str> = plan
            .entries
            .iter()
            .filter(|e| e.action == Action::Create)
            .map(|e| e.key.as_str())
            .collect();
        assert_eq!(created, ["clicks/shardId-0"]);
        let orders = plan
            .entries
            .iter()
            .find(|e| e.kcl_key == "111:orders:1700000000:shardId-1")
            .unwrap_or_else(|| panic!("{:?}", plan.entries));
        assert_eq!(orders.action, Action::Skipped);
        assert!(orders.note.contains("which no --stream names"), "{}", orders.note);

        // A second run: the target holds what the first wrote, so nothing is to be written;
        // a bare-keyed lease of a single-stream import is another key, not this lease.
        let all: Vec<String> = Vec::new();
        let first =
            build(two_streams(), &Inputs { streams: Streams::Multi(&all), ..inputs(&[], &empty) });
        let mut target: Vec<VersionedLease> =
            first.entries.iter().filter_map(|e| e.lease.clone()).map(versioned).collect();
        target.push(versioned(Lease::new("shardId-1", Position::Latest)));
        let again = build(
            two_streams(),
            &Inputs { streams: Streams::Multi(&all), ..inputs(&target, &empty) },
        );
        assert_eq!(again.count(Action::Unchanged), 5);
        assert_eq!(again.count(Action::Create), 0);
        assert_eq!(again.foreign, vec!["shardId-1".to_owned()]);
    }

    #[test]
    fn a_recreated_stream_or_a_slash_in_a_stream_name_is_refused() {
        let empty = BTreeSet::new();
        let all: Vec<String> = Vec::new();
        let seq = KclCheckpoint::Sequence { seq: "5".into(), sub: Some(0) };
        let rows = vec![
            multi("111", "orders", 1_700_000_000, "shardId-0", seq.clone(), &[]),
            // The same stream deleted and created again: its shard ids start over.
            multi("111", "orders", 1_800_000_000, "shardId-0", KclCheckpoint::TrimHorizon, &[]),
            multi("111", "orders", 1_800_000_000, "shardId-1", seq.clone(), &[]),
            multi("111", "a/b", 1_700_000_000, "shardId-0", seq, &[]),
        ];
        let plan = build(rows, &Inputs { streams: Streams::Multi(&all), ..inputs(&[], &empty) });
        let by: HashMap<&str, &Entry> =
            plan.entries.iter().map(|e| (e.kcl_key.as_str(), e)).collect();
        for old_or_new in ["111:orders:1700000000:shardId-0", "111:orders:1800000000:shardId-0"] {
            let e = by[old_or_new];
            assert_eq!(e.action, Action::Error, "{old_or_new}");
            assert!(e.lease.is_none());
            assert!(
                e.note.contains("2 KCL leases map to lease key orders/shardId-0"),
                "{}",
                e.note
            );
            assert!(e.note.contains("111:orders:1700000000:shardId-0"), "{}", e.note);
            assert!(e.note.contains("111:orders:1800000000:shardId-0"), "{}", e.note);
        }
        assert_eq!(by["111:orders:1800000000:shardId-1"].action, Action::Create);
        let slash = by["111:a/b:1700000000:shardId-0"];
        assert_eq!(slash.action, Action::Error);
        assert!(slash.note.contains("contains '/'"), "{}", slash.note);
        assert!(slash.lease.is_none());
        assert_eq!(plan.count(Action::Error), 3);

        // For a single-stream fleet a stream's name never reaches a key: `a/b` imports.
        let b = vec![multi("111", "a/b", 1, "shardId-0", KclCheckpoint::Latest, &[])];
        let single =
            build(b, &Inputs { streams: Streams::Single(Some("a/b")), ..inputs(&[], &empty) });
        assert_eq!(single.count(Action::Create), 1);
    }

    #[test]
    fn checkpoints_map_exactly_or_are_refused() {
        let seq = |s: &str, sub| KclCheckpoint::Sequence { seq: s.into(), sub };
        assert_eq!(
            position_of(&seq("12", Some(3)), None),
            Ok(Position::Sequence { seq: SequenceNumber::from(12u64), sub: 3 })
        );
        assert_eq!(
            position_of(&seq("12", None), None),
            Ok(Position::Sequence { seq: SequenceNumber::from(12u64), sub: WHOLE_RECORD })
        );
        assert_eq!(position_of(&KclCheckpoint::ShardEnd, None), Ok(Position::ShardEnd));
        assert!(position_of(&KclCheckpoint::AtTimestamp, None).is_err());
        assert!(position_of(&KclCheckpoint::AtTimestamp, Some(&Position::Latest)).is_err());
        let at = Position::AtTimestamp { millis: 5 };
        assert_eq!(position_of(&KclCheckpoint::AtTimestamp, Some(&at)), Ok(at.clone()));
        assert!(position_of(&KclCheckpoint::None, None).is_err());
        assert_eq!(position_of(&KclCheckpoint::None, Some(&at)), Ok(at));
        assert!(position_of(&seq("x1", Some(0)), None).is_err());
    }

    #[test]
    fn plan_orders_parents_first_and_compares_with_the_target() {
        let rows = vec![
            lease("c", KclCheckpoint::TrimHorizon, &["p"]),
            lease("p", KclCheckpoint::ShardEnd, &[]),
            lease("q", KclCheckpoint::Sequence { seq: "5".into(), sub: Some(1) }, &[]),
            lease("r", KclCheckpoint::Latest, &["q"]),
        ];
        let empty = BTreeSet::new();
        let plan = build(rows.clone(), &inputs(&[], &empty));
        let keys: Vec<&str> = plan.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["p", "q", "c", "r"]);
        let states: Vec<_> = plan.entries.iter().map(|e| e.state).collect();
        assert_eq!(
            states,
            [Some("finished"), Some("unowned"), Some("unowned"), Some("blocked on parent")]
        );
        assert_eq!(plan.count(Action::Create), 4);
        let target = vec![
            VersionedLease {
                lease: Lease::new("p", Position::ShardEnd),
                version: shardlease::store::Version(1),
            },
            VersionedLease {
                lease: Lease::new("q", Position::Latest),
                version: shardlease::store::Version(1),
            },
            VersionedLease {
                lease: Lease::new("z", Position::Latest),
                version: shardlease::store::Version(1),
            },
        ];
        let plan = build(rows, &inputs(&target, &empty));
        let by: HashMap<&str, Action> =
            plan.entries.iter().map(|e| (e.key.as_str(), e.action)).collect();
        assert_eq!(by["p"], Action::Unchanged);
        assert_eq!(by["q"], Action::Conflict);
        assert_eq!(by["c"], Action::Create);
        assert_eq!(plan.foreign, vec!["z".to_owned()]);
    }
}
