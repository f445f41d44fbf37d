//! A consumer fleet on a DynamoDB table's change stream, with the lease store named by a URL: run
//! this program on as many machines (or terminals) as you like and they share the stream's
//! shards, take over from each other, and follow the shards DynamoDB rotates every few hours.
//! Each change is parsed into a `ChangeEvent` and logged (event name and item key); each batch is
//! checkpointed once processed. SIGINT or SIGTERM leaves gracefully: each lease is checkpointed
//! and released, and the peers take it within a heartbeat.
//!
//! Configuration comes from the environment, the AWS way:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `DDB_TABLE` | table name (its current stream is found) or stream ARN | `shardlease-demo` |
//! | `DDB_ENDPOINT_URL` | DynamoDB Streams endpoint (an emulator such as moto) | AWS |
//! | `SHARDLEASE_STORE_URL` | lease store: `sqlite://…`, `postgres://…`, `redis://…`, `dynamodb://TABLE?region=…` | `sqlite://dynamodb-streams-demo.db` |
//! | `SHARDLEASE_NAMESPACE` | application name (lease namespace) | `dynamodb-streams-demo` |
//! | `SHARDLEASE_WORKERS` | workers in this process | `1` |
//! | `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, … | the AWS SDK's default chain | region `us-east-1` |
//!
//! The table must have a stream: building the source from a table name fails otherwise, and says
//! so. The example creates no table (the facade offers no DynamoDB client); the AWS CLI makes one
//! with a stream and writes a change to read. Against moto, which `eval "$(scripts/services.sh)"`
//! starts, run it with `AWS_ACCESS_KEY_ID=dummy AWS_SECRET_ACCESS_KEY=dummy` and add
//! `--endpoint-url $SHARDLEASE_TEST_DYNAMODB_ENDPOINT --region us-east-1` to each command:
//!
//! ```sh
//! aws dynamodb create-table --table-name shardlease-demo \
//!   --attribute-definitions AttributeName=pk,AttributeType=S \
//!   --key-schema AttributeName=pk,KeyType=HASH --billing-mode PAY_PER_REQUEST \
//!   --stream-specification StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES
//! aws dynamodb put-item --table-name shardlease-demo --item '{"pk": {"S": "order-1"}}'
//! ```
//!
//! Then, against moto:
//!
//! ```sh
//! AWS_ACCESS_KEY_ID=dummy AWS_SECRET_ACCESS_KEY=dummy \
//! DDB_ENDPOINT_URL=$SHARDLEASE_TEST_DYNAMODB_ENDPOINT \
//!   cargo run --example dynamodb_streams --features dynamodb-streams
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use shardlease::dynamodb_streams::EventName;
use shardlease::{
    processor_fn, ChangeEvent, Config, DynamoDbStreamsSource, Position, ShardSource, Worker,
};
use tracing::{info, warn};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty()).unwrap_or_else(|| default.to_owned())
}

/// Whether the region comes from the environment (else the example uses `us-east-1`).
fn region_set() -> bool {
    std::env::var_os("AWS_REGION").is_some() || std::env::var_os("AWS_DEFAULT_REGION").is_some()
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
            eprintln!("dynamodb_streams: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let table = env_or("DDB_TABLE", "shardlease-demo");
    let store_url = env_or("SHARDLEASE_STORE_URL", "sqlite://dynamodb-streams-demo.db");
    let namespace = env_or("SHARDLEASE_NAMESPACE", "dynamodb-streams-demo");
    let workers: usize = env_or("SHARDLEASE_WORKERS", "1")
        .parse()
        .map_err(|_| "SHARDLEASE_WORKERS must be a whole number")?;
    let endpoint = std::env::var("DDB_ENDPOINT_URL").ok().filter(|v| !v.trim().is_empty());

    let mut builder = DynamoDbStreamsSource::builder(&table);
    if !region_set() {
        builder = builder.region("us-east-1");
    }
    if let Some(endpoint) = &endpoint {
        builder = builder.endpoint_url(endpoint);
    }
    let source = Arc::new(builder.build().await?);

    let store = shardlease::connect_namespace(&store_url, &namespace).await?;
    info!(
        store = %shardlease::redact_url(&store_url),
        stream = source.stream_arn(),
        %namespace,
        workers,
        "starting"
    );
    let processor = processor_fn(|ctx, batch| async move {
        // Your processing goes here; the closure form checkpoints after each batch it accepts.
        for record in batch.records.iter() {
            match ChangeEvent::from_record(record) {
                Ok(change) => info!(
                    shard = %ctx.key(),
                    event = event_name(change.event_name),
                    keys = %change.key_json(),
                    seq = %change.sequence_number,
                    ttl = change.removed_by_ttl,
                    "change"
                ),
                // Not a DynamoDB stream record (cannot happen with this source): say so and go
                // on, rather than retry a batch that will never parse.
                Err(e) => warn!(shard = %ctx.key(), seq = %record.seq, error = %e, "not a change"),
            }
        }
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

/// The event name as DynamoDB spells it.
fn event_name(name: EventName) -> &'static str {
    match name {
        EventName::Insert => "INSERT",
        EventName::Modify => "MODIFY",
        EventName::Remove => "REMOVE",
    }
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
