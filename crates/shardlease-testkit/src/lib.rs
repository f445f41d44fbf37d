//! # shardlease-testkit
//!
//! Test support shared by every shardlease backend, so that "the store works" means the same
//! thing for all of them:
//!
//! - [`suite`]: the conformance suite of the [`LeaseStore`](shardlease_core::store::LeaseStore)
//!   contract, one public async fn per case, [`suite::run_all`], and the
//!   [`store_conformance_tests!`] macro that turns the suite into one `#[test]` per case;
//! - [`faults`]: a fault-injecting store wrapper (errors, lost answers, latency, per-worker
//!   partitions, corrupt records, panics) for simulations and resilience tests;
//! - [`panicky`]: a balancer and a shard source that panic now and then (plug-in panics);
//! - [`MemoryFactory`]: the suite's factory over the in-memory store of `shardlease-core`.
//!
//! A store's author runs the suite through a [`StoreFactory`], which opens the store on the
//! namespaces the cases ask for: a type of theirs, or an [`FnFactory`] over a closure. One line in
//! a test file then makes one `#[test]` per case:
//!
//! ```text
//! shardlease_testkit::store_conformance_tests!(MyFactory::new());
//! ```
//!
//! Each case is also a public async fn of [`suite`], to call from a harness of one's own. Here on
//! the in-memory store of `shardlease-core` (put your store in the closure):
//!
//! ```
//! use std::sync::Arc;
//!
//! use shardlease_core::store::{LeaseStore, MemoryBackend};
//! use shardlease_testkit::{suite, FnFactory};
//!
//! #[tokio::main]
//! async fn main() {
//!     let backend = MemoryBackend::new();
//!     let factory = FnFactory::new("memory", move |namespace| {
//!         Ok(Arc::new(backend.store(namespace)) as Arc<dyn LeaseStore>)
//!     });
//!     // Each case panics with what the store did wrong.
//!     suite::create_and_get_round_trip(&factory).await;
//!     suite::update_is_compare_and_set(&factory).await;
//!     suite::namespaces_are_isolated(&factory).await;
//! }
//! ```
//!
//! The guide [implementing a store][implementing-a-store] states the contract case by case.
//!
//! [implementing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/implementing-a-store.md

#![cfg_attr(docsrs, feature(doc_cfg))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod audit;
pub mod cluster;
pub mod counting;
pub mod extensions;
pub mod faults;
mod fn_factory;
pub mod logs;
mod macros;
mod memory_factory;
pub mod notifying;
pub mod panicky;
pub mod processors;
pub mod recorder;
pub mod suite;

pub use faults::{Faults, FaultyStore};
pub use fn_factory::FnFactory;
pub use memory_factory::MemoryFactory;
pub use notifying::{Notifier, NotifyingStore};
pub use panicky::{Panicky, PanickyBalancer, PanickySource};
pub use suite::{fresh_namespace, StoreFactory};
