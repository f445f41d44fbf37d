//! [`NotifyingStore`]: change notification for any store, in process, so the simulation and the
//! fleet tests run the runtime's push path (`LeaseStore::subscribe_changes`) on the in-memory
//! store, with the faults a real one has.
//!
//! It announces what PostgreSQL's `NOTIFY` and Redis pub/sub announce (see those stores): a lease
//! created or deleted, an update written with `update_lease` (an ownership change), a worker
//! record appearing or being removed; never a quiet update (a checkpoint) or the heartbeat of a
//! known worker. Like theirs, its notices carry the key only (no record before and after).
//!
//! Every store wrapping the same [`Notifier`] shares its subscribers, as the workers of one
//! namespace share a server. The notifier can misbehave the way real push does:
//! [`Notifier::drop_subscriptions`] ends every open stream (a lost connection, a server restart),
//! and [`Notifier::set_loss`] loses a fraction of notices (pub/sub is at most once). A subscriber
//! that falls behind by more than the channel holds loses its stream too, as Redis drops a slow
//! subscriber.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardlease_core::store::{
    ChangeStream, CreateOutcome, Lease, LeaseStore, StoreChange, StoreDecorator, Version,
    WorkerRecord,
};
use shardlease_core::{LeaseKey, Result, WorkerId};
use tokio::sync::{broadcast, watch};

/// How many notices a subscriber may fall behind before its stream ends.
const BACKLOG: usize = 4096;

/// The shared side of in-process notification: its subscribers, the worker records it has seen
/// appear, and its faults. Cheap to clone; clones are the same notifier.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

struct Inner {
    sender: broadcast::Sender<StoreChange>,
    /// Bumped to end every open stream.
    generation: watch::Sender<u64>,
    /// Worker ids whose record this notifier saw appear and not yet removed.
    present: Mutex<BTreeSet<WorkerId>>,
    /// Notices lost, in millionths, and the generator that draws the losses.
    loss_ppm: AtomicU64,
    rng: Mutex<StdRng>,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notifier")
            .field("subscribers", &self.inner.sender.receiver_count())
            .field("loss_ppm", &self.inner.loss_ppm.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// A notifier with no subscribers and no faults; `seed` draws the lost notices.
    pub fn new(seed: u64) -> Self {
        Notifier {
            inner: Arc::new(Inner {
                sender: broadcast::channel(BACKLOG).0,
                generation: watch::channel(0).0,
                present: Mutex::new(BTreeSet::new()),
                loss_ppm: AtomicU64::new(0),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
            }),
        }
    }

    /// `store`, announcing its writes to this notifier's subscribers.
    pub fn wrap(&self, store: Arc<dyn LeaseStore>) -> NotifyingStore {
        NotifyingStore { inner: store, notifier: self.clone() }
    }

    /// Loses each notice with probability `rate` (0 to 1) from now on.
    pub fn set_loss(&self, rate: f64) {
        let ppm = (rate.clamp(0.0, 1.0) * 1e6) as u64;
        self.inner.loss_ppm.store(ppm, Ordering::Relaxed);
    }

    /// Ends every stream open now (their subscribers subscribe again), as a lost connection or a
    /// server restart does.
    pub fn drop_subscriptions(&self) {
        self.inner.generation.send_modify(|g| *g += 1);
    }

    /// How many streams are open.
    pub fn subscribers(&self) -> usize {
        self.inner.sender.receiver_count()
    }

    fn announce(&self, change: StoreChange) {
        let ppm = self.inner.loss_ppm.load(Ordering::Relaxed);
        if ppm > 0 {
            let mut rng = self.inner.rng.lock().unwrap_or_else(|e| e.into_inner());
            if rng.random_range(0..1_000_000) < ppm {
                return;
            }
        }
        // No subscriber is not an error: nobody is listening.
        let _ = self.inner.sender.send(change);
    }

    fn lease(&self, key: &LeaseKey) {
        self.announce(StoreChange::Lease { key: key.clone(), before: None, after: None });
    }

    fn worker(&self, id: &WorkerId, present: bool) {
        let changed = {
            let mut known = self.inner.present.lock().unwrap_or_else(|e| e.into_inner());
            if present {
                known.insert(id.clone())
            } else {
                known.remove(id);
                true
            }
        };
        if changed {
            self.announce(StoreChange::Worker { id: id.clone(), present });
        }
    }

    fn subscribe(&self) -> ChangeStream {
        let receiver = self.inner.sender.subscribe();
        let mut generation = self.inner.generation.subscribe();
        generation.mark_unchanged();
        futures::stream::unfold((receiver, generation), |(mut rx, mut generation)| async move {
            tokio::select! {
                biased;
                _ = generation.changed() => None,
                next = rx.recv() => match next {
                    Ok(change) => Some((change, (rx, generation))),
                    // Fallen behind, or the notifier is gone: the stream ends.
                    Err(_) => None,
                },
            }
        })
        .boxed()
    }
}

/// A store whose writes are announced by a [`Notifier`]; see the module documentation.
#[derive(Debug)]
pub struct NotifyingStore {
    inner: Arc<dyn LeaseStore>,
    notifier: Notifier,
}

#[async_trait]
impl StoreDecorator for NotifyingStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let outcome = self.inner.create_lease(lease).await?;
        if matches!(outcome, CreateOutcome::Created(_)) {
            self.notifier.lease(&lease.key);
        }
        Ok(outcome)
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let v = self.inner.update_lease(lease, expected).await?;
        self.notifier.lease(&lease.key);
        Ok(v)
    }

    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.inner.update_lease_quietly(lease, expected).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        self.inner.delete_lease(key, expected).await?;
        self.notifier.lease(key);
        Ok(())
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        self.inner.heartbeat(record).await?;
        self.notifier.worker(&record.id, true);
        Ok(())
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.inner.remove_worker(id).await?;
        self.notifier.worker(id, false);
        Ok(())
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let removed = self.inner.remove_worker_if(id, beat).await?;
        if removed {
            self.notifier.worker(id, false);
        }
        Ok(removed)
    }

    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        Ok(Some(self.notifier.subscribe()))
    }
}

#[cfg(test)]
mod tests {
    use shardlease_core::store::MemoryStore;
    use shardlease_core::Position;

    use super::*;

    #[tokio::test]
    async fn dropped_subscriptions_end_and_lost_notices_are_lost() {
        let notifier = Notifier::new(7);
        let store: Arc<dyn LeaseStore> = Arc::new(notifier.wrap(Arc::new(MemoryStore::new())));
        let mut stream = store.subscribe_changes().await.unwrap().unwrap();
        store.create_lease(&Lease::new("a", Position::Latest)).await.unwrap();
        assert!(matches!(stream.next().await, Some(StoreChange::Lease { .. })));
        notifier.set_loss(1.0);
        store.create_lease(&Lease::new("b", Position::Latest)).await.unwrap();
        notifier.set_loss(0.0);
        notifier.drop_subscriptions();
        assert!(stream.next().await.is_none(), "a dropped subscription ends its stream");
        assert_eq!(notifier.subscribers(), 0);
    }
}
