//! A consumer fleet on an Amazon Kinesis data stream, with the lease store named by a URL: run
//! this program on as many machines (or terminals) as you like and they share the stream's shards,
//! take over from each other, and follow splits and merges. SIGINT or SIGTERM leaves gracefully:
//! each lease is checkpointed and released, and the peers take it within a heartbeat.
//!
//! Configuration comes from the environment, the AWS way:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `KINESIS_STREAM` | stream name or ARN | `shardlease-demo` |
//! | `KINESIS_ENDPOINT_URL` | Kinesis endpoint (an emulator such as kinesalite) | AWS |
//! | `SHARDLEASE_STORE_URL` | lease store: `dynamodb://TABLE?region=…`, `sqlite://…`, `postgres://…`, `redis://…` | `sqlite://kinesis-demo.db` |
//! | `SHARDLEASE_NAMESPACE` | application name (lease namespace) | `kinesis-demo` |
//! | `SHARDLEASE_WORKERS` | workers in this process | `1` |
//! | `KINESIS_CREATE_SHARDS` | create the stream with this many shards if it does not exist | unset |
//! | `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, … | the AWS SDK's default chain | region `us-east-1` |
//!
//! Against local emulators (`eval "$(scripts/services.sh)"` starts kinesalite):
//!
//! ```sh
//! AWS_ACCESS_KEY_ID=dummy AWS_SECRET_ACCESS_KEY=dummy \
//! KINESIS_ENDPOINT_URL=$SHARDLEASE_TEST_KINESIS_ENDPOINT KINESIS_CREATE_SHARDS=4 \
//!   cargo run --example kinesis_dynamodb --features kinesis,dynamodb
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use shardlease::kinesis::aws_sdk_kinesis;
use shardlease::{processor_fn, Config, KinesisSource, Position, ShardSource, Worker};
use tracing::{info, warn};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty()).unwrap_or_else(|| default.to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kinesis_dynamodb: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let stream = env_or("KINESIS_STREAM", "shardlease-demo");
    let store_url = env_or("SHARDLEASE_STORE_URL", "sqlite://kinesis-demo.db");
    let namespace = env_or("SHARDLEASE_NAMESPACE", "kinesis-demo");
    let workers: usize = env_or("SHARDLEASE_WORKERS", "1")
        .parse()
        .map_err(|_| "SHARDLEASE_WORKERS must be a whole number")?;

    let mut builder = KinesisSource::builder(&stream);
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        builder = builder.region("us-east-1");
    }
    if let Ok(endpoint) = std::env::var("KINESIS_ENDPOINT_URL") {
        builder = builder.endpoint_url(endpoint);
    }
    let source = Arc::new(builder.build().await?);
    if let Ok(n) = std::env::var("KINESIS_CREATE_SHARDS") {
        let shards: i32 = n.parse().map_err(|_| "KINESIS_CREATE_SHARDS must be a number")?;
        create_if_missing(&source, &stream, shards).await?;
    }

    let store = shardlease::connect_namespace(&store_url, &namespace).await?;
    info!(store = %shardlease::redact_url(&store_url), %stream, %namespace, workers, "starting");
    let processor = processor_fn(|ctx, batch| async move {
        // Your processing goes here; the closure form checkpoints after each batch it accepts.
        info!(
            shard = %ctx.key(),
            epoch = %ctx.epoch(),
            records = batch.records.len(),
            millis_behind = ?batch.millis_behind,
            "batch"
        );
        Ok(())
    });
    let mut handles = Vec::new();
    for _ in 0..workers {
        let config = Config::new(namespace.as_str())?.with_initial_position(Position::TrimHorizon);
        let source: Arc<dyn ShardSource> = source.clone();
        handles.push(
            Worker::builder(config, store.clone(), source, processor.clone()).build()?.start(),
        );
    }

    shutdown_signal().await;
    info!("leaving: checkpointing and releasing leases");
    for h in &handles {
        let report = h.shutdown().await;
        if !report.is_clean() {
            warn!(?report, "shutdown did not finish cleanly");
        }
    }
    Ok(())
}

/// Creates the stream (emulators, first runs) and waits until it is active.
async fn create_if_missing(
    source: &KinesisSource,
    stream: &str,
    shards: i32,
) -> Result<(), Box<dyn std::error::Error>> {
    if source.list_shards().await.is_ok() {
        return Ok(());
    }
    use shardlease::kinesis::aws_config::{self, BehaviorVersion, Region};
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        loader = loader.region(Region::new("us-east-1"));
    }
    let mut conf = aws_sdk_kinesis::config::Builder::from(&loader.load().await);
    if let Ok(endpoint) = std::env::var("KINESIS_ENDPOINT_URL") {
        conf = conf.endpoint_url(endpoint);
    }
    let client = aws_sdk_kinesis::Client::from_conf(conf.build());
    info!(stream, shards, "creating the stream");
    client.create_stream().stream_name(stream).shard_count(shards).send().await?;
    for _ in 0..600 {
        if source.list_shards().await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the stream did not become active within a minute".into())
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
