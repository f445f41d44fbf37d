//! The bench's view of [`CountingStore`] (which lives in the testkit, shared with the tests):
//! per-second, per-worker rates for the JSON report.

use serde_json::{Map, Value};
pub use shardlease_testkit::counting::{is_read, CountingStore, OpCounts, OPERATIONS};

/// Calls per second per worker, by operation, as a JSON object (zero-call operations kept).
pub fn rates_json(ops: &OpCounts, seconds: f64, workers: usize) -> Value {
    let per = |n: u64| per_second_per_worker(n, seconds, workers);
    let mut m = Map::new();
    for (op, n) in ops.by_op() {
        m.insert(op.to_owned(), per(n));
    }
    m.insert("update_lease_conflicts".to_owned(), per(ops.update_conflicts));
    Value::Object(m)
}

/// `n / seconds / workers`, rounded to 3 decimals; `null` when undefined.
pub fn per_second_per_worker(n: u64, seconds: f64, workers: usize) -> Value {
    if seconds <= 0.0 || workers == 0 {
        return Value::Null;
    }
    crate::report::rounded(n as f64 / seconds / workers as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_per_worker() {
        let ops = OpCounts { calls: [0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0], ..OpCounts::default() };
        let rates = rates_json(&ops, 2.0, 1);
        assert_eq!(rates["update_lease"], serde_json::json!(2.0));
        assert_eq!(per_second_per_worker(1, 0.0, 1), Value::Null);
    }
}
