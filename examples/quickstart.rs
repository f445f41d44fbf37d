//! The quickstart: a fleet of workers sharing the shards of an in-memory stream through leases,
//! with no server to install.
//!
//! ```text
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --shards 8 --workers 2
//! ```
//!
//! A producer writes a few hundred records per second to a 32-shard in-memory stream while four
//! workers share the shards. The demo then stops one worker gracefully, crashes another, adds a
//! new one and splits a shard; after each step it waits until the leases are balanced again (every
//! active lease owned by a running worker, shares within one) and says how long that took. Every
//! record delivered to a processor is counted, so the summary shows that nothing was lost and which
//! step, if any, delivered a record twice. Logging goes to stderr; set `RUST_LOG=info` to watch the
//! runtime's own decisions.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use clap::Parser;
use shardlease::store::LeaseStore;
use shardlease::{
    Config, LeaseKey, MemorySource, Position, ProcessorFactory, ShardSource, Worker, WorkerHandle,
    WorkerId,
};
use shardlease_examples::cli::FleetArgs;
use shardlease_examples::{poll_until, DeliveryLog, Distribution};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing_subscriber::EnvFilter;

/// Records written per producer tick (every 10 ms): about 300 records per second.
const RECORDS_PER_TICK: u64 = 3;

/// A fleet of workers shares the shards of an in-memory stream through leases; the demo stops one
/// worker gracefully, crashes one, adds one and splits a shard, and shows how the leases move.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "quickstart",
    after_help = "Logs go to stderr, filtered by RUST_LOG (default: warn).",
    mut_arg("store", |a| a.default_value("memory://?namespace=quickstart")),
    mut_arg("workers", |a| a.default_value("4").help("Workers started at first")
        .value_parser(clap::value_parser!(u8).range(2..=64))),
)]
struct Args {
    #[command(flatten)]
    fleet: FleetArgs,
}

/// Why the demo stopped early.
#[derive(Debug)]
enum Failure {
    /// A bad flag value discovered late (an unusable store URL): exit code 2.
    Usage(String),
    /// Anything else: exit code 1.
    Run(String),
    /// Ctrl-C: exit code 130.
    Interrupted,
}

impl From<shardlease::Error> for Failure {
    fn from(e: shardlease::Error) -> Self {
        Failure::Run(e.to_string())
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Run(e)
    }
}

/// One step of the demo and what it cost.
struct Transition {
    what: String,
    took: Duration,
    moved: Option<usize>,
    twice: u64,
}

/// Everything the demo shares between its steps.
struct Demo {
    args: Args,
    template: Config,
    store: Arc<dyn LeaseStore>,
    source: MemorySource,
    log: DeliveryLog,
    factory: Arc<dyn ProcessorFactory>,
    workers: Mutex<Vec<Arc<WorkerHandle>>>,
    started: AtomicU32,
    t0: Instant,
    /// How often conditions are checked.
    poll: Duration,
    /// How long any one step may take before the demo gives up.
    deadline: Duration,
    /// How long the fleet is watched, steady, after each step.
    dwell: Duration,
    transitions: Mutex<Vec<Transition>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

impl Demo {
    fn workers(&self) -> Vec<Arc<WorkerHandle>> {
        lock(&self.workers).clone()
    }

    fn running(&self) -> Vec<Arc<WorkerHandle>> {
        self.workers().into_iter().filter(|h| h.is_running()).collect()
    }

    fn start_worker(&self) -> Result<WorkerId, Failure> {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let cfg = self.template.clone().with_worker_id(format!("w{n}"));
        let source: Arc<dyn ShardSource> = Arc::new(self.source.clone());
        let handle =
            Worker::builder(cfg, self.store.clone(), source, self.factory.clone()).build()?.start();
        let id = handle.id();
        lock(&self.workers).push(Arc::new(handle));
        Ok(id)
    }

    async fn snapshot(&self) -> Result<Distribution, Failure> {
        Ok(Distribution::read(self.store.as_ref(), &self.workers()).await?)
    }

    fn status(&self, d: &Distribution) -> String {
        format!(
            "t={:>5.1}s  {}  processed={}/{}",
            self.t0.elapsed().as_secs_f64(),
            d.shares_line(),
            self.log.distinct(),
            self.source.produced()
        )
    }

