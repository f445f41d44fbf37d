//! The harness of one fault run: starts the store (a private server where the nemesis may
//! restart it), one proxy per worker slot, the consumer processes and the producer; plays the
//! schedule; heals everything and lets the fleet catch up; stops it gracefully; runs the checker
//! and returns the one-line report. A failed run leaves a history file that replays it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shardlease::BoxError;
use tokio::process::{Child, Command};

use crate::checker::{check, check_exactly_once, FinalLease, Verdict};
use crate::events::{position_label, read_lines, ConsumerEvent, Produced};
use crate::proxy::{Mode, Proxy};
use crate::schedule::{Fault, Schedule};
use crate::stores::{Store, StoreKind};

/// How a run is set up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunOptions {
    /// The seed the schedule is drawn from.
    pub seed: u64,
    /// The store.
    pub store: StoreKind,
    /// Consumer processes at the start.
    pub workers: usize,
    /// Shards of the stream at the start.
    pub shards: i32,
    /// Draw every fault class the store allows once.
    pub every_class: bool,
    /// Faults drawn on top.
    pub extra_faults: usize,
    /// The schedule to play instead of drawing one (a replay).
    pub schedule: Option<Schedule>,
    /// Records per second.
    pub rate: u32,
    /// The workers' heartbeat, milliseconds.
    pub heartbeat_ms: u64,
    /// The workers' failover timeout, milliseconds.
    pub failover_ms: u64,
    /// How long the fleet may take to catch up after the schedule, seconds.
    pub settle_secs: u64,
    /// Write the records through the effectively-once SQL sink ([`Env::sink_url`]) and hold the
    /// run to exactly once.
    #[serde(default)]
    pub exactly_once: bool,
    /// Draw the faults that lose the store's data too (`store_wipe`).
    #[serde(default)]
    pub wipes: bool,
}

impl RunOptions {
    /// Defaults for `store` and `seed`: 3 workers, 4 shards, every class once plus 2 more.
    pub fn new(store: StoreKind, seed: u64) -> Self {
        RunOptions {
            seed,
            store,
            workers: 3,
            shards: 4,
            every_class: true,
            extra_faults: 2,
            schedule: None,
            rate: 40,
            heartbeat_ms: 250,
            failover_ms: 2000,
            settle_secs: 120,
            exactly_once: false,
            wipes: false,
        }
    }

    /// The schedule this run plays.
    pub fn schedule(&self) -> Schedule {
        self.schedule.clone().unwrap_or_else(|| {
            crate::schedule::draw(
                self.seed,
                self.store,
                self.workers,
                self.failover_ms,
                self.every_class,
                self.extra_faults,
                self.wipes,
            )
        })
    }
}

/// Where the run finds its programs and services.
#[derive(Clone, Debug)]
pub struct Env {
    /// The `shardlease-chaos` binary (its `consumer` and `producer` subcommands).
    pub exe: PathBuf,
    /// The Kinesis emulator.
    pub endpoint: String,
    /// Where history files of failed runs go.
    pub history_dir: PathBuf,
    /// Keep the run's directory (outputs, logs) even when it passed.
    pub keep: bool,
    /// The PostgreSQL database of the effectively-once sink (runs with
    /// [`RunOptions::exactly_once`]).
    pub sink_url: Option<String>,
}

/// The one-line report of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The store.
    pub store: String,
    /// The faults played, in order.
    pub schedule: Vec<String>,
    /// How many faults.
    pub faults: usize,
    /// Records acknowledged by the stream.
    pub records: usize,
    /// Of those, never processed.
    pub lost: usize,
    /// Extra processings.
    pub duplicates: usize,
    /// Checkpoints that moved backwards.
    pub regressions: usize,
    /// Checkpoints accepted from a non-owner.
    pub foreign_checkpoints: usize,
    /// Accepted checkpoints.
    pub checkpoints: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Whether every promise held.
    pub ok: bool,
    /// Held to exactly once (the effectively-once sink): a duplicate fails the run.
    #[serde(default)]
    pub exactly_once: bool,
    /// Wipes of the store played: with one, regressions and foreign checkpoints are reported,
    /// not failed.
    #[serde(default)]
    pub wipes: usize,
    /// The harness's own failure (setup, a fault it could not inflict), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The history file of a failed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

