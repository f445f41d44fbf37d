//! Reacting to a store's change notices (an optional store capability, see `crate::notify`).
//!
//! A small task per worker subscribes to the store's change stream, when the store has one, and
//! turns each relevant notice into the triggers the loops already have: "list the leases now"
//! (an `Event::WantListing` to the balance loop) and "list the worker records now"
//! (`Shared::workers_changed`, which wakes the heartbeat). It
//! adds no decision of its own: without a stream it ends at once and the worker runs exactly as
//! before. A stream that ends or fails is subscribed again with backoff, and every subscription
//! is followed by one listing of each kind, so a change made while no stream was open (or before
//! the first one opened) is never missed. docs/algorithm.md, "Change notification".

use std::sync::Arc;

use futures::StreamExt;
use tracing::{debug, warn};

use super::events::Event;
use super::shared::{Shared, Timing};

pub(crate) async fn notice_loop(shared: Arc<Shared>) {
    let mut timing = Timing::new(&shared.cfg, shared.rng(5));
    let mut backoff = timing.backoff();
    loop {
        let subscribed = tokio::select! {
            biased;
            r = shared.store.subscribe_changes() => r,
            _ = shared.cancel.cancelled() => return,
        };
        match subscribed {
            // No change stream: nothing to do until the worker stops (a loop that returned
            // early would look like a failed one to supervision).
            Ok(None) => return shared.cancel.cancelled().await,
            Ok(Some(mut stream)) => {
                debug!("subscribed to the store's change notices");
                shared.notified.send_replace(true);
                backoff = timing.backoff();
                // Whatever changed while no stream was open is found by listing once.
                shared.tell(Event::WantListing { now: true });
                shared.workers_changed.notify_one();
                loop {
                    let next = tokio::select! {
                        biased;
                        _ = shared.cancel.cancelled() => return,
                        n = stream.next() => n,
                    };
                    let Some(change) = next else {
                        shared.notified.send_replace(false);
                        break;
                    };
                    if change.calls_for_worker_listing() {
                        shared.workers_changed.notify_one();
                    }
                    if change.calls_for_listing() {
                        shared.tell(Event::Noticed);
                    }
                }
                debug!("the store's change stream ended; subscribing again");
            }
            Err(e) => {
                let delay = backoff.next(&mut timing);
                warn!(error = %crate::error::ErrorChain(&e), ?delay, "subscribing to the store's change notices failed; retrying");
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(delay) => {}
                    _ = shared.cancel.cancelled() => return,
                }
            }
        }
    }
}
