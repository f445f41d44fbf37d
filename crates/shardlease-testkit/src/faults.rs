//! A fault-injecting [`LeaseStore`] wrapper.
//!
//! The lease algorithm must stay safe when the store misbehaves the way real stores do: calls that
//! fail, writes that were applied although the caller saw an error (the answer was lost), writes
//! that land late (the caller timed out and moved on; the store applies the write seconds later,
//! after the caller's next writes), slow calls, a worker cut off from the store while its peers
//! are not, and records that cannot be decoded. It must also survive a store client that panics
//! (the runtime turns a panic of a store call into a retryable error of that call). [`Faults`]
//! holds those faults, shared by many [`FaultyStore`] views of one inner store (typically one
//! view per simulated worker), and draws every random decision from seeded RNGs so a failing
//! simulation can be replayed from its seed.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardlease_core::store::{
    ChangeStream, CorruptRecord, CreateOutcome, FleetSignal, Lease, LeaseStore, Listing, Version,
    VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Result, WorkerId};

#[cfg(test)]
mod tests;

/// The reason given for records marked corrupt with [`Faults::corrupt`].
pub const INJECTED_CORRUPTION: &str = "injected corruption";

/// How the message of every panic this crate injects begins ([`Faults::set_panic_rate`],
/// [`PanickyBalancer`](crate::panicky::PanickyBalancer),
/// [`PanickySource`](crate::panicky::PanickySource)): a test's panic hook can keep them quiet.
pub const INJECTED_PANIC: &str = "injected panic";

/// Faults to inject into every [`FaultyStore`] built over it. Cheap to clone: clones share state,
/// so a test can change the faults while workers keep running.
///
/// Each call through a view goes: panic with probability `panic_rate` (for writes, half of those
/// panics happen *after* the call reached the store), sleep for the latency (if set), fail if the
/// view's worker is partitioned (nothing applied), fail with probability `error_rate` (for writes,
/// half of those failures happen *after* the write was applied), then apply corruption marks.
#[derive(Clone)]
pub struct Faults {
    state: Arc<Mutex<State>>,
}

struct State {
    seed: u64,
    rng: StdRng,
    error_rate: f64,
    latency: Option<(Duration, Duration)>,
    partitioned: HashSet<WorkerId>,
    corrupt: HashSet<LeaseKey>,
    injected_errors: u64,
    lost_answers: u64,
    partition_rejections: u64,
    /// Late writes: their own probability, maximum delay, RNG (so turning them on leaves every
    /// other decision of a seed as it was) and count.
    late_rate: f64,
    late_max: Duration,
    late_rng: StdRng,
    late_writes: u64,
    /// Panicking calls: their own probability, RNG (like the late writes) and count.
    panic_rate: f64,
    panic_rng: StdRng,
    injected_panics: u64,
}

/// Where a call drawn to panic panics.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PanicAt {
    /// Before anything reached the store.
    Call,
    /// After the store answered (a write may have been applied).
    Answer,
}

/// What the injector decided for one call, after latency.
enum Decision {
    /// Forward the call.
    Pass,
    /// Fail without forwarding.
    FailBefore(Error),
    /// Forward the call, then fail anyway (the answer was lost).
    FailAfter(Error),
}

/// Whether an operation writes (and so may fail after being applied).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

