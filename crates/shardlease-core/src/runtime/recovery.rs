//! Recovery from a store that lost or rolled back writes.
//!
//! Checkpoints never move backwards and epochs never go down while the store keeps its data, so
//! a worker that sees either happen knows the store lost writes: it was wiped (a Redis restarted
//! without persistence), rolled back (a failover to a lagging replica, a database restored from a
//! snapshot), or a fresh lease was created over a key the store forgot. Each worker remembers, per
//! lease, the furthest checkpoint and the highest epoch it has seen; every listing is compared with
//! that memory, and a lease the store lost is written back by compare-and-set (or created again)
//! with the remembered checkpoint, no owner, and an epoch above everything seen, so nothing is
//! skipped (records processed since the remembered checkpoint are processed again) and fencing
//! tokens handed to sinks never go backwards. A restore races a fresh create and wins: a fresh
//! lease starts at the initial position, which is behind the remembered checkpoint, so the next
//! listing finds it "lost" again until the restore lands.
//!
//! The memory lives in the process. A store that loses its data while no running worker has seen
//! it cannot be repaired this way; epochs still never go backwards then, because a lease is created
//! with an epoch taken from the wall clock ([`creation_epoch`]), which is above any epoch reached
//! by one increment per change of owner.

use std::collections::{BTreeMap, BTreeSet};

use crate::lease::{Lease, LeaseKey, Version, VersionedLease};
use crate::position::Position;

/// A lease the store lost: what to write back, and over which version (`None`: create it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The record to write: remembered checkpoint and parents, no owner, a higher epoch.
    pub restore: Lease,
    /// The version of the record the store holds now, if any.
    pub over: Option<Version>,
}

/// The epoch a new lease starts at: the wall clock in milliseconds. Any lease created before had
/// its epoch bumped once per change of owner, which is far slower than one per millisecond, so a
/// lease created again after the store lost its data starts above every epoch a sink has seen.
pub(crate) fn creation_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether reading from `now` would skip records that reading from `seen` reads: the checkpoint
/// moved backwards, or a starting point was replaced by a later one.
fn skips_from(seen: &Position, now: &Position) -> bool {
    match (seen, now) {
        (Position::TrimHorizon, Position::Latest | Position::AtTimestamp { .. }) => true,
        (Position::AtTimestamp { .. }, Position::Latest) => true,
        (Position::AtTimestamp { millis: a }, Position::AtTimestamp { millis: b }) => b > a,
        (Position::Sequence { .. } | Position::ShardEnd, _) => seen.would_regress_to(now),
        _ => false,
    }
}

/// Compares a listing with `memory`, returns the leases the store lost, and updates the memory
/// with what the listing shows (keeping the remembered values of lost leases until they are
/// restored). `corrupt` keys are left alone: their records exist but cannot be read.
pub(crate) fn compare(
    memory: &mut BTreeMap<LeaseKey, Lease>,
    listed: &[VersionedLease],
    corrupt: &BTreeSet<LeaseKey>,
) -> Vec<Lost> {
    let by_key: BTreeMap<&LeaseKey, &VersionedLease> =
        listed.iter().map(|v| (&v.0.key, v)).collect();
    let mut lost = Vec::new();
    for (key, seen) in memory.iter() {
        if corrupt.contains(key) {
            continue;
        }
        match by_key.get(key) {
            None if !seen.is_finished() && !moved_on_past(key, listed) => lost.push(Lost {
                restore: Lease {
                    owner: None,
                    claim: None,
                    epoch: (seen.epoch + 1).max(creation_epoch()),
                    ..seen.clone()
                },
                over: None,
            }),
            None => {}
            Some((now, version)) => {
                let skipped = skips_from(&seen.checkpoint, &now.checkpoint);
                if skipped || now.epoch < seen.epoch {
                    let checkpoint =
                        if skipped { seen.checkpoint.clone() } else { now.checkpoint.clone() };
                    lost.push(Lost {
                        restore: Lease {
                            key: key.clone(),
                            owner: None,
                            claim: None,
                            epoch: now.epoch.max(seen.epoch) + 1,
                            checkpoint,
                            parents: seen.parents.clone(),
                            attributes: now.attributes.clone(),
                        },
                        over: Some(*version),
                    });
                }
            }
        }
    }
    let lost_keys: BTreeSet<&LeaseKey> = lost.iter().map(|l| &l.restore.key).collect();
    let mut next: BTreeMap<LeaseKey, Lease> = listed
        .iter()
        .filter(|(l, _)| !lost_keys.contains(&l.key))
        .map(|(l, _)| (l.key.clone(), l.clone()))
        .collect();
    for key in lost_keys.into_iter().chain(corrupt.iter()) {
        if let Some(seen) = memory.get(key) {
            next.insert(key.clone(), seen.clone());
        }
    }
    *memory = next;
    lost
}