    /// Polls until the fleet is balanced and `also` holds, printing the distribution whenever it
    /// changes (at most every 200 ms) and at least once a second.
    async fn until_balanced(
        &self,
        also: &(dyn Fn(&Distribution) -> bool + Sync),
    ) -> Result<Distribution, Failure> {
        let last: Mutex<(Option<String>, Instant)> = Mutex::new((None, Instant::now()));
        let last = &last;
        let found = poll_until(
            "every active lease owned by a running worker, shares within one",
            self.deadline,
            self.poll,
            || async move {
                let d = self.snapshot().await.ok()?;
                let done = d.is_balanced() && also(&d);
                let mut last = lock(last);
                let line = d.shares_line();
                let changed = last.0.as_deref() != Some(line.as_str());
                let since = last.1.elapsed();
                if last.0.is_none()
                    || (done && (changed || since >= Duration::from_millis(200)))
                    || (changed && since >= Duration::from_millis(200))
                    || since >= Duration::from_secs(1)
                {
                    println!("  {}", self.status(&d));
                    *last = (Some(line), Instant::now());
                }
                done.then_some(d)
            },
        )
        .await;
        match found {
            Ok(d) => Ok(d),
            Err(e) => {
                let shown = match self.snapshot().await {
                    Ok(d) => self.status(&d),
                    Err(_) => "(the store could not be read)".to_owned(),
                };
                Err(Failure::Run(format!("{e}\n  last seen: {shown}")))
            }
        }
    }

    /// Watches the balanced fleet for the dwell time (a line per second) and reports whether any
    /// lease changed owner meanwhile.
    async fn dwell(&self, from: &Distribution) -> Result<(), Failure> {
        let end = Instant::now() + self.dwell;
        let step = Duration::from_secs(1).min(self.dwell);
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            tokio::time::sleep(step.min(end - now)).await;
            if Instant::now() + self.poll < end {
                println!("  {}", self.status(&self.snapshot().await?));
            }
        }
        let after = self.snapshot().await?;
        println!("  {}", self.status(&after));
        match from.epoch_bumps(&after) {
            0 => println!("  steady for {}: no lease changed owner", secs(self.dwell)),
            n => println!("  {n} ownership changes during the next {}", secs(self.dwell)),
        }
        Ok(())
    }

