//! Judging which workers are alive without comparing clocks across machines.
//!
//! Each observer remembers, per worker, the last heartbeat counter it saw and *when it first saw
//! that value* on its own monotonic clock. A worker is dead once its counter has not moved for the
//! failover timeout. Wall-clock skew between machines therefore cannot make a live worker look dead
//! (or a dead one alive). An owner named by a lease but with no worker record is timed the same way,
//! from when this observer first noticed the absence.
//!
//! Judgements are made at observation time only: a worker is dead when a listing shows its beat
//! unchanged for the failover timeout since the beat was first seen. An observer whose own view is
//! stale (it could not list for a while, as after a partition) therefore never judges a peer dead
//! from old data; it waits for a fresh listing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::ids::WorkerId;
use crate::worker_record::WorkerRecord;

#[derive(Clone, Debug)]
struct Seen {
    beat: u64,
    since: Instant,
    /// When this observer first saw the worker's current process (a restart under the same id
    /// starts a new one), if it saw the process start; `None` for a process already running when
    /// this observer first listed it.
    process_since: Option<Instant>,
    /// Whether this observer has seen the worker beat: its beat moved between two of its
    /// listings, or it was first listed on its first beats (a process that just started).
    beating: bool,
}

/// What changed in one observation of the worker records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LivenessChange {
    /// Workers seen for the first time.
    pub appeared: Vec<WorkerId>,
    /// Workers whose beat has now stood still for the failover timeout.
    pub newly_dead: Vec<WorkerId>,
    /// Workers whose record disappeared (a clean leave, normally).
    pub vanished: Vec<WorkerId>,
    /// Workers whose beat went backwards within one process: the store lost writes.
    pub went_back: Vec<WorkerId>,
    /// Of `newly_dead`, those judged dead by a peer's death notice rather than by this
    /// observer's own clock.
    pub by_notice: Vec<WorkerId>,
}

impl LivenessChange {
    /// Whether a balance pass should run at once (someone left or died).
    pub fn needs_balance(&self) -> bool {
        !self.newly_dead.is_empty() || !self.vanished.is_empty()
    }
}

/// One observer's view of who is alive.
#[derive(Clone, Debug)]
pub struct Liveness {
    failover_timeout: Duration,
    workers: BTreeMap<WorkerId, Seen>,
    dead: BTreeSet<WorkerId>,
    absent_owners: BTreeMap<WorkerId, Instant>,
    last_observed: Option<Instant>,
}

impl Liveness {
    /// A tracker judging dead after `failover_timeout` without a changed beat.
    pub fn new(failover_timeout: Duration) -> Self {
        Liveness {
            failover_timeout,
            workers: BTreeMap::new(),
            dead: BTreeSet::new(),
            absent_owners: BTreeMap::new(),
            last_observed: None,
        }
    }

    /// Records a listing of worker records that was sent at `sent` and answered at `received`.
    #[cfg(test)]
    ///
    /// The records describe some moment between the two. A beat seen for the first time is timed
    /// from `received` (the latest it can have been written), and the standstill is judged at
    /// `sent` (the earliest moment the listing can describe), so neither a slow reply nor a pause
    /// of this process between the reply and this call can make a live peer look dead.
    pub fn observe(
        &mut self,
        records: &[WorkerRecord],
        sent: Instant,
        received: Instant,
    ) -> LivenessChange {
        self.observe_some(records, None, &[], sent, received)
    }

