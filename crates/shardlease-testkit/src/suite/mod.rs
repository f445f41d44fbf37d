//! The conformance suite of the [`LeaseStore`] contract.
//!
//! Every backend runs the same cases, so the lease algorithm (written once, in the core) can rely
//! on exactly what the suite checks. A backend provides a [`StoreFactory`]; each case takes one,
//! works in fresh random namespaces and cleans them up when it ends, pass or fail. Cases panic
//! with a message naming the violated rule.
//!
//! Three ways to run the suite:
//! - [`store_conformance_tests!`](crate::store_conformance_tests) in a test file: one `#[test]`
//!   per case (the usual way);
//! - [`run_all`]: every case in a row, e.g. from a custom harness;
//! - one case fn (listed in [`STORE_CASES`]) on its own.

mod batch;
mod check;
mod create;
mod fleet;
mod lease_loop;
mod lifecycle;
mod listing;
mod notices;
mod rollback;
mod scope;
mod skip;
mod update;
mod workers;

use std::sync::Arc;

use async_trait::async_trait;
use rand::Rng;
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::Result;

pub use batch::{
    a_batch_applies_each_compare_and_set_on_its_own, a_batch_creates_only_missing_leases,
    a_batch_honours_versions_like_update_lease, a_batch_larger_than_any_backend_chunk,
    an_empty_batch_does_nothing, LARGE_BATCH,
};
pub use create::{create_and_get_round_trip, create_race_is_idempotent};
pub use fleet::{get_workers_reads_the_named_records, the_fleet_signal_round_trips, MANY_WORKERS};
pub use lease_loop::{
    a_crashed_workers_leases_are_taken_over,
    a_graceful_leave_releases_leases_and_keeps_checkpoints,
    a_joining_worker_gets_its_share_without_duplicates, a_zombie_cannot_checkpoint,
    children_wait_for_their_parents, one_worker_takes_every_lease_in_one_pass,
    workers_share_leases_evenly,
};
pub use listing::{
    list_many_leases, list_many_leases_n, namespaces_are_isolated, LIST_MANY_LEASES_COUNT,
};
pub use notices::{
    a_dropped_subscription_ends_its_stream, notices_announce_ownership_changes_only,
};
pub use rollback::a_rolled_back_record_never_accepts_a_stale_version;
pub use scope::{with_scope, Scope};
pub use skip::{env_or_skip, skip, MaybeFactory};
pub use update::{concurrent_increments, delete_is_compare_and_set, update_is_compare_and_set};
pub use workers::{
    a_heartbeat_never_moves_the_beat_back, remove_worker_if_checks_the_beat, worker_records,
    worker_records_keep_lease_loads,
};

#[doc(hidden)]
pub use lifecycle::__run_test;

/// Builds stores for the suite. `store(ns)` returns a store bound to namespace `ns`; two calls
/// with the same namespace see the same data (the suite opens a namespace twice to check that
/// the data lives in the backend, not in the handle).
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// A store bound to `namespace`, which may or may not exist yet.
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>>;

    /// Removes whatever `namespace` left behind. Called once per namespace at the end of every
    /// case, pass or fail; best effort (an error is printed, not raised).
    async fn cleanup(&self, _namespace: &str) -> Result<()> {
        Ok(())
    }

    /// The backend's name, for messages ("memory", "postgres", ...).
    fn name(&self) -> String;

    /// How much slower than the defaults the lease-loop cases run on this store (heartbeat,
    /// polling, record production and deadlines are all multiplied by it). Default 1; a store
    /// whose test server is slow (an emulator answering a few hundred writes a second) raises it
    /// rather than loosening any check.
    fn timing_scale(&self) -> u32 {
        1
    }

    /// The rollback hook: writes `lease` into `namespace` with exactly `version`, whatever the
    /// record holds now (creating it if missing), bypassing compare-and-set, the way a store
    /// that rolled back (a failover to a lagging replica, a restored backup) would hold an older
    /// record. `store` is a store this factory opened on `namespace`. Returns `Ok(true)` when it
    /// wrote, `Ok(false)` when the backend does not support it (the default), in which case the
    /// cases needing it say they are skipped, which fails them under `CI=true`.
    ///
    /// A test hook only: implement it with whatever raw access the factory has (a test-only
    /// method, a raw `UPDATE`, a raw `HSET`).
    async fn restore_raw(
        &self,
        _store: &Arc<dyn LeaseStore>,
        _namespace: &str,
        _lease: &Lease,
        _version: Version,
    ) -> Result<bool> {
        Ok(false)
    }

    /// The subscription hook: makes the server drop the connections of the change
    /// subscriptions of `namespace` (e.g. `pg_terminate_backend` on PostgreSQL, `CLIENT KILL`
    /// on Redis), the way a network failure or a server restart would. `store` is a store this
    /// factory opened on `namespace`. Returns `Ok(true)` when it did, `Ok(false)` when the
    /// backend cannot (the default); the case needing it then says so and passes, since a store
    /// may well have no way to do this from outside.
    ///
    /// It may drop more than the namespace's subscriptions (other cases' subscriptions then end
    /// and are made again, as the runtime does); the notification cases of one process run one
    /// at a time.
    async fn drop_subscriptions(
        &self,
        _store: &Arc<dyn LeaseStore>,
        _namespace: &str,
    ) -> Result<bool> {
        Ok(false)
    }
}

