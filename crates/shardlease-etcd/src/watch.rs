//! Change notification for the etcd store: one etcd watch on the namespace's key prefix, turned
//! into the core's [`StoreChange`] notices.
//!
//! Every lease write becomes a notice carrying the record before and after, so the core can tell
//! an ownership change from a checkpoint. The "before" comes from the stream's own copy of the
//! namespace's leases: read once when subscribing (at revision `R`, the watch then starts at
//! `R + 1`, so nothing falls between), then kept current from the events. etcd's `prev_kv`
//! would give it too, but makes the server read the previous value for every event and every
//! watcher, which on a busy server costs more than the writes themselves. A worker
//! record becomes a notice only when it appears (its per-key version is 1) or is deleted, never
//! for a heartbeat. A write of the fleet signal is no notice at all. The stream ends when etcd cancels the watch (a compaction past it, a lost
//! connection, a server restart); the runtime then subscribes again and lists once. Ending the
//! stream drops the watch's request channel, which cancels it on the server.

use shardlease_core::store::VersionedLease;
use std::collections::{HashMap, VecDeque};

use etcd_client::{Client, Event, EventType, GetOptions, WatchOptions, WatchStream};
use futures::StreamExt;
use shardlease_core::store::Redactor;
use shardlease_core::store::{ChangeStream, Lease, StoreChange};
use shardlease_core::{LeaseKey, Result, WorkerId};
use tracing::debug;

use crate::codec;
use crate::errors::{backend, unexpected};
use crate::keys::{range_end, Keys, Record};

/// The stream's copy of the namespace's leases, by lease key.
type Known = HashMap<String, Box<Lease>>;

/// Reads the leases, opens the watch right after that read's revision and waits until etcd
/// confirms it, so every change after this returns is seen.
pub(crate) async fn subscribe(
    client: &Client,
    keys: &Keys,
    redactor: &Redactor,
) -> Result<ChangeStream> {
    let (known, revision) = read_leases(client, keys, redactor).await?;
    let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
    let mut watch = client
        .watch_client()
        .watch(keys.root().to_owned(), Some(options))
        .await
        .map_err(|e| backend(redactor, "watch", e))?;
    match watch.message().await.map_err(|e| backend(redactor, "watch", e))? {
        Some(resp) if resp.created() && !resp.canceled() => {}
        _ => return Err(unexpected("watch (not created)")),
    }
    let state = State { watch, keys: keys.clone(), known, pending: VecDeque::new() };
    Ok(futures::stream::unfold(state, next).boxed())
}

/// Every lease of the namespace that decodes, and the revision they were read at.
async fn read_leases(client: &Client, keys: &Keys, redactor: &Redactor) -> Result<(Known, i64)> {
    let prefix = keys.lease_prefix();
    let options = GetOptions::new().with_range(range_end(&prefix));
    let resp = client
        .kv_client()
        .get(prefix, Some(options))
        .await
        .map_err(|e| backend(redactor, "watch: read leases", e))?;
    let revision = resp.header().map(|h| h.revision()).ok_or_else(|| unexpected("watch"))?;
    let mut known = Known::new();
    for kv in resp.kvs() {
        if let Record::Lease(k) = keys.classify(kv.key()) {
            let key = String::from_utf8_lossy(k).into_owned();
            if let Ok(VersionedLease { lease, .. }) = codec::decode_lease(&key, kv.value()) {
                known.insert(key, Box::new(lease));
            }
        }
    }
    Ok((known, revision))
}

struct State {
    watch: WatchStream,
    keys: Keys,
    known: Known,
    pending: VecDeque<StoreChange>,
}

async fn next(mut s: State) -> Option<(StoreChange, State)> {
    loop {
        if let Some(change) = s.pending.pop_front() {
            return Some((change, s));
        }
        match s.watch.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    debug!(reason = resp.cancel_reason(), "etcd cancelled the watch");
                    return None;
                }
                for event in resp.events() {
                    if let Some(change) = to_change(&s.keys, &mut s.known, event) {
                        s.pending.push_back(change);
                    }
                }
            }
            Ok(None) => {
                debug!("the etcd watch stream closed");
                return None;
            }
            Err(e) => {
                debug!(error = %e, "the etcd watch stream failed");
                return None;
            }
        }
    }
}

/// The notice for one event, or `None` when it is not worth one (a heartbeat).
fn to_change(keys: &Keys, known: &mut Known, event: &Event) -> Option<StoreChange> {
    let kv = event.kv()?;
    let put = event.event_type() == EventType::Put;
    match keys.classify(kv.key()) {
        Record::Lease(k) => {
            let key = String::from_utf8_lossy(k).into_owned();
            let after = if put {
                codec::decode_lease(&key, kv.value()).ok().map(|v| Box::new(v.lease))
            } else {
                None
            };
            let before = match &after {
                Some(lease) => known.insert(key.clone(), lease.clone()),
                None => known.remove(&key),
            };
            Some(StoreChange::Lease { key: LeaseKey::new(key), before, after })
        }
        Record::Worker(id) => {
            let id = WorkerId::new(String::from_utf8_lossy(id).into_owned());
            match (put, kv.version()) {
                (true, 1) => Some(StoreChange::Worker { id, present: true }),
                (true, _) => None,
                (false, _) => Some(StoreChange::Worker { id, present: false }),
            }
        }
        // The fleet signal is no lease or worker change: the runtime reads it on its heartbeat.
        Record::FleetSignal | Record::Other => None,
    }
}