/// Whether a lease missing from the listing was deleted by the shard sync's garbage collection:
/// that only happens once every child of it moved past its start, which children cannot do
/// before their parent finished.
fn moved_on_past(key: &LeaseKey, listed: &[VersionedLease]) -> bool {
    let mut children = listed.iter().filter(|(l, _)| l.parents.contains(key)).peekable();
    children.peek().is_some()
        && children
            .all(|(l, _)| matches!(l.checkpoint, Position::Sequence { .. } | Position::ShardEnd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkerId;

    fn seq(n: u128) -> Position {
        Position::sequence(crate::position::SequenceNumber::from(n))
    }

    fn lease(key: &str, epoch: u64, checkpoint: Position) -> Lease {
        Lease { epoch, owner: Some(WorkerId::new("w")), ..Lease::new(key, checkpoint) }
    }

    fn listed(leases: &[Lease]) -> Vec<VersionedLease> {
        leases.iter().cloned().enumerate().map(|(i, l)| (l, Version(i as u64 + 1))).collect()
    }

    #[test]
    fn a_normal_listing_loses_nothing_and_is_remembered() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        assert!(compare(&mut memory, &listed(&[lease("a", 1, seq(5))]), &none).is_empty());
        let later = listed(&[lease("a", 2, seq(9)), lease("b", 1, Position::TrimHorizon)]);
        assert!(compare(&mut memory, &later, &none).is_empty());
        assert_eq!(memory[&LeaseKey::new("a")].checkpoint, seq(9));
        assert_eq!(memory.len(), 2);
    }

    #[test]
    fn vanished_regressed_and_rolled_back_leases_are_restored_above_every_epoch_seen() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        let before = listed(&[
            lease("gone", 4, seq(5)),
            lease("fresh", 7, seq(8)),
            lease("rolled", 9, seq(3)),
            lease("fine", 2, seq(1)),
        ]);
        compare(&mut memory, &before, &none);
        let after = listed(&[
            Lease::new("fresh", Position::Latest),
            lease("rolled", 6, seq(3)),
            lease("fine", 3, seq(2)),
        ]);
        let lost = compare(&mut memory, &after, &none);
        let by: BTreeMap<&str, &Lost> = lost.iter().map(|l| (l.restore.key.as_str(), l)).collect();
        assert_eq!(by.len(), 3, "{lost:?}");
        assert_eq!(by["gone"].over, None);
        assert_eq!(by["gone"].restore.checkpoint, seq(5));
        assert!(by["gone"].restore.epoch > 4);
        assert_eq!(by["fresh"].restore.checkpoint, seq(8));
        assert_eq!(by["fresh"].restore.epoch, 8);
        assert_eq!(by["fresh"].over, Some(Version(1)));
        assert_eq!(by["rolled"].restore.epoch, 10);
        assert!(by.values().all(|l| l.restore.owner.is_none()));
        // Not restored yet: the next listing finds them lost again.
        assert_eq!(compare(&mut memory, &after, &none).len(), 3);
    }

    #[test]
    fn a_collected_parent_and_a_corrupt_record_are_not_lost() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        let child = lease("child", 1, Position::TrimHorizon).with_parents([LeaseKey::new("p")]);
        compare(&mut memory, &listed(&[lease("p", 1, seq(5)), child.clone()]), &none);
        let moved = Lease { checkpoint: seq(100), ..child };
        assert!(compare(&mut memory, &listed(std::slice::from_ref(&moved)), &none).is_empty());
        compare(&mut memory, &listed(&[lease("c", 1, seq(5)), moved.clone()]), &none);
        let corrupt = BTreeSet::from([LeaseKey::new("c")]);
        assert!(compare(&mut memory, &listed(&[moved]), &corrupt).is_empty());
        assert!(memory.contains_key(&LeaseKey::new("c")), "remembered until readable again");
    }

    #[test]
    fn later_starting_points_skip_records() {
        let t = |m| Position::AtTimestamp { millis: m };
        assert!(skips_from(&Position::TrimHorizon, &Position::Latest));
        assert!(skips_from(&t(5), &t(6)));
        assert!(!skips_from(&t(6), &t(5)));
        assert!(!skips_from(&Position::Latest, &Position::TrimHorizon));
        assert!(skips_from(&seq(5), &Position::TrimHorizon));
        assert!(!skips_from(&seq(5), &Position::ShardEnd));
    }
}
