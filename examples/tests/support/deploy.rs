//! Reads the Prometheus rules, their unit tests and the Grafana dashboard under `deploy/` and
//! lists the metric names they use, so that `tests/deploy.rs` can hold them against
//! `shardlease::telemetry::METRICS` and `tests/prometheus.rs` against a live scrape. No YAML
//! parser: the rules are scanned for identifiers outside comments, which is what matters here.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The repository's `deploy/` directory.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("deploy")
}

/// The contents of `deploy/<path>`.
pub fn read(path: &str) -> String {
    let p = dir().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

pub const RULES: &str = "prometheus/shardlease.rules.yml";
pub const RULES_TEST: &str = "prometheus/shardlease.rules.test.yml";
pub const DASHBOARD: &str = "grafana/shardlease.json";

/// Every PromQL-style identifier (`[A-Za-z_:][A-Za-z0-9_:]*`) in `text`, outside `#` comments.
pub fn identifiers(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let mut current = String::new();
        for c in line.chars().chain(std::iter::once(' ')) {
            let starts = c.is_ascii_alphabetic() || c == '_' || c == ':';
            if starts || (!current.is_empty() && c.is_ascii_digit()) {
                current.push(c);
            } else if !current.is_empty() {
                out.insert(std::mem::take(&mut current));
            }
        }
    }
    out
}

/// A name a worker's series is scraped under (`shardlease_…`, no colon).
pub fn is_metric_name(id: &str) -> bool {
    id.starts_with("shardlease_") && !id.contains(':')
}

/// A recording rule's name (`level:shardlease_…:operations`).
pub fn is_recorded_name(id: &str) -> bool {
    id.contains(":shardlease_")
}

/// The names the rules file records.
pub fn recorded(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// The names of the rules file's alerts.
pub fn alerts(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// Every PromQL string of the dashboard: panel targets' `expr`, template variables' queries.
pub fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "definition" | "query", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    // The data source variable's `query` is a plugin type, not PromQL.
    out.retain(|q| q != "prometheus");
    out
}

/// A rules file split into its alerts' prose (`summary:` and `description:` lines, which may
/// name a histogram by its own name) and the rest (expressions, names, test series).
pub fn split_prose(text: &str) -> (String, String) {
    let (mut code, mut prose) = (String::new(), String::new());
    for line in text.lines() {
        let t = line.trim_start();
        let target = if t.starts_with("summary:") || t.starts_with("description:") {
            &mut prose
        } else {
            &mut code
        };
        target.push_str(line);
        target.push('\n');
    }
    (code, prose)
}

/// The metric names (`shardlease_…`) used by the rules, their tests and the dashboard, as
/// series names (in queries and test series) and in the alerts' prose.
pub fn metric_names_used() -> (BTreeSet<String>, BTreeSet<String>) {
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let (rules, prose) = split_prose(&read(RULES));
    let (tests, test_prose) = split_prose(&read(RULES_TEST));
    let mut series = identifiers(&rules);
    series.extend(identifiers(&tests));
    for q in dashboard_queries(&dashboard) {
        series.extend(identifiers(&q));
    }
    let mut named = identifiers(&prose);
    named.extend(identifiers(&test_prose));
    let only_metrics =
        |ids: BTreeSet<String>| ids.into_iter().filter(|i| is_metric_name(i)).collect();
    (only_metrics(series), only_metrics(named))
}
