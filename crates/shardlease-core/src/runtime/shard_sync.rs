//! Shard sync: create a lease for every shard the stream lists and the namespace lacks, and delete
//! finished leases once their children have moved past their start.
//!
//! Creation is idempotent (`create_lease` is create-if-absent), so every worker may run it. Parents
//! are created before their children, so a balancer never sees a child whose parent lease does not
//! exist yet (it would count as "gone" and the child would start too early).
//!
//! The periodic sync lists the leases only when the stream's shards changed since its last full
//! sync (or that sync left a shard without a lease): otherwise every shard still has its lease,
//! and the only work left is collecting finished leases, which reads just their children.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tracing::{debug, info, warn};

use tokio::sync::mpsc::UnboundedReceiver;

use super::events::{Event, Request};
use super::shared::{Shared, SyncRequest, Timing};
use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseKey, VersionedLease};
use crate::position::Position;
use crate::source::ShardInfo;

/// The namespace's leases (`None` when listing failed) and whether another worker of an
/// established fleet has a record there: one that had beaten [`WorkerRecord::ESTABLISHED_BEATS`]
/// times more than this process has, so workers of a new application that start together (and
/// look again after the same wait) never take each other for an established fleet.
///
/// [`WorkerRecord::ESTABLISHED_BEATS`]: crate::worker_record::WorkerRecord
async fn first_look(
    shared: &Shared,
    state: &mut SyncState,
) -> (Option<crate::store::Listing<VersionedLease>>, bool) {
    let listing = shared.store.list_leases().await.ok();
    let me = shared.id();
    let established = match shared.store.list_workers().await {
        Ok(l) => {
            let mine = l.items.iter().find(|r| r.id == me).map_or(0, |r| r.beats_written());
            let ahead = mine + crate::worker_record::WorkerRecord::ESTABLISHED_BEATS;
            l.items.iter().any(|r| r.id != me && r.beats_written() >= ahead)
        }
        Err(_) => false,
    };
    let has_leases = listing.as_ref().is_some_and(|l| !l.items.is_empty() || !l.corrupt.is_empty());
    if has_leases || established {
        state.seen_running = true;
    }
    (listing, established)
}

/// What only the shard sync loop reads and writes.
#[derive(Default)]
struct SyncState {
    /// Whether this process has seen the application run: leases in the namespace, or an
    /// established fleet. A lease missing after that is one the store lost, never one of a new
    /// application, so it is not created at `LATEST` (see [`start_for_missing`]).
    seen_running: bool,
    /// What the last full sync saw, so the next one can skip listing the leases.
    last: Option<LastSync>,
}

/// The balance loop's memory of the namespace's leases (empty when the loop is not running).
async fn memory(shared: &Shared) -> Vec<Lease> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    shared.tell(Event::Request(Request::Memory(tx)));
    rx.await.unwrap_or_default()
}

