//! The conformance suite against the in-memory store: proves the store the simulations rely on,
//! and proves the suite and its macro work.

use shardlease_testkit::MemoryFactory;

shardlease_testkit::store_conformance_tests!(MemoryFactory::new());

/// The in-process notifier the simulation draws ([`shardlease_testkit::NotifyingStore`]) meets
/// the notification cases like a real store's push.
mod notifying {
    use shardlease_testkit::MemoryFactory;

    shardlease_testkit::store_conformance_tests!(MemoryFactory::new().with_notifications());
}

/// The `@async` form with a factory, and `run_all` on a shared factory.
mod asynchronous {
    use std::sync::Arc;

    use shardlease_testkit::{MemoryFactory, StoreFactory};

    async fn configured() -> Option<Arc<dyn StoreFactory>> {
        tokio::task::yield_now().await;
        Some(Arc::new(MemoryFactory::new()))
    }

    shardlease_testkit::store_conformance_tests!(@async configured());

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all_in_one_go() {
        shardlease_testkit::suite::run_all(&MemoryFactory::new()).await;
    }
}
