//! Change notification for the etcd store: one etcd watch on the namespace's key prefix, turned
//! into the core's [`StoreChange`] notices.
//!
//! Every lease write becomes a notice carrying the record before and after (the watch asks for
//! the previous value), so the core can tell an ownership change from a checkpoint. A worker
//! record becomes a notice only when it appears (its per-key version is 1) or is deleted, never
//! for a heartbeat. The stream ends when etcd cancels the watch (a compaction past it, a lost
//! connection, a server restart); the runtime then subscribes again and lists once. Ending the
//! stream drops the watch's request channel, which cancels it on the server.

use std::collections::VecDeque;

use etcd_client::{Client, Event, EventType, WatchOptions, WatchStream};
use futures::StreamExt;
use shardlease_core::redact::Redactor;
use shardlease_core::{ChangeStream, LeaseKey, Result, StoreChange, WorkerId};
use tracing::debug;

use crate::codec;
use crate::errors::{backend, unexpected};
use crate::keys::{Keys, Record};

/// Opens the watch and waits until etcd confirms it, so every change after this returns is seen.
pub(crate) async fn subscribe(
    client: &Client,
    keys: &Keys,
    redactor: &Redactor,
) -> Result<ChangeStream> {
    let options = WatchOptions::new().with_prefix().with_prev_key();
    let mut watch = client
        .watch_client()
        .watch(keys.root().to_owned(), Some(options))
        .await
        .map_err(|e| backend(redactor, "watch", e))?;
    match watch.message().await.map_err(|e| backend(redactor, "watch", e))? {
        Some(resp) if resp.created() && !resp.canceled() => {}
        _ => return Err(unexpected("watch (not created)")),
    }
    let state = (watch, keys.clone(), VecDeque::new());
    Ok(futures::stream::unfold(state, next).boxed())
}

type State = (WatchStream, Keys, VecDeque<StoreChange>);

async fn next((mut watch, keys, mut pending): State) -> Option<(StoreChange, State)> {
    loop {
        if let Some(change) = pending.pop_front() {
            return Some((change, (watch, keys, pending)));
        }
        match watch.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    debug!(reason = resp.cancel_reason(), "etcd cancelled the watch");
                    return None;
                }
                pending.extend(resp.events().iter().filter_map(|e| to_change(&keys, e)));
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
fn to_change(keys: &Keys, event: &Event) -> Option<StoreChange> {
    let kv = event.kv()?;
    let put = event.event_type() == EventType::Put;
    match keys.classify(kv.key()) {
        Record::Lease(k) => {
            let key = String::from_utf8_lossy(k).into_owned();
            let decode = |v: &[u8]| codec::decode_lease(&key, v).ok().map(|(l, _)| Box::new(l));
            let before = event.prev_kv().and_then(|p| decode(p.value()));
            let after = if put { decode(kv.value()) } else { None };
            Some(StoreChange::Lease { key: LeaseKey::new(key.clone()), before, after })
        }
        Record::Worker(id) => {
            let id = WorkerId::new(String::from_utf8_lossy(id).into_owned());
            match (put, kv.version()) {
                (true, 1) => Some(StoreChange::Worker { id, present: true }),
                (true, _) => None,
                (false, _) => Some(StoreChange::Worker { id, present: false }),
            }
        }
        Record::Other => None,
    }
}
