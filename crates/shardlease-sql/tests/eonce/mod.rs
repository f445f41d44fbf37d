//! Shared by the effectively-once tests: a sink table per dialect ([`sink`]) and the fleet
//! scenario run against it ([`fleet`]).

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod fleet;
pub mod sink;

/// A table prefix of this test's own (`e` + 8 random letters/digits + `_`), so tests on one
/// database never meet.
pub fn fresh_prefix() -> String {
    let ns = shardlease_testkit::fresh_namespace("e");
    let tail: String = ns.chars().filter(char::is_ascii_alphanumeric).collect();
    let tail: String = tail.chars().rev().take(10).collect();
    format!("e{tail}_")
}
