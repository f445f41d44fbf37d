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
//! A backend crate proves itself with a few lines in one of its tests:
//!
//! ```text
//! shardlease_testkit::store_conformance_tests!(MyFactory::new());
//! ```

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