    /// Runs one step: `act`, then waits until balanced (and `also`), then watches it steady.
    async fn step<A, Fut>(
        &self,
        what: String,
        explain: &str,
        act: A,
        also: &(dyn Fn(&Distribution) -> bool + Sync),
    ) -> Result<(), Failure>
    where
        A: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), Failure>>,
    {
        println!();
        println!("== {what}");
        if !explain.is_empty() {
            println!("   {explain}");
        }
        let before = self.snapshot().await?;
        let twice_before = self.log.redelivered();
        let t = Instant::now();
        act().await?;
        let after = self.until_balanced(also).await?;
        let took = t.elapsed();
        println!("  -> balanced {} after the step began", secs(took));
        self.dwell(&after).await?;
        let moved = (!before.leases.is_empty()).then(|| before.owners_changed(&after));
        let twice = self.log.redelivered().saturating_sub(twice_before);
        lock(&self.transitions).push(Transition { what, took, moved, twice });
        Ok(())
    }

    async fn scenario(&self) -> Result<(), Failure> {
        let cfg = &self.template;
        println!("shardlease quickstart");
        println!(
            "  stream:  in-memory, {} shards, about {} records/s",
            self.args.fleet.shards,
            RECORDS_PER_TICK * 100
        );
        println!("  store:   {}", shardlease::redact_url(&self.args.fleet.store));
        println!(
            "  timing:  heartbeat {} ms, failover timeout {}, balance pass every {}, claim timeout {}",
            cfg.heartbeat_interval().as_millis(),
            secs(cfg.failover_timeout()),
            secs(cfg.balance_interval()),
            secs(cfg.claim_timeout())
        );

        let all_active_seen = |d: &Distribution| d.active > 0;
        let n = usize::from(self.args.fleet.workers);
        self.step(
            format!("start {n} workers on {} shards", self.args.fleet.shards),
            "each takes its whole share in one pass; claims even out any excess",
            || async {
                for _ in 0..n {
                    self.start_worker()?;
                }
                Ok(())
            },
            &all_active_seen,
        )
        .await?;

        let victim = self.running().first().cloned();
        if let Some(h) = victim {
            self.step(
                format!("stop {} gracefully", h.id()),
                "it checkpoints and releases its leases; peers take them at their next pass",
                || async move {
                    let report = h.shutdown().await;
                    if !report.is_clean() {
                        return Err(
                            format!("the graceful stop cut processors short: {report:?}").into()
                        );
                    }
                    Ok(())
                },
                &all_active_seen,
            )
            .await?;
        }

        if self.running().len() < 2 {
            self.add_worker("only one worker left, so one joins before the crash").await?;
        }
        let victim = self.running().first().cloned();
        if let Some(h) = victim {
            self.step(
                format!("crash {}", h.id()),
                &format!(
                    "no release: peers take its leases once its heartbeat has stood still for \
                     the failover timeout ({})",
                    secs(cfg.failover_timeout())
                ),
                || async move {
                    h.crash();
                    Ok(())
                },
                &all_active_seen,
            )
            .await?;
        }

        self.add_worker("it takes free leases, then claims from the most loaded workers").await?;

        let Some(shard) = self.source.open_shards().first().map(|s| s.id.clone()) else {
            return Err(Failure::Run("the stream has no open shard to split".into()));
        };
        let children: Mutex<Vec<LeaseKey>> = Mutex::new(Vec::new());
        let children = &children;
        let parent = shard.clone();
        let split_done = move |d: &Distribution| {
            let kids = lock(children);
            let parent_done = d.finished.contains(&parent) || !d.leases.contains_key(&parent);
            parent_done && !kids.is_empty() && kids.iter().all(|k| d.leases.contains_key(k))
        };
        self.step(
            format!("split {shard}"),
            "the parent is read to its end first; then its two children become active leases",
            || async {
                let (low, high) = self.source.split(&shard)?;
                println!("   children: {low}, {high}");
                lock(children).extend([low, high]);
                Ok(())
            },
            &split_done,
        )
        .await?;
        Ok(())
    }

    async fn add_worker(&self, explain: &str) -> Result<(), Failure> {
        let next = format!("w{}", self.started.load(Ordering::SeqCst) + 1);
        self.step(
            format!("add {next}"),
            explain,
            || async { self.start_worker().map(|_| ()) },
            &|d: &Distribution| d.active > 0,
        )
        .await
    }

    /// Waits until every record written so far has been processed at least once.
    async fn drain(&self) -> Result<Duration, Failure> {
        let t = Instant::now();
        let produced = self.source.produced();
        poll_until("every produced record to be processed", self.deadline, self.poll, || async {
            (self.log.distinct() >= produced).then_some(())
        })
        .await?;
        Ok(t.elapsed())
    }

    fn summary(&self, drained: Duration) {
        let produced = self.source.produced();
        let distinct = self.log.distinct();
        let twice = self.log.redelivered();
        let transitions = lock(&self.transitions);
        println!();
        println!("== summary");
        println!("  records produced:  {produced}");
        println!(
            "  records processed: {distinct} distinct{}",
            if distinct == produced { " (every one)" } else { " (some missing!)" }
        );
        println!("  processed twice:   {twice}");
        println!("  last records processed {} after the producer stopped", secs(drained));
        println!();
        println!(
            "  {:<34} {:>8}  {:>12}  {:>15}",
            "step", "took", "leases moved", "processed twice"
        );
        for t in transitions.iter() {
            let moved = t.moved.map_or_else(|| "-".to_owned(), |m| m.to_string());
            println!("  {:<34} {:>8}  {:>12}  {:>15}", t.what, secs(t.took), moved, t.twice);
        }
        println!();
        let crash_twice: u64 =
            transitions.iter().filter(|t| t.what.starts_with("crash")).map(|t| t.twice).sum();
        let graceful_twice = twice.saturating_sub(crash_twice);
        println!(
            "  the graceful steps (start, stop, join, split) processed {graceful_twice} records \
             twice (expected 0: an owner checkpoints before it lets a lease go)."
        );
        println!(
            "  the crash processed {crash_twice} records twice (a crash may cause some: a batch \
             processed but not yet checkpointed when the worker died is read again by the new \
             owner)."
        );
    }

    /// Shuts every running worker down at once and checks that no active lease is left owned.
    async fn shutdown_all(&self) -> Result<(), Failure> {
        let t = Instant::now();
        let running = self.running();
        let n = running.len();
        let mut set = JoinSet::new();
        for h in running {
            set.spawn(async move { h.shutdown().await });
        }
        let mut first_error = None;
        while let Some(joined) = set.join_next().await {
            let r =
                joined.map_err(|e| e.to_string()).and_then(|r| r.record_error.map_or(Ok(()), Err));
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(Failure::Run(format!("a worker did not shut down cleanly: {e}")));
        }
        let d = self.snapshot().await?;
        let still_owned = d.active - d.unowned;
        println!(
            "\nshut down {n} workers gracefully in {} ms; active leases still owned: {still_owned}",
            t.elapsed().as_millis()
        );
        Ok(())
    }
}

