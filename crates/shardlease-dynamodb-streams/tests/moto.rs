//! The DynamoDB Streams source against moto's real server (`SHARDLEASE_TEST_DYNAMODB_ENDPOINT`,
//! started by `scripts/services.sh`): building by table name and by stream ARN, a table without
//! a stream refused, every change typed and in order with checkpoint resume, `LATEST`, and a
//! fleet of workers on the in-memory lease store that processes every change through a graceful
//! leave and a crash while a writer keeps changing the table.
//!
//! moto keeps one shard per table that never rotates or is trimmed; shard rotation, trimming,
//! expired iterators and throttling are covered by the unit tests on the crate's fake.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::{
    change, eventually, key_of, moto, n, only_shard, read_records, s, Expected, Writer, DEADLINE,
};
use shardlease_core::store::{LeaseStore, MemoryBackend};
use shardlease_core::{
    Batch, BoxError, CheckpointHandle, Config, Epoch, Error, LeaseContext, LeaseKey, Position,
    Record, RecordProcessor, SequenceNumber, ShardSource, Worker, WorkerHandle, WorkerId,
};
use shardlease_dynamodb_streams::{ChangeEvent, EventName, Item};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_is_built_from_a_table_name_or_a_stream_arn() {
    let Some(m) = moto() else { return };
    let started = Instant::now();
    let table = m.create_table(true).await;
    let arn = m.stream_arn(&table).await;

    let by_name = m.source(&table).await;
    assert_eq!(by_name.stream_arn(), arn, "the table's latest stream");
    let by_arn = m.source(&arn).await;
    assert_eq!(by_arn.stream_arn(), arn);
    // An ARN with blanks around it is the same ARN.
    let padded = m.source(&format!("  {arn} ")).await;
    assert_eq!(padded.stream_arn(), arn);

    let mut w = Writer::new(&m, &table);
    let written = [w.cycle("a", 0).await, w.cycle("b", 0).await, w.cycle("a", 1).await];
    for source in [&by_name, &by_arn] {
        let shard = only_shard(source).await;
        assert!(!shard.closed, "{shard:?}");
        assert!(shard.parents.is_empty(), "{shard:?}");
        let mut reader = source.open(&shard.id, &Position::TrimHorizon).await.unwrap();
        let records = read_records(&mut reader, written.len()).await;
        let got: Vec<Expected> = records.iter().map(|r| Expected::of(&change(r))).collect();
        assert_eq!(got, written);
    }
    m.delete_table(&table).await;
    println!("built by name and by ARN in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_stream_is_a_config_error_naming_it() {
    let Some(m) = moto() else { return };
    let table = m.create_table(false).await;
    match m.builder(&table).build().await {
        Err(Error::Config(message)) => {
            assert!(message.contains(&table), "the message names the table: {message}");
        }
        other => panic!("a table without a stream: {other:?}"),
    }
    m.delete_table(&table).await;
}

/// The sequence numbers of `records`.
fn seqs(records: &[Record]) -> Vec<SequenceNumber> {
    records.iter().map(|r| r.seq.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_typed_and_in_order() {
    let Some(m) = moto() else { return };
    let started = Instant::now();
    let table = m.create_table(true).await;
    let source = m.source(&table).await;
    let shard = only_shard(&source).await;

    // Three items, interleaved, each through INSERT, MODIFY (UpdateItem), MODIFY (PutItem over
    // it), REMOVE (DeleteItem), and inserted again.
    let mut w = Writer::new(&m, &table);
    let ids = ["alpha", "beta", "gamma"];
    for round in 0..9 {
        for id in ids {
            w.cycle(id, round).await;
        }
    }
    let expected = w.written.clone();
    for name in [EventName::Insert, EventName::Modify, EventName::Remove] {
        assert!(expected.iter().any(|e| e.name == name), "the writes include {name:?}");
    }

    let mut reader = source.open(&shard.id, &Position::TrimHorizon).await.unwrap();
    let records = read_records(&mut reader, expected.len()).await;
    assert_eq!(records.len(), expected.len(), "exactly the changes written");
    let changes: Vec<ChangeEvent> = records.iter().map(change).collect();
    // 2020-01-01 and 2100-01-01: a creation time in milliseconds (not seconds) since the epoch.
    let plausible = 1_577_836_800_000..4_102_444_800_000;
    for (i, ((r, c), e)) in records.iter().zip(&changes).zip(&expected).enumerate() {
        assert_eq!(&Expected::of(c), e, "change {i}: event, keys, new and old image");
        assert_eq!(r.partition_key, c.key_json(), "change {i}: the partition key is the key");
        assert_eq!(r.seq, c.sequence_number, "change {i}");
        assert_eq!(r.sub, 0, "change {i}");
        assert_eq!(r.arrival_millis, c.approximate_creation_millis, "change {i}");
        assert!(plausible.contains(&c.approximate_creation_millis), "change {i}: {c:?}");
        assert_eq!(c.stream_view_type.as_deref(), Some("NEW_AND_OLD_IMAGES"), "change {i}");
        assert!(!c.removed_by_ttl, "change {i}");
        assert!(!c.event_id.is_empty(), "change {i}");
    }
    // The partition key is the key as canonical JSON: its names sorted, one item one key.
    assert_eq!(records[0].partition_key, r#"{"pk":{"S":"alpha"},"sk":{"N":"7"}}"#);
    for id in ids {
        let keys: BTreeSet<&str> = records
            .iter()
            .zip(&changes)
            .filter(|(_, c)| c.keys == key_of(id))
            .map(|(r, _)| r.partition_key.as_str())
            .collect();
        assert_eq!(keys.len(), 1, "one partition key per item: {keys:?}");
    }
    let ids_seen: BTreeSet<&str> = records.iter().map(|r| r.partition_key.as_str()).collect();
    assert_eq!(ids_seen.len(), ids.len(), "one partition key per item");
    // Sequence numbers grow (compared as numbers), and so per item in the order of its writes.
    for pair in records.windows(2) {
        assert!(pair[0].seq < pair[1].seq, "{} then {}", pair[0].seq, pair[1].seq);
    }
    for id in ids {
        let got: Vec<EventName> =
            changes.iter().filter(|c| c.keys == key_of(id)).map(|c| c.event_name).collect();
        let want: Vec<EventName> =
            expected.iter().filter(|e| e.id() == id).map(|e| e.name).collect();
        assert_eq!(got, want, "the changes of {id} in the order written");
    }

    // Resuming from a checkpoint: exactly the records after it, in order.
    for k in [0, records.len() / 2, records.len() - 2] {
        let at = Position::Sequence { seq: records[k].seq.clone(), sub: 0 };
        let mut reader = source.open(&shard.id, &at).await.unwrap();
        let rest = read_records(&mut reader, records.len() - k - 1).await;
        assert_eq!(seqs(&rest), seqs(&records[k + 1..]), "resumed after record {k}");
        let data: Vec<_> = rest.iter().map(|r| r.data.clone()).collect();
        let want: Vec<_> = records[k + 1..].iter().map(|r| r.data.clone()).collect();
        assert_eq!(data, want, "resumed after record {k}");
    }
    // From a checkpoint at the last record: the next change written, nothing before it.
    let last = records.last().unwrap().seq.clone();
    let mut reader =
        source.open(&shard.id, &Position::Sequence { seq: last.clone(), sub: 0 }).await.unwrap();
    let next = w.cycle("delta", 100).await;
    let more = read_records(&mut reader, 1).await;
    assert_eq!(more.len(), 1, "{more:?}");
    assert_eq!(Expected::of(&change(&more[0])), next);
    assert!(more[0].seq > last);

    m.delete_table(&table).await;
    println!("{} changes checked in {:?}", records.len() + 1, started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_at_latest_sees_only_new_changes() {
    let Some(m) = moto() else { return };
    let started = Instant::now();
    let table = m.create_table(true).await;
    let source = m.source(&table).await;
    let shard = only_shard(&source).await;
    let mut w = Writer::new(&m, &table);
    for i in 0..5 {
        w.put(&format!("before-{i}"), Item::from([("n".to_owned(), n(i))])).await;
    }
    let before = w.written.len();

    // The reader takes its iterator when it first reads, so it runs in a task of its own, and
    // probes are written until it shows one: from then on it must see every change.
    let mut reader = source.open(&shard.id, &Position::Latest).await.unwrap();
    let seen: Arc<Mutex<Vec<Record>>> = Arc::default();
    let task = {
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                let batch = reader.next_batch().await.unwrap();
                seen.lock().unwrap().extend(batch.records.iter().cloned());
            }
        })
    };
    let count = || seen.lock().unwrap().len();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut probe = 0;
    while count() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the reader at LATEST saw no probe");
        w.put(&format!("probe-{probe}"), Item::from([("n".to_owned(), n(probe))])).await;
        probe += 1;
        // Polls for up to a second for the reader to show the probe; another probe follows if
        // it took its iterator after this one was written.
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        while count() == 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut after = Vec::new();
    for i in 0..10 {
        after.push(w.put(&format!("after-{i}"), Item::from([("s".to_owned(), s("x"))])).await);
    }
    let last = after.last().unwrap().clone();
    let seen = eventually("the changes written after the probe", || async {
        let seen = seen.lock().unwrap().clone();
        let got = seen.last().map(|r| Expected::of(&change(r)));
        (got.as_ref() == Some(&last)).then_some(seen)
    })
    .await;
    task.abort();

    let got: Vec<Expected> = seen.iter().map(|r| Expected::of(&change(r))).collect();
    let since_open = &w.written[before..];
    assert!(got.len() > after.len() && got.len() <= since_open.len(), "{got:?}");
    // Exactly the changes from some probe on: none written before the reader was opened.
    assert_eq!(got, since_open[since_open.len() - got.len()..], "a suffix of the writes");
    assert!(got.iter().all(|e| !e.id().starts_with("before-")), "{got:?}");
    assert!(got[0].id().starts_with("probe-"), "{got:?}");
    m.delete_table(&table).await;
    println!("LATEST: {probe} probe(s), {} changes seen in {:?}", got.len(), started.elapsed());
}

/// DynamoDB Streams has no `AT_TIMESTAMP`: the reader starts at the trim horizon and skips the
/// changes made in seconds before the timestamp's (creation times are rounded down to the
/// second, so every change of the timestamp's own second is delivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_at_a_timestamp_starts_at_the_first_change_of_its_second() {
    let Some(m) = moto() else { return };
    let table = m.create_table(true).await;
    let source = m.source(&table).await;
    let shard = only_shard(&source).await;
    let mut w = Writer::new(&m, &table);
    // Changes until they span two seconds of creation time, each read back as it is made.
    let mut reader = source.open(&shard.id, &Position::TrimHorizon).await.unwrap();
    let mut records: Vec<Record> = Vec::new();
    let second = |r: &Record| r.arrival_millis.div_euclid(1000);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut round = 0;
    while records.len() < 2 || second(&records[0]) == second(records.last().unwrap()) {
        assert!(tokio::time::Instant::now() < deadline, "changes made in one second only");
        w.cycle(["a", "b", "c"][round % 3], round).await;
        records.extend(read_records(&mut reader, 1).await);
        round += 1;
    }
    for round in round..round + 3 {
        w.cycle(["a", "b", "c"][round % 3], round).await;
    }
    records.extend(read_records(&mut reader, 3).await);
    assert_eq!(records.len(), w.written.len());

    // The timestamp: the last change made in the second of the first change of a new second.
    let from = records.iter().position(|r| second(r) > second(&records[0])).unwrap();
    let millis = records.iter().filter(|r| second(r) == second(&records[from])).last().unwrap();
    let millis = millis.arrival_millis;
    let mut reader = source.open(&shard.id, &Position::AtTimestamp { millis }).await.unwrap();
    let got = read_records(&mut reader, records.len() - from).await;
    assert_eq!(seqs(&got), seqs(&records[from..]), "from change {from} ({millis} ms) on");
    m.delete_table(&table).await;
}

/// The reader takes its `LATEST` iterator at its first read, not when it is opened: a change
/// made between `open` and the first `next_batch` is skipped (and `resolved_start` is `None`).
/// The Kinesis source takes the iterator in `open` and reports where it landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_at_latest_sees_a_change_made_right_after_it_was_opened() {
    let Some(m) = moto() else { return };
    let table = m.create_table(true).await;
    let source = m.source(&table).await;
    let shard = only_shard(&source).await;
    let mut w = Writer::new(&m, &table);
    w.put("before", Item::from([("n".to_owned(), n(0))])).await;
    let mut reader = source.open(&shard.id, &Position::Latest).await.unwrap();
    let after_open = w.put("after-open", Item::from([("n".to_owned(), n(1))])).await;
    let task = tokio::spawn(async move { read_records(&mut reader, 1).await });
    // More changes until the reader shows one (each polled for up to a second).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut later = 0;
    while !task.is_finished() {
        assert!(tokio::time::Instant::now() < deadline, "the reader at LATEST read nothing");
        w.put(&format!("later-{later}"), Item::from([("n".to_owned(), n(later))])).await;
        later += 1;
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        while !task.is_finished() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let got = task.await.unwrap();
    assert_eq!(Expected::of(&change(&got[0])), after_open, "the first change made after open");
    m.delete_table(&table).await;
}

/// A processor instance of the fleet: made for one lease at one epoch, starting at `start`.
#[derive(Clone, Debug)]
struct Instance {
    worker: WorkerId,
    epoch: Epoch,
    start: Position,
}

/// One change handed to a processor instance (an index into [`Trace::instances`]).
#[derive(Clone, Debug)]
struct Delivery {
    instance: usize,
    seq: SequenceNumber,
    key: String,
}

/// Every processor instance made and every change processed, in the order they happened.
#[derive(Clone, Default)]
struct Trace {
    inner: Arc<Mutex<(Vec<Instance>, Vec<Delivery>)>>,
}

impl Trace {
    fn instances(&self) -> Vec<Instance> {
        self.inner.lock().unwrap().0.clone()
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.inner.lock().unwrap().1.clone()
    }

    fn processed_by(&self, worker: &WorkerId) -> usize {
        let inner = self.inner.lock().unwrap();
        inner.1.iter().filter(|d| &inner.0[d.instance].worker == worker).count()
    }

    fn factory(&self) -> Arc<dyn shardlease_core::ProcessorFactory> {
        let trace = self.clone();
        Arc::new(move |ctx: &LeaseContext| -> Box<dyn RecordProcessor> {
            let mut inner = trace.inner.lock().unwrap();
            inner.0.push(Instance {
                worker: ctx.token.owner.clone(),
                epoch: ctx.epoch(),
                start: ctx.start.clone(),
            });
            Box::new(Recorder { instance: inner.0.len() - 1, trace: trace.clone() })
        })
    }
}

/// Records each change it is given, then checkpoints after the batch.
struct Recorder {
    instance: usize,
    trace: Trace,
}

#[async_trait]
impl RecordProcessor for Recorder {
    async fn process_records(
        &mut self,
        batch: &Batch,
        checkpointer: &CheckpointHandle,
    ) -> Result<(), BoxError> {
        {
            let mut inner = self.trace.inner.lock().unwrap();
            for r in batch.records.iter() {
                inner.1.push(Delivery {
                    instance: self.instance,
                    seq: r.seq.clone(),
                    key: r.partition_key.clone(),
                });
            }
        }
        checkpointer.checkpoint_batch(batch).await?;
        Ok(())
    }
}

/// The worker that owns `key` in the store, if any.
async fn owner(store: &Arc<dyn LeaseStore>, key: &LeaseKey) -> Option<WorkerId> {
    store.get_lease(key).await.ok()??.lease.owner
}

/// The running worker among `workers` that owns `key`, once one does.
async fn running_owner(
    store: &Arc<dyn LeaseStore>,
    key: &LeaseKey,
    workers: &[WorkerHandle],
    not: &[WorkerId],
) -> usize {
    eventually("a running worker to own the shard", || async {
        let id = owner(store, key).await?;
        workers.iter().position(|w| w.id() == id && w.is_running() && !not.contains(&id))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_processes_every_change_once_through_a_leave_and_a_crash() {
    let Some(m) = moto() else { return };
    let started = Instant::now();
    let table = m.create_table(true).await;
    let key = only_shard(&m.source(&table).await).await.id;

    // A writer keeps changing six items until told to stop (paced, so that moto, which applies
    // one request at a time, keeps answering the readers too).
    let written = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = {
        let (m, table, written) = (m.clone(), table.clone(), written.clone());
        tokio::spawn(async move {
            let mut w = Writer::new(&m, &table);
            let mut pace = tokio::time::interval(Duration::from_millis(20));
            let mut round = 0;
            while !*stopped.borrow() {
                pace.tick().await;
                w.cycle(&format!("item-{}", round % 6), round).await;
                written.store(w.written.len(), Ordering::SeqCst);
                round += 1;
            }
            w.written
        })
    };
    eventually("the first changes written", || async {
        (written.load(Ordering::SeqCst) >= 10).then_some(())
    })
    .await;

    // Failover and shutdown timeouts of 15 heartbeats: a busy machine must not get a live worker
    // judged dead, nor a graceful leave cut short (either would process changes twice).
    let heartbeat = Duration::from_millis(200);
    let store: Arc<dyn LeaseStore> =
        Arc::new(MemoryBackend::new().store("ddb-streams-fleet".parse().unwrap()));
    let config = Config::new("ddb-streams-fleet")
        .unwrap()
        .with_heartbeat(heartbeat)
        .with_failover_timeout(heartbeat * 15)
        .with_shutdown_timeout(heartbeat * 15)
        .with_initial_position(Position::TrimHorizon);
    let trace = Trace::default();
    let mut workers = Vec::new();
    for name in ["worker-a", "worker-b", "worker-c"] {
        // Each worker its own source, as separate processes would have.
        let source: Arc<dyn ShardSource> = Arc::new(m.source(&table).await);
        let config = config.clone().with_worker_id(name);
        workers.push(
            Worker::builder(config, store.clone(), source, trace.factory())
                .build()
                .unwrap()
                .start(),
        );
    }

    // A graceful leave of the worker holding the shard, once it processed some changes.
    let first = running_owner(&store, &key, &workers, &[]).await;
    let leaver = workers[first].id();
    eventually("the first owner to process changes", || async {
        (trace.processed_by(&leaver) >= 20).then_some(())
    })
    .await;
    let report = workers[first].shutdown().await;
    println!("graceful leave of {leaver}: {report:?}");
    assert!(report.abandoned.is_empty(), "the leave was cut short: {report:?}");
    let leave_mark = trace.instances().len();

    // A crash of the next owner, once it processed some changes.
    let second = running_owner(&store, &key, &workers, std::slice::from_ref(&leaver)).await;
    let victim = workers[second].id();
    eventually("the second owner to process changes", || async {
        (trace.processed_by(&victim) >= 20).then_some(())
    })
    .await;
    let crash_mark = trace.deliveries().len();
    let crash_instances = trace.instances().len();
    workers[second].crash();
    println!("crashed {victim} after {crash_mark} deliveries");

    let third = running_owner(&store, &key, &workers, &[leaver.clone(), victim.clone()]).await;
    let survivor = workers[third].id();
    eventually("the third owner to process changes", || async {
        (trace.processed_by(&survivor) >= 20).then_some(())
    })
    .await;
    stop.send_replace(true);
    let expected = writer.await.unwrap();

    // What was written, as the stream has it: the ground truth to compare deliveries with.
    let source = m.source(&table).await;
    let mut reader = source.open(&key, &Position::TrimHorizon).await.unwrap();
    let records = read_records(&mut reader, expected.len()).await;
    assert_eq!(records.len(), expected.len());
    for (i, (r, e)) in records.iter().zip(&expected).enumerate() {
        assert_eq!(&Expected::of(&change(r)), e, "change {i}");
    }
    let truth: Vec<SequenceNumber> = seqs(&records);
    let index: BTreeMap<&SequenceNumber, usize> =
        truth.iter().enumerate().map(|(i, s)| (s, i)).collect();
    let all: BTreeSet<SequenceNumber> = truth.iter().cloned().collect();
    eventually("every change processed", || async {
        let done: BTreeSet<SequenceNumber> =
            trace.deliveries().into_iter().map(|d| d.seq).collect();
        all.is_subset(&done).then_some(())
    })
    .await;
    for (i, w) in workers.iter().enumerate() {
        if i != first && i != second {
            w.shutdown().await;
        }
    }

    let instances = trace.instances();
    let deliveries = trace.deliveries();
    let first_index = |start: &Position| match start {
        Position::TrimHorizon => 0,
        Position::Sequence { seq, sub: 0 } => index[seq] + 1,
        other => panic!("a processor started at {other:?}"),
    };
    // Each processor instance processed a run of consecutive changes, starting right after the
    // checkpoint it was given: nothing skipped, nothing out of order.
    for (i, inst) in instances.iter().enumerate() {
        let got: Vec<&SequenceNumber> =
            deliveries.iter().filter(|d| d.instance == i).map(|d| &d.seq).collect();
        let from = first_index(&inst.start);
        let want: Vec<&SequenceNumber> = truth.iter().skip(from).take(got.len()).collect();
        assert_eq!(got, want, "instance {i} ({inst:?}) processed a run from its checkpoint");
    }
    // Every change processed; none twice before the crash.
    let mut times: BTreeMap<&SequenceNumber, Vec<usize>> = BTreeMap::new();
    for (at, d) in deliveries.iter().enumerate() {
        times.entry(&d.seq).or_default().push(at);
    }
    assert_eq!(times.len(), truth.len(), "every change processed, nothing else");
    for (seq, at) in &times {
        let before_crash = at.iter().filter(|a| **a < crash_mark).count();
        assert!(before_crash <= 1, "{seq} processed twice before the crash: {at:?}");
    }
    // The leave: the next owner started exactly after the leaver's last change.
    let leaver_last = deliveries
        .iter()
        .rev()
        .find(|d| instances[d.instance].worker == leaver)
        .map(|d| d.seq.clone())
        .unwrap();
    let successor = instances
        .iter()
        .skip(leave_mark)
        .find(|i| i.worker != leaver)
        .expect("an instance after the leave");
    assert_eq!(successor.worker, victim);
    let leaver_epoch = instances.iter().rev().find(|i| i.worker == leaver).unwrap().epoch;
    assert!(successor.epoch > leaver_epoch, "{successor:?} after {leaver_epoch:?}");
    assert_eq!(successor.start, Position::Sequence { seq: leaver_last, sub: 0 });
    // The crash: only changes after the checkpoint the survivor started from are processed
    // again, each by the victim and then by the survivor.
    let (survivor_instance, after_crash) = instances
        .iter()
        .enumerate()
        .skip(crash_instances)
        .find(|(_, i)| i.worker == survivor)
        .expect("an instance after the crash");
    let victim_last = deliveries
        .iter()
        .rev()
        .find(|d| instances[d.instance].worker == victim)
        .map(|d| index[&d.seq])
        .unwrap();
    assert!(after_crash.epoch > successor.epoch, "{after_crash:?} after {successor:?}");
    let resumed_from = first_index(&after_crash.start);
    assert!(resumed_from <= victim_last + 1, "the survivor skipped changes: {after_crash:?}");
    let mut twice = 0;
    for (seq, at) in &times {
        if at.len() < 2 {
            continue;
        }
        twice += 1;
        assert_eq!(at.len(), 2, "{seq} processed {} times", at.len());
        let (a, b) = (&deliveries[at[0]], &deliveries[at[1]]);
        assert_eq!(instances[a.instance].worker, victim, "{seq}: first by the victim");
        assert_eq!(b.instance, survivor_instance, "{seq}: again by the survivor");
        assert!(index[seq] >= resumed_from, "{seq} was checkpointed before the crash");
    }
    assert_eq!(twice, victim_last + 1 - resumed_from, "exactly the uncheckpointed changes");
    // Per item, changes are processed in the order they were made (each first delivery).
    let mut last_of_key: BTreeMap<&str, usize> = BTreeMap::new();
    for (at, d) in deliveries.iter().enumerate() {
        if times[&d.seq][0] != at {
            continue;
        }
        let i = index[&d.seq];
        if let Some(prev) = last_of_key.insert(d.key.as_str(), i) {
            assert!(prev < i, "{}: change {i} processed after change {prev}", d.key);
        }
    }
    for k in last_of_key.keys() {
        assert!(k.contains("item-"), "{k}");
    }
    println!(
        "fleet: {} changes, {} deliveries, {twice} twice after the crash ({} instances) in {:?}",
        truth.len(),
        deliveries.len(),
        instances.len(),
        started.elapsed()
    );
    m.delete_table(&table).await;
}