impl Faults {
    /// No faults yet; every random decision will come from an RNG seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Faults {
            state: Arc::new(Mutex::new(State {
                seed,
                rng: StdRng::seed_from_u64(seed),
                error_rate: 0.0,
                latency: None,
                partitioned: HashSet::new(),
                corrupt: HashSet::new(),
                injected_errors: 0,
                lost_answers: 0,
                partition_rejections: 0,
                late_rate: 0.0,
                late_max: Duration::ZERO,
                late_rng: StdRng::seed_from_u64(seed ^ 0x1a7e_5eed),
                late_writes: 0,
                panic_rate: 0.0,
                panic_rng: StdRng::seed_from_u64(seed ^ 0x9a41_c0de_0f5e),
                injected_panics: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the state consistent (every update is
        // a single assignment), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The seed the RNG was created with (print it when a simulation fails).
    pub fn seed(&self) -> u64 {
        self.lock().seed
    }

    /// Makes each call fail with probability `rate` (clamped to `0.0..=1.0`; NaN means 0) with a
    /// retryable backend error. For writes (create, update, delete, heartbeat, remove worker,
    /// conditional remove worker), half of these failures happen after the write was applied.
    pub fn set_error_rate(&self, rate: f64) {
        self.lock().error_rate = if rate.is_nan() { 0.0 } else { rate.clamp(0.0, 1.0) };
    }

    /// Makes each write (create, update, delete, heartbeat, remove worker) land late with
    /// probability `rate` (clamped to `0.0..=1.0`; NaN means 0): the caller gets a retryable
    /// "timed out" error at once, and the write is applied by a task of its own after a uniformly
    /// random delay up to `max`, whatever the caller wrote meanwhile. That is a statement that timed
    /// out in the client but still reached the server, as a SQLite write waiting for the lock
    /// does. Drawn from an RNG of its own, so setting it changes no other decision of a seed.
    pub fn set_late_writes(&self, rate: f64, max: Duration) {
        let mut s = self.lock();
        s.late_rate = if rate.is_nan() { 0.0 } else { rate.clamp(0.0, 1.0) };
        s.late_max = max;
    }

    /// How many writes were made to land late.
    pub fn late_writes(&self) -> u64 {
        self.lock().late_writes
    }

    /// Makes each call through a view (every store method but `namespace`, which a worker's
    /// builder asks before it guards the store) panic with probability `rate` (clamped to
    /// `0.0..=1.0`; NaN means 0), with a message beginning with [`INJECTED_PANIC`], as a store
    /// client with a bug would. For writes, half of these panics happen after the inner store
    /// answered (the write may have been applied). A write drawn to land late does not panic,
    /// and a call that panics before reaching the store draws no other fault. Drawn from an RNG
    /// of its own, so setting it changes no other decision of a seed until a call panics.
    pub fn set_panic_rate(&self, rate: f64) {
        self.lock().panic_rate = if rate.is_nan() { 0.0 } else { rate.clamp(0.0, 1.0) };
    }

    /// How many calls were made to panic.
    pub fn injected_panics(&self) -> u64 {
        self.lock().injected_panics
    }

    /// Whether the next call panics, and where.
    fn draw_panic(&self, kind: Kind) -> Option<PanicAt> {
        let mut s = self.lock();
        let rate = s.panic_rate;
        if rate <= 0.0 || !s.panic_rng.random_bool(rate) {
            return None;
        }
        s.injected_panics += 1;
        if kind == Kind::Write && s.panic_rng.random_bool(0.5) {
            Some(PanicAt::Answer)
        } else {
            Some(PanicAt::Call)
        }
    }

    /// Whether the next write of `worker` lands late, and after how long.
    fn draw_late(&self, worker: Option<&WorkerId>) -> Option<Duration> {
        let mut s = self.lock();
        if s.late_rate <= 0.0 || worker.is_some_and(|w| s.partitioned.contains(w)) {
            return None;
        }
        let rate = s.late_rate;
        if !s.late_rng.random_bool(rate) {
            return None;
        }
        s.late_writes += 1;
        let max = s.late_max.as_nanos().max(1);
        let nanos = s.late_rng.random_range(0..=max);
        Some(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
    }

    /// Sleeps (with `tokio::time::sleep`, so paused test time applies) for a uniformly random
    /// duration between `min` and `max` (in either order) before each call.
    pub fn set_latency(&self, min: Duration, max: Duration) {
        let (lo, hi) = if min <= max { (min, max) } else { (max, min) };
        self.lock().latency = if hi.is_zero() { None } else { Some((lo, hi)) };
    }

    /// Cuts `worker` off from the store: every call through its views fails with a retryable
    /// error and nothing is applied. Views without a worker are never partitioned.
    pub fn partition(&self, worker: &WorkerId) {
        self.lock().partitioned.insert(worker.clone());
    }

    /// Reconnects `worker`.
    pub fn heal(&self, worker: &WorkerId) {
        self.lock().partitioned.remove(worker);
    }

    /// Reconnects every worker.
    pub fn heal_all(&self) {
        self.lock().partitioned.clear();
    }

    /// Whether `worker` is currently partitioned.
    pub fn is_partitioned(&self, worker: &WorkerId) -> bool {
        self.lock().partitioned.contains(worker)
    }

    /// Makes the lease `key` undecodable in every view: `get_lease` fails with `Error::Corrupt`,
    /// `list_leases` reports it in [`Listing::corrupt`] instead of its items, and `update_lease` /
    /// `delete_lease` of it fail with `Error::Corrupt` without writing. The inner record is kept.
    pub fn corrupt(&self, key: &LeaseKey) {
        self.lock().corrupt.insert(key.clone());
    }

    /// Makes the lease `key` decodable again.
    pub fn uncorrupt(&self, key: &LeaseKey) {
        self.lock().corrupt.remove(key);
    }

    /// Turns every fault off: no errors, no late writes, no panics, no latency, no partitions, no
    /// corrupt records (writes already made late still land). The counters and the RNG state are
    /// kept.
    pub fn clear(&self) {
        let mut s = self.lock();
        s.error_rate = 0.0;
        s.panic_rate = 0.0;
        s.latency = None;
        s.partitioned.clear();
        s.corrupt.clear();
        s.late_rate = 0.0;
    }

    /// How many calls failed because of the error rate (including those applied before failing).
    pub fn injected_errors(&self) -> u64 {
        self.lock().injected_errors
    }

    /// How many of [`injected_errors`](Self::injected_errors) were writes applied before failing.
    pub fn lost_answers(&self) -> u64 {
        self.lock().lost_answers
    }

    /// How many calls were refused because their worker was partitioned.
    pub fn partition_rejections(&self) -> u64 {
        self.lock().partition_rejections
    }

    fn is_corrupt(&self, key: &LeaseKey) -> bool {
        self.lock().corrupt.contains(key)
    }

    fn draw_latency(&self) -> Option<Duration> {
        let mut s = self.lock();
        let (lo, hi) = s.latency?;
        let nanos = s.rng.random_range(lo.as_nanos()..=hi.as_nanos());
        Some(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
    }

    fn decide(&self, worker: Option<&WorkerId>, op: &str, kind: Kind) -> Decision {
        let mut s = self.lock();
        if let Some(w) = worker.filter(|w| s.partitioned.contains(*w)) {
            s.partition_rejections += 1;
            return Decision::FailBefore(Error::retryable(format!(
                "partitioned: worker {w} cannot reach the store ({op})"
            )));
        }
        let rate = s.error_rate;
        if rate <= 0.0 || !s.rng.random_bool(rate) {
            return Decision::Pass;
        }
        s.injected_errors += 1;
        if kind == Kind::Write && s.rng.random_bool(0.5) {
            s.lost_answers += 1;
            Decision::FailAfter(Error::retryable(format!(
                "injected fault: {op} was applied but its answer was lost"
            )))
        } else {
            Decision::FailBefore(Error::retryable(format!("injected fault: {op} failed")))
        }
    }
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("Faults")
            .field("seed", &s.seed)
            .field("error_rate", &s.error_rate)
            .field("latency", &s.latency)
            .field("partitioned", &s.partitioned)
            .field("corrupt", &s.corrupt)
            .field("injected_errors", &s.injected_errors)
            .field("lost_answers", &s.lost_answers)
            .field("partition_rejections", &s.partition_rejections)
            .field("late_rate", &s.late_rate)
            .field("late_writes", &s.late_writes)
            .field("panic_rate", &s.panic_rate)
            .field("injected_panics", &s.injected_panics)
            .finish()
    }
}

/// One view of an inner store through a set of [`Faults`], as seen by one worker (or by nobody
/// in particular when `worker` is `None`, which is then never partitioned).
#[derive(Clone, Debug)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    faults: Faults,
    worker: Option<WorkerId>,
}

impl FaultyStore {
    /// A view of `inner` subject to `faults`, on behalf of `worker`.
    pub fn new(inner: Arc<dyn LeaseStore>, faults: Faults, worker: Option<WorkerId>) -> Self {
        FaultyStore { inner, faults, worker }
    }

    /// The faults this view obeys.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The store behind the faults.
    pub fn inner(&self) -> &Arc<dyn LeaseStore> {
        &self.inner
    }

    /// Runs `call` through panics, latency, partitions and random errors.
    async fn run<T, F>(&self, op: &str, kind: Kind, call: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let panic_at = self.faults.draw_panic(kind);
        if panic_at == Some(PanicAt::Call) {
            panic!("{INJECTED_PANIC}: {op}");
        }
        if let Some(delay) = self.faults.draw_latency() {
            tokio::time::sleep(delay).await;
        }
        let result = match self.faults.decide(self.worker.as_ref(), op, kind) {
            Decision::Pass => call.await,
            Decision::FailBefore(e) => Err(e),
            Decision::FailAfter(e) => {
                // Whatever the store answered (even a conflict), the caller never hears it.
                let _ = call.await;
                Err(e)
            }
        };
        if panic_at == Some(PanicAt::Answer) {
            // Whatever the store did, the caller hears a panic.
            panic!("{INJECTED_PANIC}: {op}, after the store answered");
        }
        result
    }

    /// When the faults make this write land late: spawns `write` to run on the inner store after
    /// the drawn delay and returns the caller's timeout error; `None` when the write goes through
    /// [`run`](Self::run) as usual.
    fn late<F, Fut>(&self, op: &str, write: F) -> Option<Error>
    where
        F: FnOnce(Arc<dyn LeaseStore>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let delay = self.faults.draw_late(self.worker.as_ref())?;
        let landing = write(self.inner.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            landing.await;
        });
        Some(Error::retryable(format!("injected fault: {op} timed out (it will land late)")))
    }

    fn corrupt_error(key: &LeaseKey) -> Error {
        Error::Corrupt { key: key.to_string(), reason: INJECTED_CORRUPTION.to_owned() }
    }
}

impl FaultyStore {
    /// A compare-and-set update (`quiet`: one the core wrote with `update_lease_quietly`), with
    /// the faults of a write; a late landing repeats it the same way.
    async fn update(&self, lease: &Lease, expected: Version, quiet: bool) -> Result<Version> {
        if !self.faults.is_corrupt(&lease.key) {
            let l = lease.clone();
            if let Some(e) = self.late("update_lease", move |s| async move {
                let _ = if quiet {
                    s.update_lease_quietly(&l, expected).await
                } else {
                    s.update_lease(&l, expected).await
                };
            }) {
                return Err(e);
            }
        }
        let call = async {
            if self.faults.is_corrupt(&lease.key) {
                return Err(Self::corrupt_error(&lease.key));
            }
            if quiet {
                self.inner.update_lease_quietly(lease, expected).await
            } else {
                self.inner.update_lease(lease, expected).await
            }
        };
        self.run("update_lease", Kind::Write, call).await
    }
}

#[async_trait]
impl shardlease_core::store::StoreDecorator for FaultyStore {
    fn inner(&self) -> &dyn LeaseStore {
        &*self.inner
    }

    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let l = lease.clone();
        if let Some(e) = self.late("create_lease", |s| async move {
            let _ = s.create_lease(&l).await;
        }) {
            return Err(e);
        }
        self.run("create_lease", Kind::Write, self.inner.create_lease(lease)).await
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        let found = self.run("get_lease", Kind::Read, self.inner.get_lease(key)).await?;
        if self.faults.is_corrupt(key) {
            return Err(Self::corrupt_error(key));
        }
        Ok(found)
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let mut listing = self.run("list_leases", Kind::Read, self.inner.list_leases()).await?;
        let corrupt = self.faults.lock().corrupt.clone();
        if !corrupt.is_empty() {
            let (bad, good): (Vec<_>, Vec<_>) =
                listing.items.into_iter().partition(|v| corrupt.contains(&v.lease.key));
            listing.items = good;
            listing.corrupt.extend(bad.into_iter().map(|v| CorruptRecord {
                key: v.lease.key.to_string(),
                reason: INJECTED_CORRUPTION.to_owned(),
            }));
        }
        Ok(listing)
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update(lease, expected, false).await
    }

    /// The same faults as an update, passed on as quiet.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update(lease, expected, true).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        if !self.faults.is_corrupt(key) {
            let k = key.clone();
            if let Some(e) = self.late("delete_lease", |s| async move {
                let _ = s.delete_lease(&k, expected).await;
            }) {
                return Err(e);
            }
        }
        let call = async {
            if self.faults.is_corrupt(key) {
                return Err(Self::corrupt_error(key));
            }
            self.inner.delete_lease(key, expected).await
        };
        self.run("delete_lease", Kind::Write, call).await
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let r = record.clone();
        if let Some(e) = self.late("heartbeat", |s| async move {
            let _ = s.heartbeat(&r).await;
        }) {
            return Err(e);
        }
        self.run("heartbeat", Kind::Write, self.inner.heartbeat(record)).await
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.run("list_workers", Kind::Read, self.inner.list_workers()).await
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        let i = id.clone();
        if let Some(e) = self.late("remove_worker", |s| async move {
            let _ = s.remove_worker(&i).await;
        }) {
            return Err(e);
        }
        self.run("remove_worker", Kind::Write, self.inner.remove_worker(id)).await
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let i = id.clone();
        if let Some(e) = self.late("remove_worker_if", |s| async move {
            let _ = s.remove_worker_if(&i, beat).await;
        }) {
            return Err(e);
        }
        self.run("remove_worker_if", Kind::Write, self.inner.remove_worker_if(id, beat)).await
    }

    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        if let Some(e) = self.late("write_fleet_signal", move |s| async move {
            let _ = s.write_fleet_signal(token).await;
        }) {
            return Err(e);
        }
        self.run("write_fleet_signal", Kind::Write, self.inner.write_fleet_signal(token)).await
    }

    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        self.run("read_fleet_signal", Kind::Read, self.inner.read_fleet_signal()).await
    }

    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        self.run("get_workers", Kind::Read, self.inner.get_workers(ids)).await
    }

    /// A partitioned worker cannot subscribe, and its open stream ends at the first notice after
    /// the partition began, as a lost connection ends a real one. No latency or error is drawn
    /// (a seed's other draws stay what they were); a panic may be.
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        if self.faults.draw_panic(Kind::Read).is_some() {
            panic!("{INJECTED_PANIC}: subscribe_changes");
        }
        let down = || Error::retryable("partitioned: cannot subscribe to change notices");
        if self.worker.as_ref().is_some_and(|w| self.faults.is_partitioned(w)) {
            return Err(down());
        }
        let Some(stream) = self.inner.subscribe_changes().await? else { return Ok(None) };
        let (faults, worker) = (self.faults.clone(), self.worker.clone());
        Ok(Some(
            stream
                .take_while(move |_| {
                    let up = !worker.as_ref().is_some_and(|w| faults.is_partitioned(w));
                    async move { up }
                })
                .boxed(),
        ))
    }
}
