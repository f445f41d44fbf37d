//! Skipping conformance tests whose backend is not available, loudly.
//!
//! Backend tests read their server from an environment variable. Without it a test says it is
//! skipped, but under `CI=true` a missing server is a failure, so a misconfigured CI run cannot
//! pass by testing nothing.

use std::fmt::Display;

use super::StoreFactory;

/// Whether we run under CI (`CI=true` or `CI=1`), where skipping is a failure.
fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Skips `test` for `reason`: prints a line saying so, or panics under `CI=true`.
pub fn skip(test: &str, reason: &str) {
    if under_ci() {
        panic!("{test}: cannot be skipped under CI=true, but {reason}");
    }
    println!("{test}: SKIPPED because {reason}");
}

/// The value of the environment variable `var`, or `None` after printing that the tests needing
/// it are skipped (a panic under `CI=true`). Empty counts as unset.
pub fn env_or_skip(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            skip(&format!("a test needing {var}"), &format!("{var} is not set"));
            None
        }
    }
}

/// What the `@async` form of [`store_conformance_tests!`](crate::store_conformance_tests)
/// accepts from its factory expression: a factory, or the reason the test is skipped.
pub trait MaybeFactory {
    /// The factory type.
    type Factory: StoreFactory;

    /// The factory, or why there is none.
    fn into_factory(self) -> Result<Self::Factory, String>;
}

impl<F: StoreFactory> MaybeFactory for Option<F> {
    type Factory = F;
    fn into_factory(self) -> Result<F, String> {
        self.ok_or_else(|| "its store factory returned None (the backend is not configured)".into())
    }
}

impl<F: StoreFactory, E: Display> MaybeFactory for Result<F, E> {
    type Factory = F;
    fn into_factory(self) -> Result<F, String> {
        self.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryFactory;

    #[test]
    fn none_and_err_are_reasons_to_skip() {
        assert!(Some(MemoryFactory::new()).into_factory().is_ok());
        let none = None::<MemoryFactory>.into_factory().unwrap_err();
        assert!(none.contains("returned None"), "{none}");
        let err = Err::<MemoryFactory, _>("REDIS_URL is not set").into_factory().unwrap_err();
        assert_eq!(err, "REDIS_URL is not set");
    }
}
