//! Shard sync: create a lease for every shard the stream lists and the namespace lacks, and delete
//! finished leases once their children have moved past their start.
//!
//! Creation is idempotent (`create_lease` is create-if-absent), so every worker may run it. Parents
//! are created before their children, so a balancer never sees a child whose parent lease does not
//! exist yet (it would count as "gone" and the child would start too early).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tracing::{debug, info, warn};

use super::shared::{lock, Shared};
use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseKey};
use crate::position::Position;
use crate::source::ShardInfo;

/// A peer whose heartbeat counter reached this has been running for a few heartbeats: part of an
/// established fleet rather than a worker starting at the same moment as this one.
const ESTABLISHED_BEATS: u64 = 3;

pub(crate) async fn shard_sync_loop(shared: Arc<Shared>) {
    let empty = match shared.store.list_leases().await {
        Ok(l) => l.items.is_empty() && l.corrupt.is_empty(),
        Err(_) => true,
    };
    // An empty namespace with an established fleet around is not a new application: the store
    // lost its data, and the fleet restores the leases it remembers (then syncs the rest). A
    // fresh lease created here first would race those restores, so a newcomer leaves it to them
    // (its own periodic sync still runs).
    let me = shared.id();
    let established = match shared.store.list_workers().await {
        Ok(l) => l.items.iter().any(|r| r.id != me && r.beats_written() >= ESTABLISHED_BEATS),
        Err(_) => false,
    };
    if empty && established {
        info!("the namespace is empty but an established fleet is running; leaving lease creation to it");
    } else if empty {
        if let Err(e) = sync(&shared).await {
            warn!(error = %e, "initial shard sync failed; retrying at the next interval");
        }
    }
    loop {
        let d = shared.jittered(shared.cfg.shard_sync_interval);
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = shared.stop_taking.cancelled() => return,
        }
        if let Err(e) = sync(&shared).await {
            warn!(error = %e, "shard sync failed");
        }
    }
}

/// Orders shards so every parent comes before its children.
fn parents_first(shards: &[ShardInfo]) -> Vec<&ShardInfo> {
    let ids: BTreeSet<&LeaseKey> = shards.iter().map(|s| &s.id).collect();
    let mut placed: BTreeSet<&LeaseKey> = BTreeSet::new();
    let mut out = Vec::with_capacity(shards.len());
    let mut rest: Vec<&ShardInfo> = shards.iter().collect();
    while !rest.is_empty() {
        let before = rest.len();
        rest.retain(|s| {
            let ready = s.parents.iter().all(|p| !ids.contains(p) || placed.contains(p));
            if ready {
                placed.insert(&s.id);
                out.push(*s);
            }
            !ready
        });
        if rest.len() == before {
            // A cycle in the source's parent links: create the rest as they come.
            out.append(&mut rest);
        }
    }
    out
}

/// One sync pass.
pub(crate) async fn sync(shared: &Shared) -> Result<()> {
    sync_from(shared, &shared.cfg.initial_position).await
}

/// A sync right after the store lost every lease: the namespace is not new, so a shard nobody
/// remembers is read from its start rather than from `LATEST` (whose records up to now would be
/// skipped, though a lost lease may have been reading them). `AT_TIMESTAMP` stays.
pub(crate) async fn sync_after_loss(shared: &Shared) -> Result<()> {
    let initial = match &shared.cfg.initial_position {
        Position::Latest => Position::TrimHorizon,
        other => other.clone(),
    };
    sync_from(shared, &initial).await
}

async fn sync_from(shared: &Shared, initial: &Position) -> Result<()> {
    let shards = shared.source.list_shards().await?;
    let listing = shared.store.list_leases().await?;
    let mut existing: BTreeSet<String> =
        listing.items.iter().map(|(l, _)| l.key.as_str().to_owned()).collect();
    existing.extend(listing.corrupt.iter().map(|c| c.key.clone()));
    // Leases this worker remembers exist too, even when the store lost them: the balance pass
    // restores them with their checkpoints, and a fresh lease created here first would race that
    // restore (a fresh `LATEST` lease pinned by its new owner would skip the records between the
    // lost checkpoint and the pin).
    existing.extend(lock(&shared.remembered).keys().map(|k| k.as_str().to_owned()));
    let mut children: BTreeMap<&LeaseKey, Vec<&LeaseKey>> = BTreeMap::new();
    for s in &shards {
        for p in &s.parents {
            children.entry(p).or_default().push(&s.id);
        }
    }
    let mut finished_now: BTreeSet<&LeaseKey> = BTreeSet::new();
    let mut created = 0usize;
    for shard in parents_first(&shards) {
        if existing.contains(shard.id.as_str()) {
            continue;
        }
        let kids = children.get(&shard.id).map(Vec::as_slice).unwrap_or(&[]);
        if shard.closed && has_leased_descendant(&shard.id, &children, &existing) {
            // Processing has already moved past this shard (its lease was finished and deleted
            // once its children moved on): recreating it would process it all over again.
            continue;
        }
        let checkpoint = initial_checkpoint(initial, shard, kids, &existing, &finished_now);
        if checkpoint.is_shard_end() {
            finished_now.insert(&shard.id);
        }
        let lease = Lease {
            epoch: super::recovery::creation_epoch(),
            ..Lease::new(shard.id.clone(), checkpoint).with_parents(shard.parents.iter().cloned())
        };
        if let crate::store::CreateOutcome::Created(_) = shared.store.create_lease(&lease).await? {
            created += 1;
        }
        existing.insert(shard.id.as_str().to_owned());
    }
    if created > 0 {
        info!(created, shards = shards.len(), "shard sync created leases");
        shared.balance_now.notify_one();
    }
    collect_finished(shared, &listing.items, &children).await;
    Ok(())
}

