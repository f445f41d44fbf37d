//! The `shardlease-chaos` binary: `run` is the harness (one JSON line per run), `consumer` and
//! `producer` are the processes it starts.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shardlease_chaos::harness::{self, Env, RunOptions};
use shardlease_chaos::stores::StoreKind;
use shardlease_chaos::{consumer, producer};

/// Fault runs of a real shardlease fleet.
#[derive(Parser, Debug)]
#[command(name = "shardlease-chaos")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run fault runs and print one JSON line each.
    Run(RunArgs),
    /// A consumer process (started by `run`).
    Consumer(consumer::ConsumerArgs),
    /// The producer process (started by `run`).
    Producer(producer::ProducerArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The store.
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    /// The first seed (runs use seed, seed+1, ...).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How many runs.
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// Consumer processes at the start.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Shards at the start.
    #[arg(long, default_value_t = 4)]
    shards: i32,
    /// Faults drawn on top of one of each class.
    #[arg(long, default_value_t = 2)]
    extra_faults: usize,
    /// Do not draw one fault of each class first.
    #[arg(long)]
    no_every_class: bool,
    /// Records per second.
    #[arg(long, default_value_t = 40)]
    rate: u32,
    /// Replay the schedule of this history file (other options come from it too).
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Where history files of failed runs go.
    #[arg(long, default_value = "target/chaos")]
    history_dir: PathBuf,
    /// Kinesis emulator endpoint.
    #[arg(long, env = "SHARDLEASE_TEST_KINESIS_ENDPOINT")]
    endpoint: String,
    /// Keep each run's directory.
    #[arg(long)]
    keep: bool,
    /// Write the records through the effectively-once SQL sink and hold each run to exactly
    /// once (every record once, none twice).
    #[arg(long)]
    exactly_once: bool,
    /// Draw wipes of the store too (Redis, DynamoDB): a run with one is judged on lost records
    /// alone.
    #[arg(long)]
    wipes: bool,
    /// The sink's PostgreSQL database (for `--exactly-once`).
    #[arg(long, env = "SHARDLEASE_TEST_POSTGRES_URL", hide_env_values = true)]
    sink_url: Option<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shardlease-chaos: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.cmd {
            Cmd::Consumer(a) => consumer::run(a).await.map(|()| true),
            Cmd::Producer(a) => producer::run(a).await.map(|()| true),
            Cmd::Run(a) => run(a).await,
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("shardlease-chaos: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: RunArgs) -> Result<bool, shardlease::BoxError> {
    let env = Env {
        exe: std::env::current_exe()?,
        endpoint: a.endpoint.clone(),
        history_dir: a.history_dir.clone(),
        keep: a.keep,
        sink_url: a.sink_url.clone(),
    };
    let mut all_ok = true;
    if let Some(path) = &a.replay {
        let opts = harness::replay_options(path)?;
        let r = harness::run(&opts, &env).await;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(r.ok);
    }
    for i in 0..a.runs {
        let mut opts = RunOptions::new(a.store, a.seed + i);
        opts.workers = a.workers;
        opts.shards = a.shards;
        opts.extra_faults = a.extra_faults;
        opts.every_class = !a.no_every_class;
        opts.rate = a.rate;
        opts.exactly_once = a.exactly_once;
        opts.wipes = a.wipes;
        let r = harness::run(&opts, &env).await;
        println!("{}", serde_json::to_string(&r)?);
        all_ok &= r.ok;
    }
    Ok(all_ok)
}
