//! The daemon: a shardlease [`Worker`] over the Kinesis stream the properties name, its leases in
//! the store they name, one child per lease. It runs until its [`CancellationToken`] is
//! cancelled (SIGTERM/SIGINT in the binary) or the worker stops on its own; then every child is
//! asked to checkpoint (`shutdownRequested`, within `shutdownGraceMillis`), the leases are
//! released, and every child has exited or been killed before [`run`] returns.
//!
//! With `shardlease.metricsAddress` set, the address is bound before anything else, and
//! `/metrics` and `/health` are served until the run returns ([`crate::listener`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use shardlease::kinesis::KinesisSource;
use shardlease::store::LeaseStore;
use shardlease::{Config, ShardSource, ShutdownReport, Worker};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{MultiLangError, Result};
use crate::listener::{self, Health, Listener};
use crate::processor::{ChildStats, MultiLangFactory};
use crate::settings::{Retrieval, Settings};

/// How a run ended.
#[derive(Debug)]
pub struct RunReport {
    /// What the worker's shutdown did with each lease.
    pub shutdown: ShutdownReport,
    /// What the children did.
    pub children: Arc<ChildStats>,
}

/// What a run takes besides its settings, store, source and stop token: how the
/// `shardlease.metricsAddress` listener is served (nothing here matters without that key).
#[derive(Debug, Default)]
pub struct RunOptions {
    /// The recorder whose text `GET /metrics` serves; `None`: the Prometheus recorder
    /// [`listener::install_recorder`] installs for the process (a program that installed its own
    /// Prometheus recorder passes its handle here).
    pub prometheus: Option<PrometheusHandle>,
    /// Sent the address the listener is bound to, once it is (with port 0, the port picked).
    pub listening: Option<oneshot::Sender<SocketAddr>>,
}

/// Logs, once, the keys the daemon does not use and what it does about the KCL's lease table.
pub fn log_startup(settings: &Settings) {
    let (kcl, unknown): (Vec<_>, Vec<_>) = settings.ignored.iter().partition(|k| k.known_to_kcl);
    if !kcl.is_empty() {
        let keys: Vec<String> =
            kcl.iter().map(|k| format!("{} (line {})", k.key, k.line)).collect();
        info!("ignored KCL keys with no meaning here: {}", keys.join(", "));
    }
    if !unknown.is_empty() {
        let keys: Vec<String> =
            unknown.iter().map(|k| format!("{} (line {})", k.key, k.line)).collect();
        warn!("ignored unknown keys: {}", keys.join(", "));
    }
    info!(
        kcl_table = %settings.kcl_table,
        "the KCL's DynamoDB lease table is never read nor written; to resume from its \
         checkpoints, stop the KCL fleet and run `shardlease --store URL --namespace {} \
         import-kcl --table {}` once before starting this daemon (docs/migrating-from-kcl.md)",
        settings.namespace,
        settings.kcl_table
    );
}

/// The KCL's `failoverTimeMillis` when the properties set none.
const KCL_FAILOVER: std::time::Duration = std::time::Duration::from_secs(10);

/// The worker configuration the settings describe.
pub fn worker_config(settings: &Settings) -> Result<Config> {
    let mut config = Config::new(settings.namespace.as_str())?
        .with_initial_position(settings.initial_position.clone())
        .with_shutdown_timeout(settings.grace)
        .with_balance(settings.balance.clone());
    // The KCL's failover default, and a heartbeat of a tenth of it: a worker starting alone
    // takes its leases one heartbeat after its first (the start hold, docs/algorithm.md
    // "Starting together"), so the first record reaches a child about a second after the start
    // instead of two; a heartbeat is one small write.
    let failover = settings.failover.unwrap_or(KCL_FAILOVER);
    let heartbeat = settings.heartbeat.unwrap_or(failover / 10);
    config = config.with_heartbeat(heartbeat).with_failover_timeout(failover);
    if let Some(s) = settings.shard_sync {
        config = config.with_shard_sync_interval(s);
    }
    if let Some(n) = settings.max_leases {
        config = config.with_max_leases_per_worker(n);
    }
    if let Some(id) = &settings.worker_id {
        config = config.with_worker_id(id.as_str());
    }
    Ok(config)
}

/// The Kinesis source the settings describe.
pub async fn kinesis_source(settings: &Settings) -> Result<KinesisSource> {
    let mut builder = KinesisSource::builder(&settings.stream);
    if let Some(r) = &settings.region {
        builder = builder.region(r);
    }
    if let Some(e) = &settings.kinesis_endpoint {
        builder = builder.endpoint_url(e);
    }
    // One reading configuration from both keys (`read_config` replaces every knob at once).
    let mut read = shardlease::kinesis::ReadConfig::default();
    if let Some(n) = settings.max_records {
        read.max_records = n;
    }
    if let Some(idle) = settings.idle_between_reads {
        read.idle_interval = idle;
        read.min_call_interval = idle;
    }
    builder = builder.read_config(read);
    if let Retrieval::FanOut { consumer_name } = &settings.retrieval {
        builder = builder.enhanced_fan_out(consumer_name);
    }
    Ok(builder.build().await?)
}

