//! The consumer process of a fault run: one worker built only from the `shardlease` facade's
//! public API, reading the shared Kinesis emulator with leases in the store its URL names. Each
//! record becomes one line of its output file, fsynced before the checkpoint that covers it, and
//! every checkpoint is logged with the token it was written under and the time around the write,
//! so the checker can tell what was processed and who wrote which checkpoint when. With
//! `--sink-url` the records go into a PostgreSQL table effectively once instead (`sink`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardlease::kinesis::ReadConfig;
use shardlease::{
    async_trait, Batch, BoxError, CheckpointHandle, Config, KinesisSource, LeaseContext, Position,
    ProcessorFactory, RecordProcessor, Worker,
};

use crate::events::{now_micros, position_label, ConsumerEvent, LineFile};

/// What a consumer process is told on its command line.
#[derive(clap::Args, Debug, Clone)]
pub struct ConsumerArgs {
    /// Lease store URL.
    #[arg(long)]
    pub store: String,
    /// Lease namespace.
    #[arg(long)]
    pub namespace: String,
    /// Kinesis stream name.
    #[arg(long)]
    pub stream: String,
    /// Kinesis endpoint (the emulator).
    #[arg(long)]
    pub endpoint: String,
    /// Worker id.
    #[arg(long)]
    pub worker_id: String,
    /// Output file (appended to).
    #[arg(long)]
    pub out: PathBuf,
    /// Heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub heartbeat_ms: u64,
    /// Failover timeout in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub failover_ms: u64,
    /// Write every record into this PostgreSQL database effectively once (the `--exactly-once`
    /// runs; see `sink`), instead of checkpointing through the lease store.
    #[arg(long)]
    pub sink_url: Option<String>,
}

type Out = Arc<Mutex<LineFile>>;

fn write(out: &Out, events: &[ConsumerEvent]) -> std::io::Result<()> {
    let mut f = out.lock().unwrap_or_else(|p| p.into_inner());
    for e in events {
        f.push(e)?;
    }
    f.sync()
}

struct Factory {
    out: Out,
}

impl ProcessorFactory for Factory {
    fn create(&self, ctx: &LeaseContext) -> Box<dyn RecordProcessor> {
        Box::new(Processor { out: self.out.clone(), ctx: ctx.clone(), logged_init: false })
    }
}

struct Processor {
    out: Out,
    ctx: LeaseContext,
    logged_init: bool,
}

impl Processor {
    fn shard(&self) -> String {
        self.ctx.key().to_string()
    }

    fn owner(&self) -> String {
        self.ctx.token.owner.to_string()
    }

    async fn checkpoint(&self, h: &CheckpointHandle, pos: Position) -> Result<(), BoxError> {
        let t0 = now_micros();
        let r = h.checkpoint(pos.clone()).await;
        let t1 = now_micros();
        let ev = ConsumerEvent::Ckpt {
            t0,
            t1,
            shard: self.shard(),
            pos: position_label(&pos),
            owner: h.token().owner.to_string(),
            epoch: h.token().epoch.get(),
            ok: r.is_ok(),
            err: r.as_ref().err().map(|e| e.to_string()),
        };
        write(&self.out, &[ev])?;
        r.map_err(Into::into)
    }
}

#[async_trait]
impl RecordProcessor for Processor {
    async fn initialize(&mut self, ctx: &LeaseContext) -> Result<(), BoxError> {
        if !self.logged_init {
            let ev = ConsumerEvent::Init {
                t: now_micros(),
                shard: ctx.key().to_string(),
                owner: ctx.token.owner.to_string(),
                epoch: ctx.epoch().get(),
                start: position_label(&ctx.start),
            };
            write(&self.out, &[ev])?;
            self.logged_init = true;
        }
        Ok(())
    }

    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        if batch.records.is_empty() {
            return Ok(());
        }
        let (shard, owner, epoch) = (self.shard(), self.owner(), self.ctx.epoch().get());
        let events: Vec<ConsumerEvent> = batch
            .records
            .iter()
            .map(|r| ConsumerEvent::Rec {
                shard: shard.clone(),
                seq: r.seq.to_string(),
                id: String::from_utf8_lossy(&r.data).into_owned(),
                owner: owner.clone(),
                epoch,
            })
            .collect();
        write(&self.out, &events)?;
        if let Some(p) = batch.last_position() {
            // A refusal (the lease moved on) or a store error is logged; the runtime learns of a
            // refusal from the handle and ends the lease, and the next batch retries an error.
            let _ = self.checkpoint(checkpointer, p).await;
        }
        Ok(())
    }

    async fn shard_ended(&mut self, checkpointer: &CheckpointHandle) -> Result<(), BoxError> {
        self.checkpoint(checkpointer, Position::ShardEnd).await
    }
}

/// Runs the consumer until SIGTERM or SIGINT, then shuts the worker down gracefully.
pub async fn run(args: ConsumerArgs) -> Result<(), BoxError> {
    let out: Out = Arc::new(Mutex::new(LineFile::open(&args.out)?));
    let mut read = ReadConfig::default();
    read.min_call_interval = Duration::from_millis(20);
    read.idle_interval = Duration::from_millis(100);
    read.base_backoff = Duration::from_millis(50);
    read.max_backoff = Duration::from_millis(1000);
    read.operation_timeout = Duration::from_secs(5);
    let source = KinesisSource::builder(&args.stream)
        .region("us-east-1")
        .endpoint_url(&args.endpoint)
        .static_credentials("dummy", "dummy")
        .read_config(read)
        .build()
        .await?;
    let store = shardlease::connect_namespace(&args.store, &args.namespace).await?;
    let config = Config::new(&args.namespace)?
        .with_worker_id(args.worker_id.as_str())
        .with_heartbeat(Duration::from_millis(args.heartbeat_ms))
        .with_failover_timeout(Duration::from_millis(args.failover_ms))
        .with_initial_position(Position::TrimHorizon);
    let handle = match &args.sink_url {
        None => {
            let factory: Arc<dyn ProcessorFactory> = Arc::new(Factory { out });
            Worker::builder(config, store, Arc::new(source), factory).build()?.start()
        }
        Some(url) => {
            let pool = crate::sink::connect(url).await?;
            let (checkpointer, factory) =
                crate::sink::processors(pool, &args.namespace, out).await?;
            Worker::builder(config, store, Arc::new(source), factory)
                .checkpointer(checkpointer)
                .build()?
                .start()
        }
    };
    tracing::info!(worker = %args.worker_id, "consumer started");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!(worker = %args.worker_id, "consumer stopping");
    let report = handle.shutdown().await;
    if let Some(e) = &report.record_error {
        tracing::warn!(error = %e, "the worker record could not be removed; peers judge it dead after the failover timeout");
    }
    Ok(())
}
