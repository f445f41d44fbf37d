//! The nemesis schedule: the faults of one run, drawn from a seed (or read back from a history
//! file to replay a failed run). A schedule is plain data, so the same one can run again.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::proxy::{Direction, PartitionKind};
use crate::stores::StoreKind;

/// One fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// `kill -9` a consumer, then restart it after `down_ms` under the same worker id or a fresh
    /// one.
    Kill {
        /// The worker slot.
        slot: usize,
        /// Restart under a new worker id.
        fresh_id: bool,
        /// How long it stays dead.
        down_ms: u64,
    },
    /// `SIGSTOP` a consumer for `ms` (past the failover timeout), then `SIGCONT`: a zombie that
    /// wakes up holding stale leases.
    Pause {
        /// The worker slot.
        slot: usize,
        /// How long it stays stopped.
        ms: u64,
    },
    /// A graceful stop (`SIGTERM`), then a restart under the same id after `down_ms`.
    Term {
        /// The worker slot.
        slot: usize,
        /// How long it stays away.
        down_ms: u64,
    },
    /// A new consumer joins the fleet (and stays to the end).
    Join,
    /// A shard of the stream is split.
    Split,
    /// Two adjacent shards are merged.
    Merge,
    /// A worker is partitioned from the store for `ms`.
    Partition {
        /// The worker slot.
        slot: usize,
        /// What the partition does.
        kind: PartitionKind,
        /// Which way it cuts.
        dir: Direction,
        /// How long it lasts.
        ms: u64,
    },
    /// The store server crashes and comes back after `down_ms`.
    StoreRestart {
        /// How long it stays down.
        down_ms: u64,
    },
    /// A worker's wall clock steps by `offset_s` seconds (libfaketime) for `ms`, then steps back;
    /// its monotonic clock runs on, as under an NTP step.
    Clock {
        /// The worker slot.
        slot: usize,
        /// The step, in seconds (negative: back in time).
        offset_s: i64,
        /// How long the skew lasts.
        ms: u64,
    },
    /// The store server crashes and comes back after `down_ms` with every record lost (a Redis
    /// without persistence, a moto restart): the workers must restore the leases from memory.
    StoreWipe {
        /// How long it stays down.
        down_ms: u64,
    },
}

impl Fault {
    /// The fault's class, for the counts of faults drawn.
    pub fn class(&self) -> &'static str {
        match self {
            Fault::Kill { fresh_id: false, .. } => "kill_same_id",
            Fault::Kill { fresh_id: true, .. } => "kill_fresh_id",
            Fault::Pause { .. } => "pause",
            Fault::Term { .. } => "term",
            Fault::Join => "join",
            Fault::Split => "split",
            Fault::Merge => "merge",
            Fault::Partition { .. } => "partition",
            Fault::StoreRestart { .. } => "store_restart",
            Fault::StoreWipe { .. } => "store_wipe",
            Fault::Clock { .. } => "clock",
        }
    }

    /// A short label for the JSON line.
    pub fn label(&self) -> String {
        match self {
            Fault::Kill { slot, fresh_id, down_ms } => {
                format!("kill9(w{slot},{},{down_ms}ms)", if *fresh_id { "fresh" } else { "same" })
            }
            Fault::Pause { slot, ms } => format!("stop(w{slot},{ms}ms)"),
            Fault::Term { slot, down_ms } => format!("term(w{slot},{down_ms}ms)"),
            Fault::Join => "join".into(),
            Fault::Split => "split".into(),
            Fault::Merge => "merge".into(),
            Fault::Partition { slot, kind, dir, ms } => {
                let k = match kind {
                    PartitionKind::Drop => "drop".to_owned(),
                    PartitionKind::Blackhole => "blackhole".to_owned(),
                    PartitionKind::Delay { ms } => format!("delay{ms}"),
                };
                let d = match dir {
                    Direction::Both => "both",
                    Direction::ToStore => "to_store",
                    Direction::FromStore => "from_store",
                };
                format!("partition(w{slot},{k},{d},{ms}ms)")
            }
            Fault::StoreRestart { down_ms } => format!("store_restart({down_ms}ms)"),
            Fault::StoreWipe { down_ms } => format!("store_wipe({down_ms}ms)"),
            Fault::Clock { slot, offset_s, ms } => format!("clock(w{slot},{offset_s:+}s,{ms}ms)"),
        }
    }
}

/// One step: wait `gap_ms`, then inflict the fault (and heal it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The quiet time before the fault.
    pub gap_ms: u64,
    /// The fault.
    pub fault: Fault,
}

/// The faults of one run, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// The steps.
    pub steps: Vec<Step>,
}

