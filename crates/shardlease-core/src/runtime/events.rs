//! What the worker's other tasks tell the balance loop, the one owner of its coordination state.
//!
//! The heartbeat reports each listing of the worker records, the watchdog a fence, the heartbeat
//! a fence's end, lease tasks how they ended and what they wrote, the shard sync what it created,
//! the notices loop that something changed, the handle what it asks. The loop applies each event
//! to the state it owns, between the steps of its passes, in the order they were sent; it answers
//! requests through the `oneshot` they carry. docs/algorithm.md, "Who owns the runtime's state".

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::lease_task::Exited;
use super::shutdown_report::ShutdownReport;
use crate::ids::WorkerId;
use crate::lease::{Lease, LeaseKey};
use crate::worker_record::WorkerRecord;

/// One event for the balance loop.
pub(crate) enum Event {
    /// A lease task ended (however it ended: an abort or a panic too).
    Exited(Exited),
    /// The heartbeat observed the worker records.
    Workers(Observation),
    /// The watchdog fenced this worker: `old` was its incarnation until now. Every task of that
    /// incarnation was told to stop already (its fence token).
    Fenced {
        /// The incarnation that fenced itself.
        old: WorkerId,
    },
    /// A heartbeat succeeded after a fence: the worker works again as its new incarnation.
    Resumed,
    /// Ownership changes made outside a pass (a handoff or release by a lease task, a shard end,
    /// leases created by the shard sync, a write whose answer was lost): counted and published at
    /// once, and this worker's next pass lists the leases.
    Changed {
        /// How many.
        n: u64,
    },
    /// A reason to list the leases: a refused fenced write, a lost lease, a new subscription. With
    /// `now`, the next pass runs at once.
    WantListing {
        /// Run the pass at once rather than at the next interval.
        now: bool,
    },
    /// The store announced a change worth a listing (see `notices`): a pass runs soon, a few
    /// milliseconds later so that a burst of notices (a leave releasing every lease) is one
    /// listing, and no sooner than [`NOTICE_GAP`](super::balance::NOTICE_GAP) after the last
    /// listing a notice asked for.
    Noticed,
    /// This worker's lease loads as the heartbeat just measured them (balancing by load).
    Loads(Vec<crate::load::LeaseLoad>),
    /// A lease task wrote `lease` (a pinned start, a handoff or release, a shard's end): the loop's
    /// memory of the namespace follows without waiting for a listing (see `recovery`).
    Remember(Lease, Instant),
    /// A request from the handle or the shard sync.
    Request(Request),
}

/// One observation of the worker records by the heartbeat: sent at `sent`, answered at
/// `received` (see `fleet_view`).
pub(crate) struct Observation {
    /// The records read: every worker record (a full listing), or those of `observed` that
    /// exist (death notices left out).
    pub records: std::sync::Arc<Vec<WorkerRecord>>,
    /// The death notices of the last full listing that still hold: `(dead worker, beat)`.
    pub notices: Vec<(WorkerId, u64)>,
    /// The workers this observation read (`None`: every one, a full listing).
    pub observed: Option<std::collections::BTreeSet<WorkerId>>,
    /// Whether the fleet's observations are gated by the fleet signal (this worker then
    /// announces the deaths it judges, see `fleet_view`).
    pub gated: bool,
    /// When the read was sent.
    pub sent: Instant,
    /// When its answer arrived.
    pub received: Instant,
}

/// A request to the balance loop, answered through its `oneshot`.
pub(crate) enum Request {
    /// Answer after the next pass that lists the leases (`WorkerHandle::balance_now`).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    Pass(oneshot::Sender<()>),
    /// Collect how the lease tasks ended, by the deadline, and withdraw this worker's claims.
    Shutdown {
        /// When a task still running is aborted and its lease released anyway.
        deadline: Instant,
        /// Where the report goes.
        reply: oneshot::Sender<ShutdownReport>,
    },
    /// The loop's memory of the namespace's leases, for a shard sync (which must not create at
    /// the initial position a lease this worker knows the store lost).
    Memory(oneshot::Sender<Vec<Lease>>),
}

/// The keys a shard sync expects the namespace to hold, as the sync loop publishes them: a
/// listing that misses one of them asks for a full sync at once.
pub(crate) type Expected = std::sync::Arc<std::collections::BTreeSet<LeaseKey>>;