    /// [`observe`](Liveness::observe) of an observation that read only the records of
    /// `observed` (`None`: every record of the namespace), with the death notices of the
    /// namespace's last full listing.
    ///
    /// Only observed workers are judged: a record of `records` whose id is not observed is a
    /// copy of an older listing, and says nothing of now (its beat may have moved since, unseen),
    /// and an observed id missing from `records` has vanished. A notice `(id, beat)` (a peer
    /// that watches `id` judged it dead at `beat`, docs/algorithm.md, "A fleet too large to list
    /// each heartbeat") makes `id` dead while its record, as this observer last saw it, still
    /// shows that beat.
    pub fn observe_some(
        &mut self,
        records: &[WorkerRecord],
        observed: Option<&BTreeSet<WorkerId>>,
        notices: &[(WorkerId, u64)],
        sent: Instant,
        received: Instant,
    ) -> LivenessChange {
        let seen_now = |id: &WorkerId| observed.is_none_or(|o| o.contains(id));
        if self.last_observed.is_some_and(|last| sent < last) {
            // A listing sent before the one already applied (two tasks of the worker list the
            // records): it would show beats going back. The newer view stands.
            return LivenessChange::default();
        }
        let (now, first_seen) = (sent, received.max(sent));
        self.last_observed = Some(now);
        let mut change = LivenessChange::default();
        let listed: BTreeSet<&WorkerId> = records.iter().map(|r| &r.id).collect();
        let gone: Vec<WorkerId> = self
            .workers
            .keys()
            .filter(|id| !listed.contains(id) && seen_now(id))
            .cloned()
            .collect();
        for id in gone {
            self.workers.remove(&id);
            self.dead.remove(&id);
            self.absent_owners.insert(id.clone(), first_seen);
            change.vanished.push(id);
        }
        for r in records.iter().filter(|r| seen_now(&r.id)) {
            self.absent_owners.remove(&r.id);
            match self.workers.get_mut(&r.id) {
                Some(seen) if seen.beat == r.beat => {}
                Some(seen) => {
                    if WorkerRecord::beat_went_back(seen.beat, r.beat) {
                        change.went_back.push(r.id.clone());
                    }
                    let process_since = if WorkerRecord::same_process(seen.beat, r.beat) {
                        seen.process_since
                    } else {
                        Some(first_seen)
                    };
                    *seen = Seen { beat: r.beat, since: first_seen, process_since, beating: true };
                    self.dead.remove(&r.id);
                }
                None => {
                    let process_since =
                        (r.beats_written() < WorkerRecord::ESTABLISHED_BEATS).then_some(first_seen);
                    let beating = process_since.is_some();
                    self.workers.insert(
                        r.id.clone(),
                        Seen { beat: r.beat, since: first_seen, process_since, beating },
                    );
                    change.appeared.push(r.id.clone());
                }
            }
        }
        for (id, seen) in self.workers.iter().filter(|(id, _)| seen_now(id)) {
            if now.saturating_duration_since(seen.since) >= self.failover_timeout
                && self.dead.insert(id.clone())
            {
                change.newly_dead.push(id.clone());
            }
        }
        for (id, beat) in notices {
            let current = self.workers.get(id).is_some_and(|seen| seen.beat == *beat);
            if current && self.dead.insert(id.clone()) {
                change.newly_dead.push(id.clone());
                change.by_notice.push(id.clone());
            }
        }
        change
    }

    /// Workers whose beat has stood still for at least `age` at the last observation, with that
    /// beat: their records are garbage once `age` is far beyond the failover timeout (a worker
    /// that stopped heartbeating fenced itself long ago), and may be removed on the condition
    /// that the beat is still the same.
    pub fn long_dead(&self, age: Duration) -> Vec<(WorkerId, u64)> {
        let Some(now) = self.last_observed else { return Vec::new() };
        self.workers
            .iter()
            .filter(|(id, seen)| {
                self.dead.contains(*id) && now.saturating_duration_since(seen.since) >= age
            })
            .map(|(id, seen)| (id.clone(), seen.beat))
            .collect()
    }

    /// Whether `id` counted as alive at the last observation. An owner with no worker record is
    /// timed from the observation at which this observer first noticed it (it may be a worker whose
    /// first heartbeat this observer has not listed yet).
    pub fn is_alive(&mut self, id: &WorkerId) -> bool {
        if self.workers.contains_key(id) {
            return !self.dead.contains(id);
        }
        let Some(observed) = self.last_observed else { return true };
        let since = *self.absent_owners.entry(id.clone()).or_insert(observed);
        observed.saturating_duration_since(since) < self.failover_timeout
    }

