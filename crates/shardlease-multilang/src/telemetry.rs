//! The names of the daemon's metrics (through the `metrics` facade, like the rest of shardlease:
//! whatever recorder the process installs receives them).

/// Children that failed, by `shard` and `fault` (`exited`, `not_json`, `wrong_response`,
/// `timeout`, `unknown_action`, `malformed`, `write`, `spawn`).
pub const CHILD_FAULTS: &str = "shardlease_multilang_child_faults_total";
/// Leases given up because their child failed, by `shard`.
pub const LEASES_GIVEN_UP: &str = "shardlease_multilang_leases_given_up_total";
/// Children started.
pub const CHILDREN_STARTED: &str = "shardlease_multilang_children_started_total";
/// Children killed because they did not exit once their stdin was closed, by `shard`.
pub const CHILDREN_KILLED: &str = "shardlease_multilang_children_killed_total";
