//! The Prometheus rules and the Grafana dashboard under `deploy/` are checked against the code:
//! every metric they query is one the workers register (`shardlease::telemetry::METRICS`, with
//! the `_bucket`/`_sum`/`_count` series the exporter writes for a histogram), every recording rule
//! they read is defined, every alert has a unit test that fires it and one that keeps it quiet,
//! and `promtool` checks the rules, runs those unit tests and parses the dashboard's queries.
//! (`tests/prometheus.rs` holds the same names against a live scrape of the Prometheus example.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/deploy.rs"]
mod deploy;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use shardlease::telemetry::{MetricKind, METRICS};

/// The series names each registered metric is scraped under.
fn scraped_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for m in METRICS {
        match m.kind {
            MetricKind::Counter | MetricKind::Gauge => {
                names.insert(m.name.to_owned());
            }
            MetricKind::Histogram => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{}{suffix}", m.name));
                }
            }
        }
    }
    names
}

#[test]
fn every_metric_the_rules_and_the_dashboard_use_is_registered() {
    let (series, prose) = deploy::metric_names_used();
    let scraped = scraped_names();
    let unknown: Vec<&String> = series.iter().filter(|n| !scraped.contains(*n)).collect();
    assert!(unknown.is_empty(), "queried but not registered (telemetry::METRICS): {unknown:?}");
    let registered: BTreeSet<&str> = METRICS.iter().map(|m| m.name).collect();
    let unknown: Vec<&String> = prose
        .iter()
        .filter(|n| !scraped.contains(*n) && !registered.contains(n.as_str()))
        .collect();
    assert!(unknown.is_empty(), "named in an alert's text but not registered: {unknown:?}");
    // The figures the dashboard exists for (issue 32): lag per shard, leases per worker,
    // ownership changes, store latency by operation, records per second.
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy::read(deploy::DASHBOARD)).unwrap();
    let queries = deploy::dashboard_queries(&dashboard).join("\n");
    for (what, needle) in [
        ("lag per shard", "max by (namespace, shard) (shardlease_millis_behind_latest"),
        ("leases per worker", "shardlease_leases_held{"),
        ("ownership changes", "shardlease_leases_taken_total"),
        (
            "store latency by operation",
            "sum by (operation, le) (rate(shardlease_store_call_seconds_bucket",
        ),
        ("records per second", "rate(shardlease_records_processed_total"),
    ] {
        assert!(queries.contains(needle), "the dashboard has no {what} ({needle})");
    }
    // Some metric of each kind is used, so a check that finds nothing cannot pass.
    assert!(series.len() >= 15, "only {} metric names found: {series:?}", series.len());
}

#[test]
fn the_rules_read_only_recording_rules_they_define() {
    let rules = deploy::read(deploy::RULES);
    let recorded = deploy::recorded(&rules);
    assert!(recorded.len() >= 5, "{recorded:?}");
    let (code, _) = deploy::split_prose(&rules);
    let (tests, _) = deploy::split_prose(&deploy::read(deploy::RULES_TEST));
    for id in deploy::identifiers(&code).into_iter().chain(deploy::identifiers(&tests)) {
        if deploy::is_recorded_name(&id) {
            assert!(recorded.contains(&id), "{id} is read but no rule records it");
        }
    }
}

/// For each alert: one `alert_rule_test` case that expects it and one that expects none.
#[test]
fn every_alert_has_a_test_that_fires_it_and_one_that_does_not() {
    let alerts = deploy::alerts(&deploy::read(deploy::RULES));
    assert!(alerts.len() >= 6, "{alerts:?}");
    let tests = deploy::read(deploy::RULES_TEST);
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.strip_prefix("alertname:") else { continue };
        let name = name.trim().to_owned();
        match lines.get(i + 1).copied() {
            Some("exp_alerts: []") => quiet.insert(name),
            Some("exp_alerts:")
                if lines.get(i + 2).is_some_and(|l| l.starts_with("- exp_labels:")) =>
            {
                fires.insert(name)
            }
            other => panic!("alertname {name} is followed by {other:?}"),
        };
    }
    for a in &alerts {
        assert!(fires.contains(a), "no test fires {a}");
        assert!(quiet.contains(a), "no test keeps {a} quiet");
    }
    let known: BTreeSet<&String> = alerts.iter().collect();
    for a in fires.iter().chain(&quiet) {
        assert!(known.contains(a), "the tests name {a}, which the rules do not define");
    }
}

/// `promtool`, or why not: under CI it must be installed (scripts/build-deps.sh installs Debian's
/// `prometheus` package); elsewhere the test says it is skipped.
fn promtool() -> Option<&'static str> {
    let found =
        Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if found {
        return Some("promtool");
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("promtool is not installed (scripts/build-deps.sh installs it: apt-get install prometheus)");
    }
    eprintln!("SKIPPED: promtool is not installed (apt-get install prometheus)");
    None
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).current_dir(dir).output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    println!("$ promtool {}\n{text}", args.join(" "));
    text
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let Some(_) = promtool() else { return };
    let dir = deploy::dir().join("prometheus");
    let checked = run(&dir, &["check", "rules", "shardlease.rules.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(&dir, &["test", "rules", "shardlease.rules.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// promtool has no command that parses a lone query, so the dashboard's queries (with Grafana's
/// variables replaced) go into a rules file as recording rules, which `check rules` parses.
#[test]
fn promtool_parses_every_dashboard_query() {
    let Some(_) = promtool() else { return };
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy::read(deploy::DASHBOARD)).unwrap();
    let queries = deploy::dashboard_queries(&dashboard);
    assert!(queries.len() >= 15, "{queries:?}");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let q = q.replace("$__rate_interval", "5m").replace("$namespace", ".*");
        let q = match q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
            // `label_values(metric, label)` is Grafana's, not PromQL: its metric must parse.
            Some(args) => args.split(',').next().unwrap_or_default().trim().to_owned(),
            None => q,
        };
        assert!(!q.contains('$'), "a Grafana variable left in {q}");
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&q).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard.rules.yml"), &rules).unwrap();
    let checked = run(dir.path(), &["check", "rules", "dashboard.rules.yml"]);
    assert!(checked.contains(&format!("SUCCESS: {} rules found", queries.len())), "{checked}");
}

#[test]
fn the_dashboard_is_valid_json_with_unique_panels() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy::read(deploy::DASHBOARD)).unwrap();
    assert_eq!(dashboard["uid"], "shardlease");
    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "panel id repeated: {p}");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "panel {} has no gridPos.{k}", p["title"]);
        }
        if p["type"] != "row" {
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "panel {} queries nothing", p["title"]);
            for t in targets {
                assert!(!t["expr"].as_str().unwrap().is_empty(), "{t}");
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{t}");
            }
        }
    }
}
