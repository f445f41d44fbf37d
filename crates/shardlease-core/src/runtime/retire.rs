//! Retiring the leases of a stream the source stopped reading for good (a stream removed from a
//! multi-stream source whose grace passed, see [`ShardSource::retired`]): shard sync finishes
//! each such lease by compare-and-set (unowned, new epoch: the owner is fenced like after an
//! operator's release) and deletes it at a later full sync, once every peer had the time to list
//! it finished. A finished lease that vanishes is what garbage collection looks like to a peer's
//! memory, and the recovery of lost leases also leaves retired keys alone, so none comes back.
//!
//! Kept apart from `shard_sync` on purpose: the sync calls [`retire_listed`] once per full sync.
//!
//! [`ShardSource::retired`]: crate::source::ShardSource::retired

use tracing::{info, warn};

use super::cas::{self, Outcome, Policy};
use super::events::Event;
use super::shared::{Shared, Timing};
use crate::error::Error;
use crate::lease::transition;
use crate::lease::VersionedLease;

/// Finishes the unfinished retired leases of `listed` and deletes the finished ones. True when
/// retired leases are left for a later sync (just finished, or a write failed).
pub(crate) async fn retire_listed(shared: &Shared, listed: &[VersionedLease]) -> bool {
    let retired: Vec<&VersionedLease> =
        listed.iter().filter(|v| shared.source.retired(&v.lease.key)).collect();
    if retired.is_empty() {
        return false;
    }
    let mut timing = Timing::new(&shared.cfg, shared.rng(7));
    let (mut finished, mut deleted, mut left) = (0usize, 0usize, false);
    for v in retired {
        let key = &v.lease.key;
        if v.lease.is_finished() {
            match shared.store.delete_lease(key, v.version).await {
                Ok(()) => deleted += 1,
                Err(Error::Conflict { .. }) => left = true,
                Err(e) => {
                    warn!(shard = %key, error = %crate::error::ErrorChain(&e), "deleting a retired lease failed");
                    left = true;
                }
            }
            continue;
        }
        left = true;
        let outcome = cas::write(
            shared,
            &mut timing,
            key,
            Some(v.clone()),
            Policy::PERSIST,
            "retire a lease of a removed stream",
            |l| transition::retire(l, crate::clock::now_millis()),
        )
        .await;
        if let Outcome::Written(..) = outcome {
            finished += 1;
        }
    }
    if finished + deleted > 0 {
        info!(finished, deleted, "retired the leases of removed streams");
        shared.tell(Event::Changed { n: (finished + deleted) as u64 });
        shared.tell(Event::WantListing { now: true });
    }
    left
}

/// The source's own initial position for `key` (a multi-stream source's per-stream start), with
/// `LATEST` read as `TRIM_HORIZON` unless `latest_ok` (the namespace gets its first leases): the
/// rule the configured position follows (docs/algorithm.md, "Creating leases").
pub(crate) fn own_start(
    shared: &Shared,
    key: &crate::lease::LeaseKey,
    latest_ok: bool,
) -> Option<crate::position::Position> {
    use crate::position::Position;
    match shared.source.initial_position(key)? {
        Position::Latest if !latest_ok => Some(Position::TrimHorizon),
        other => Some(other),
    }
}
