//! `watch` against the in-memory store: which reads a refresh makes, and frames rendered into
//! ratatui's `TestBackend` and read back as text, on records written by hand and on a real
//! fleet in which a worker joins and one crashes. Conditions are awaited by refreshing until
//! they hold, with a generous deadline; nothing waits a fixed time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
use shardlease::store::{Lease, LeaseStore, WorkerRecord};
use shardlease::{processor_fn, Config, MemorySource, Position, Worker, WorkerHandle, WorkerId};

use super::model::{Change, Watch};
use super::render_text;
use super::view::Meta;
use crate::state::LeaseState;

const DEADLINE: Duration = Duration::from_secs(60);

fn meta() -> Meta {
    Meta {
        url: "memory://?namespace=watch".into(),
        namespace: "watch".into(),
        interval: Duration::from_millis(100),
        interactive: false,
    }
}

fn frame(w: &Watch) -> String {
    render_text(w, &meta(), 110, 40).unwrap()
}

async fn memory(namespace: &str) -> Arc<dyn LeaseStore> {
    shardlease::connect(&format!("memory://?namespace={namespace}")).await.unwrap()
}

fn record(id: &str, beat: u64, changes: u64) -> WorkerRecord {
    let mut r = WorkerRecord::new(WorkerId::from(id), WorkerRecord::first_beat() + beat);
    r.changes = changes;
    r
}

#[tokio::test]
async fn a_refresh_lists_the_leases_only_when_a_worker_came_left_or_changed_owners() {
    let store = memory("reads").await;
    store.heartbeat(&record("w1", 1, 0)).await.unwrap();
    let mut owned = Lease::new("shard-0", Position::TrimHorizon);
    owned.owner = Some(WorkerId::from("w1"));
    store.create_lease(&owned).await.unwrap();
    store.create_lease(&Lease::new("shard-1", Position::TrimHorizon)).await.unwrap();

    let mut w = Watch::new(Duration::from_secs(3600), None);
    w.refresh(&*store).await.unwrap();
    assert_eq!((w.reads.worker_listings, w.reads.lease_listings), (1, 1));
    // Nothing changed: the worker records only.
    w.refresh(&*store).await.unwrap();
    assert_eq!((w.reads.worker_listings, w.reads.lease_listings), (2, 1));
    // A beat is not a change.
    store.heartbeat(&record("w1", 2, 0)).await.unwrap();
    w.refresh(&*store).await.unwrap();
    assert_eq!(w.reads.lease_listings, 1);
    assert_eq!(w.workers[&WorkerId::from("w1")].state(), "alive");
    // A worker's change count moved: the leases are listed, and the move is seen.
    let mut taken = Lease::new("shard-1", Position::TrimHorizon);
    taken.owner = Some(WorkerId::from("w1"));
    let v = store.get_lease(&"shard-1".into()).await.unwrap().unwrap().version;
    store.update_lease(&taken, v).await.unwrap();
    store.heartbeat(&record("w1", 3, 1)).await.unwrap();
    w.refresh(&*store).await.unwrap();
    assert_eq!(w.reads.lease_listings, 2);
    let moved = Change::Moved { key: "shard-1".into(), from: None, to: Some(WorkerId::from("w1")) };
    assert_eq!(w.events.front().map(|e| &e.change), Some(&moved));
    // A worker came: listed again.
    store.heartbeat(&record("w2", 1, 0)).await.unwrap();
    w.refresh(&*store).await.unwrap();
    assert_eq!(w.reads.lease_listings, 3);
    assert_eq!(w.events.front().map(|e| &e.change), Some(&Change::Joined(WorkerId::from("w2"))));
    // And left.
    store.remove_worker(&WorkerId::from("w2")).await.unwrap();
    w.refresh(&*store).await.unwrap();
    assert_eq!(w.reads.lease_listings, 4);
    assert_eq!(w.events.front().map(|e| &e.change), Some(&Change::Left(WorkerId::from("w2"))));

    let text = frame(&w);
    assert!(text.contains("health: ok"), "{text}");
    assert!(text.contains("reads: 6 worker listings, 4 lease listings"), "{text}");
    assert!(text.contains("shard-1   "), "{text}");
    assert!(text.contains("shard-1  - -> w1"), "{text}");
    assert!(text.contains("worker w2 joined"), "{text}");
    assert!(text.contains("worker w2 left"), "{text}");
}

#[tokio::test]
async fn list_every_refreshes_checkpoints_without_a_change() {
    let store = memory("every").await;
    store.create_lease(&Lease::new("shard-0", Position::TrimHorizon)).await.unwrap();
    let mut w = Watch::new(Duration::from_secs(3600), Some(Duration::ZERO));
    w.refresh(&*store).await.unwrap();
    w.refresh(&*store).await.unwrap();
    assert_eq!(w.reads.lease_listings, 2);
}