/// Opens the store the settings name, refusing a DynamoDB table that is the KCL's own.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn LeaseStore>> {
    if settings.store_dynamodb_table() == Some(settings.kcl_table.as_str()) {
        return Err(MultiLangError::Missing(format!(
            "shardlease.store names the KCL's lease table {}: this daemon never writes a KCL \
             lease table. Give shardlease a table of its own and import the KCL's checkpoints \
             into it with `shardlease import-kcl --table {}`",
            settings.kcl_table, settings.kcl_table
        )));
    }
    let url = settings.effective_store_url();
    info!(store = %shardlease::redact_url(&url), namespace = %settings.namespace, "opening the lease store");
    Ok(shardlease::connect_namespace(&url, &settings.namespace).await?)
}

/// Runs the daemon on Kinesis until `stop` is cancelled.
pub async fn run(settings: &Settings, stop: CancellationToken) -> Result<RunReport> {
    // First, so that an address in use fails the start before the store is opened.
    let listener = bind(settings).await?;
    let store = open_store(settings).await?;
    let source: Arc<dyn ShardSource> = Arc::new(kinesis_source(settings).await?);
    info!(stream = %settings.stream, retrieval = ?settings.retrieval, "reading the stream");
    run_bound(settings, store, source, stop, RunOptions::default(), listener).await
}

/// Runs the daemon on any store and source until `stop` is cancelled (tests run it on an
/// in-memory stream).
pub async fn run_with(
    settings: &Settings,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    stop: CancellationToken,
) -> Result<RunReport> {
    run_with_options(settings, store, source, stop, RunOptions::default()).await
}

/// [`run_with`], the `shardlease.metricsAddress` listener served as `options` say.
pub async fn run_with_options(
    settings: &Settings,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    stop: CancellationToken,
    options: RunOptions,
) -> Result<RunReport> {
    let listener = bind(settings).await?;
    run_bound(settings, store, source, stop, options, listener).await
}

/// Binds `shardlease.metricsAddress`, if set.
async fn bind(settings: &Settings) -> Result<Option<Listener>> {
    match settings.metrics_address {
        Some(addr) => Ok(Some(Listener::bind(addr).await?)),
        None => Ok(None),
    }
}

/// The run, the listener (if any) bound.
async fn run_bound(
    settings: &Settings,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    stop: CancellationToken,
    options: RunOptions,
    listener: Option<Listener>,
) -> Result<RunReport> {
    let health = Health::new();
    // The server stops when the run returns, or when its future is dropped.
    let server_stop = CancellationToken::new();
    let _server_guard = server_stop.clone().drop_guard();
    let server = listener.map(|listener| {
        // Before the worker is built: shardlease registers its metrics with the recorder
        // installed then.
        let metrics = options.prometheus.or_else(listener::install_recorder);
        if let Some(tx) = options.listening {
            let _ = tx.send(listener.local_addr());
        }
        listener.serve(metrics, health.clone(), server_stop.clone())
    });
    let report = run_worker(settings, store, source, stop, &health).await;
    if let Some(mut server) = server {
        server_stop.cancel();
        // The port is closed at once; open connections get a moment to finish.
        if tokio::time::timeout(Duration::from_secs(2), &mut server).await.is_err() {
            server.abort();
            let _ = server.await;
        }
    }
    report
}

/// The worker and its children, from start to the last child's exit.
async fn run_worker(
    settings: &Settings,
    store: Arc<dyn LeaseStore>,
    source: Arc<dyn ShardSource>,
    stop: CancellationToken,
    health: &Health,
) -> Result<RunReport> {
    let factory = MultiLangFactory::new(settings.child.clone());
    let config = worker_config(settings)?;
    let worker = Arc::new(
        Worker::builder(config, store, source, Arc::new(factory.clone())).build()?.start(),
    );
    health.set_worker(worker.clone());
    info!(worker = %worker.id(), command = ?settings.child.command, "daemon running");
    tokio::select! {
        _ = stop.cancelled() => info!("stopping: asking every child to checkpoint, then releasing the leases"),
        cause = worker.stopped() => warn!(%cause, "the worker stopped on its own; stopping"),
    }
    let shutdown = worker.shutdown().await;
    if !shutdown.is_clean() {
        warn!(?shutdown, "the shutdown was not clean");
    }
    // Every farewell is bounded by the exit bound (then the child is killed); this bound only
    // guards against a child that cannot even be killed.
    let bound = settings.child.exit_timeout * 2 + Duration::from_secs(5);
    if tokio::time::timeout(bound, factory.wait_for_children()).await.is_err() {
        warn!("some children did not finish in time");
    }
    Ok(RunReport { shutdown, children: factory.stats() })
}
