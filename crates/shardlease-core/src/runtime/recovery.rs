//! Recovery from a store that lost or rolled back writes.
//!
//! Checkpoints never move backwards and epochs never go down while the store keeps its data, so
//! a worker that sees either happen knows the store lost writes: it was wiped (a Redis restarted
//! without persistence), rolled back (a failover to a lagging replica, a database restored from a
//! snapshot), or a fresh lease was created over a key the store forgot. Each worker remembers, per
//! lease, the furthest checkpoint and the highest epoch it has seen; every listing is compared with
//! that memory. A lease the store lost is written back by compare-and-set (or created again) with
//! the remembered checkpoint, so nothing is skipped (records processed since the remembered
//! checkpoint are processed again), and an epoch no lower than any seen, so fencing tokens handed
//! to sinks never go backwards.
//!
//! Who writes it back matters, because the lease may still be running somewhere. The worker that
//! runs it repairs it at once, keeping itself as the owner (at its task's epoch when it can, so the
//! task goes on undisturbed); the owner it remembers, if that is itself and it no longer runs it,
//! writes it back unowned at once; any other worker first gives the owner time for a balance pass
//! (its memory may be out of date), then writes it back to the remembered owner if that one is
//! alive (which re-takes it by compare-and-set), unowned otherwise. A lease a worker saw finished
//! is written back at once by any worker that remembers it: nobody can know a checkpoint past its
//! end, so there is nothing to wait for. A restore races a fresh create and wins:
//! a fresh lease starts at the initial position, behind the remembered checkpoint, so the next
//! listing finds it lost again until the restore lands.
//!
//! The memory lives in the process. A store that loses its data while no running worker has seen
//! it cannot be repaired this way; epochs still never go backwards then, because a lease is created
//! with an epoch taken from the wall clock ([`transition::creation_epoch`]), which is above any epoch reached
//! by one increment per change of owner.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use crate::ids::WorkerId;
use crate::lease::transition::{self, next_epoch};
use crate::lease::{Epoch, Lease, LeaseKey, VersionedLease};
use crate::position::Position;

/// A lease the store lost: what this worker last saw of it, and what the store holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The lease as this worker last saw it (furthest checkpoint, highest epoch).
    pub seen: Lease,
    /// The record the store holds now, if any.
    pub now: Option<VersionedLease>,
}

/// What a worker remembers of one lease (see [`Memory`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Remembered {
    /// The furthest checkpoint and highest epoch seen, in the lease as last seen.
    pub lease: Lease,
    /// When this worker's own write last updated the entry, until a listing sent after that
    /// moment has been compared: a listing sent before it cannot show the write ([`fresh_keys`]).
    pub written_at: Option<Instant>,
}

impl Remembered {
    /// An entry learnt from a listing (no write of this worker's pending).
    pub(crate) fn listed(lease: Lease) -> Self {
        Remembered { lease, written_at: None }
    }
}

/// Per lease, what this worker has seen of the namespace: one map, so a lease and the stamp of
/// this worker's last write to it are always read and updated together.
pub(crate) type Memory = BTreeMap<LeaseKey, Remembered>;

/// The keys this worker wrote (and remembered) after a listing was sent at `list_sent`: that
/// listing may predate the write, so [`compare`] leaves them alone. Older stamps are cleared, no
/// longer needed once a listing sent after them is compared.
pub(crate) fn fresh_keys(memory: &mut Memory, list_sent: Instant) -> BTreeSet<LeaseKey> {
    let mut fresh = BTreeSet::new();
    for (key, r) in memory.iter_mut() {
        match r.written_at {
            Some(t) if t >= list_sent => {
                fresh.insert(key.clone());
            }
            Some(_) => r.written_at = None,
            None => {}
        }
    }
    fresh
}

/// Where this worker stands toward a lost lease.
#[derive(Clone, Debug)]
pub(crate) struct Standing<'a> {
    /// This worker.
    pub me: &'a WorkerId,
    /// The epoch this worker runs the lease at, if it runs it.
    pub running_at: Option<Epoch>,
    /// Whether the owner this worker remembers is alive (in its view).
    pub owner_alive: bool,
    /// Whether the lease has been found lost for long enough that its owner, if alive, has run
    /// a balance pass since (and repaired it, had it been running it).
    pub owner_had_time: bool,
    /// The wall clock in milliseconds, for the epoch rule ([`transition::next_epoch`]).
    pub now_millis: u64,
}

impl Lost {
    /// The key of the lease.
    pub(crate) fn key(&self) -> &LeaseKey {
        &self.seen.key
    }