#[async_trait]
impl<T: StoreFactory + ?Sized> StoreFactory for Arc<T> {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        (**self).store(namespace).await
    }
    async fn cleanup(&self, namespace: &str) -> Result<()> {
        (**self).cleanup(namespace).await
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn timing_scale(&self) -> u32 {
        (**self).timing_scale()
    }
    async fn restore_raw(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        (**self).restore_raw(store, namespace, lease, version).await
    }
    async fn drop_subscriptions(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
    ) -> Result<bool> {
        (**self).drop_subscriptions(store, namespace).await
    }
}

#[async_trait]
impl<T: StoreFactory + ?Sized> StoreFactory for Box<T> {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        (**self).store(namespace).await
    }
    async fn cleanup(&self, namespace: &str) -> Result<()> {
        (**self).cleanup(namespace).await
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn timing_scale(&self) -> u32 {
        (**self).timing_scale()
    }
    async fn restore_raw(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        (**self).restore_raw(store, namespace, lease, version).await
    }
    async fn drop_subscriptions(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
    ) -> Result<bool> {
        (**self).drop_subscriptions(store, namespace).await
    }
}

/// A namespace nobody else uses: `prefix` reduced to `[a-z0-9-]` (at most 40 characters, starting
/// with a letter), a dash, and 12 random characters of `[a-z0-9]`. Safe as a key prefix, a path
/// segment or a column value in any backend.
pub fn fresh_namespace(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut ns: String = prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(40)
        .collect();
    if !ns.starts_with(|c: char| c.is_ascii_lowercase()) {
        ns.insert_str(0, "ns-");
    }
    if !ns.ends_with('-') {
        ns.push('-');
    }
    let mut rng = rand::rng();
    ns.extend((0..12).map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])));
    ns
}

macro_rules! case_names {
    ($how:tt $($case:ident)*) => {
        &[$(stringify!($case)),*]
    };
}

macro_rules! run_cases {
    (($factory:expr) $($case:ident)*) => {
        $( lifecycle::announce($factory, stringify!($case), $case($factory)).await; )*
    };
}

/// The name of every case of the suite, in the order [`run_all`] runs them (and the name of the
/// test fn [`store_conformance_tests!`](crate::store_conformance_tests) generates for it).
pub const STORE_CASES: &[&str] = crate::__conformance_cases!([case_names]());

/// Runs every case of the suite against `factory`, one after another; panics at the first
/// violation.
pub async fn run_all(factory: &dyn StoreFactory) {
    crate::__conformance_cases!([run_cases](factory));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_namespaces_are_safe_and_distinct() {
        let a = fresh_namespace("create_race Is/Idempotent");
        let b = fresh_namespace("create_race Is/Idempotent");
        assert_ne!(a, b);
        assert!(a.starts_with("create-race-is-idempotent-"), "{a}");
        for ns in [a, b, fresh_namespace(""), fresh_namespace("9lives"), fresh_namespace("ü")] {
            assert!(ns.starts_with(|c: char| c.is_ascii_lowercase()), "{ns}");
            assert!(ns.bytes().all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'-')), "{ns}");
            assert!(ns.len() <= 56, "{ns}");
        }
    }

    #[test]
    fn every_case_is_listed_once() {
        let mut names = STORE_CASES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), STORE_CASES.len());
        assert!(STORE_CASES.contains(&"concurrent_increments"));
        assert!(STORE_CASES.contains(&"a_rolled_back_record_never_accepts_a_stale_version"));
        assert!(STORE_CASES.contains(&"remove_worker_if_checks_the_beat"));
        assert!(STORE_CASES.contains(&"a_heartbeat_never_moves_the_beat_back"));
        assert!(STORE_CASES.contains(&"worker_records_keep_lease_loads"));
    }
}
