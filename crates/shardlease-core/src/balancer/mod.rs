//! The balancer: a pure function from a snapshot of the namespace to the actions of one pass.
//!
//! Keeping it pure (no I/O, no clock, randomness only from the snapshot's seed) is what lets us
//! test every distribution rule with tables and replay any decision. The runtime builds the
//! snapshot, asks the balancer for a [`Plan`], and carries the plan out with compare-and-set writes,
//! skipping any action whose write conflicts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use crate::lease::{Lease, LeaseKey, WorkerId};
use crate::load::LeaseLoad;

mod greedy;
#[cfg(any(test, feature = "test-util"))]
mod one_per_pass;

pub use greedy::GreedyBalancer;
#[cfg(any(test, feature = "test-util"))]
pub use one_per_pass::OnePerPassBalancer;

/// What the balancer sees: every lease, the workers judged alive, and this worker's limits.
/// Built with [`Snapshot::new`] and the `with_*` methods (a balancer's own tests build them).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Snapshot {
    /// The worker running the pass.
    pub me: WorkerId,
    /// Every (decodable) lease of the namespace.
    pub leases: Vec<Lease>,
    /// Keys of leases that exist but are not in `leases`: records that could not be decoded, and
    /// leases the store lost that are being restored. A child of one stays blocked: a parent that
    /// cannot be seen is not a finished parent.
    pub withheld: BTreeSet<LeaseKey>,
    /// Workers judged alive, `me` included. An owner not in this set holds nothing: its leases
    /// are available.
    pub live_workers: BTreeSet<WorkerId>,
    /// The most leases `me` may hold.
    pub max_leases_per_worker: Option<usize>,
    /// The most claims `me` may make in this pass.
    pub max_claims_per_pass: Option<usize>,
    /// Leases `me` claimed whose owners did not hand them over within the claim timeout.
    pub expired_claims: BTreeSet<LeaseKey>,
    /// Seed for the balancer's random choices (which of a victim's leases to claim).
    pub seed: u64,
    /// The measured loads, when the fleet balances by load; `None` balances by count.
    pub loads: Option<LoadView>,
}

/// What a pass balancing by load knows of the loads (docs/algorithm.md, "Balancing by load").
///
/// Loads are busy seconds per second of a lease's processor (see
/// [`LeaseLoad`]). Each live worker publishes its total and its heaviest
/// leases; the pass estimates each other lease of a worker as the average of the rest of its
/// total. The entry of `me` should list all of its leases (it knows them exactly).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct LoadView {
    /// What each worker published: its total and its heaviest leases.
    pub published: BTreeMap<WorkerId, PublishedLoad>,
    /// Leases that changed owner within the cooldown: never claimed for load.
    pub cooling: BTreeSet<LeaseKey>,
    /// Loads to count for leases in their cooldown instead of what their new owner publishes:
    /// the last figure measured before the move. A new owner measures a lease afresh, and its
    /// first figures include the catch-up of the records that waited during the handoff (several
    /// times the lease's steady load), which would make the receiver look overloaded and send
    /// other leases back.
    pub pinned: BTreeMap<LeaseKey, f64>,
    /// Workers that received a lease a moment ago (two balance intervals, at run time), or took
    /// a lease never seen owned (one interval): they neither give nor receive a lease for
    /// load until their figures show the move. A move shifts more than the moved lease's load:
    /// the receiver's other leases wait while it catches up on the moved lease's backlog.
    /// Planning on those figures sent leases back and forth.
    pub settling: BTreeSet<WorkerId>,
    /// Workers that gave a lease in the round under way (at run time, until the round window of
    /// that move ends): they may
    /// give again, since their figures are right at once (the moved lease leaves their list, and
    /// their other leases' figures are shares of their cores, which a queue does not inflate),
    /// but receive nothing until their figures show the move. When a giver sat out as a receiver
    /// does, the second receiver of a plan found it sitting out and the plan's other moves waited
    /// two intervals more; when it could receive, it took a lease back in the same round.
    pub gave: BTreeSet<WorkerId>,
    /// Workers that received a lease in the round of load moves under way (see
    /// [`LoadView::round_in_progress`]; at run time, until the round window of that move ends):
    /// once their figures have settled they may receive more, but give nothing until the round
    /// is over. A round's moves go one way: a receiver that gave back within its round, at the
    /// round's lower margin, corrected a move that had overshot (simulation seed 1630) instead
    /// of the round stopping inside the band.
    pub received: BTreeSet<WorkerId>,
    /// A round of load moves is under way: a lease changed owner within about three and a half
    /// balance intervals, long enough for the receivers of a move to have sat out and planned
    /// again (a claim pending is seen in the snapshot itself). The moves after a round's first
    /// need only half the threshold; a round starts only for a clear gain (see `by_load`).
    pub round_in_progress: bool,
    /// The relative margin: a worker is overloaded when its load exceeds the fleet's mean load
    /// by more than `margin × mean` (and by more than `floor`).
    pub margin: f64,
    /// The absolute floor, in load units: no move is made for a difference below it, and each
    /// lease counts `2 × floor` on top of its load (so a quiet fleet balances by count).
    pub floor: f64,
}