    /// When the first of the owners with no worker record that [`Liveness::is_alive`] is timing
    /// will be judged dead (their failover timeout from first notice), if that is after `now`:
    /// a pass that found nothing else to do lists again then, not at every pass until then.
    /// (One judged dead already needs no reminder: its active leases are available.)
    pub fn absent_owners_due(&self, now: Instant) -> Option<Instant> {
        self.absent_owners
            .iter()
            .filter(|(id, _)| !self.workers.contains_key(*id))
            .map(|(_, since)| *since + self.failover_timeout)
            .filter(|due| *due > now)
            .min()
    }

    /// Whether the process now running under `id` started less than `window` before the last
    /// observation (a worker restarted under the same id, or one that just started). Such a
    /// process knows only what it listed since: a peer must not leave the repair of a lease the
    /// store lost to it on the strength of its id being alive.
    pub fn started_within(&self, id: &WorkerId, window: Duration) -> bool {
        let (Some(now), Some(seen)) = (self.last_observed, self.workers.get(id)) else {
            return false;
        };
        seen.process_since.is_some_and(|t| now.saturating_duration_since(t) < window)
    }

    /// How many worker records this observer knows of, dead ones included (until their record
    /// is gone).
    pub fn known(&self) -> usize {
        self.workers.len()
    }

    /// The workers with a record that were alive at the last observation.
    pub fn live_workers(&self) -> BTreeSet<WorkerId> {
        self.workers.keys().filter(|id| !self.dead.contains(*id)).cloned().collect()
    }