    /// The record to write back from where this worker stands, or `None` to leave the repair to
    /// the lease's owner this pass.
    pub(crate) fn restoration(&self, at: &Standing<'_>) -> Option<Lease> {
        let seen = &self.seen;
        let now = self.now.as_ref().map(|v| &v.lease);
        let now_epoch = now.map_or(Epoch::ZERO, |l| l.epoch);
        let checkpoint = match now {
            Some(l) if !skips_from(&seen.checkpoint, &l.checkpoint) => l.checkpoint.clone(),
            _ => seen.checkpoint.clone(),
        };
        // A lease restored at `LATEST` would be reopened at a new tip, skipping what was written
        // since its first owner opened (and pinned) it, a pin this worker may never have seen:
        // when in doubt, read more.
        let checkpoint = match checkpoint {
            Position::Latest => Position::TrimHorizon,
            other => other,
        };
        let attributes = now.map_or_else(|| seen.attributes.clone(), |l| l.attributes.clone());
        let base = Lease { checkpoint, attributes, claim: None, ..seen.clone() };
        let runs_it =
            at.running_at.is_some_and(|e| e == seen.epoch) && seen.owner.as_ref() == Some(at.me);
        if runs_it {
            // Keep it, at the running task's epoch unless the store moved past it meanwhile.
            let still_at_task_epoch = now_epoch < seen.epoch
                || (now_epoch == seen.epoch && now.is_some_and(|l| l.is_owned_by(at.me)));
            let epoch =
                if still_at_task_epoch { seen.epoch } else { next_epoch(now_epoch, at.now_millis) };
            return Some(Lease { owner: Some(at.me.clone()), epoch, ..base });
        }
        let mine = seen.owner.as_ref() == Some(at.me);
        if !mine && !at.owner_had_time && !seen.is_finished() {
            // What this worker remembers may be out of date: whoever runs the lease now repairs
            // it first, under its own name. Not a lease this worker saw finished: nothing is
            // further along than its end and nobody runs it, so there is nothing to wait for,
            // and for as long as it stays unfinished in the store a worker that never saw it end
            // may take it and read the shard again.
            return None;
        }
        let epoch = next_epoch(now_epoch.max(seen.epoch), at.now_millis);
        // A live owner gets it back under a new epoch (it re-takes it by compare-and-set and
        // restarts its task; nobody else may take it meanwhile); otherwise it is left unowned.
        let owner = seen.owner.clone().filter(|_| !mine && at.owner_alive);
        Some(Lease { owner, epoch, ..base })
    }
}

