//! What `watch` knows about one namespace between refreshes, and a refresh that reads the store
//! the way a worker does: one listing of the worker records every time (O(workers)), and a listing
//! of the leases only when that showed something happened: a worker came, left or was judged
//! dead, or a worker's count of ownership changes moved (the heartbeat's `changes`, which the
//! runtime's own peers watch to decide when to list). Checkpoints move without any ownership
//! change, so the leases are also listed every `list_every` to keep checkpoint ages honest.
//!
//! Liveness is judged as the runtime judges it, on this process's monotonic clock and never on
//! anyone's wall clock: a worker is dead once its heartbeat `beat` has stood still for the
//! failover timeout since this view first saw that beat.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use shardlease::store::{CorruptRecord, Lease, LeaseStore, WorkerRecord};
use shardlease::{LeaseKey, WorkerId};
use tokio::time::Instant;

use crate::state::LeaseState;

/// How many recent changes are kept.
const EVENTS_KEPT: usize = 64;

/// A worker as this view sees it.
#[derive(Clone, Debug)]
pub struct WorkerSeen {
    /// Its record at the last listing.
    pub record: WorkerRecord,
    /// When this view first saw its current beat.
    pub beat_since: Instant,
    /// Whether this view has seen its beat move (or it appeared after the first refresh).
    pub beating: bool,
    /// Whether its beat has stood still for the failover timeout.
    pub dead: bool,
}

impl WorkerSeen {
    /// The word shown for it.
    pub fn state(&self) -> &'static str {
        match (self.dead, self.beating) {
            (true, _) => "dead",
            (false, true) => "alive",
            (false, false) => "no beat yet",
        }
    }
}

/// A lease as this view sees it.
#[derive(Clone, Debug)]
pub struct LeaseSeen {
    /// The lease at the last listing.
    pub lease: Lease,
    /// Its state at the last refresh.
    pub state: LeaseState,
    /// When this view saw its checkpoint change (`None`: not since the watch started).
    pub checkpoint_since: Option<Instant>,
    /// Since when it has been active without a live owner (`None`: it has one, or is inactive).
    pub ownerless_since: Option<Instant>,
}

/// Something that happened, as seen by this view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A worker record appeared.
    Joined(WorkerId),
    /// A worker record disappeared (a graceful leave removes it).
    Left(WorkerId),
    /// A worker's beat stood still for the failover timeout.
    Died(WorkerId),
    /// A worker judged dead beats again.
    Revived(WorkerId),
    /// A lease changed owner.
    Moved {
        /// The lease.
        key: LeaseKey,
        /// The owner before (none: unowned).
        from: Option<WorkerId>,
        /// The owner now (none: released).
        to: Option<WorkerId>,
    },
    /// A lease appeared (a new shard).
    Added(LeaseKey),
    /// A lease disappeared.
    Removed(LeaseKey),
}

/// One change and when this view saw it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Wall-clock time of the refresh that saw it (for display only).
    pub at: SystemTime,
    /// What happened.
    pub change: Change,
}

/// How many reads the view has made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// Listings of the worker records (one per refresh).
    pub worker_listings: u64,
    /// Listings of the leases.
    pub lease_listings: u64,
}

/// The state of one namespace as refreshes have seen it.
#[derive(Debug)]
pub struct Watch {
    failover: Duration,
    list_every: Option<Duration>,
    /// Workers by id.
    pub workers: BTreeMap<WorkerId, WorkerSeen>,
    /// Leases by key.
    pub leases: BTreeMap<LeaseKey, LeaseSeen>,
    /// Lease records that could not be decoded (last listing).
    pub corrupt_leases: Vec<CorruptRecord>,
    /// Worker records that could not be decoded (last listing).
    pub corrupt_workers: Vec<CorruptRecord>,
    /// Recent changes, newest first.
    pub events: VecDeque<Entry>,
    /// Reads made so far.
    pub reads: Reads,
    /// When the watch started.
    pub started: Instant,
    /// When the leases were last listed.
    pub listed_at: Option<Instant>,
    /// When the last refresh finished.
    pub refreshed_at: Option<Instant>,
    /// The last refresh's failure, if it failed (the view keeps what it saw before).
    pub error: Option<String>,
}