/// Writes records with varied partition keys until told to stop.
fn spawn_producer(source: MemorySource, mut stop: oneshot::Receiver<()>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u64 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    for _ in 0..RECORDS_PER_TICK {
                        let customer = n.wrapping_mul(2_654_435_761) % 10_007;
                        source.put(&format!("customer-{customer}"), format!("order {n}"));
                        n += 1;
                    }
                }
                _ = &mut stop => return,
            }
        }
    })
}

/// Completes on Ctrl-C; never, if the signal handler cannot be installed.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn run(args: Args) -> Result<(), Failure> {
    let store = shardlease::connect(&args.fleet.store).await.map_err(|e| match e {
        shardlease::Error::Config(m) => Failure::Usage(format!("--store: {m}")),
        other => Failure::Run(format!("connecting to the store failed: {other}")),
    })?;
    if !store.list_leases().await?.items.is_empty() {
        return Err(Failure::Usage(format!(
            "the namespace of {} already holds leases (from an earlier run?); pick a fresh one \
             with ?namespace=NAME",
            shardlease::redact_url(&args.fleet.store)
        )));
    }
    // The namespace the store was opened in (the URL's, read the way `connect` reads it).
    let namespace = shardlease::store::url::namespace_of(&args.fleet.store)
        .map_err(|e| Failure::Usage(format!("--store: {e}")))?;
    let template = Config::new(namespace)?
        .with_heartbeat(args.fleet.heartbeat)
        .with_initial_position(Position::TrimHorizon);
    template.validate().map_err(|e| Failure::Usage(e.to_string()))?;
    let source = MemorySource::new(usize::from(args.fleet.shards));
    let log = DeliveryLog::new();
    let hb = args.fleet.heartbeat;
    let demo = Demo {
        factory: log.factory(),
        log,
        template,
        store,
        source: source.clone(),
        workers: Mutex::new(Vec::new()),
        started: AtomicU32::new(0),
        t0: Instant::now(),
        poll: (hb / 4).clamp(Duration::from_millis(5), Duration::from_millis(250)),
        deadline: Duration::from_secs(5) + hb * 40,
        dwell: hb * 10,
        transitions: Mutex::new(Vec::new()),
        args,
    };

    let (stop_producer, stopped) = oneshot::channel();
    let producer = spawn_producer(source, stopped);
    let outcome = tokio::select! {
        r = async {
            demo.scenario().await?;
            let _ = stop_producer.send(());
            let _ = producer.await;
            let drained = demo.drain().await?;
            demo.summary(drained);
            Ok(())
        } => r,
        _ = interrupted() => {
            println!("\ninterrupted; shutting down gracefully");
            Err(Failure::Interrupted)
        }
    };
    let shut = demo.shutdown_all().await;
    outcome.and(shut)
}

#[tokio::main]
async fn main() -> ExitCode {
    // `--help` prints and exits 0; a bad flag prints the mistake and exits 2.
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("quickstart: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Run(m)) => {
            eprintln!("\nquickstart: FAILED: {m}");
            ExitCode::FAILURE
        }
        Err(Failure::Interrupted) => ExitCode::from(130),
    }
}
