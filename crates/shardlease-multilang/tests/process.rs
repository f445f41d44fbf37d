//! The daemon's own binary (`shardlease-multilang --properties ...`, a real process) running the
//! real amazon-kclpy application of `kclpy_app/app.py` on kinesalite, its leases in a SQLite file
//! shared by the processes: a graceful stop by SIGTERM (every child checkpoints, the leases are
//! released and the worker record removed), a `kill -9` mid-stream and a restart (nothing lost,
//! nothing before the children's checkpoints redone), a second daemon joining (the leases split
//! by graceful handoff, nothing processed twice), and a shard split (the parent's child checkpoints
//! its end before the children's records are processed).
//!
//! Skipped, with the reason printed, when the emulator, python3 or kclpy is unavailable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::{
    children_gone, events, eventually, kclpy_app, kclpy_or_skip, last_checkpoints, namespace,
    of_kind, open_store, processed, seq, Daemon, Kinesis, World,
};
use shardlease::{LeaseKey, Position};
use tokio_util::sync::CancellationToken;

/// A graceful stop's bound: the children's grace (20 s in these properties) and the rest.
const EXIT_BOUND: Duration = Duration::from_secs(60);

/// The kclpy application's command line.
fn kclpy_command() -> String {
    format!("python3 -u {}", kclpy_app().display())
}

/// Shard -> the sequence number of its last record in the logs `outs`.
fn last_records(outs: &[&Path]) -> BTreeMap<String, String> {
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    for out in outs {
        for (shard, rest) in of_kind(out, "record") {
            let newer = last.get(&shard).is_none_or(|l| seq(&rest[0]) > seq(l));
            if newer {
                last.insert(shard, rest[0].clone());
            }
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_checkpoints_every_child_releases_the_leases_and_exits_zero() {
    let Some(kinesis) = Kinesis::or_skip() else { return };
    let Some(pythonpath) = kclpy_or_skip() else { return };
    let World { kinesis, dir, stream, store, properties } = World::new(
        kinesis,
        "sigterm",
        2,
        &kclpy_command(),
        "shutdownGraceMillis = 20000\nshardlease.heartbeatMillis = 200\n",
    )
    .await;
    let out = dir.path().join("processed.log");
    kinesis.put(&stream, 0, 20).await;
    let env = [("PYTHONPATH", pythonpath.as_str()), ("KCLPY_TEST_OUT", out.to_str().unwrap())];
    let mut daemon = Daemon::start(&properties, &env, &dir.path().join("daemon.log"));
    eventually("20 records processed", || processed(&[&out]).len() == 20, || daemon.log_text())
        .await;
    // A child per shard.
    assert_eq!(of_kind(&out, "pid").len(), 2, "{:?}", events(&out));

    daemon.signal("TERM");
    let status = daemon.wait_exit(EXIT_BOUND).await;
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());
    children_gone(&out).await;

    // Each child heard shutdownRequested, checkpointed its last record, then heard leaseLost.
    let last = last_records(&[&out]);
    let ev = events(&out);
    for (shard, last_seq) in &last {
        let of_shard: Vec<String> = ev
            .iter()
            .filter(|e| &e[1] == shard && e[0] != "record")
            .map(|e| e[0..3.min(e.len())].join(" "))
            .collect();
        let tail: Vec<&str> = of_shard.iter().rev().take(3).rev().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                format!("shutdownRequested {shard}").as_str(),
                format!("checkpointed {shard} {last_seq}").as_str(),
                format!("leaseLost {shard}").as_str(),
            ],
            "{of_shard:?}"
        );
    }
    let seen = processed(&[&out]);
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "multilang kclpy sigterm: produced 20 processed {} twice {twice} lost {} exit {}",
        seen.len(),
        20 - seen.len(),
        status.code().unwrap_or(-1)
    );
    assert_eq!(twice, 0, "{seen:?}");

    // The store: every lease released at its last record, the worker record gone.
    let leases = open_store(&store, &namespace(&stream)).await;
    let listing = leases.list_leases().await.unwrap();
    assert_eq!(listing.items.len(), 2);
    for v in &listing.items {
        let lease = &v.lease;
        assert_eq!(lease.owner, None, "{} released: {lease:?}", lease.key);
        let want = Position::Sequence { seq: seq(&last[lease.key.as_str()]), sub: 0 };
        assert_eq!(lease.checkpoint, want, "{}", lease.key);
    }
    let workers = leases.list_workers().await.unwrap();
    assert!(workers.items.is_empty(), "the worker record is removed: {:?}", workers.items);
    assert!(daemon.log_text().contains("SIGTERM"), "{}", daemon.log_text());
    kinesis.delete_stream(&stream).await;
}