impl LoadView {
    /// A view with no loads published yet, balancing with `margin` and `floor`.
    pub fn new(margin: f64, floor: f64) -> Self {
        LoadView { margin, floor, ..LoadView::default() }
    }

    /// Adds what `worker` published.
    pub fn with_worker(mut self, worker: WorkerId, load: PublishedLoad) -> Self {
        self.published.insert(worker, load);
        self
    }

    /// Sets the leases in their cooldown.
    pub fn with_cooling(mut self, cooling: BTreeSet<LeaseKey>) -> Self {
        self.cooling = cooling;
        self
    }

    /// Sets the workers whose figures are settling after a move (see [`LoadView::settling`]).
    pub fn with_settling(mut self, settling: BTreeSet<WorkerId>) -> Self {
        self.settling = settling;
        self
    }

    /// Sets the workers that gave a lease a moment ago (see [`LoadView::gave`]).
    pub fn with_gave(mut self, gave: BTreeSet<WorkerId>) -> Self {
        self.gave = gave;
        self
    }

    /// Sets the workers that received a lease in the round under way (see
    /// [`LoadView::received`]).
    pub fn with_received(mut self, received: BTreeSet<WorkerId>) -> Self {
        self.received = received;
        self
    }

    /// Sets whether a round of load moves is under way (see [`LoadView::round_in_progress`]).
    pub fn with_round_in_progress(mut self, round: bool) -> Self {
        self.round_in_progress = round;
        self
    }

    /// Sets the loads counted for leases in their cooldown (see [`LoadView::pinned`]).
    pub fn with_pinned(mut self, pinned: BTreeMap<LeaseKey, f64>) -> Self {
        self.pinned = pinned;
        self
    }
}

/// One worker's published loads: its total and its heaviest leases.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct PublishedLoad {
    /// The sum of the loads of all its leases.
    pub total: f64,
    /// Its heaviest leases (all of them for the worker running the pass).
    pub leases: Vec<LeaseLoad>,
}

impl PublishedLoad {
    /// A worker's `total` and its heaviest `leases`.
    pub fn new(total: f64, leases: Vec<LeaseLoad>) -> Self {
        PublishedLoad { total, leases }
    }
}

impl Snapshot {
    /// A snapshot for `me` of `leases` with `live_workers` alive: nothing withheld, no limits,
    /// no expired claims, seed 0.
    pub fn new(me: WorkerId, leases: Vec<Lease>, live_workers: BTreeSet<WorkerId>) -> Self {
        Snapshot {
            me,
            leases,
            withheld: BTreeSet::new(),
            live_workers,
            max_leases_per_worker: None,
            max_claims_per_pass: None,
            expired_claims: BTreeSet::new(),
            seed: 0,
            loads: None,
        }
    }

    /// Balances by load with `loads` (by count with `None`).
    pub fn with_loads(mut self, loads: Option<LoadView>) -> Self {
        self.loads = loads;
        self
    }

    /// Sets the leases that exist but cannot be used this pass.
    pub fn with_withheld(mut self, withheld: BTreeSet<LeaseKey>) -> Self {
        self.withheld = withheld;
        self
    }

    /// Sets the most leases `me` may hold.
    pub fn with_max_leases_per_worker(mut self, max: Option<usize>) -> Self {
        self.max_leases_per_worker = max;
        self
    }

    /// Sets the most claims `me` may make in this pass.
    pub fn with_max_claims_per_pass(mut self, max: Option<usize>) -> Self {
        self.max_claims_per_pass = max;
        self
    }