/// The epoch a lease created now starts at ([`transition::creation_epoch`] at the wall clock).
pub(crate) fn creation_epoch() -> Epoch {
    transition::creation_epoch(crate::clock::now_millis())
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
/// restored). `corrupt` keys are left alone: their records exist but cannot be read. So are
/// `fresh` keys, remembered after the listing was sent: the listing may predate the write this
/// worker remembers (a start position pinned, a lease taken while the reply was on its way), so
/// it says nothing about whether the store lost it (the next listing will).
pub(crate) fn compare(
    memory: &mut Memory,
    listed: &[VersionedLease],
    corrupt: &BTreeSet<LeaseKey>,
    fresh: &BTreeSet<LeaseKey>,
) -> Vec<Lost> {
    let by_key: BTreeMap<&LeaseKey, &VersionedLease> =
        listed.iter().map(|v| (&v.lease.key, v)).collect();
    let mut lost = Vec::new();
    for (key, Remembered { lease: seen, .. }) in memory.iter() {
        if corrupt.contains(key) || fresh.contains(key) {
            continue;
        }
        match by_key.get(key) {
            None if !seen.is_finished() && !moved_on_past(key, listed) => {
                lost.push(Lost { seen: seen.clone(), now: None });
            }
            Some(now)
                if skips_from(&seen.checkpoint, &now.lease.checkpoint)
                    || now.lease.epoch < seen.epoch =>
            {
                lost.push(Lost { seen: seen.clone(), now: Some((*now).clone()) });
            }
            _ => {}
        }
    }
    let lost_keys: BTreeSet<&LeaseKey> = lost.iter().map(Lost::key).collect();
    let mut next: Memory = listed
        .iter()
        .filter(|v| !lost_keys.contains(&v.lease.key) && !fresh.contains(&v.lease.key))
        .map(|v| (v.lease.key.clone(), Remembered::listed(v.lease.clone())))
        .collect();
    for key in lost_keys.into_iter().chain(corrupt.iter()).chain(fresh.iter()) {
        if let Some(seen) = memory.get(key) {
            next.insert(key.clone(), seen.clone());
        }
    }
    // Finished leases stay remembered after they are deleted (the shard sync collects them once
    // their children moved on): should one come back behind its end (a fresh create after the
    // store lost its data), it is restored as finished instead of being processed again after its
    // children.
    for (key, seen) in memory.iter() {
        if seen.lease.is_finished() && !next.contains_key(key) {
            next.insert(key.clone(), seen.clone());
        }
    }
    *memory = next;
    lost
}

/// Drops from `lost` (and from `memory`) the vanished leases the shard sync collected while this
/// worker was not looking (partitioned, say): a lease is collected only once its children moved
/// on, and they may have been collected since too, so the stream's lineage (`children` of each
/// shard) is followed down to a listed descendant that moved past its start, which no descendant
/// can do before all its ancestors finished.
pub(crate) fn forget_collected(
    memory: &mut Memory,
    lost: Vec<Lost>,
    children: &BTreeMap<LeaseKey, Vec<LeaseKey>>,
    listed: &[VersionedLease],
) -> Vec<Lost> {
    let moved: BTreeSet<&LeaseKey> = listed
        .iter()
        .filter(|v| matches!(v.lease.checkpoint, Position::Sequence { .. } | Position::ShardEnd))
        .map(|v| &v.lease.key)
        .collect();
    let collected = |key: &LeaseKey| {
        let mut stack: Vec<&LeaseKey> = children.get(key).into_iter().flatten().collect();
        let mut seen = BTreeSet::new();
        while let Some(k) = stack.pop() {
            if !seen.insert(k) {
                continue;
            }
            if moved.contains(k) {
                return true;
            }
            stack.extend(children.get(k).into_iter().flatten());
        }
        false
    };
    let (gone, kept): (Vec<Lost>, Vec<Lost>) =
        lost.into_iter().partition(|l| l.now.is_none() && collected(l.key()));
    for l in gone {
        memory.remove(l.key());
    }
    kept
}

/// Whether a lease missing from the listing was deleted by the shard sync's garbage collection:
/// that only happens once every child of it moved past its start, which children cannot do
/// before their parent finished.
fn moved_on_past(key: &LeaseKey, listed: &[VersionedLease]) -> bool {
    let mut children = listed.iter().filter(|v| v.lease.parents.contains(key)).peekable();
    children.peek().is_some()
        && children
            .all(|v| matches!(v.lease.checkpoint, Position::Sequence { .. } | Position::ShardEnd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Version;

    fn seq(n: u128) -> Position {
        Position::sequence(crate::position::SequenceNumber::from(n))
    }

    fn lease(key: &str, epoch: u64, checkpoint: Position) -> Lease {
        Lease {
            epoch: Epoch(epoch),
            owner: Some(WorkerId::new("w")),
            ..Lease::new(key, checkpoint)
        }
    }

    fn listed(leases: &[Lease]) -> Vec<VersionedLease> {
        leases
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, l)| VersionedLease::new(l, Version(i as u64 + 1)))
            .collect()
    }

    /// A listing sent before this worker's own write (its reply still on the way when the write
    /// was remembered) shows the lease as it was: not a loss, and not a reason to forget the
    /// write. Before, a start position pinned while a listing was in flight was reported at
    /// ERROR as "the store lost or rolled back writes" (seen in the two-process fleet demo).
    #[test]
    fn a_listing_older_than_a_remembered_write_is_not_a_loss() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        compare(&mut memory, &listed(&[lease("a", 1, Position::TrimHorizon)]), &none, &none);
        // The worker pins the start (remembered now); a listing sent earlier still shows it.
        let list_sent = Instant::now();
        let written_at = Some(list_sent + std::time::Duration::from_millis(1));
        let a = Remembered { lease: lease("a", 1, seq(5)), written_at };
        memory.insert(LeaseKey::new("a"), a);
        // And it created "b", which the early listing cannot show either.
        let b = Remembered { lease: lease("b", 1, Position::TrimHorizon), written_at };
        memory.insert(LeaseKey::new("b"), b);
        let stale = listed(&[lease("a", 1, Position::TrimHorizon)]);
        let fresh = fresh_keys(&mut memory, list_sent);
        assert_eq!(fresh, ["a", "b"].into_iter().map(LeaseKey::new).collect());
        assert!(compare(&mut memory, &stale, &none, &fresh).is_empty());
        let a = &memory[&LeaseKey::new("a")];
        assert_eq!(a.lease.checkpoint, seq(5), "the write stays remembered");
        assert_eq!(a.written_at, written_at, "and so does its stamp");
        assert!(memory.contains_key(&LeaseKey::new("b")));
        // A listing sent after the write clears the stamp; without it the same listing reads as
        // a checkpoint that moved backwards and a lease that vanished.
        let fresh = fresh_keys(&mut memory, list_sent + std::time::Duration::from_millis(2));
        assert!(fresh.is_empty());
        assert!(memory.values().all(|r| r.written_at.is_none()));
        assert_eq!(compare(&mut memory, &stale, &none, &fresh).len(), 2);
    }

    #[test]
    fn a_normal_listing_loses_nothing_and_is_remembered() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        assert!(compare(&mut memory, &listed(&[lease("a", 1, seq(5))]), &none, &BTreeSet::new())
            .is_empty());
        let later = listed(&[lease("a", 2, seq(9)), lease("b", 1, Position::TrimHorizon)]);
        assert!(compare(&mut memory, &later, &none, &BTreeSet::new()).is_empty());
        assert_eq!(memory[&LeaseKey::new("a")].lease.checkpoint, seq(9));
        assert_eq!(memory.len(), 2);
    }

    fn standing(me: &WorkerId, running_at: Option<u64>, alive: bool, waited: bool) -> Standing<'_> {
        Standing {
            me,
            running_at: running_at.map(Epoch),
            owner_alive: alive,
            owner_had_time: waited,
            now_millis: 1_000,
        }
    }

    #[test]
    fn vanished_regressed_and_rolled_back_leases_are_found() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        let before = listed(&[
            lease("gone", 4, seq(5)),
            lease("fresh", 7, seq(8)),
            lease("rolled", 9, seq(3)),
            lease("fine", 2, seq(1)),
        ]);
        compare(&mut memory, &before, &none, &BTreeSet::new());
        let after = listed(&[
            Lease::new("fresh", Position::Latest),
            lease("rolled", 6, seq(3)),
            lease("fine", 3, seq(2)),
        ]);
        let lost = compare(&mut memory, &after, &none, &BTreeSet::new());
        let keys: Vec<&str> = lost.iter().map(|l| l.key().as_str()).collect();
        assert_eq!(keys, ["fresh", "gone", "rolled"]);
        assert_eq!(lost[1].now, None);
        assert_eq!(lost[0].now.as_ref().map(|v| v.version), Some(Version(1)));
        // Not restored yet: the next listing finds them lost again.
        assert_eq!(compare(&mut memory, &after, &none, &BTreeSet::new()).len(), 3);
    }

    #[test]
    fn the_owner_keeps_its_lease_and_the_others_give_it_time() {
        let (w, x) = (WorkerId::new("w"), WorkerId::new("x"));
        let seen = lease("k", 7, seq(8));
        let rolled = Lost {
            seen: seen.clone(),
            now: Some(VersionedLease::new(lease("k", 5, seq(3)), Version(9))),
        };
        // The owner, running it at epoch 7: same epoch, its checkpoint, still its own.
        let r = rolled.restoration(&standing(&w, Some(7), true, false)).unwrap();
        assert_eq!((r.owner.as_ref(), r.epoch, &r.checkpoint), (Some(&w), Epoch(7), &seq(8)));
        // The store moved past the task's epoch meanwhile: the owner takes a newer one.
        let by_x = Lease { owner: Some(x.clone()), ..lease("k", 7, seq(3)) };
        let taken = Lost { seen: seen.clone(), now: Some(VersionedLease::new(by_x, Version(9))) };
        assert!(taken.restoration(&standing(&w, Some(7), true, false)).unwrap().epoch > Epoch(7));
        // Another worker gives the owner time for a pass, then restores it to that owner if it
        // is alive, unowned otherwise; a vanished lease gets a creation epoch.
        assert_eq!(rolled.restoration(&standing(&x, None, true, false)), None);
        assert_eq!(rolled.restoration(&standing(&x, None, false, false)), None);
        let r = rolled.restoration(&standing(&x, None, true, true)).unwrap();
        assert_eq!((r.owner.as_ref(), r.checkpoint), (Some(&w), seq(8)));
        assert!(r.epoch > Epoch(7));
        assert_eq!(rolled.restoration(&standing(&x, None, false, true)).unwrap().owner, None);
        let gone = Lost { seen, now: None };
        assert!(gone.restoration(&standing(&x, None, false, true)).unwrap().epoch > Epoch(8));
        // The remembered owner that no longer runs it restores it unowned at once.
        assert_eq!(rolled.restoration(&standing(&w, None, true, false)).unwrap().owner, None);
    }

    /// A lease this worker saw finished that the store shows unfinished again (a rollback to a
    /// copy taken before it ended, or before it was collected) is written back finished at once,
    /// by any worker that remembers it: nothing is further along than its end, so there is no
    /// owner to wait for. Before, every worker gave the remembered owner a balance interval and a
    /// heartbeat, and the lease stood in the store unfinished meanwhile, takeable by a worker
    /// that never saw it end (soak seeds 27842 and 36934: a second accident came first, and the
    /// fleet, rightly, never brought the finished lease back).
    #[test]
    fn a_finished_lease_that_comes_back_unfinished_is_restored_at_once() {
        let x = WorkerId::new("x");
        let back = Lost {
            seen: lease("p", 7, Position::ShardEnd),
            now: Some(VersionedLease::new(lease("p", 5, seq(3)), Version(9))),
        };
        for alive in [true, false] {
            let r = back.restoration(&standing(&x, None, alive, false)).unwrap();
            assert!(r.is_finished(), "{r:?}");
            assert!(r.epoch > Epoch(7));
        }
        // An unfinished lease still waits for its owner, which may know a further checkpoint.
        let rolled = Lost {
            seen: lease("q", 7, seq(8)),
            now: Some(VersionedLease::new(lease("q", 5, seq(3)), Version(9))),
        };
        assert_eq!(rolled.restoration(&standing(&x, None, true, false)), None);
    }

    #[test]
    fn a_collected_parent_and_a_corrupt_record_are_not_lost() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        let child = lease("child", 1, Position::TrimHorizon).with_parents([LeaseKey::new("p")]);
        compare(
            &mut memory,
            &listed(&[lease("p", 1, seq(5)), child.clone()]),
            &none,
            &BTreeSet::new(),
        );
        let moved = Lease { checkpoint: seq(100), ..child };
        assert!(compare(
            &mut memory,
            &listed(std::slice::from_ref(&moved)),
            &none,
            &BTreeSet::new()
        )
        .is_empty());
        compare(
            &mut memory,
            &listed(&[lease("c", 1, seq(5)), moved.clone()]),
            &none,
            &BTreeSet::new(),
        );
        let corrupt = BTreeSet::from([LeaseKey::new("c")]);
        assert!(compare(&mut memory, &listed(&[moved]), &corrupt, &BTreeSet::new()).is_empty());
        assert!(memory.contains_key(&LeaseKey::new("c")), "remembered until readable again");
    }

    #[test]
    fn a_finished_lease_that_comes_back_unfinished_is_lost() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        compare(
            &mut memory,
            &listed(&[lease("p", 3, Position::ShardEnd)]),
            &none,
            &BTreeSet::new(),
        );
        assert!(
            compare(&mut memory, &[], &none, &BTreeSet::new()).is_empty(),
            "collected: not lost"
        );
        let back = compare(
            &mut memory,
            &listed(&[Lease::new("p", Position::TrimHorizon)]),
            &none,
            &BTreeSet::new(),
        );
        assert_eq!(back.len(), 1);
        let x = WorkerId::new("x");
        let standing = Standing {
            me: &x,
            running_at: None,
            owner_alive: false,
            owner_had_time: true,
            now_millis: 1_000,
        };
        assert!(back[0].restoration(&standing).unwrap().is_finished());
    }

    #[test]
    fn a_chain_collected_while_away_is_not_lost() {
        let mut memory = BTreeMap::new();
        let none = BTreeSet::new();
        compare(&mut memory, &listed(&[lease("q", 1, seq(5))]), &none, &BTreeSet::new());
        // q → p → c: q and p were finished and collected while this worker was away.
        let c = lease("c", 1, seq(9)).with_parents([LeaseKey::new("p")]);
        let lost = compare(&mut memory, &listed(std::slice::from_ref(&c)), &none, &BTreeSet::new());
        assert_eq!(lost.len(), 1);
        let k = LeaseKey::new;
        let children = BTreeMap::from([(k("q"), vec![k("p")]), (k("p"), vec![k("c")])]);
        let now = listed(std::slice::from_ref(&c));
        assert!(forget_collected(&mut memory, lost, &children, &now).is_empty());
        assert!(!memory.contains_key(&k("q")));
        // Had c not moved yet, q would still be lost (a wipe takes the descendants too).
        compare(&mut memory, &listed(&[lease("q", 1, seq(5))]), &none, &BTreeSet::new());
        let fresh = listed(&[Lease { checkpoint: Position::TrimHorizon, ..c }]);
        let lost = compare(&mut memory, &fresh, &none, &BTreeSet::new());
        let kept = forget_collected(&mut memory, lost, &children, &fresh);
        assert!(kept.iter().any(|l| l.key() == &k("q")), "{kept:?}");
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
