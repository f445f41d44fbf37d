//! Fresh namespaces for a case, cleaned up when it ends, whether it passed or panicked.
//!
//! Cases run against shared, long-lived servers, so each one works in namespaces nobody else
//! uses and removes them afterwards. Cleanup is async, so it cannot live in `Drop`; instead
//! [`with_scope`] runs the case body, catches its panic, cleans up, then resumes the panic.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use shardlease_core::store::LeaseStore;

use super::{fresh_namespace, StoreFactory};

/// The namespaces one case has opened, and the factory it opens them with.
pub struct Scope<'a> {
    factory: &'a dyn StoreFactory,
    case: &'a str,
    namespaces: Arc<Mutex<Vec<String>>>,
}

impl<'a> Scope<'a> {
    /// The factory under test.
    pub fn factory(&self) -> &'a dyn StoreFactory {
        self.factory
    }

    /// The case's name.
    pub fn case(&self) -> &'a str {
        self.case
    }

    /// A store in a new namespace (named after the case), cleaned up when the case ends.
    pub async fn fresh_store(&self) -> (String, Arc<dyn LeaseStore>) {
        let ns = fresh_namespace(&format!("sl-{}", self.case));
        let store = self.store(&ns).await;
        (ns, store)
    }

    /// A store bound to `namespace` (opened again if it already was), cleaned up when the case
    /// ends. Panics if the factory fails.
    pub async fn store(&self, namespace: &str) -> Arc<dyn LeaseStore> {
        {
            let mut names = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
            if !names.iter().any(|n| n == namespace) {
                names.push(namespace.to_owned());
            }
        }
        match self.factory.store(namespace).await {
            Ok(store) => store,
            Err(e) => panic!(
                "{}: store factory `{}` failed to open namespace {namespace:?}: {e}",
                self.case,
                self.factory.name()
            ),
        }
    }
}

/// Runs `body` with a [`Scope`] for case `case`, then cleans up every namespace it opened (best
/// effort: failures are printed), then re-raises the body's panic if it panicked.
pub async fn with_scope<'a, F, Fut>(factory: &'a dyn StoreFactory, case: &'a str, body: F)
where
    F: FnOnce(Scope<'a>) -> Fut,
    Fut: Future<Output = ()>,
{
    let namespaces = Arc::new(Mutex::new(Vec::new()));
    let scope = Scope { factory, case, namespaces: namespaces.clone() };
    let outcome = AssertUnwindSafe(body(scope)).catch_unwind().await;
    let names = std::mem::take(&mut *namespaces.lock().unwrap_or_else(|p| p.into_inner()));
    for ns in &names {
        let cleanup = AssertUnwindSafe(factory.cleanup(ns)).catch_unwind().await;
        match cleanup {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("{case}: cleanup of namespace {ns:?} failed: {e}"),
            Err(_) => eprintln!("{case}: cleanup of namespace {ns:?} panicked"),
        }
    }
    if let Err(panic) = outcome {
        eprintln!(
            "conformance case `{case}` FAILED on store `{}` (namespaces {names:?})",
            factory.name()
        );
        std::panic::resume_unwind(panic);
    }
}