impl Watch {
    /// An empty view judging workers dead after `failover` without a moved beat, listing the
    /// leases at least every `list_every` (never for lack of a change when `None`).
    pub fn new(failover: Duration, list_every: Option<Duration>) -> Self {
        Watch {
            failover,
            list_every,
            workers: BTreeMap::new(),
            leases: BTreeMap::new(),
            corrupt_leases: Vec::new(),
            corrupt_workers: Vec::new(),
            events: VecDeque::new(),
            reads: Reads::default(),
            started: Instant::now(),
            listed_at: None,
            refreshed_at: None,
            error: None,
        }
    }

    /// The failover timeout the view judges with.
    pub fn failover(&self) -> Duration {
        self.failover
    }

    fn note(&mut self, at: SystemTime, change: Change) {
        self.events.push_front(Entry { at, change });
        self.events.truncate(EVENTS_KEPT);
    }

    /// Reads the store once (see the module comment); a failure is kept in [`Watch::error`]
    /// and returned, and the view keeps what it saw before.
    pub async fn refresh(&mut self, store: &dyn LeaseStore) -> shardlease::Result<()> {
        let result = self.read(store).await;
        self.error = result.as_ref().err().map(|e| shardlease::ErrorChain(e).to_string());
        result
    }

    async fn read(&mut self, store: &dyn LeaseStore) -> shardlease::Result<()> {
        let first = self.refreshed_at.is_none();
        let sent = Instant::now();
        let listing = store.list_workers().await?;
        self.reads.worker_listings += 1;
        let now = Instant::now();
        let wall = SystemTime::now();
        // Death notices (`<id>#dead`) are records about workers, not workers.
        let records = listing.items.into_iter().filter(|r| r.notice_of().is_none()).collect();
        let mut changed = self.observe_workers(records, sent, now, wall, first);
        self.corrupt_workers = listing.corrupt;
        changed |= self.list_every.is_some_and(|every| {
            self.listed_at.is_none_or(|t| now.saturating_duration_since(t) >= every)
        });
        if changed || self.listed_at.is_none() {
            let leases = store.list_leases().await?;
            self.reads.lease_listings += 1;
            let at = Instant::now();
            self.observe_leases(
                leases.items.into_iter().map(|v| v.lease).collect(),
                at,
                wall,
                first,
            );
            self.corrupt_leases = leases.corrupt;
            self.listed_at = Some(at);
        }
        self.classify(now);
        self.refreshed_at = Some(now);
        Ok(())
    }

    /// Applies a listing of worker records; true when the leases should be listed again.
    fn observe_workers(
        &mut self,
        records: Vec<WorkerRecord>,
        sent: Instant,
        received: Instant,
        wall: SystemTime,
        first: bool,
    ) -> bool {
        let mut changed = false;
        let listed: BTreeSet<WorkerId> = records.iter().map(|r| r.id.clone()).collect();
        let gone: Vec<WorkerId> =
            self.workers.keys().filter(|id| !listed.contains(*id)).cloned().collect();
        for id in gone {
            self.workers.remove(&id);
            self.note(wall, Change::Left(id));
            changed = true;
        }
        for record in records {
            let id = record.id.clone();
            match self.workers.get_mut(&id) {
                Some(seen) => {
                    changed |= seen.record.changes != record.changes;
                    let mut revived = false;
                    if seen.record.beat != record.beat {
                        seen.beat_since = received;
                        seen.beating = true;
                        revived = std::mem::replace(&mut seen.dead, false);
                    }
                    seen.record = record;
                    if revived {
                        changed = true;
                        self.note(wall, Change::Revived(id));
                    }
                }
                None => {
                    let seen =
                        WorkerSeen { record, beat_since: received, beating: !first, dead: false };
                    self.workers.insert(id.clone(), seen);
                    if !first {
                        self.note(wall, Change::Joined(id));
                    }
                    changed = true;
                }
            }
        }
        let newly_dead: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, s)| {
                !s.dead && sent.saturating_duration_since(s.beat_since) >= self.failover
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in newly_dead {
            if let Some(s) = self.workers.get_mut(&id) {
                s.dead = true;
            }
            self.note(wall, Change::Died(id));
            changed = true;
        }
        changed
    }