/// Whether some shard's child of `out` has processed records past its last confirmed checkpoint.
fn past_checkpoint(out: &Path) -> bool {
    let mut last_kind: BTreeMap<String, String> = BTreeMap::new();
    for e in events(out) {
        if e[0] == "record" || e[0] == "checkpointed" {
            last_kind.insert(e[1].clone(), e[0].clone());
        }
    }
    last_kind.values().any(|k| k == "record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_then_a_restart_loses_nothing_and_redoes_only_past_the_checkpoints() {
    let Some(kinesis) = Kinesis::or_skip() else { return };
    let Some(pythonpath) = kclpy_or_skip() else { return };
    // No workerId: the restarted daemon is a new worker (the default id names the process), which
    // takes the dead one's leases once they have not been renewed for failoverTimeMillis (short,
    // but not so short that a busy machine's stalled heartbeat loses a lease of the live daemon).
    let World { kinesis, dir, stream, store, properties } =
        World::new(kinesis, "kill9", 2, &kclpy_command(), "failoverTimeMillis = 6000\n").await;
    let (out1, out2) = (dir.path().join("processed-1.log"), dir.path().join("processed-2.log"));
    // Records keep coming, before, across and after the kill and the restart.
    let stop_producing = CancellationToken::new();
    let producer = kinesis.produce(&stream, 0, Duration::from_millis(20), stop_producing.clone());
    // The first daemon's children checkpoint every third batch only, so that the kill finds
    // records processed past a checkpoint: those, and only those, are to be processed again.
    let env1 = [
        ("PYTHONPATH", pythonpath.as_str()),
        ("KCLPY_TEST_OUT", out1.to_str().unwrap()),
        ("KCLPY_TEST_CHECKPOINT_EVERY", "3"),
    ];
    let mut first = Daemon::start(&properties, &env1, &dir.path().join("daemon-1.log"));
    eventually(
        "records processed, a checkpoint confirmed, records processed past a checkpoint",
        || {
            processed(&[&out1]).len() >= 20
                && !last_checkpoints(&out1).is_empty()
                && past_checkpoint(&out1)
        },
        || first.log_text(),
    )
    .await;
    first.signal("KILL");
    let status = first.wait_exit(EXIT_BOUND).await;
    assert_eq!(status.code(), None, "killed by a signal: {status}");
    // The orphaned children see EOF on stdin and exit on their own.
    children_gone(&out1).await;
    let at_kill = processed(&[&out1]).len();
    let logged = last_checkpoints(&out1);

    // What the dead daemon left: its leases still owned (nobody released them), each checkpoint
    // at or past the last one a child of it saw confirmed.
    let leases = open_store(&store, &namespace(&stream)).await;
    let mut stored: BTreeMap<String, Position> = BTreeMap::new();
    for v in leases.list_leases().await.unwrap().items {
        assert!(v.lease.owner.is_some(), "a killed daemon releases nothing: {:?}", v.lease);
        if let Some(s) = logged.get(v.lease.key.as_str()) {
            match &v.lease.checkpoint {
                Position::Sequence { seq: at, .. } => {
                    assert!(*at >= seq(s), "{}: stored {at} behind confirmed {s}", v.lease.key)
                }
                other => panic!("{}: stored {other:?}, confirmed {s}", v.lease.key),
            }
        }
        stored.insert(v.lease.key.to_string(), v.lease.checkpoint.clone());
    }
    assert_eq!(stored.len(), 2, "{stored:?}");
    drop(leases);

    let env2 = [("PYTHONPATH", pythonpath.as_str()), ("KCLPY_TEST_OUT", out2.to_str().unwrap())];
    let mut second = Daemon::start(&properties, &env2, &dir.path().join("daemon-2.log"));
    eventually(
        "the restarted daemon processing new records",
        || processed(&[&out2]).len() >= 20,
        || second.log_text(),
    )
    .await;
    stop_producing.cancel();
    let n = producer.await.unwrap();
    eventually(
        "every record processed",
        || processed(&[&out1, &out2]).len() == n,
        || second.log_text(),
    )
    .await;
    second.signal("TERM");
    let status = second.wait_exit(EXIT_BOUND).await;
    assert!(status.success(), "exit status {status}; log:\n{}", second.log_text());

    // The restarted daemon's children started at the stored checkpoints and processed nothing
    // at or before them.
    for (shard, rest) in of_kind(&out2, "start") {
        let want = match &stored[&shard] {
            Position::Sequence { seq, .. } => seq.to_string(),
            Position::TrimHorizon => "TRIM_HORIZON".to_owned(),
            other => panic!("{shard}: stored {other:?}"),
        };
        assert_eq!(rest[0], want, "{shard} resumed from its stored checkpoint");
    }
    for (shard, rest) in of_kind(&out2, "record") {
        if let Position::Sequence { seq: at, .. } = &stored[&shard] {
            assert!(seq(&rest[0]) > *at, "{shard}: {} redone, at or before {at}", rest[2]);
        }
    }
    // So exactly what the killed daemon's children processed past the stored checkpoints is
    // processed twice, all of it past the last checkpoint they saw confirmed.
    let seen = processed(&[&out1, &out2]);
    let twice: BTreeSet<String> =
        seen.iter().filter(|(_, n)| **n > 1).map(|(r, _)| r.clone()).collect();
    let mut past_stored = BTreeSet::new();
    for (shard, rest) in of_kind(&out1, "record") {
        let beyond = match &stored[&shard] {
            Position::Sequence { seq: at, .. } => seq(&rest[0]) > *at,
            _ => true,
        };
        if beyond {
            past_stored.insert(rest[2].clone());
        }
        if twice.contains(&rest[2]) {
            if let Some(c) = logged.get(&shard) {
                assert!(seq(&rest[0]) > seq(c), "{shard}: {} redone, confirmed at {c}", rest[2]);
            }
        }
    }
    assert_eq!(twice, past_stored, "processed twice vs processed past the stored checkpoints");
    assert!(seen.values().all(|n| *n <= 2), "{seen:?}");
    println!(
        "multilang kclpy kill-9: produced {n} processed {} twice {} lost {} (killed after {at_kill} processed)",
        seen.len(),
        twice.len(),
        n - seen.len(),
    );
    assert_eq!(seen.len(), n, "lost: {seen:?}");
    kinesis.delete_stream(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_joining_takes_half_the_shards_by_graceful_handoff_nothing_twice() {
    let Some(kinesis) = Kinesis::or_skip() else { return };
    let Some(pythonpath) = kclpy_or_skip() else { return };
    // One properties file for both: same applicationName, same store.
    let World { kinesis, dir, stream, store, properties } = World::new(
        kinesis,
        "join",
        4,
        &kclpy_command(),
        "shutdownGraceMillis = 20000\nshardlease.heartbeatMillis = 200\n",
    )
    .await;
    let (out_a, out_b) = (dir.path().join("processed-a.log"), dir.path().join("processed-b.log"));
    kinesis.put(&stream, 0, 20).await;
    let env_a = [("PYTHONPATH", pythonpath.as_str()), ("KCLPY_TEST_OUT", out_a.to_str().unwrap())];
    let mut a = Daemon::start(&properties, &env_a, &dir.path().join("daemon-a.log"));
    eventually(
        "the first daemon running a child per shard, 20 records processed",
        || of_kind(&out_a, "start").len() == 4 && processed(&[&out_a]).len() == 20,
        || a.log_text(),
    )
    .await;

    // Records keep coming while the second daemon joins.
    let stop_producing = CancellationToken::new();
    let producer = kinesis.produce(&stream, 20, Duration::from_millis(20), stop_producing.clone());
    let env_b = [("PYTHONPATH", pythonpath.as_str()), ("KCLPY_TEST_OUT", out_b.to_str().unwrap())];
    let mut b = Daemon::start(&properties, &env_b, &dir.path().join("daemon-b.log"));
    eventually(
        "two shards handed over, and records processed by the newcomer",
        || of_kind(&out_b, "start").len() >= 2 && processed(&[&out_b]).len() >= 10,
        || format!("{:?}\n{}", events(&out_b), b.log_text()),
    )
    .await;
    stop_producing.cancel();
    let n = producer.await.unwrap();
    eventually(
        "every record processed",
        || processed(&[&out_a, &out_b]).len() == n,
        || format!("{} of {n}", processed(&[&out_a, &out_b]).len()),
    )
    .await;

    // The store: two leases each.
    let leases = open_store(&store, &namespace(&stream)).await;
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    for v in leases.list_leases().await.unwrap().items {
        let owner = v.lease.owner.map(|o| o.to_string()).unwrap_or_default();
        *owners.entry(owner).or_insert(0) += 1;
    }
    assert_eq!(owners.values().copied().collect::<Vec<_>>(), [2, 2], "{owners:?}");
    drop(leases);

    // Each moved shard: the first daemon's child heard shutdownRequested, checkpointed its last
    // record and heard leaseLost; the newcomer's child started exactly at that checkpoint.
    let moved: BTreeSet<String> = of_kind(&out_b, "start").into_iter().map(|(s, _)| s).collect();
    assert_eq!(moved.len(), 2, "{:?}", events(&out_b));
    assert_eq!(of_kind(&out_b, "start").len(), 2, "one child each: {:?}", events(&out_b));
    let ev_a = events(&out_a);
    let last_a = last_records(&[&out_a]);
    let starts_b: BTreeMap<String, String> =
        of_kind(&out_b, "start").into_iter().map(|(s, rest)| (s, rest[0].clone())).collect();
    for shard in &moved {
        let of_shard: Vec<String> = ev_a
            .iter()
            .filter(|e| &e[1] == shard && e[0] != "record")
            .map(|e| e[0..3.min(e.len())].join(" "))
            .collect();
        let last = last_a.get(shard).cloned().unwrap_or_else(|| "TRIM_HORIZON".to_owned());
        let tail: Vec<&str> = of_shard.iter().rev().take(3).rev().map(String::as_str).collect();
        assert_eq!(
            tail,
            [
                format!("shutdownRequested {shard}").as_str(),
                format!("checkpointed {shard} {last}").as_str(),
                format!("leaseLost {shard}").as_str(),
            ],
            "{of_shard:?}"
        );
        assert_eq!(
            starts_b[shard], last,
            "{shard}: the newcomer starts at the handed-over checkpoint"
        );
    }
    // The shards that stayed were never stopped.
    for (shard, _) in of_kind(&out_a, "start").iter().filter(|(s, _)| !moved.contains(s)) {
        assert!(
            !ev_a.iter().any(|e| &e[1] == shard && e[0] == "shutdownRequested"),
            "{shard} stayed: {ev_a:?}"
        );
    }

    a.signal("TERM");
    b.signal("TERM");
    for d in [&mut a, &mut b] {
        let status = d.wait_exit(EXIT_BOUND).await;
        assert!(status.success(), "exit status {status}; log:\n{}", d.log_text());
    }
    let seen = processed(&[&out_a, &out_b]);
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "multilang kclpy join: produced {n} processed {} twice {twice} lost {} moved {} of 4 \
         (first daemon {}, second {})",
        seen.len(),
        n - seen.len(),
        moved.len(),
        processed(&[&out_a]).len(),
        processed(&[&out_b]).len(),
    );
    assert_eq!(twice, 0, "a graceful handoff processes nothing twice: {seen:?}");
    assert_eq!(seen.len(), n);
    kinesis.delete_stream(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_split_ends_the_parent_with_a_checkpoint_before_its_children_are_read() {
    let Some(kinesis) = Kinesis::or_skip() else { return };
    let Some(pythonpath) = kclpy_or_skip() else { return };
    let World { kinesis, dir, stream, store, properties } = World::new(
        kinesis,
        "split",
        1,
        &kclpy_command(),
        "shutdownGraceMillis = 20000\nshardSyncIntervalMillis = 1000\n\
         shardlease.heartbeatMillis = 200\n",
    )
    .await;
    let out = dir.path().join("processed.log");
    kinesis.put(&stream, 0, 10).await;
    let env = [("PYTHONPATH", pythonpath.as_str()), ("KCLPY_TEST_OUT", out.to_str().unwrap())];
    let mut daemon = Daemon::start(&properties, &env, &dir.path().join("daemon.log"));
    eventually("10 records processed", || processed(&[&out]).len() == 10, || daemon.log_text())
        .await;

    let parent = "shardId-000000000000";
    kinesis
        .client
        .split_shard()
        .stream_name(&stream)
        .shard_to_split(parent)
        // The middle of the hash key range (0 .. 2^128 - 1): 2^127.
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .unwrap();
    kinesis.wait_active(&stream).await;
    kinesis.put(&stream, 10, 30).await;
    eventually("30 records processed", || processed(&[&out]).len() == 30, || daemon.log_text())
        .await;
    daemon.signal("TERM");
    let status = daemon.wait_exit(EXIT_BOUND).await;
    assert!(status.success(), "exit status {status}; log:\n{}", daemon.log_text());

    let ev = events(&out);
    let at = |pred: &dyn Fn(&Vec<String>) -> bool| ev.iter().position(pred);
    let ended = at(&|e| e[0] == "shardEnded" && e[1] == parent).expect("the parent's shardEnded");
    let end_checkpoint = at(&|e| e[0] == "checkpointed" && e[1] == parent && e[2] == "SHARD_END")
        .expect("the parent's end checkpointed");
    assert!(ended < end_checkpoint);
    let parent_records: Vec<usize> =
        (0..ev.len()).filter(|i| ev[*i][0] == "record" && ev[*i][1] == parent).collect();
    let last_parent_record = *parent_records.last().unwrap();
    assert!(last_parent_record < ended, "{ev:?}");
    // The parent holds exactly the records put before the split, the children the rest; every
    // child event comes after the parent's end was checkpointed.
    let mut parent_data: Vec<&str> = parent_records.iter().map(|i| ev[*i][4].as_str()).collect();
    parent_data.sort_unstable();
    let mut before: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    before.sort_unstable();
    assert_eq!(parent_data, before);
    let children: BTreeSet<&str> =
        ev.iter().filter(|e| e[1] != parent).map(|e| e[1].as_str()).collect();
    assert_eq!(children.len(), 2, "two child shards: {children:?}");
    let first_child_event = at(&|e| e[1] != parent).unwrap();
    assert!(end_checkpoint < first_child_event, "{ev:?}");

    let seen = processed(&[&out]);
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "multilang kclpy split: produced 30 processed {} twice {twice} lost {} (the parent's 10 \
         checkpointed to SHARD_END before its 2 children started)",
        seen.len(),
        30 - seen.len()
    );
    assert_eq!(twice, 0, "{seen:?}");
    assert_eq!(seen.len(), 30);

    // The parent's lease is finished, or already collected (a finished parent whose children
    // have started is deleted, as with the KCL's cleanupLeasesUponShardCompletion).
    let leases = open_store(&store, &namespace(&stream)).await;
    if let Some(v) = leases.get_lease(&LeaseKey::from(parent)).await.unwrap() {
        assert_eq!(v.lease.checkpoint, Position::ShardEnd);
    }
    kinesis.delete_stream(&stream).await;
}