/// The fault classes a store allows, one representative draw each.
fn draw_one(rng: &mut StdRng, class: &str, workers: usize, failover_ms: u64) -> Fault {
    let slot = rng.random_range(0..workers.max(1));
    match class {
        "kill_same_id" => Fault::Kill { slot, fresh_id: false, down_ms: rng.random_range(0..3000) },
        "kill_fresh_id" => Fault::Kill { slot, fresh_id: true, down_ms: rng.random_range(0..3000) },
        "pause" => Fault::Pause {
            slot,
            ms: failover_ms + rng.random_range(failover_ms / 2..failover_ms * 2),
        },
        "term" => Fault::Term { slot, down_ms: rng.random_range(0..2000) },
        "join" => Fault::Join,
        "split" => Fault::Split,
        "merge" => Fault::Merge,
        "partition" => {
            let kind = match rng.random_range(0..3) {
                0 => PartitionKind::Drop,
                1 => PartitionKind::Blackhole,
                _ => PartitionKind::Delay { ms: rng.random_range(50..1500) },
            };
            let dir = match (kind, rng.random_range(0..3)) {
                (PartitionKind::Drop, _) | (_, 0) => Direction::Both,
                (_, 1) => Direction::ToStore,
                _ => Direction::FromStore,
            };
            Fault::Partition {
                slot,
                kind,
                dir,
                ms: rng.random_range(failover_ms / 2..failover_ms * 3),
            }
        }
        "clock" => {
            let step = rng.random_range(60..7200);
            Fault::Clock {
                slot,
                offset_s: if rng.random_bool(0.5) { -step } else { step },
                ms: rng.random_range(failover_ms..failover_ms * 3),
            }
        }
        "store_wipe" => Fault::StoreWipe { down_ms: rng.random_range(200..3000) },
        _ => Fault::StoreRestart { down_ms: rng.random_range(200..3000) },
    }
}

/// The fault classes that apply to `store`.
pub fn classes(store: StoreKind) -> Vec<&'static str> {
    let mut c =
        vec!["kill_same_id", "kill_fresh_id", "pause", "term", "join", "split", "merge", "clock"];
    if store.networked() {
        c.push("partition");
    }
    if store.restartable() {
        c.push("store_restart");
    }
    c
}

/// The fault classes that may lose the store's data, drawn only when asked (`--wipes`): a run
/// with one is judged on lost records alone ([`crate::checker::Verdict::ok`]).
pub fn wipe_classes(store: StoreKind) -> Vec<&'static str> {
    if store.wipeable() {
        vec!["store_wipe"]
    } else {
        Vec::new()
    }
}

/// Draws a schedule from `seed`: every class once in a random order when `every_class`, then
/// `extra` more faults of random classes (at most two joins in a run); the wipe classes are
/// among them only when `wipes`.
pub fn draw(
    seed: u64,
    store: StoreKind,
    workers: usize,
    failover_ms: u64,
    every_class: bool,
    extra: usize,
    wipes: bool,
) -> Schedule {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut all = classes(store);
    if wipes {
        all.extend(wipe_classes(store));
    }
    let mut picked: Vec<&str> = if every_class { all.clone() } else { Vec::new() };
    let mut joins = picked.iter().filter(|c| **c == "join").count();
    while picked.len() < extra + if every_class { all.len() } else { 0 } {
        let c = all[rng.random_range(0..all.len())];
        if c == "join" {
            if joins >= 2 {
                continue;
            }
            joins += 1;
        }
        picked.push(c);
    }
    picked.shuffle(&mut rng);
    let steps = picked
        .into_iter()
        .map(|c| Step {
            gap_ms: rng.random_range(500..2500),
            fault: draw_one(&mut rng, c, workers, failover_ms),
        })
        .collect();
    Schedule { steps }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_schedule_and_every_class_when_asked() {
        let a = draw(7, StoreKind::Postgres, 3, 2000, true, 3, false);
        assert_eq!(a, draw(7, StoreKind::Postgres, 3, 2000, true, 3, false));
        assert_ne!(a, draw(8, StoreKind::Postgres, 3, 2000, true, 3, false));
        for class in classes(StoreKind::Postgres) {
            assert!(a.steps.iter().any(|s| s.fault.class() == class), "{class} missing");
        }
        assert_eq!(a.steps.len(), classes(StoreKind::Postgres).len() + 3);
        let sqlite = draw(7, StoreKind::Sqlite, 3, 2000, true, 0, false);
        assert!(sqlite
            .steps
            .iter()
            .all(|s| !matches!(s.fault, Fault::Partition { .. } | Fault::StoreRestart { .. })));
        for s in &a.steps {
            if let Fault::Pause { ms, .. } = s.fault {
                assert!(ms > 2000, "a pause must outlast the failover timeout");
            }
        }
        assert!(a.steps.iter().all(|s| !matches!(s.fault, Fault::StoreWipe { .. })));
    }

    #[test]
    fn wipes_are_drawn_only_when_asked_and_only_where_they_apply() {
        let redis = draw(7, StoreKind::Redis, 3, 2000, true, 0, true);
        assert!(redis.steps.iter().any(|s| matches!(s.fault, Fault::StoreWipe { .. })));
        let no = draw(7, StoreKind::Redis, 3, 2000, true, 5, false);
        assert!(no.steps.iter().all(|s| !matches!(s.fault, Fault::StoreWipe { .. })));
        let pg = draw(7, StoreKind::Postgres, 3, 2000, true, 5, true);
        assert!(pg.steps.iter().all(|s| !matches!(s.fault, Fault::StoreWipe { .. })));
        let ddb = draw(7, StoreKind::Dynamodb, 3, 2000, true, 0, true);
        assert!(ddb.steps.iter().any(|s| matches!(s.fault, Fault::StoreWipe { .. })));
        assert!(ddb.steps.iter().all(|s| !matches!(s.fault, Fault::StoreRestart { .. })));
    }
}