/// What a history file holds: enough to replay the run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct History {
    /// The options, the schedule included.
    pub options: RunOptions,
    /// The report.
    pub report: Report,
    /// The checker's examples.
    pub examples: Vec<String>,
    /// The run's directory (outputs and logs), kept.
    pub dir: String,
}

/// Reads a history file into the options that replay it.
pub fn replay_options(path: &Path) -> Result<RunOptions, BoxError> {
    let h: History = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut o = h.options;
    if o.schedule.is_none() {
        o.schedule = Some(o.schedule());
    }
    Ok(o)
}

struct Slot {
    proxy: Option<Proxy>,
    worker_id: String,
    incarnation: u32,
    child: Option<Child>,
}

struct Fleet {
    exe: PathBuf,
    dir: PathBuf,
    namespace: String,
    stream: String,
    endpoint: String,
    heartbeat_ms: u64,
    failover_ms: u64,
    sink_url: Option<String>,
    /// libfaketime, when the schedule steps a clock: every consumer runs under it, with its wall
    /// clock read from its slot's file in `dir/clock`.
    faketime: Option<PathBuf>,
    slots: Vec<Slot>,
    fresh: u32,
}

/// libfaketime's library: `SHARDLEASE_CHAOS_FAKETIME`, else where Debian's `faketime` package
/// puts it (scripts/build-deps.sh installs it).
fn faketime_lib() -> Result<PathBuf, BoxError> {
    if let Some(p) = std::env::var_os("SHARDLEASE_CHAOS_FAKETIME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    for dir in
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/lib"]
    {
        let p = Path::new(dir).join("faketime/libfaketime.so.1");
        if p.exists() {
            return Ok(p);
        }
    }
    Err("the clock fault needs libfaketime (Debian's faketime package: scripts/build-deps.sh \
         installs it; or set SHARDLEASE_CHAOS_FAKETIME)"
        .into())
}

fn signal(pid: Option<u32>, sig: &str) -> Result<(), BoxError> {
    let pid = pid.ok_or("the process has exited")?;
    let st = std::process::Command::new("kill").args(["-s", sig, &pid.to_string()]).status()?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("kill -s {sig} {pid} failed").into())
    }
}

