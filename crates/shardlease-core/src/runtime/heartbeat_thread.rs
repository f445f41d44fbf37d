//! The process's heartbeat thread: where heartbeats and watchdogs run, out of reach of lease tasks.
//!
//! A worker's lease tasks run user code on the application's runtime. Thousands of them, or a
//! processor that computes without yielding, can keep every runtime thread busy long enough to
//! delay the heartbeat past the fence margin, and the worker then fences itself although nothing
//! is wrong with it. So the heartbeat loop and the watchdog run on one OS thread of their own,
//! with a current-thread tokio runtime, shared by every worker of the process and kept for the
//! life of the process (the store's connections opened from it stay usable after a worker
//! stops). On a current-thread runtime, tests on paused time above all, they stay on the caller's
//! runtime: their timers must follow its clock.
//!
//! What this cannot do: a store whose client drives its I/O from a task on the application's
//! runtime (a Redis connection manager, an HTTP connection pool) still needs that runtime to
//! make progress; the heartbeat then waits for it, and fencing is the right answer to a process
//! that cannot reach its store in time.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::task::JoinHandle;
use tracing::warn;

/// The heartbeat runtime's handle, once started (`None` if the thread could not be started).
static HEARTBEAT_RUNTIME: OnceLock<Option<Handle>> = OnceLock::new();

fn heartbeat_runtime() -> Option<Handle> {
    HEARTBEAT_RUNTIME
        .get_or_init(|| {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "could not build the heartbeat runtime; heartbeats share the application's");
                    return None;
                }
            };
            let handle = rt.handle().clone();
            let started = std::thread::Builder::new()
                .name("shardlease-heartbeat".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()));
            match started {
                Ok(_) => Some(handle),
                Err(e) => {
                    warn!(error = %crate::error::ErrorChain(&e), "could not start the heartbeat thread; heartbeats share the application's runtime");
                    None
                }
            }
        })
        .clone()
}

/// Spawns `fut` on the heartbeat thread when `dedicated` is set and the caller runs on a
/// multi-threaded runtime; on the caller's runtime otherwise.
pub(crate) fn spawn<F>(dedicated: bool, fut: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let multi =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    match (dedicated && multi).then(heartbeat_runtime).flatten() {
        Some(h) => h.spawn(fut),
        None => tokio::spawn(fut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_multi_threaded_caller_gets_the_heartbeat_thread() {
        let name = spawn(true, async {
            assert_eq!(std::thread::current().name(), Some("shardlease-heartbeat"));
        });
        name.await.unwrap_or_else(|e| panic!("{e}"));
        let shared = spawn(false, async {
            assert_ne!(std::thread::current().name(), Some("shardlease-heartbeat"));
        });
        shared.await.unwrap_or_else(|e| panic!("{e}"));
    }

    #[tokio::test]
    async fn a_current_thread_caller_keeps_them() {
        let here = std::thread::current().id();
        let same = spawn(true, async move { assert_eq!(std::thread::current().id(), here) });
        same.await.unwrap_or_else(|e| panic!("{e}"));
    }
}
