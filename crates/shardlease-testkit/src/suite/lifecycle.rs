//! How cases are run: the runtime behind each generated test, and the progress lines of
//! [`run_all`](super::run_all).

use std::future::Future;
use std::time::Instant;

use super::StoreFactory;

/// Runs one generated test on a multi-threaded runtime with 2 worker threads and every driver
/// enabled, as `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` would.
#[doc(hidden)]
pub fn __run_test<F: Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the tokio runtime for a conformance test")
        .block_on(test);
}

/// Runs one case of [`run_all`](super::run_all), printing its name and how long it took.
pub(super) async fn announce<F: Future<Output = ()>>(
    factory: &dyn StoreFactory,
    case: &str,
    run: F,
) {
    println!("conformance [{}] {case} ...", factory.name());
    let start = Instant::now();
    run.await;
    println!("conformance [{}] {case} ok ({:.2?})", factory.name(), start.elapsed());
}
