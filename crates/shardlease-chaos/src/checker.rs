//! The checker: reads what the fleet wrote after a run and judges it against the at-least-once
//! promise. Every record the producer had acknowledged was processed at least once (none lost);
//! no checkpoint moved backwards (a write that began after another had been answered never names
//! an earlier position, and the store's final checkpoint is no earlier than any accepted one); no
//! checkpoint was accepted from a worker that no longer owned the lease (a write that began after
//! the lease had been granted at a higher epoch, or two owners under one epoch). Duplicates are
//! counted, not failed: at-least-once allows them. A run with the effectively-once sink
//! ([`check_exactly_once`]) is held to more: every acknowledged record in the sink's table, and
//! none twice.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::events::{ConsumerEvent, Produced};

/// A lease row as the store holds it at the end of a run.
#[derive(Clone, Debug)]
pub struct FinalLease {
    /// The shard.
    pub shard: String,
    /// The epoch.
    pub epoch: u64,
    /// The checkpoint, as the consumers label positions.
    pub checkpoint: String,
}

/// What the checker found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdict {
    /// Records the producer had acknowledged.
    pub records: usize,
    /// Acknowledged records no consumer processed.
    pub lost: usize,
    /// Extra processings (a record processed n times counts n - 1).
    pub duplicates: usize,
    /// Checkpoints that moved backwards.
    pub regressions: usize,
    /// Checkpoints accepted from a worker that was not the lease's owner at the time.
    pub foreign_checkpoints: usize,
    /// Accepted checkpoints seen.
    pub checkpoints: usize,
    /// Examples of each problem (a few of each), for the history file.
    pub examples: Vec<String>,
    /// Judged against the effectively-once promise: a duplicate fails the run.
    pub exactly_once: bool,
    /// The store was wiped during the run: checkpoints written since the workers last listed the
    /// leases are gone, so regressions and overlapping owners are reported, not failed (the
    /// bound of docs/reliability.md: duplicates, never losses).
    pub wiped: bool,
}

impl Verdict {
    /// Whether the run kept every promise.
    pub fn ok(&self) -> bool {
        self.lost == 0
            && (self.wiped || (self.regressions == 0 && self.foreign_checkpoints == 0))
            && (!self.exactly_once || self.duplicates == 0)
    }
}

/// Judges a run with the effectively-once sink from the ids of the rows in its table (one per
/// row): every acknowledged record there, none twice. Rows of records the producer never saw
/// acknowledged (a put that timed out but landed) are neither lost nor duplicates unless twice.
pub fn check_exactly_once(produced: &[Produced], rows: &[String]) -> Verdict {
    let mut v = Verdict { records: produced.len(), exactly_once: true, ..Verdict::default() };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for id in rows {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    for p in produced {
        if !seen.contains_key(p.id.as_str()) {
            v.lost += 1;
            if v.lost <= 5 {
                v.examples.push(format!("not in the sink: {} ({} seq {})", p.id, p.shard, p.seq));
            }
        }
    }
    for (id, n) in &seen {
        if *n > 1 {
            v.duplicates += n - 1;
            if v.examples.len() < 10 {
                v.examples.push(format!("{id} written {n} times"));
            }
        }
    }
    v
}

/// Orders positions: sequence numbers numerically (decimal strings without leading zeros), `END`
/// after all of them.
pub fn cmp_pos(a: &str, b: &str) -> Ordering {
    match (a == "END", b == "END") {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.len().cmp(&b.len()).then_with(|| a.cmp(b)),
    }
}

struct Ck<'a> {
    t0: u64,
    t1: u64,
    pos: &'a str,
    owner: &'a str,
    epoch: u64,
}