pub(crate) async fn shard_sync_loop(
    shared: Arc<Shared>,
    mut requests: UnboundedReceiver<SyncRequest>,
) {
    let mut state = SyncState::default();
    let mut timing = Timing::new(&shared.cfg, shared.rng(2));
    let (mut listing, mut established) = first_look(&shared, &mut state).await;
    let mut empty = listing.as_ref().is_none_or(|l| l.items.is_empty() && l.corrupt.is_empty());
    // An empty namespace with an established fleet around is not a new application: the store
    // lost its data, and the fleet restores the leases it remembers (then syncs the rest). A
    // fresh lease created here first would race those restores, so a newcomer leaves it to them
    // (its own periodic sync still runs).
    //
    // The store may have lost the fleet's worker records too: each running worker writes its
    // record again at its next heartbeat (with its process's beat count), so under a start that
    // skips history (`LATEST`), where a fresh lease created over a lost one would be pinned at
    // the new tip and the records since its lost checkpoint skipped, a newcomer that finds
    // nothing waits two heartbeats and looks again before deciding the application is new. Only
    // the very first start of an application pays that wait.
    if empty && !established && *shared.cfg.initial_position() == Position::Latest {
        let wait = shared.cfg.heartbeat_interval().saturating_mul(2);
        tokio::select! {
            biased;
            _ = shared.stop_taking.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        (listing, established) = first_look(&shared, &mut state).await;
        empty = listing.as_ref().is_none_or(|l| l.items.is_empty() && l.corrupt.is_empty());
    }
    if empty && established {
        info!("the namespace is empty but an established fleet is running; leaving lease creation to it");
    } else {
        // Also on a namespace that has leases (with the listing just made): the periodic syncs
        // then know the shards and list the leases again only when those change.
        let synced = match shared.source.list_shards().await {
            Ok(shards) => {
                let initial = shared.cfg.initial_position().clone();
                let memory = memory(&shared).await;
                let listing = listing.filter(|_| !empty);
                sync_shards_listed(&shared, &mut state, shards, &initial, listing, &memory).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = synced {
            warn!(error = %crate::error::ErrorChain(&e), "initial shard sync failed; retrying at the next interval");
        }
    }
    loop {
        let d = timing.jittered(shared.cfg.shard_sync_interval());
        let mut replies = Vec::new();
        tokio::select! {
            biased;
            _ = tokio::time::sleep(d) => {}
            request = requests.recv() => match request {
                Some(SyncRequest::Now(reply)) => {
                    // A full sync now: whatever the last one saw is out of date.
                    state.last = None;
                    replies.extend(reply);
                    while let Ok(SyncRequest::Now(reply)) = requests.try_recv() {
                        replies.extend(reply);
                    }
                }
                None => return,
            },
            _ = shared.stop_taking.cancelled() => return,
        }
        let synced = sync_if_changed(&shared, &mut state).await;
        if let Err(e) = &synced {
            warn!(error = %crate::error::ErrorChain(e), "shard sync failed");
        }
        for reply in replies {
            let answer = match &synced {
                Ok(()) => Ok(()),
                Err(e) => Err(Error::retryable(crate::error::ErrorChain(e).to_string())),
            };
            let _ = reply.send(answer);
        }
    }
}

/// What the last full sync saw and left to do.
#[derive(Clone, Debug)]
struct LastSync {
    /// The shards the stream listed.
    shards: Vec<ShardInfo>,
    /// Whether every one of them had a lease (or was skipped as history) when it finished.
    complete: bool,
    /// Finished leases not yet collected, with the children that must move on first.
    pending: Vec<(LeaseKey, Vec<LeaseKey>)>,
    /// The leases the store held (or this sync created) for the listed shards, minus those this
    /// worker collected since, published on `Shared::expected`. A balance pass that lists the
    /// leases and misses one of these asks for a full sync at once (the store lost leases, or a
    /// peer collected one: either way, look).
    expected: BTreeSet<LeaseKey>,
}

/// The periodic sync: a full one when the shard list changed since the last full sync (or that
/// one was incomplete); otherwise only the collection of finished leases still pending, reading
/// their children one by one instead of listing every lease.
async fn sync_if_changed(shared: &Shared, state: &mut SyncState) -> Result<()> {
    let shards = shared.source.list_shards().await?;
    let last = state.last.take();
    let Some(mut last) = last.filter(|l| l.complete && l.shards == shards) else {
        let memory = memory(shared).await;
        let initial = shared.cfg.initial_position();
        return sync_shards_listed(shared, state, shards, initial, None, &memory).await;
    };
    let mut pending = Vec::with_capacity(last.pending.len());
    let mut collected = Vec::new();
    for (parent, kids) in std::mem::take(&mut last.pending) {
        if collect_if_moved_on(shared, &parent, &kids).await {
            collected.push(parent);
        } else {
            pending.push((parent, kids));
        }
    }
    last.pending = pending;
    for k in &collected {
        last.expected.remove(k);
    }
    if !collected.is_empty() {
        shared.expected.send_replace(Some(Arc::new(last.expected.clone())));
    }
    state.last = Some(last);
    Ok(())
}

/// Deletes the finished lease `parent` once every one of `kids` has a checkpoint past its start,
/// reading only those leases. True when nothing is left to do for it.
async fn collect_if_moved_on(shared: &Shared, parent: &LeaseKey, kids: &[LeaseKey]) -> bool {
    for kid in kids {
        match shared.store.get_lease(kid).await {
            Ok(Some(VersionedLease { lease: c, .. })) if moved_on(&c) => {}
            Ok(_) => return false,
            Err(e) => {
                debug!(shard = %kid, error = %crate::error::ErrorChain(&e), "reading a child lease failed");
                return false;
            }
        }
    }
    match shared.store.get_lease(parent).await {
        Ok(Some(VersionedLease { lease, version })) if lease.is_finished() => {
            match shared.store.delete_lease(parent, version).await {
                Ok(()) => {
                    shared.tell(Event::Changed { n: 1 });
                    debug!(shard = %parent, "deleted a finished lease whose children moved on");
                    true
                }
                Err(Error::Conflict { .. }) => false,
                Err(e) => {
                    warn!(shard = %parent, error = %crate::error::ErrorChain(&e), "deleting a finished lease failed");
                    false
                }
            }
        }
        Ok(_) => true,
        Err(_) => false,
    }
}

/// Whether a child lease has read past its start (so its parent's lease is no longer needed).
fn moved_on(child: &Lease) -> bool {
    matches!(child.checkpoint, Position::Sequence { .. } | Position::ShardEnd)
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

/// One full sync, outside the sync loop, given the balance loop's memory of the namespace (empty
/// before the worker starts).
pub(crate) async fn sync(shared: &Shared, memory: &[Lease]) -> Result<()> {
    sync_from(shared, shared.cfg.initial_position(), memory).await
}

/// One full sync by the sync loop, for the handle: the loop's answer, or (the loop has ended) a
/// sync of its own.
pub(crate) async fn sync_now(shared: &Shared) -> Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if shared.sync.send(SyncRequest::Now(Some(tx))).is_ok() {
        if let Ok(result) = rx.await {
            return result;
        }
    }
    let memory = memory(shared).await;
    sync(shared, &memory).await
}

/// A sync right after the store lost every lease: the namespace is not new, so a shard nobody
/// remembers is read from its start rather than from `LATEST` (whose records up to now would be
/// skipped, though a lost lease may have been reading them). `AT_TIMESTAMP` stays.
pub(crate) async fn sync_after_loss(shared: &Shared, memory: &[Lease]) -> Result<()> {
    let initial = match shared.cfg.initial_position() {
        Position::Latest => Position::TrimHorizon,
        other => other.clone(),
    };
    sync_from(shared, &initial, memory).await
}

/// A full sync with a state of its own (the sync loop's is not at hand): it knows the memory it is
/// given, and leaves the loop's next sync to be a full one.
async fn sync_from(shared: &Shared, initial: &Position, memory: &[Lease]) -> Result<()> {
    let shards = shared.source.list_shards().await?;
    let mut state = SyncState { seen_running: !memory.is_empty(), last: None };
    sync_shards_listed(shared, &mut state, shards, initial, None, memory).await
}

/// A full sync against `listing` (listed now when `None`).
async fn sync_shards_listed(
    shared: &Shared,
    state: &mut SyncState,
    shards: Vec<ShardInfo>,
    initial: &Position,
    listing: Option<crate::store::Listing<crate::lease::VersionedLease>>,
    memory: &[Lease],
) -> Result<()> {
    let listing = match listing {
        Some(l) => l,
        None => shared.store.list_leases().await?,
    };
    let remembers_any = !memory.is_empty() || state.seen_running;
    // A stream's own start (multi-stream sources) follows the same rule as the configured one.
    let latest_ok = start_for_missing(&Position::Latest, &listing, remembers_any)
        == Position::Latest
        && initial == shared.cfg.initial_position();
    let initial = &start_for_missing(initial, &listing, remembers_any);
    let mut existing: BTreeSet<String> =
        listing.items.iter().map(|v| v.lease.key.as_str().to_owned()).collect();
    existing.extend(listing.corrupt.iter().map(|c| c.key.clone()));
    // What the store holds; `existing` also counts what this worker remembers.
    let mut stored = existing.clone();
    // Leases this worker remembers exist too, even when the store lost them: the balance pass
    // restores them with their checkpoints. A finished one is not created again here; an
    // unfinished one is created behind, at its shard's start (below), never at `LATEST` (a fresh
    // `LATEST` lease pinned by its new owner would skip the records between the lost checkpoint
    // and the pin).
    existing.extend(memory.iter().map(|l| l.key.as_str().to_owned()));
    // Leases that read past their start, listed or remembered: only such a descendant proves a
    // shard's own lease was finished and collected (collection waits for every child to move on).
    let mut moved: BTreeSet<String> = listing
        .items
        .iter()
        .filter(|v| moved_on(&v.lease))
        .map(|v| v.lease.key.as_str().to_owned())
        .collect();
    // An undecodable lease may well have moved on: counted as if it had (recreating a parent
    // already processed would read it again after its children).
    moved.extend(listing.corrupt.iter().map(|c| c.key.clone()));
    moved.extend(memory.iter().filter(|l| moved_on(l)).map(|l| l.key.as_str().to_owned()));
    let mut children: BTreeMap<&LeaseKey, Vec<&LeaseKey>> = BTreeMap::new();
    for s in &shards {
        for p in &s.parents {
            children.entry(p).or_default().push(&s.id);
        }
    }
    let mut finished_now: BTreeSet<&LeaseKey> = BTreeSet::new();
    let mut created = 0usize;
    // The leases to create, in the order decided (parents first), written a batch at a time.
    let mut pending: Vec<Lease> = Vec::new();
    let mut complete = true;
    // Remembered, unfinished and missing from the store: lost, and being restored by the balance
    // passes (this worker's, or its owner's first). Created here behind, at its shard's start,
    // so that until the restore lands every worker sees it unfinished and keeps its children
    // blocked. Left missing, it would look collected to a worker that never saw it (a process
    // restarted under the same id knows nothing of it), which would start its children at once;
    // once a child moves on, the lease really looks collected and its records are never read.
    // The restore then finds the fresh lease behind what it remembers and writes it back.
    // It is created unowned, like any fresh lease: created under the owner it remembers, a lease
    // that owner no longer runs (this memory may be out of date) would be re-taken by it from its
    // start, while the peers that remember more kept waiting for that owner to restore it.
    let lost_unfinished: BTreeSet<String> = memory
        .iter()
        .filter(|l| !l.is_finished() && !stored.contains(l.key.as_str()))
        .map(|l| l.key.as_str().to_owned())
        .collect();
    for shard in parents_first(&shards) {
        let lost = lost_unfinished.contains(shard.id.as_str());
        if existing.contains(shard.id.as_str()) && !lost {
            // Remembered but not stored: the balance pass restores it; sync fully again later.
            complete &= stored.contains(shard.id.as_str());
            continue;
        }
        let kids = children.get(&shard.id).map(Vec::as_slice).unwrap_or(&[]);
        if shard.closed && has_moved_on_descendant(&shard.id, &children, &moved) {
            // Processing has already moved past this shard (its lease was finished and deleted
            // once its children moved on): recreating it would process it all over again. A
            // descendant that merely has a lease proves nothing: after the store lost its data,
            // a child restored at its start may still wait for this shard.
            continue;
        }
        let own = super::retire::own_start(shared, &shard.id, latest_ok);
        let initial = own.as_ref().unwrap_or(initial);
        let checkpoint = if lost {
            complete = false;
            child_start(initial)
        } else {
            initial_checkpoint(initial, shard, kids, &existing, &finished_now)
        };
        if checkpoint.is_shard_end() {
            finished_now.insert(&shard.id);
        }
        let lease = Lease {
            epoch: super::recovery::creation_epoch(),
            ..Lease::new(shard.id.clone(), checkpoint).with_parents(shard.parents.iter().cloned())
        };
        pending.push(lease);
        if pending.len() == CREATE_BATCH {
            created += create_all(shared, &mut pending).await?;
        }
        existing.insert(shard.id.as_str().to_owned());
        stored.insert(shard.id.as_str().to_owned());
    }
    created += create_all(shared, &mut pending).await?;
    if created > 0 {
        info!(created, shards = shards.len(), "shard sync created leases");
        shared.tell(Event::Changed { n: created as u64 });
        shared.tell(Event::WantListing { now: true });
    }
    let (pending, collected) = collect_finished(shared, &listing.items, &children).await;
    // Streams the source retired (multi-stream): finished now, deleted at a later full sync.
    complete &= !super::retire::retire_listed(shared, &listing.items).await;
    let expected: BTreeSet<LeaseKey> = shards
        .iter()
        .filter(|s| stored.contains(s.id.as_str()) && !collected.contains(&s.id))
        .map(|s| s.id.clone())
        .collect();
    shared.expected.send_replace(Some(Arc::new(expected.clone())));
    state.last = Some(LastSync { shards: shards.clone(), complete, pending, expected });
    Ok(())
}

/// Leases created per store call at most (`LeaseStore::create_leases`).
pub(crate) const CREATE_BATCH: usize = 100;

/// Creates the `pending` leases in one batch, in their order (parents before children: the store
/// keeps a batch's order), and empties it. The number created (the others existed already).
async fn create_all(shared: &Shared, pending: &mut Vec<Lease>) -> crate::error::Result<usize> {
    if pending.is_empty() {
        return Ok(0);
    }
    let outcomes = shared.store.create_leases(pending).await?;
    pending.clear();
    Ok(outcomes.iter().filter(|o| matches!(o, crate::store::CreateOutcome::Created(_))).count())
}

/// The start of a lease created now for a shard no leased ancestor leads into.
///
/// `LATEST` skips history only when the namespace gets its first leases. Once the application has
/// run (a lease was pinned or read past `LATEST`, a record exists that cannot be decoded, or this
/// worker remembers leases), a shard without a lease is either new since the application started
/// (all its records are newer than the start, so reading it from its first record skips nothing
/// the user asked for) or a lease the store lost (a wipe, a rollback, a restore) that this worker
/// cannot restore, because it never saw it: a process restarted under the same id after its
/// predecessor ran the lease knows nothing of it, while the peers that do defer to that "live"
/// owner. Created at `LATEST`, such a lease would be pinned at the new tip by its next owner and
/// every record since its last checkpoint skipped; read from its first record, they are processed
/// again instead. `TRIM_HORIZON` and `AT_TIMESTAMP` already start at a fixed point.
fn start_for_missing(
    initial: &Position,
    listing: &crate::store::Listing<crate::lease::VersionedLease>,
    remembers_any: bool,
) -> Position {
    let has_run = remembers_any
        || !listing.corrupt.is_empty()
        || listing.items.iter().any(|v| v.lease.checkpoint != Position::Latest);
    match initial {
        Position::Latest if has_run => Position::TrimHorizon,
        other => other.clone(),
    }
}

/// Whether any shard descending from `id` (children, grandchildren, ...) has a lease that read
/// past its start (`moved`).
fn has_moved_on_descendant(
    id: &LeaseKey,
    children: &BTreeMap<&LeaseKey, Vec<&LeaseKey>>,
    moved: &BTreeSet<String>,
) -> bool {
    let mut stack: Vec<&LeaseKey> = children.get(id).cloned().unwrap_or_default();
    let mut seen: BTreeSet<&LeaseKey> = BTreeSet::new();
    while let Some(k) = stack.pop() {
        if !seen.insert(k) {
            continue;
        }
        if moved.contains(k.as_str()) {
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

/// Deletes finished leases whose children all exist and have a checkpoint past their start;
/// returns those left for later, with their children, and those deleted.
#[allow(clippy::type_complexity)]
async fn collect_finished(
    shared: &Shared,
    leases: &[VersionedLease],
    children_listed: &BTreeMap<&LeaseKey, Vec<&LeaseKey>>,
) -> (Vec<(LeaseKey, Vec<LeaseKey>)>, BTreeSet<LeaseKey>) {
    let mut pending = Vec::new();
    let mut collected = BTreeSet::new();
    let by_key: BTreeMap<&LeaseKey, &Lease> =
        leases.iter().map(|v| (&v.lease.key, &v.lease)).collect();
    let mut lease_children: BTreeMap<&LeaseKey, Vec<&LeaseKey>> = BTreeMap::new();
    for VersionedLease { lease: l, .. } in leases {
        for p in &l.parents {
            lease_children.entry(p).or_default().push(&l.key);
        }
    }
    for VersionedLease { lease, version } in leases {
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
        let all_moved_on = kids.iter().all(|k| by_key.get(k).is_some_and(|c| moved_on(c)));
        let later = (lease.key.clone(), kids.iter().map(|k| (*k).clone()).collect());
        if !all_moved_on {
            pending.push(later);
            continue;
        }
        match shared.store.delete_lease(&lease.key, *version).await {
            Ok(()) => {
                shared.tell(Event::Changed { n: 1 });
                collected.insert(lease.key.clone());
                debug!(shard = %lease.key, "deleted a finished lease whose children moved on")
            }
            Err(Error::Conflict { .. }) => pending.push(later),
            Err(e) => {
                warn!(shard = %lease.key, error = %crate::error::ErrorChain(&e), "deleting a finished lease failed");
                pending.push(later);
            }
        }
    }
    (pending, collected)
}