    /// Applies a listing of the leases, noting owner changes and checkpoint moves.
    fn observe_leases(&mut self, leases: Vec<Lease>, at: Instant, wall: SystemTime, first: bool) {
        let listed: BTreeSet<LeaseKey> = leases.iter().map(|l| l.key.clone()).collect();
        let gone: Vec<LeaseKey> =
            self.leases.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for key in gone {
            self.leases.remove(&key);
            self.note(wall, Change::Removed(key));
        }
        for lease in leases {
            let key = lease.key.clone();
            match self.leases.get_mut(&key) {
                Some(seen) => {
                    let (from, to) = (seen.lease.owner.clone(), lease.owner.clone());
                    if seen.lease.checkpoint != lease.checkpoint {
                        seen.checkpoint_since = Some(at);
                    }
                    seen.lease = lease;
                    if from != to {
                        self.note(wall, Change::Moved { key, from, to });
                    }
                }
                None => {
                    let seen = LeaseSeen {
                        lease,
                        state: LeaseState::Unowned,
                        checkpoint_since: None,
                        ownerless_since: None,
                    };
                    self.leases.insert(key.clone(), seen);
                    if !first {
                        self.note(wall, Change::Added(key));
                    }
                }
            }
        }
    }

    /// Whether `id` is alive as this view judges it (an owner without a record is not).
    pub fn is_alive(&self, id: &WorkerId) -> bool {
        self.workers.get(id).is_some_and(|w| !w.dead)
    }

    /// Each lease's state from the last listing and the current liveness, and since when the
    /// active ones without a live owner have been so.
    fn classify(&mut self, now: Instant) {
        let withheld: BTreeSet<LeaseKey> =
            self.corrupt_leases.iter().map(|c| LeaseKey::from(c.key.as_str())).collect();
        let states: Vec<(LeaseKey, LeaseState)> = {
            let all: HashMap<&LeaseKey, &Lease> =
                self.leases.iter().map(|(k, s)| (k, &s.lease)).collect();
            self.leases
                .iter()
                .map(|(k, s)| {
                    let l = &s.lease;
                    let state = if l.is_finished() {
                        LeaseState::Finished
                    } else if !shardlease::balancer::is_active(l, &all, &withheld) {
                        LeaseState::Blocked
                    } else {
                        match &l.owner {
                            None => LeaseState::Unowned,
                            Some(o) if !self.is_alive(o) => LeaseState::OwnerDead,
                            Some(_) if l.live_claim().is_some() => LeaseState::Claimed,
                            Some(_) => LeaseState::Running,
                        }
                    };
                    (k.clone(), state)
                })
                .collect()
        };
        for (key, state) in states {
            if let Some(s) = self.leases.get_mut(&key) {
                s.state = state;
                if matches!(state, LeaseState::Unowned | LeaseState::OwnerDead) {
                    s.ownerless_since.get_or_insert(now);
                } else {
                    s.ownerless_since = None;
                }
            }
        }
    }

    /// Active leases held by each worker in the last listing.
    pub fn held(&self) -> BTreeMap<&WorkerId, usize> {
        let mut held = BTreeMap::new();
        for s in self.leases.values() {
            if let (Some(o), LeaseState::Running | LeaseState::Claimed | LeaseState::OwnerDead) =
                (&s.lease.owner, s.state)
            {
                *held.entry(o).or_default() += 1;
            }
        }
        held
    }

    /// What is wrong, in words: leases without a live owner for longer than the failover
    /// timeout, corrupt records, a failed refresh. Empty: healthy.
    pub fn problems(&self, now: Instant) -> Vec<String> {
        let mut problems = Vec::new();
        let stuck: Vec<&str> = self
            .leases
            .values()
            .filter(|s| {
                s.ownerless_since.is_some_and(|t| now.saturating_duration_since(t) >= self.failover)
            })
            .map(|s| s.lease.key.as_str())
            .collect();
        if !stuck.is_empty() {
            problems.push(format!(
                "{} lease(s) without a live owner for over {:.1} s: {}",
                stuck.len(),
                self.failover.as_secs_f64(),
                stuck.join(", ")
            ));
        }
        for c in self.corrupt_leases.iter().chain(&self.corrupt_workers) {
            problems.push(format!("corrupt record {}: {}", c.key, c.reason));
        }
        if let Some(e) = &self.error {
            problems.push(format!("the last refresh failed: {e}"));
        }
        problems
    }
}