async fn stop_gracefully(child: &mut Child, within: Duration) {
    if signal(child.id(), "TERM").is_ok()
        && tokio::time::timeout(within, child.wait()).await.is_ok()
    {
        return;
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

impl Fleet {
    async fn add_slot(&mut self, store: &Store) -> Result<usize, BoxError> {
        let proxy = match store.upstream() {
            Some(up) if store.kind().networked() => Some(Proxy::start(up).await?),
            _ => None,
        };
        let i = self.slots.len();
        if self.faketime.is_some() {
            std::fs::write(self.clock_file(i), "+0\n")?;
        }
        self.slots.push(Slot { proxy, worker_id: format!("w{i}"), incarnation: 0, child: None });
        self.spawn(i, store)?;
        Ok(i)
    }

    fn clock_file(&self, i: usize) -> PathBuf {
        self.dir.join("clock").join(format!("w{i}.spec"))
    }

    fn spawn(&mut self, i: usize, store: &Store) -> Result<(), BoxError> {
        let clock = self.clock_file(i);
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        let url = store.url(slot.proxy.as_ref().map(Proxy::port))?;
        let name = format!("{}-{}", slot.worker_id, slot.incarnation);
        let log = std::fs::File::create(self.dir.join("logs").join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("consumer");
        if let Some(sink) = &self.sink_url {
            cmd.args(["--sink-url", sink]);
        }
        if let Some(lib) = &self.faketime {
            // The wall clock comes from the slot's file, read again every second; the monotonic
            // clock (timers, the runtime's liveness) is left alone, as an NTP step leaves it.
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", &clock)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let child = cmd
            .args(["--store", &url, "--namespace", &self.namespace])
            .args(["--stream", &self.stream, "--endpoint", &self.endpoint])
            .args(["--worker-id", &slot.worker_id])
            .arg("--out")
            .arg(self.dir.join("out").join(format!("{name}.jsonl")))
            .args(["--heartbeat-ms", &self.heartbeat_ms.to_string()])
            .args(["--failover-ms", &self.failover_ms.to_string()])
            .env("RUST_LOG", std::env::var("CHAOS_CONSUMER_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        slot.child = Some(child);
        Ok(())
    }

    fn child(&mut self, i: usize) -> Result<&mut Child, BoxError> {
        self.slots
            .get_mut(i)
            .and_then(|s| s.child.as_mut())
            .ok_or_else(|| format!("worker slot {i} has no process").into())
    }

    async fn inflict(
        &mut self,
        f: &Fault,
        store: &mut Store,
        kin: &KinCtx,
    ) -> Result<(), BoxError> {
        let sleep = |ms: u64| tokio::time::sleep(Duration::from_millis(ms));
        match f {
            Fault::Kill { slot, fresh_id, down_ms } => {
                let c = self.child(*slot)?;
                let _ = c.start_kill();
                let _ = c.wait().await;
                sleep(*down_ms).await;
                if *fresh_id {
                    self.fresh += 1;
                    self.slots[*slot].worker_id = format!("w{slot}f{}", self.fresh);
                }
                self.spawn(*slot, store)?;
            }
            Fault::Pause { slot, ms } => {
                let pid = self.child(*slot)?.id();
                signal(pid, "STOP")?;
                sleep(*ms).await;
                signal(pid, "CONT")?;
            }
            Fault::Term { slot, down_ms } => {
                stop_gracefully(self.child(*slot)?, Duration::from_secs(30)).await;
                sleep(*down_ms).await;
                self.spawn(*slot, store)?;
            }
            Fault::Join => {
                self.add_slot(store).await?;
            }
            Fault::Split => {
                crate::kinesis::split(&kin.client, &kin.stream).await?;
            }
            Fault::Merge => {
                crate::kinesis::merge(&kin.client, &kin.stream).await?;
            }
            Fault::Partition { slot, kind, dir, ms } => {
                let proxy = self.slots[*slot].proxy.as_ref().ok_or("this store has no proxy")?;
                proxy.set(Mode { cut: Some((*kind, *dir)) });
                sleep(*ms).await;
                proxy.set(Mode::default());
            }
            Fault::StoreRestart { down_ms } => {
                store.crash().await?;
                sleep(*down_ms).await;
                store.restart().await?;
            }
            Fault::Clock { slot, offset_s, ms } => {
                let file = self.clock_file(*slot);
                std::fs::write(&file, format!("{offset_s:+}\n"))?;
                sleep(*ms).await;
                std::fs::write(&file, "+0\n")?;
            }
            Fault::StoreWipe { down_ms } => {
                store.crash().await?;
                store.forget()?;
                sleep(*down_ms).await;
                store.restart().await?;
                // A DynamoDB wipe takes the table too; bring back the table (not its items), as
                // an operator would, so that what is judged is the loss of the leases.
                if store.kind() == crate::stores::StoreKind::Dynamodb {
                    shardlease::connect_namespace(&store.url(None)?, &self.namespace).await?;
                }
            }
        }
        Ok(())
    }

    fn outputs(&self) -> Vec<ConsumerEvent> {
        let mut all = Vec::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.join("out")) {
            for e in rd.flatten() {
                if let Ok(mut v) = read_lines::<ConsumerEvent>(&e.path()) {
                    all.append(&mut v);
                }
            }
        }
        all
    }

    async fn stop_all(&mut self) {
        let mut children: Vec<Child> =
            self.slots.iter_mut().filter_map(|s| s.child.take()).collect();
        for c in &children {
            // A paused process must run to leave.
            let _ = signal(c.id(), "CONT");
            let _ = signal(c.id(), "TERM");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for c in &mut children {
            if tokio::time::timeout_at(deadline, c.wait()).await.is_err() {
                let _ = c.start_kill();
                let _ = c.wait().await;
            }
        }
    }
}

struct KinCtx {
    client: shardlease::kinesis::aws_sdk_kinesis::Client,
    stream: String,
}

/// Runs one fault run and returns its report (a harness error is reported, not returned).
pub async fn run(opts: &RunOptions, env: &Env) -> Report {
    let start = Instant::now();
    let schedule = opts.schedule();
    let mut report = Report {
        seed: opts.seed,
        store: opts.store.name().into(),
        schedule: schedule.steps.iter().map(|s| s.fault.label()).collect(),
        faults: schedule.steps.len(),
        records: 0,
        lost: 0,
        duplicates: 0,
        regressions: 0,
        foreign_checkpoints: 0,
        checkpoints: 0,
        seconds: 0.0,
        ok: false,
        exactly_once: opts.exactly_once,
        wipes: schedule.steps.iter().filter(|s| matches!(s.fault, Fault::StoreWipe { .. })).count(),
        error: None,
        history: None,
    };
    let dir = match tempfile::Builder::new().prefix("shardlease-chaos-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            report.error = Some(format!("temp dir: {e}"));
            return report;
        }
    };
    let result = run_in(opts, env, &schedule, dir.path()).await;
    report.seconds = (start.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    let examples = match result {
        Ok(mut v) => {
            v.wiped = report.wipes > 0;
            report.records = v.records;
            report.lost = v.lost;
            report.duplicates = v.duplicates;
            report.regressions = v.regressions;
            report.foreign_checkpoints = v.foreign_checkpoints;
            report.checkpoints = v.checkpoints;
            report.ok = v.ok();
            v.examples
        }
        Err(e) => {
            report.error = Some(e.to_string());
            Vec::new()
        }
    };
    if !report.ok || env.keep {
        let kept = dir.keep();
        if !report.ok {
            let mut opts = opts.clone();
            opts.schedule = Some(schedule);
            let _ = std::fs::create_dir_all(&env.history_dir);
            let path = env.history_dir.join(format!(
                "chaos-{}-{}-{}.json",
                opts.store.name(),
                opts.seed,
                std::process::id()
            ));
            let h = History {
                options: opts,
                report: report.clone(),
                examples,
                dir: kept.to_string_lossy().into_owned(),
            };
            if let Ok(text) = serde_json::to_string_pretty(&h) {
                if std::fs::write(&path, text).is_ok() {
                    report.history = Some(path.to_string_lossy().into_owned());
                }
            }
        }
    }
    report
}

async fn run_in(
    opts: &RunOptions,
    env: &Env,
    schedule: &Schedule,
    dir: &Path,
) -> Result<Verdict, BoxError> {
    std::fs::create_dir_all(dir.join("out"))?;
    std::fs::create_dir_all(dir.join("logs"))?;
    let tag = format!("{}-{:08x}", opts.seed, rand::random::<u32>());
    let stream = format!("chaos-{tag}");
    let kin = KinCtx { client: crate::kinesis::client(&env.endpoint), stream: stream.clone() };
    crate::kinesis::create_stream(&kin.client, &stream, opts.shards).await?;
    let mut store = Store::start(opts.store, &dir.join("store")).await?;
    let result = fleet_run(opts, env, schedule, dir, &kin, &mut store, &tag).await;
    store.stop().await;
    crate::kinesis::delete_stream(&kin.client, &stream).await;
    result
}

async fn fleet_run(
    opts: &RunOptions,
    env: &Env,
    schedule: &Schedule,
    dir: &Path,
    kin: &KinCtx,
    store: &mut Store,
    tag: &str,
) -> Result<Verdict, BoxError> {
    let namespace = format!("chaos-{tag}");
    // Create the schema (and DynamoDB table) once before the fleet races to.
    let direct = store.url(None)?;
    shardlease::connect_namespace(&direct, &namespace).await?;
    let sink = match (opts.exactly_once, &env.sink_url) {
        (false, _) => None,
        (true, None) => {
            return Err("an exactly-once run needs the sink's PostgreSQL database: set \
                        SHARDLEASE_TEST_POSTGRES_URL or pass --sink-url"
                .into())
        }
        (true, Some(url)) => {
            let pool = crate::sink::connect(url).await?;
            crate::sink::create_table(&pool).await?;
            Some(pool)
        }
    };
    let mut fleet = Fleet {
        exe: env.exe.clone(),
        dir: dir.to_path_buf(),
        namespace: namespace.clone(),
        stream: kin.stream.clone(),
        endpoint: env.endpoint.clone(),
        heartbeat_ms: opts.heartbeat_ms,
        failover_ms: opts.failover_ms,
        sink_url: if opts.exactly_once { env.sink_url.clone() } else { None },
        faketime: if schedule.steps.iter().any(|s| matches!(s.fault, Fault::Clock { .. })) {
            std::fs::create_dir_all(dir.join("clock"))?;
            Some(faketime_lib()?)
        } else {
            None
        },
        slots: Vec::new(),
        fresh: 0,
    };
    for _ in 0..opts.workers {
        fleet.add_slot(store).await?;
    }
    let produced_path = dir.join("produced.jsonl");
    let mut producer = Command::new(&env.exe)
        .arg("producer")
        .args(["--stream", &kin.stream, "--endpoint", &env.endpoint])
        .args(["--prefix", &format!("r{tag}"), "--rate", &opts.rate.to_string()])
        .arg("--out")
        .arg(&produced_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("logs").join("producer.log"))?)
        .kill_on_drop(true)
        .spawn()?;
    // Warm up: the fleet has processed something before the first fault.
    let warm = Instant::now();
    while !fleet.outputs().iter().any(|e| matches!(e, ConsumerEvent::Rec { .. })) {
        if warm.elapsed() > Duration::from_secs(90) {
            return Err("the fleet processed nothing within 90 s of starting".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (n, step) in schedule.steps.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(step.gap_ms)).await;
        tracing::info!(step = n, fault = %step.fault.label(), "inflicting");
        fleet
            .inflict(&step.fault, store, kin)
            .await
            .map_err(|e| format!("fault {n} ({}): {e}", step.fault.label()))?;
    }
    // Heal: every proxy passes, every slot runs (a process that died on its own is restarted).
    for s in &fleet.slots {
        if let Some(p) = &s.proxy {
            p.set(Mode::default());
        }
    }
    for i in 0..fleet.slots.len() {
        let dead = match fleet.slots[i].child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_some(),
            None => true,
        };
        if dead {
            tracing::warn!(slot = i, "a consumer had exited on its own; restarting it");
            fleet.spawn(i, store)?;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_gracefully(&mut producer, Duration::from_secs(10)).await;
    let produced: Vec<Produced> = read_lines(&produced_path)?;
    let want: HashSet<&str> = produced.iter().map(|p| p.id.as_str()).collect();
    let settle = Instant::now();
    loop {
        let seen: HashSet<String> = match &sink {
            // Only committed rows count: an attempt may have rolled back.
            Some(pool) => crate::sink::ids(pool, &namespace).await?.into_iter().collect(),
            None => fleet
                .outputs()
                .into_iter()
                .filter_map(|e| match e {
                    ConsumerEvent::Rec { id, .. } => Some(id),
                    _ => None,
                })
                .collect(),
        };
        if want.iter().all(|id| seen.contains(*id)) {
            break;
        }
        if settle.elapsed() > Duration::from_secs(opts.settle_secs) {
            tracing::warn!("the fleet did not catch up within the settle time");
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    fleet.stop_all().await;
    if let Some(pool) = &sink {
        return Ok(check_exactly_once(&produced, &crate::sink::ids(pool, &namespace).await?));
    }
    let events = fleet.outputs();
    let finals: Vec<FinalLease> = shardlease::connect_namespace(&direct, &namespace)
        .await?
        .list_leases()
        .await?
        .items
        .into_iter()
        .map(|v| FinalLease {
            shard: v.lease.key.to_string(),
            epoch: v.lease.epoch.get(),
            checkpoint: position_label(&v.lease.checkpoint),
        })
        .collect();
    Ok(check(&produced, &events, &finals))
}
