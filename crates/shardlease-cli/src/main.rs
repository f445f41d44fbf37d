//! `shardlease`: the command line for the person on call. It reads and repairs a fleet's leases
//! and worker records on any store `shardlease::connect` accepts, and every write it makes goes
//! through the store's compare-and-set, the same contract the workers use, so a running fleet
//! notices it (see docs/operations.md).

mod demo;
#[cfg(feature = "kinesis")]
mod efo;
mod error;
#[cfg(feature = "dynamodb")]
mod import_kcl;
mod inspect;
mod observe;
mod output;
mod state;
mod store_url;
mod watch;
mod write;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::error::CliError;

const EXIT_CODES: &str = "\
Exit codes:
  0  success (for `status`: healthy)
  1  `status` found a problem: a stuck lease or a corrupt record
  2  bad command line or input (also an unknown store scheme; for `import-kcl`, a row that
     cannot be imported)
  3  the store (or the KCL table) failed or could not be reached
  4  refused for safety (the owner or worker is alive; for `import-kcl`, the KCL fleet is
     alive, or the target namespace holds other leases without --merge); --force overrides
     liveness
  5  a compare-and-set lost (the record changed meanwhile); nothing was written (for
     `import-kcl --merge`: a lease differs from the import and was left as it is)
  6  no such lease, worker or KCL table

Liveness: a worker is \"alive\" when its heartbeat beat moved between two listings of the
worker records taken --observe-ms apart on this machine's clock (a worker that appeared in
between counts as alive). No wall clocks are compared. Pick a window longer than the fleet's
heartbeat interval (2 s by default), or live workers will look dead.";

