//! The JSON line a scenario run prints: fixed keys every run has (`null` where a figure does not
//! apply to the scenario), then scenario-specific extras in alphabetical order.

use serde::Serialize;
use serde_json::{Map, Value};

/// One scenario run's figures. Serializes to one JSON object.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Store URL with any password redacted.
    pub store: String,
    /// Balancer policy (`greedy` or `one-per-pass`).
    pub policy: String,
    /// Shards (leases) in the stream.
    pub shards: usize,
    /// Workers the scenario starts with.
    pub workers: usize,
    /// Largest number of lease-taking balance passes of any worker when the last lease was owned.
    pub passes_to_full_coverage: Option<u64>,
    /// Seconds from the start (or the event) until every active lease was owned by a running worker.
    pub seconds_to_full_coverage: Option<f64>,
    /// Changes of owner after a lease's first owner, until shares were balanced.
    pub moves_after_first_pass: Option<u64>,
    /// Seconds from the start (or the event) until every lease was owned and shares within one.
    pub seconds_to_balanced: Option<f64>,
    /// Largest share once balanced.
    pub max_share: Option<usize>,
    /// Smallest share once balanced.
    pub min_share: Option<usize>,
    /// Deliveries beyond the first, summed over records, caused by the scenario's event.
    pub records_processed_twice: Option<u64>,
    /// Store reads (get/list calls) per second per worker.
    pub store_reads_per_sec_per_worker: Option<f64>,
    /// Store writes (create/update/delete/heartbeat/remove calls) per second per worker.
    pub store_writes_per_sec_per_worker: Option<f64>,
    /// Records per second through the runtime.
    pub records_per_sec: Option<f64>,
    /// Scenario-specific figures and the settings of the run.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Report {
    /// Adds (or replaces) an extra key.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.extra.insert(key.to_owned(), value.into());
    }

    /// The report as one line of JSON.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            serde_json::json!({ "scenario": self.scenario, "error": format!("serializing the report failed: {e}") })
                .to_string()
        })
    }
}

/// `x` rounded to 3 decimals (milliseconds, for seconds).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `x` rounded to 3 decimals as a JSON number (`null` when not finite).
pub fn rounded(x: f64) -> Value {
    serde_json::Number::from_f64(round3(x)).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_keys_come_first_and_missing_figures_are_null() {
        let mut r = Report { scenario: "startup".into(), shards: 4, ..Report::default() };
        r.set("heartbeat_ms", 100);
        let v: Value = serde_json::from_str(&r.to_line()).unwrap();
        assert_eq!(v["scenario"], "startup");
        assert!(v["records_per_sec"].is_null());
        assert_eq!(v["heartbeat_ms"], 100);
        assert!(r.to_line().starts_with("{\"scenario\":\"startup\""));
        assert_eq!(round3(1.23456), 1.235);
    }
}