    /// Sets the claims of `me` whose owners did not answer within the claim timeout.
    pub fn with_expired_claims(mut self, expired: BTreeSet<LeaseKey>) -> Self {
        self.expired_claims = expired;
        self
    }

    /// Sets the seed of the balancer's random choices.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// The actions of one pass. Each is carried out by compare-and-set; a conflict skips that action.
///
/// `#[non_exhaustive]`, like [`Snapshot`], so that a new kind of action can be added without
/// breaking balancers written outside this crate: those build a plan with [`Plan::new`] and the
/// `with_*` methods, not a struct literal. The fields stay public for reading and for changing a
/// plan in place.
///
/// ```
/// use shardlease_core::balancer::Plan;
/// use shardlease_core::{LeaseKey, WorkerId};
///
/// let plan = Plan::new()
///     .with_takes(vec![LeaseKey::from("shard-1"), LeaseKey::from("shard-2")], 1)
///     .with_claims(vec![(LeaseKey::from("shard-3"), WorkerId::from("busy-worker"))]);
/// assert_eq!(plan.take_count, 1);
/// assert!(!plan.is_empty());
/// assert!(Plan::new().is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// Available leases to try, in order, until `take_count` of them were taken.
    pub take_candidates: Vec<LeaseKey>,
    /// How many leases to take.
    pub take_count: usize,
    /// Handoff requests to write: `(lease, its current owner)`.
    pub claims: Vec<(LeaseKey, WorkerId)>,
    /// Leases `me` owns to hand over: `(lease, claimant)`.
    pub handoffs: Vec<(LeaseKey, WorkerId)>,
    /// Claims on `me`'s leases to clear (not worth honouring, or the claimant is dead).
    pub clear_claims: Vec<LeaseKey>,
    /// Leases `me` claimed whose owner did not answer in time: take them by compare-and-set.
    pub take_over: Vec<LeaseKey>,
}

impl Plan {
    /// A plan that does nothing (the same as `Plan::default()`); add its actions with the
    /// `with_*` methods.
    pub fn new() -> Self {
        Plan::default()
    }

    /// Sets the takes: try the available leases of `candidates`, in order, until `count` of them
    /// were taken (more candidates than `count` leave room for conflicts).
    pub fn with_takes(mut self, candidates: Vec<LeaseKey>, count: usize) -> Self {
        self.take_candidates = candidates;
        self.take_count = count;
        self
    }

    /// Sets the handoff requests to write: `(lease, its current owner)`.
    pub fn with_claims(mut self, claims: Vec<(LeaseKey, WorkerId)>) -> Self {
        self.claims = claims;
        self
    }

    /// Sets the leases `me` owns to hand over: `(lease, claimant)`.
    pub fn with_handoffs(mut self, handoffs: Vec<(LeaseKey, WorkerId)>) -> Self {
        self.handoffs = handoffs;
        self
    }

    /// Sets the claims on `me`'s leases to clear (not worth honouring, or the claimant is dead).
    pub fn with_clear_claims(mut self, clear_claims: Vec<LeaseKey>) -> Self {
        self.clear_claims = clear_claims;
        self
    }

    /// Sets the leases `me` claimed whose owner did not answer in time, to take by
    /// compare-and-set.
    pub fn with_take_over(mut self, take_over: Vec<LeaseKey>) -> Self {
        self.take_over = take_over;
        self
    }

    /// Whether the plan does nothing.
    pub fn is_empty(&self) -> bool {
        self.take_count == 0
            && self.claims.is_empty()
            && self.handoffs.is_empty()
            && self.clear_claims.is_empty()
            && self.take_over.is_empty()
    }
}

/// A lease-distribution policy. The greedy one is the default.
pub trait Balancer: Send + Sync + Debug {
    /// The actions of one pass for `snapshot.me`.
    fn plan(&self, snapshot: &Snapshot) -> Plan;
}

/// Whether `lease` counts toward shares: not finished, and every parent finished or gone. A
/// parent that is `withheld` (undecodable, or lost and being restored) is neither: it blocks its
/// children until it can be read again.
pub fn is_active(
    lease: &Lease,
    all: &std::collections::HashMap<&LeaseKey, &Lease>,
    withheld: &BTreeSet<LeaseKey>,
) -> bool {
    !lease.is_finished()
        && lease
            .parents
            .iter()
            .all(|p| !withheld.contains(p) && all.get(p).is_none_or(|parent| parent.is_finished()))
}