/// Inspect and repair the leases of a shardlease fleet.
#[derive(Parser, Debug)]
#[command(name = "shardlease", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Args, Debug)]
struct Global {
    /// The store URL, as `shardlease::connect` takes it (sqlite://leases.db, postgres://…,
    /// redis://…, memory://). Passwords in it are never printed.
    #[arg(long, env = "SHARDLEASE_STORE", global = true, hide_env_values = true)]
    store: Option<String>,
    /// The namespace (application). It is the URL's `?namespace=`: this flag adds it to the URL,
    /// and differing values in both are an error. Default: the URL's, else "default".
    #[arg(long, global = true)]
    namespace: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// How long to watch heartbeats to tell live workers from dead ones, in milliseconds
    /// [default: 3000; for `import-kcl`, how long it watches the KCL table: 12000].
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    observe_ms: Option<u64>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every lease: key, owner, epoch, checkpoint, state, claim, parents.
    Leases {
        /// Refresh in place every SECONDS seconds until interrupted.
        #[arg(long, value_name = "SECONDS",
              value_parser = clap::value_parser!(u64).range(1..=86_400))]
        watch: Option<u64>,
    },
    /// Every worker record: alive or dead as seen now, leases held, beats, last beat age.
    Workers,
    /// One summary, and an exit status for scripts (see "Exit codes").
    ///
    /// Observes the fleet for --failover-ms (instead of --observe-ms) and exits 1 when an active
    /// lease stayed unowned, or owned by a worker whose heartbeat did not move, with its record
    /// unchanged for that whole window, or when any record is corrupt.
    Status {
        /// The fleet's failover timeout in milliseconds: how long the observation lasts.
        #[arg(long, default_value_t = 10_000,
              value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        failover_ms: u64,
    },
    /// Free a lease so a worker takes it.
    ///
    /// An unowned lease: clears a pending claim, else nothing to do. A lease whose owner is not
    /// alive: cleared by compare-and-set (owner none, epoch + 1) so the fleet takes it at its
    /// checkpoint without waiting for the failover timeout. A lease whose owner is alive is
    /// refused unless --force: a live owner hands over only to a claiming worker, and a forced
    /// release fences it (its next checkpoint fails, it stops; records it processed after its
    /// last checkpoint are processed again).
    Release {
        /// The lease key.
        key: String,
        /// Release even though the owner is alive.
        #[arg(long)]
        force: bool,
    },
    /// Set a lease's checkpoint (prints old and new).
    ///
    /// POSITION: TRIM_HORIZON, LATEST, AT_TIMESTAMP(MILLIS), SHARD_END, or a sequence number
    /// (SEQ or SEQ.SUB). Refused while the owner is alive unless --force. An owned lease is
    /// released at the new checkpoint (owner none, epoch + 1), so its owner is fenced and whoever
    /// takes it next starts there.
    ResetCheckpoint {
        /// The lease key.
        key: String,
        /// The new checkpoint.
        position: String,
        /// Reset even though the owner is alive.
        #[arg(long)]
        force: bool,
    },
    /// Remove a dead worker's record (conditional on the beat seen, so a worker that beats
    /// meanwhile keeps it).
    DeleteWorker {
        /// The worker id.
        id: String,
        /// Remove it even though it looks alive (it writes it again on its next heartbeat).
        #[arg(long)]
        force: bool,
    },
    /// A live terminal view of the namespace: workers, leases, recent changes and health,
    /// refreshed every interval until `q`, Esc or Ctrl-C.
    ///
    /// Each refresh lists the worker records; the leases are listed only when a worker came,
    /// left, died or changed owners (its record's change count moved), and every
    /// --list-every-ms for checkpoint ages. A worker is dead once its beat stood still for
    /// --failover-ms on this machine's clock. With --once, it watches for --observe-ms and
    /// prints one frame as text instead (no terminal needed).
    Watch {
        /// Time between refreshes, in milliseconds.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..=3_600_000))]
        interval_ms: u64,
        /// The fleet's failover timeout in milliseconds: a beat still for that long is dead.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        failover_ms: u64,
        /// List the leases at least this often, in milliseconds, to refresh checkpoint ages
        /// (0: only when something changed).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
        list_every_ms: u64,
        /// Print one frame as text after watching for --observe-ms, instead of the live view.
        #[arg(long)]
        once: bool,
        /// Width of the --once frame in columns.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(40..=1000))]
        width: u16,
        /// Height of the --once frame in rows (default: tall enough for everything, up to 200).
        #[arg(long, value_parser = clap::value_parser!(u16).range(12..=1000))]
        height: Option<u16>,
    },
    /// Run a small fleet on the store: workers reading an in-memory stream, printing who holds
    /// how many leases every second.
    Demo {
        /// Workers in this process.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=64))]
        workers: u64,
        /// Shards of the in-memory stream.
        #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        shards: u64,
        /// How long to run, in seconds (the workers then leave gracefully).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        seconds: u64,
        /// Heartbeat interval in milliseconds; the other timings scale with it.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
        heartbeat_ms: u64,
    },
    /// Import a KCL lease table (Java KCL 2.x/3.x or vmware-go-kcl, on DynamoDB) into the
    /// store: unowned leases at the exact checkpoints, finished ones for SHARD_END.
    ///
    /// Refuses while the KCL fleet is alive (a lease's leaseCounter / LeaseTimeout, checkpoint
    /// or owner moved between two scans --observe-ms apart, 12000 by default: longer than the
    /// KCL's failover time) unless --force, and a namespace holding other leases unless
    /// --merge. Running it again writes nothing. See docs/migrating-from-kcl.md.
    #[cfg(feature = "dynamodb")]
    ImportKcl(import_kcl::ImportKclArgs),
    /// Kinesis enhanced fan-out: stream consumers (needs no --store).
    #[cfg(feature = "kinesis")]
    #[command(subcommand)]
    Efo(efo::EfoCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shardlease: {e}");
            e.exit_code()
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let g = cli.global;
    #[cfg(feature = "kinesis")]
    if let Command::Efo(cmd) = &cli.command {
        return efo::run(cmd, g.json).await;
    }
    let Some(url) = g.store.as_deref() else {
        return Err(CliError::Usage(
            "no store given: pass --store URL or set SHARDLEASE_STORE".into(),
        ));
    };
    let target = store_url::open(url, g.namespace.as_deref()).await?;
    let observe = Duration::from_millis(g.observe_ms.unwrap_or(3000));
    match cli.command {
        Command::Leases { watch } => inspect::leases(&target, observe, g.json, watch).await,
        Command::Workers => inspect::workers(&target, observe, g.json).await,
        Command::Status { failover_ms } => {
            inspect::status(&target, Duration::from_millis(failover_ms), g.json).await
        }
        Command::Release { key, force } => {
            write::release(&target, observe, g.json, &key, force).await
        }
        Command::ResetCheckpoint { key, position, force } => {
            write::reset_checkpoint(&target, observe, g.json, &key, &position, force).await
        }
        Command::DeleteWorker { id, force } => {
            write::delete_worker(&target, observe, g.json, &id, force).await
        }
        Command::Watch { interval_ms, failover_ms, list_every_ms, once, width, height } => {
            let opts = watch::Options {
                interval: Duration::from_millis(interval_ms),
                failover: Duration::from_millis(failover_ms),
                list_every: (list_every_ms > 0).then(|| Duration::from_millis(list_every_ms)),
                once: once.then_some(observe),
                width,
                height,
            };
            watch::run(&target, opts).await
        }
        Command::Demo { workers, shards, seconds, heartbeat_ms } => {
            demo::run(&target, workers, shards, seconds, heartbeat_ms).await
        }
        #[cfg(feature = "dynamodb")]
        Command::ImportKcl(args) => {
            let window = g.observe_ms.unwrap_or(import_kcl::DEFAULT_OBSERVE_MS);
            import_kcl::run(&target, &args, Duration::from_millis(window), g.json).await
        }
        #[cfg(feature = "kinesis")]
        Command::Efo(cmd) => efo::run(&cmd, g.json).await, // (answered above, before the store)
    }
}