    /// Workers alive by their record that this observer has never seen beat: first listed with
    /// [`WorkerRecord::ESTABLISHED_BEATS`] or more beats written, and the same beat ever since.
    /// Such a record may be a worker that crashed a moment ago (its record stands still until
    /// the failover timeout judges it dead) as well as a live one whose next beat is on its way;
    /// the balance pass leaves out of the share computation those of them that own and claim
    /// nothing (docs/algorithm.md, "Records never seen beating").
    pub fn unproven(&self) -> BTreeSet<WorkerId> {
        self.workers
            .iter()
            .filter(|(id, seen)| !seen.beating && !self.dead.contains(*id))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Forgets absent owners that no lease names any more.
    pub fn retain_absent(&mut self, still_named: &BTreeSet<&WorkerId>) {
        self.absent_owners.retain(|id, _| still_named.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, beat: u64) -> WorkerRecord {
        WorkerRecord::new(WorkerId::new(id), beat)
    }

    /// A partial observation judges only the workers it read: a copy of an older record says
    /// nothing of now, so a peer nobody read for longer than the failover timeout is not judged
    /// dead by it; an observed id without a record has vanished, the others have not.
    #[tokio::test(start_paused = true)]
    async fn only_observed_workers_are_judged() {
        let fo = Duration::from_secs(10);
        let mut l = Liveness::new(fo);
        let t0 = Instant::now();
        l.observe(&[rec("a", 1), rec("b", 1), rec("c", 1)], t0, t0);
        let later = t0 + fo * 2;
        let watched: BTreeSet<WorkerId> = ["b".into(), "c".into()].into();
        // b stood still (read now), c's record is gone, a was not read.
        let change = l.observe_some(&[rec("a", 1), rec("b", 1)], Some(&watched), &[], later, later);
        assert_eq!(change.newly_dead, [WorkerId::from("b")]);
        assert_eq!(change.vanished, [WorkerId::from("c")]);
        assert!(l.live_workers().contains(&WorkerId::from("a")), "a was not observed");
        // A full listing that shows a's beat where it was long ago judges it.
        let change = l.observe(&[rec("a", 1), rec("b", 1)], later, later);
        assert_eq!(change.newly_dead, [WorkerId::from("a")]);
    }

    /// A death notice makes its worker dead while the worker's record shows the beat it names,
    /// and only then: a notice of an older beat (the worker beat since) changes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_death_notice_holds_while_the_beat_stands() {
        let fo = Duration::from_secs(10);
        let mut l = Liveness::new(fo);
        let t0 = Instant::now();
        l.observe(&[rec("a", 5), rec("b", 7)], t0, t0);
        let t1 = t0 + Duration::from_secs(1);
        let notices = [(WorkerId::from("a"), 5), (WorkerId::from("b"), 6)];
        let change = l.observe_some(&[rec("a", 5), rec("b", 7)], None, &notices, t1, t1);
        assert_eq!(change.newly_dead, [WorkerId::from("a")]);
        assert_eq!(change.by_notice, [WorkerId::from("a")]);
        assert_eq!(l.live_workers(), [WorkerId::from("b")].into());
        // Heard again, it is not news.
        let change = l.observe_some(&[rec("a", 5), rec("b", 8)], None, &notices, t1, t1);
        assert!(change.newly_dead.is_empty(), "{change:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_older_than_the_view_changes_nothing() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10));
        l.observe(&[rec("a", 1)], t0, t0);
        let newer = t0 + Duration::from_secs(2);
        l.observe(&[rec("a", 3)], newer, newer);
        // Sent before the view above, answered after it: beat 2 is not a beat going back.
        let c = l.observe(&[rec("a", 2)], t0 + Duration::from_secs(1), newer);
        assert_eq!(c, LivenessChange::default());
        assert!(l.is_alive(&WorkerId::new("a")));
        assert_eq!(l.workers[&WorkerId::new("a")].beat, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_beat_dies_after_the_failover_timeout() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10));
        let c = l.observe(&[rec("a", 1), rec("b", 7)], t0, t0);
        assert_eq!(c.appeared.len(), 2);
        let a = WorkerId::new("a");
        assert!(l.is_alive(&a));
        // a keeps beating, b is frozen
        let c = l.observe(
            &[rec("a", 2), rec("b", 7)],
            t0 + Duration::from_secs(6),
            t0 + Duration::from_secs(6),
        );
        assert!(c.newly_dead.is_empty());
        let c = l.observe(
            &[rec("a", 3), rec("b", 7)],
            t0 + Duration::from_secs(10),
            t0 + Duration::from_secs(10),
        );
        assert_eq!(c.newly_dead, vec![WorkerId::new("b")]);
        assert!(c.needs_balance());
        assert_eq!(l.live_workers(), [a.clone()].into());
        // reported once only
        let c = l.observe(
            &[rec("a", 4), rec("b", 7)],
            t0 + Duration::from_secs(11),
            t0 + Duration::from_secs(11),
        );
        assert!(c.newly_dead.is_empty());
        // b comes back
        let c = l.observe(
            &[rec("a", 5), rec("b", 8)],
            t0 + Duration::from_secs(12),
            t0 + Duration::from_secs(12),
        );
        assert!(c.newly_dead.is_empty());
        assert!(l.is_alive(&WorkerId::new("b")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_under_the_same_id_is_a_new_process() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut l = Liveness::new(s(10));
        let w = WorkerId::new("w");
        let base = 5u64 << 24;
        // Listed first while long running: not a process that just started.
        l.observe(&[rec("w", base + 100)], t0, t0);
        assert!(!l.started_within(&w, s(30)));
        l.observe(&[rec("w", base + 101)], t0 + s(1), t0 + s(1));
        assert!(!l.started_within(&w, s(30)));
        // The same id with another base: restarted, and counted as new for the window.
        let other = 9u64 << 24;
        l.observe(&[rec("w", other + 1)], t0 + s(2), t0 + s(2));
        assert!(l.started_within(&w, s(30)));
        l.observe(&[rec("w", other + 40)], t0 + s(40), t0 + s(40));
        assert!(!l.started_within(&w, s(30)));
        // A worker first listed on its first beats just started.
        l.observe(&[rec("w", other + 41), rec("n", 3 << 24 | 1)], t0 + s(41), t0 + s(41));
        assert!(l.started_within(&WorkerId::new("n"), s(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_established_record_is_unproven_until_its_beat_moves() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut l = Liveness::new(s(10));
        let base = 7u64 << 24;
        // First listed: one worker well established, one on its first beat.
        l.observe(&[rec("old", base + 40), rec("new", (3 << 24) + 1)], t0, t0);
        let old = WorkerId::new("old");
        assert_eq!(l.unproven(), [old.clone()].into());
        assert!(l.is_alive(&old));
        // Its beat stands still: still unproven (and alive, until the failover timeout).
        l.observe(&[rec("old", base + 40), rec("new", (3 << 24) + 2)], t0 + s(1), t0 + s(1));
        assert_eq!(l.unproven(), [old.clone()].into());
        // It beats: counted from now on, whatever its beat does later.
        l.observe(&[rec("old", base + 41), rec("new", (3 << 24) + 3)], t0 + s(2), t0 + s(2));
        assert!(l.unproven().is_empty());
        l.observe(&[rec("old", base + 41), rec("new", (3 << 24) + 4)], t0 + s(3), t0 + s(3));
        assert!(l.unproven().is_empty());
        // One that never beats is judged dead after the failover timeout, and is no longer
        // unproven: it is out of the live set altogether.
        let mut l = Liveness::new(s(10));
        l.observe(&[rec("gone", base + 40)], t0, t0);
        assert_eq!(l.unproven().len(), 1);
        l.observe(&[rec("gone", base + 40)], t0 + s(10), t0 + s(10));
        assert!(l.unproven().is_empty());
        assert!(!l.is_alive(&WorkerId::new("gone")));
        // A record that left and came back under a new process is seen starting: counted.
        l.observe(&[rec("gone", (9 << 24) + 1)], t0 + s(11), t0 + s(11));
        assert!(l.unproven().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_view_never_makes_a_peer_dead() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10));
        l.observe(&[rec("a", 1)], t0, t0);
        // No listing for a long time (this observer was partitioned): still alive.
        assert!(l.is_alive(&WorkerId::new("a")));
        // The next listing shows the beat moved on: alive.
        let c =
            l.observe(&[rec("a", 40)], t0 + Duration::from_secs(60), t0 + Duration::from_secs(60));
        assert!(c.newly_dead.is_empty());
        assert!(l.is_alive(&WorkerId::new("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_vanished_record_is_reported_and_its_owner_timed_from_then() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10));
        l.observe(&[rec("a", 1), rec("b", 1)], t0, t0);
        let c = l.observe(&[rec("a", 2)], t0 + Duration::from_secs(1), t0 + Duration::from_secs(1));
        assert_eq!(c.vanished, vec![WorkerId::new("b")]);
        let b = WorkerId::new("b");
        assert!(l.is_alive(&b));
        l.observe(&[rec("a", 3)], t0 + Duration::from_secs(5), t0 + Duration::from_secs(5));
        assert!(l.is_alive(&b));
        l.observe(&[rec("a", 4)], t0 + Duration::from_secs(11), t0 + Duration::from_secs(11));
        assert!(!l.is_alive(&b));
        // an owner never seen is timed from the observation where it was first noticed
        let z = WorkerId::new("z");
        assert!(l.is_alive(&z));
        l.observe(&[rec("a", 5)], t0 + Duration::from_secs(20), t0 + Duration::from_secs(20));
        assert!(l.is_alive(&z));
        l.observe(&[rec("a", 6)], t0 + Duration::from_secs(21), t0 + Duration::from_secs(21));
        assert!(!l.is_alive(&z));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_listing_never_makes_a_live_peer_dead() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let mut l = Liveness::new(s(10));
        // The first listing took 900 ms: the beat may have been written at its very end.
        l.observe(&[rec("a", 1)], t0, t0 + ms(900));
        // A listing sent 10.5 s later shows the same beat (its reply is slow too): the beat has
        // provably stood still only 9.6 s. Judged from the replies (11.4 − 0.9 = 10.5 s) the peer
        // would be dead.
        let c = l.observe(&[rec("a", 1)], t0 + ms(10_500), t0 + ms(11_400));
        assert!(c.newly_dead.is_empty(), "{c:?}");
        assert!(l.is_alive(&WorkerId::new("a")));
        let c = l.observe(&[rec("a", 1)], t0 + ms(10_900), t0 + ms(11_000));
        assert_eq!(c.newly_dead, vec![WorkerId::new("a")]);
        assert!(l.long_dead(s(60)).is_empty());
        l.observe(&[rec("a", 1)], t0 + s(61), t0 + s(61));
        assert_eq!(l.long_dead(s(60)), vec![(WorkerId::new("a"), 1)]);
    }
}
