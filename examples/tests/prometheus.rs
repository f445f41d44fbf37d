//! The Prometheus example's endpoint, scraped over HTTP on 127.0.0.1: once the fleet has processed
//! records on every shard, `/metrics` shows each shard's lag under the worker that runs it, both
//! workers' gauges side by side, the store's call latencies, and every series with exactly the
//! labels `shardlease::telemetry::METRICS` (and docs/operations.md) give it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/deploy.rs"]
mod deploy;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use shardlease::telemetry::{self, METRICS};
use shardlease_examples::poll_until;
use shardlease_examples::prometheus::{
    install_exporter, parse_samples, scrape, Fleet, FleetOptions, Sample,
};

const NAMESPACE: &str = "prometheus-test";

async fn get(addr: std::net::SocketAddr) -> (String, Vec<Sample>, String) {
    tokio::task::spawn_blocking(move || {
        let (status, body) = scrape(addr, Duration::from_secs(10)).expect("scrape");
        (status, parse_samples(&body), body)
    })
    .await
    .unwrap()
}

/// The metric a sample belongs to (histogram parts name their histogram).
fn metric_of(name: &str) -> &str {
    ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_serves_per_shard_lag_with_the_documented_labels() {
    let addr = install_exporter(0).unwrap();
    let options = FleetOptions {
        shards: 4,
        workers: 2,
        heartbeat: Duration::from_millis(100),
        records_per_second: 200,
    };
    let fleet = Fleet::start(NAMESPACE, &options).await.unwrap();
    let shards: BTreeSet<String> =
        fleet.source.open_shards().iter().map(|s| s.id.as_str().to_owned()).collect();
    assert_eq!(shards.len(), 4);

    // Until every shard has processed records and lag is reported for each.
    let per_shard = |samples: &[Sample], name: &str| -> BTreeSet<String> {
        samples
            .iter()
            .filter(|s| s.name == name && s.label("namespace") == Some(NAMESPACE))
            .filter_map(|s| s.label("shard").map(str::to_owned))
            .collect()
    };
    let (status, samples, body) = poll_until(
        "records processed on every shard",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async {
            let got = get(addr).await;
            let processed = per_shard(&got.1, telemetry::RECORDS_PROCESSED);
            let lag = per_shard(&got.1, telemetry::MILLIS_BEHIND_LATEST);
            (processed == shards && lag == shards).then_some(got)
        },
    )
    .await
    .unwrap();
    assert!(fleet.log.distinct() > 0);
    assert_eq!(status, "HTTP/1.1 200 OK", "{status}");

    // The per-shard lag series: one per shard, named by namespace, worker and shard.
    for s in samples.iter().filter(|s| s.name == telemetry::MILLIS_BEHIND_LATEST) {
        let keys: BTreeSet<&str> = s.labels.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, BTreeSet::from(["namespace", "shard", "worker"]), "{s:?}");
        assert!(["w1", "w2"].contains(&s.label("worker").unwrap()), "{s:?}");
        assert!(s.value >= 0.0, "{s:?}");
    }
    assert!(body.contains(&format!("# HELP {}", telemetry::MILLIS_BEHIND_LATEST)), "{body}");

    // Both workers' gauges, side by side rather than overwriting each other.
    let held: BTreeMap<String, f64> = samples
        .iter()
        .filter(|s| s.name == telemetry::LEASES_HELD && s.label("namespace") == Some(NAMESPACE))
        .map(|s| (s.label("worker").unwrap().to_owned(), s.value))
        .collect();
    assert_eq!(held.keys().map(String::as_str).collect::<Vec<_>>(), ["w1", "w2"], "{held:?}");

    // The store's calls, timed by operation.
    let operations: BTreeSet<&str> = samples
        .iter()
        .filter(|s| s.name == format!("{}_count", telemetry::STORE_CALL_SECONDS))
        .filter_map(|s| s.label("operation"))
        .collect();
    for op in ["heartbeat", "list_workers", "list_leases", "update_lease"] {
        assert!(operations.contains(op), "no {op} in {operations:?}");
    }

    // Every shardlease series has exactly the labels METRICS lists for it.
    let mut checked = 0;
    for s in samples.iter().filter(|s| s.name.starts_with("shardlease_")) {
        let Some(info) = METRICS.iter().find(|m| m.name == metric_of(&s.name)) else {
            panic!("{} is not listed in telemetry::METRICS", s.name)
        };
        let keys: BTreeSet<&str> =
            s.labels.iter().map(|(k, _)| k.as_str()).filter(|k| *k != "le").collect();
        let want: BTreeSet<&str> = info.labels.iter().copied().collect();
        assert_eq!(keys, want, "labels of {s:?}");
        checked += 1;
    }
    assert!(checked > 20, "only {checked} samples");

    // The metric names deploy/ (the Prometheus rules, their tests, the Grafana dashboard) queries,
    // held against what this exporter writes: a metric that is scraped is scraped under exactly
    // the name queried (a histogram's `_bucket`, which the quantiles need, a counter's one `_total`).
    let (used, _) = deploy::metric_names_used();
    let scraped: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();
    let mut found = BTreeSet::new();
    for name in &used {
        let base = metric_of(name);
        let written: BTreeSet<&str> =
            scraped.iter().copied().filter(|s| metric_of(s) == base).collect();
        if !written.is_empty() {
            assert!(
                written.contains(name.as_str()),
                "deploy/ queries {name}; scraped: {written:?}"
            );
            found.insert(name.as_str());
        }
    }
    for name in [
        "shardlease_millis_behind_latest",
        "shardlease_leases_held",
        "shardlease_records_processed_total",
        "shardlease_store_call_seconds_bucket",
        "shardlease_batch_processing_seconds_bucket",
    ] {
        assert!(found.contains(name), "{name} is not in the scrape: {found:?}");
    }
    fleet.shutdown().await.unwrap();
}