/// Whether any shard descending from `id` (children, grandchildren, ...) has a lease.
fn has_leased_descendant(
    id: &LeaseKey,
    children: &BTreeMap<&LeaseKey, Vec<&LeaseKey>>,
    existing: &BTreeSet<String>,
) -> bool {
    let mut stack: Vec<&LeaseKey> = children.get(id).cloned().unwrap_or_default();
    let mut seen: BTreeSet<&LeaseKey> = BTreeSet::new();
    while let Some(k) = stack.pop() {
        if !seen.insert(k) {
            continue;
        }
        if existing.contains(k.as_str()) {
            return true;
        }
        stack.extend(children.get(k).into_iter().flatten().copied());
    }
    false
}

/// Where a new shard's lease starts.
///
/// A shard whose parent has (or is getting) a lease continues where that parent ends, whatever the
/// initial position: the parent's lease leads into it. This is checked before anything else, so a
/// closed shard is "history" only when no ancestor leads into it (a lagging grandparent must not
/// have its grandchildren's records skipped because the shard between them closed before any sync
/// saw it open).
fn initial_checkpoint(
    initial: &Position,
    shard: &ShardInfo,
    kids: &[&LeaseKey],
    existing: &BTreeSet<String>,
    finished_now: &BTreeSet<&LeaseKey>,
) -> Position {
    let parent_leads_in =
        shard.parents.iter().any(|p| existing.contains(p.as_str()) && !finished_now.contains(p));
    if parent_leads_in {
        return child_start(initial);
    }
    match initial {
        // LATEST: history before "now" is skipped. A closed shard that already has children is
        // history, so it is created finished.
        Position::Latest if shard.closed && !kids.is_empty() => Position::ShardEnd,
        // AT_TIMESTAMP: every shard, open or closed, is read from the timestamp; a closed shard
        // whose records all came before it ends at once. Finishing it here would skip the records
        // it received between the timestamp and its close.
        other => other.clone(),
    }
}

/// Where the lease of a shard that continues a leased parent starts: from its first record, or,
/// under an `AT_TIMESTAMP` start, from that timestamp (the parents are read from it too, so
/// nothing after it is skipped and nothing before it is read).
pub(crate) fn child_start(initial: &Position) -> Position {
    match initial {
        Position::AtTimestamp { .. } => initial.clone(),
        _ => Position::TrimHorizon,
    }
}

/// Deletes finished leases whose children all exist and have a checkpoint past their start.
async fn collect_finished(
    shared: &Shared,
    leases: &[(Lease, crate::lease::Version)],
    children_listed: &BTreeMap<&LeaseKey, Vec<&LeaseKey>>,
) {
    let by_key: BTreeMap<&LeaseKey, &Lease> = leases.iter().map(|(l, _)| (&l.key, l)).collect();
    let mut lease_children: BTreeMap<&LeaseKey, Vec<&LeaseKey>> = BTreeMap::new();
    for (l, _) in leases {
        for p in &l.parents {
            lease_children.entry(p).or_default().push(&l.key);
        }
    }
    for (lease, version) in leases {
        if !lease.is_finished() {
            continue;
        }
        let kids: BTreeSet<&LeaseKey> = children_listed
            .get(&lease.key)
            .into_iter()
            .chain(lease_children.get(&lease.key))
            .flatten()
            .copied()
            .collect();
        if kids.is_empty() {
            continue;
        }
        let all_moved_on = kids.iter().all(|k| {
            by_key.get(k).is_some_and(|c| {
                matches!(c.checkpoint, Position::Sequence { .. } | Position::ShardEnd)
            })
        });
        if !all_moved_on {
            continue;
        }
        match shared.store.delete_lease(&lease.key, *version).await {
            Ok(()) => debug!(key = %lease.key, "deleted a finished lease whose children moved on"),
            Err(Error::Conflict { .. }) => {}
            Err(e) => warn!(key = %lease.key, error = %e, "deleting a finished lease failed"),
        }
    }
}
