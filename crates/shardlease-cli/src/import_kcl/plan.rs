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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use shardlease::store::{Lease, VersionedLease};
use shardlease::{LeaseKey, Position, SequenceNumber};

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
    /// The shardlease lease key (the shard id), or the KCL key of a row that is not imported.
    pub key: String,
    /// The row's key in the KCL table.
    pub kcl_key: String,
    /// The checkpoint as shardlease writes it (`None` for rows not imported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The sub-sequence number of a sequence checkpoint (`all`: the whole Kinesis record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_sequence: Option<String>,
    /// Parent shards.
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

/// The inputs of a plan besides the rows.
pub struct Inputs<'a> {
    /// `--stream`: the stream whose multi-stream leases are imported.
    pub stream: Option<&'a str>,
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
            Row::Lease(l) => match (&l.stream, inputs.stream) {
                (Some(s), None) => others.push(skipped(
                    l.kcl_key.clone(),
                    format!("multi-stream lease of stream {s}: pass --stream {s} to import it"),
                    l.owner.clone(),
                )),
                (Some(s), Some(want)) if s != want => others.push(skipped(
                    l.kcl_key.clone(),
                    format!("lease of stream {s}, not of --stream {want}"),
                    l.owner.clone(),
                )),
                _ => leases.push(entry_of(&l, inputs)),
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

fn entry_of(l: &KclLease, inputs: &Inputs<'_>) -> Entry {
    let mut e = Entry {
        key: l.shard.clone(),
        kcl_key: l.kcl_key.clone(),
        checkpoint: None,
        sub_sequence: None,
        parents: l.parents.clone(),
        state: None,
        action: Action::Create,
        note: String::new(),
        kcl_owner: l.owner.clone(),
        lease: None,
    };
    if l.kcl_key != l.shard {
        e.note = format!("KCL key {}", l.kcl_key);
    }
    match position_of(&l.checkpoint, inputs.initial) {
        Ok(position) => {
            let (cp, sub) = show(&position);
            e.checkpoint = Some(cp);
            e.sub_sequence = sub;
            let mut lease = Lease::new(l.shard.as_str(), position)
                .with_parents(l.parents.iter().map(|p| LeaseKey::from(p.as_str())));
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

/// Two rows that map to one shardlease key (a stream recreated under the same name, in a
/// multi-stream table) cannot both be imported.
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
                "{} KCL leases map to lease key {}: {}; import them into separate namespaces \
                 (one --stream each) or remove the stale ones",
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
        Inputs { stream: None, initial: None, target, target_corrupt: corrupt, epoch: Epoch(7) }
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
