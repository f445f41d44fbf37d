//! Assertion helpers shared by the cases: unwrap store results and name the rule broken.

use std::fmt::{Debug, Display};

use shardlease_core::store::{CreateOutcome, Version, VersionedLease};
use shardlease_core::{Error, LeaseKey, Result};
use tokio::task::JoinHandle;

/// The value of a store call that must succeed.
pub(crate) fn ok<T>(result: Result<T>, what: impl Display) -> T {
    match result {
        Ok(v) => v,
        Err(e) => panic!("{what}: the store failed unexpectedly: {e} ({e:?})"),
    }
}

/// The version of a create that must create.
pub(crate) fn created(result: Result<CreateOutcome>, what: impl Display) -> Version {
    match ok(result, &what) {
        CreateOutcome::Created(v) => v,
        CreateOutcome::AlreadyExists => {
            panic!("{what}: expected Created, got AlreadyExists for a key that did not exist")
        }
    }
}

/// The `current` record of a call that must fail with `Error::Conflict` about `key`.
pub(crate) fn conflict<T: Debug>(
    result: Result<T>,
    key: &LeaseKey,
    what: impl Display,
) -> Option<VersionedLease> {
    match result {
        Err(Error::Conflict { key: k, current }) => {
            assert_eq!(&k, key, "{what}: Error::Conflict names the wrong key");
            current.map(|c| *c)
        }
        Err(e) => panic!("{what}: expected Error::Conflict, got another error: {e} ({e:?})"),
        Ok(v) => panic!("{what}: expected Error::Conflict, but the call succeeded with {v:?}"),
    }
}

/// Waits for spawned tasks, re-raising the panic of any that panicked.
pub(crate) async fn join_tasks<T>(handles: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.await {
            Ok(v) => out.push(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a task of the case was cancelled: {e}"),
        }
    }
    out
}