/// Judges a run.
pub fn check(produced: &[Produced], events: &[ConsumerEvent], finals: &[FinalLease]) -> Verdict {
    let mut v = Verdict { records: produced.len(), ..Verdict::default() };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    // Per shard: grants (time, epoch, owner) and accepted checkpoints.
    let mut grants: BTreeMap<&str, Vec<(u64, u64, &str)>> = BTreeMap::new();
    let mut cks: BTreeMap<&str, Vec<Ck<'_>>> = BTreeMap::new();
    for e in events {
        match e {
            ConsumerEvent::Rec { id, .. } => *seen.entry(id.as_str()).or_default() += 1,
            ConsumerEvent::Init { t, shard, owner, epoch, .. } => {
                grants.entry(shard).or_default().push((*t, *epoch, owner));
            }
            ConsumerEvent::Ckpt { t0, t1, shard, pos, owner, epoch, ok: true, .. } => {
                cks.entry(shard).or_default().push(Ck {
                    t0: *t0,
                    t1: *t1,
                    pos,
                    owner,
                    epoch: *epoch,
                });
            }
            ConsumerEvent::Ckpt { .. } => {}
        }
    }
    for p in produced {
        if !seen.contains_key(p.id.as_str()) {
            v.lost += 1;
            if v.lost <= 5 {
                v.examples.push(format!("lost {} ({} seq {})", p.id, p.shard, p.seq));
            }
        }
    }
    let produced_ids: HashSet<&str> = produced.iter().map(|p| p.id.as_str()).collect();
    v.duplicates = seen
        .iter()
        .filter(|(id, _)| produced_ids.contains(*id))
        .map(|(_, n)| n.saturating_sub(1))
        .sum();

    for (shard, list) in &mut cks {
        v.checkpoints += list.len();
        // Regressions: a write that began after another had been answered names an earlier
        // position.
        let mut by_t1: Vec<(u64, &str)> = list.iter().map(|c| (c.t1, c.pos)).collect();
        by_t1.sort_by_key(|x| x.0);
        list.sort_by_key(|c| c.t0);
        let mut i = 0;
        let mut max: Option<&str> = None;
        // Foreign: a write that began after a higher epoch had been granted (or had written).
        let mut shard_grants = grants.get(shard).cloned().unwrap_or_default();
        shard_grants.extend(list.iter().map(|c| (c.t1, c.epoch, c.owner)));
        shard_grants.sort_by_key(|g| g.0);
        let mut j = 0;
        let mut max_epoch: Option<(u64, &str)> = None;
        for c in list.iter() {
            while i < by_t1.len() && by_t1[i].0 < c.t0 {
                if max.is_none_or(|m| cmp_pos(by_t1[i].1, m) == Ordering::Greater) {
                    max = Some(by_t1[i].1);
                }
                i += 1;
            }
            if let Some(m) = max {
                if cmp_pos(c.pos, m) == Ordering::Less {
                    v.regressions += 1;
                    if v.regressions <= 5 {
                        v.examples.push(format!(
                            "regression on {shard}: {} by {} (epoch {}) at {} after {m}",
                            c.pos, c.owner, c.epoch, c.t0
                        ));
                    }
                }
            }
            while j < shard_grants.len() && shard_grants[j].0 < c.t0 {
                if max_epoch.is_none_or(|(e, _)| shard_grants[j].1 > e) {
                    max_epoch = Some((shard_grants[j].1, shard_grants[j].2));
                }
                j += 1;
            }
            if let Some((e, who)) = max_epoch {
                if e > c.epoch {
                    v.foreign_checkpoints += 1;
                    if v.foreign_checkpoints <= 5 {
                        v.examples.push(format!(
                            "foreign checkpoint on {shard}: {} by {} at epoch {} (t0 {}) after epoch {e} went to {who}",
                            c.pos, c.owner, c.epoch, c.t0
                        ));
                    }
                }
            }
        }
    }
    // Two owners under one epoch.
    let mut owners: BTreeMap<(&str, u64), HashSet<&str>> = BTreeMap::new();
    for (shard, list) in &grants {
        for (_, e, o) in list {
            owners.entry((shard, *e)).or_default().insert(o);
        }
    }
    for (shard, list) in &cks {
        for c in list {
            owners.entry((shard, c.epoch)).or_default().insert(c.owner);
        }
    }
    for ((shard, e), os) in owners {
        if os.len() > 1 {
            v.foreign_checkpoints += 1;
            v.examples.push(format!("two owners of {shard} under epoch {e}: {os:?}"));
        }
    }
    // The store's final rows: no earlier than any accepted checkpoint.
    for f in finals {
        let Some(list) = cks.get(f.shard.as_str()) else { continue };
        if let Some(best) = list.iter().map(|c| c.pos).max_by(|a, b| cmp_pos(a, b)) {
            if cmp_pos(&f.checkpoint, best) == Ordering::Less {
                v.regressions += 1;
                v.examples.push(format!(
                    "final checkpoint of {} is {} but {best} had been accepted",
                    f.shard, f.checkpoint
                ));
            }
        }
        if let Some(e) = list.iter().map(|c| c.epoch).max() {
            if f.epoch < e {
                v.regressions += 1;
                v.examples.push(format!(
                    "final epoch of {} is {} but a checkpoint was accepted at {e}",
                    f.shard, f.epoch
                ));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> ConsumerEvent {
        ConsumerEvent::Rec {
            shard: "s".into(),
            seq: "1".into(),
            id: id.into(),
            owner: "a".into(),
            epoch: 1,
        }
    }

    fn ck(t0: u64, t1: u64, pos: &str, owner: &str, epoch: u64) -> ConsumerEvent {
        ConsumerEvent::Ckpt {
            t0,
            t1,
            shard: "s".into(),
            pos: pos.into(),
            owner: owner.into(),
            epoch,
            ok: true,
            err: None,
        }
    }

    fn init(t: u64, owner: &str, epoch: u64) -> ConsumerEvent {
        ConsumerEvent::Init {
            t,
            shard: "s".into(),
            owner: owner.into(),
            epoch,
            start: "TRIM_HORIZON".into(),
        }
    }

    fn produced(ids: &[&str]) -> Vec<Produced> {
        ids.iter()
            .map(|i| Produced { id: (*i).into(), shard: "s".into(), seq: "1".into() })
            .collect()
    }

    #[test]
    fn exactly_once_fails_on_a_duplicate_row_and_on_a_missing_one() {
        let p = produced(&["a", "b"]);
        let rows = |ids: &[&str]| ids.iter().map(|i| (*i).to_owned()).collect::<Vec<_>>();
        assert!(check_exactly_once(&p, &rows(&["a", "b", "x"])).ok());
        let twice = check_exactly_once(&p, &rows(&["a", "b", "b"]));
        assert_eq!((twice.lost, twice.duplicates), (0, 1));
        assert!(!twice.ok());
        let missing = check_exactly_once(&p, &rows(&["a"]));
        assert_eq!((missing.lost, missing.duplicates), (1, 0));
        assert!(!missing.ok());
        // The at-least-once checker allows what exactly-once refuses.
        assert!(check(&p, &[rec("a"), rec("b"), rec("b")], &[]).ok());
    }

    #[test]
    fn after_a_wipe_only_a_lost_record_fails_the_run() {
        let back = [ck(1, 2, "100", "a", 1), ck(3, 4, "99", "a", 1)];
        let mut v = check(&produced(&["a"]), &[rec("a")], &[]);
        v.regressions = check(&[], &back, &[]).regressions;
        assert_eq!(v.regressions, 1);
        assert!(!v.ok());
        v.wiped = true;
        assert!(v.ok());
        v.lost = 1;
        assert!(!v.ok(), "a wipe never excuses a lost record");
    }

    #[test]
    fn counts_lost_and_duplicate_records() {
        let v = check(&produced(&["a", "b", "c"]), &[rec("a"), rec("a"), rec("c"), rec("x")], &[]);
        assert_eq!((v.records, v.lost, v.duplicates), (3, 1, 1));
        assert!(!v.ok());
    }

    #[test]
    fn a_later_write_at_an_earlier_position_is_a_regression() {
        let ok = [ck(1, 2, "10", "a", 1), ck(3, 4, "20", "a", 1), ck(5, 6, "END", "a", 1)];
        assert_eq!(check(&[], &ok, &[]).regressions, 0);
        let back = [ck(1, 2, "100", "a", 1), ck(3, 4, "99", "a", 1)];
        assert_eq!(check(&[], &back, &[]).regressions, 1);
        // Overlapping writes are not ordered: no verdict.
        let overlap = [ck(1, 4, "100", "a", 1), ck(2, 5, "99", "a", 1)];
        assert_eq!(check(&[], &overlap, &[]).regressions, 0);
        let fin = FinalLease { shard: "s".into(), epoch: 1, checkpoint: "10".into() };
        assert_eq!(check(&[], &ok, &[fin]).regressions, 1);
    }

    #[test]
    fn a_write_after_a_higher_grant_is_foreign() {
        let fine =
            [init(1, "a", 1), ck(2, 3, "10", "a", 1), init(4, "b", 2), ck(5, 6, "20", "b", 2)];
        assert_eq!(check(&[], &fine, &[]).foreign_checkpoints, 0);
        let zombie = [init(1, "a", 1), init(4, "b", 2), ck(5, 6, "10", "a", 1)];
        assert_eq!(check(&[], &zombie, &[]).foreign_checkpoints, 1);
        // A write under way when the lease moved is not judged.
        let racing = [init(1, "a", 1), ck(3, 6, "10", "a", 1), init(4, "b", 2)];
        assert_eq!(check(&[], &racing, &[]).foreign_checkpoints, 0);
        let twins = [init(1, "a", 1), init(2, "b", 1)];
        assert_eq!(check(&[], &twins, &[]).foreign_checkpoints, 1);
    }
}