#[tokio::test]
async fn an_empty_namespace_says_the_fleet_may_be_in_another() {
    // The `fleet` example writes to namespace `fleet-demo`; a watch of the same file without
    // `--namespace` reads `default` and finds nothing there.
    let hint = "(namespace \"watch\" is empty: wrong --namespace?)";
    let store = memory("empty").await;
    let mut w = Watch::new(Duration::from_secs(3600), None);
    assert!(!frame(&w).contains(hint), "not before the first listing:\n{}", frame(&w));
    w.refresh(&*store).await.unwrap();
    assert!(frame(&w).contains(hint), "{}", frame(&w));
    store.create_lease(&Lease::new("shard-0", Position::TrimHorizon)).await.unwrap();
    let mut w = Watch::new(Duration::from_secs(3600), None);
    w.refresh(&*store).await.unwrap();
    assert!(!frame(&w).contains(hint), "{}", frame(&w));
}

#[tokio::test]
async fn a_lease_without_a_live_owner_past_the_failover_timeout_is_a_problem() {
    let store = memory("problem").await;
    let mut orphan = Lease::new("shard-7", Position::TrimHorizon);
    orphan.owner = Some(WorkerId::from("gone"));
    store.create_lease(&orphan).await.unwrap();
    // A failover timeout of zero: the owner without a record is past it at once.
    let mut w = Watch::new(Duration::ZERO, None);
    w.refresh(&*store).await.unwrap();
    assert_eq!(w.leases[&"shard-7".into()].state, LeaseState::OwnerDead);
    let text = frame(&w);
    assert!(
        text.contains("health: PROBLEM: 1 lease(s) without a live owner for over 0.0 s: shard-7"),
        "{text}"
    );
    assert!(text.contains("owner dead"), "{text}");
}

fn start(store: Arc<dyn LeaseStore>, source: Arc<MemorySource>) -> WorkerHandle {
    let config = Config::new("fleet")
        .unwrap()
        .with_heartbeat(Duration::from_millis(100))
        .with_initial_position(Position::TrimHorizon);
    let processor = processor_fn(|_ctx, _batch| async move { Ok(()) });
    Worker::builder(config, store, source, processor).build().unwrap().start()
}

/// Refreshes until `check` holds, or panics naming `what` with the last frame.
async fn until(w: &mut Watch, store: &dyn LeaseStore, what: &str, check: impl Fn(&Watch) -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        w.refresh(store).await.unwrap();
        if check(w) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            frame(w)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_running(w: &Watch, workers: usize) -> bool {
    w.workers.values().filter(|s| !s.dead).count() == workers
        && w.leases.values().all(|s| s.state == LeaseState::Running)
        && w.held().values().filter(|n| **n > 0).count() == workers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_frame_shows_a_join_and_a_crash() {
    let store = memory("fleet").await;
    let source = Arc::new(MemorySource::new(6));
    let a = start(store.clone(), source.clone());
    let b = start(store.clone(), source.clone());
    // The fleet's failover timeout (5 heartbeats).
    let mut w = Watch::new(Duration::from_millis(500), Some(Duration::from_millis(500)));
    until(&mut w, &*store, "two workers running every lease", |w| {
        w.leases.len() == 6 && all_running(w, 2)
    })
    .await;

    let c = start(store.clone(), source.clone());
    until(&mut w, &*store, "the third worker's join and share", |w| all_running(w, 3)).await;
    assert!(w.events.iter().any(|e| e.change == Change::Joined(c.id())));

    b.crash();
    let crashed = b.id();
    until(&mut w, &*store, "the crash judged and its leases taken", |w| {
        w.workers.get(&crashed).is_some_and(|s| s.dead)
            && w.leases.values().all(|s| s.state == LeaseState::Running)
            && !w.held().contains_key(&crashed)
    })
    .await;
    let text = frame(&w);
    assert!(text.contains(&format!("worker {} joined", c.id())), "{text}");
    assert!(text.contains(&format!("worker {crashed} dead: no beat for 0.5s")), "{text}");
    assert!(
        text.contains(&format!("{crashed} -> ")),
        "a lease moved off the crashed worker:\n{text}"
    );
    let row = text.lines().find(|l| l.contains(&crashed.to_string()) && l.contains("dead"));
    assert!(row.is_some(), "no dead row for {crashed}:\n{text}");
    assert!(text.contains("health: ok"), "{text}");
    assert!(text.contains("running"), "{text}");
    for h in [&a, &c] {
        h.shutdown().await;
    }
}

#[test]
fn q_esc_and_ctrl_c_quit_other_keys_do_not() {
    let key = |code, modifiers| Event::Key(KeyEvent::new(code, modifiers));
    assert!(super::quits(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
    assert!(super::quits(&key(KeyCode::Esc, KeyModifiers::NONE)));
    assert!(super::quits(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
    assert!(!super::quits(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
    assert!(!super::quits(&key(KeyCode::Char('x'), KeyModifiers::NONE)));
}
