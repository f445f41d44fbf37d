//! Tests of the greedy and one-per-pass balancers.
//!
//! Single-pass rules are checked with tables of snapshots. Convergence is checked with a small
//! simulator that applies plans to a shared `Vec<Lease>` the way the runtime's compare-and-set
//! writes would: an action whose precondition no longer holds is skipped (a conflict).

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::balancer::{Balancer, GreedyBalancer, OnePerPassBalancer, Plan, Snapshot};
use crate::lease::{Claim, Epoch, Lease, LeaseKey, WorkerId};
use crate::position::Position;

// ---------------------------------------------------------------------------------------------
// Builders

fn w(s: &str) -> WorkerId {
    WorkerId::from(s)
}

fn k(s: &str) -> LeaseKey {
    LeaseKey::from(s)
}

/// An unowned, unfinished lease.
fn free(key: &str) -> Lease {
    Lease::new(key, Position::TrimHorizon)
}

fn owned(key: &str, owner: &str) -> Lease {
    Lease { owner: Some(w(owner)), ..free(key) }
}

fn finished(key: &str) -> Lease {
    Lease { checkpoint: Position::ShardEnd, ..free(key) }
}

fn child(key: &str, parents: &[&str]) -> Lease {
    free(key).with_parents(parents.iter().map(|p| k(p)))
}

/// `lease` with a claim by `by` made against epoch `at`.
fn claimed(lease: Lease, by: &str, at: u64) -> Lease {
    Lease { claim: Some(Claim { by: w(by), at: Epoch(at) }), ..lease }
}

/// `n` leases `{prefix}0000..`, owned by `owner` (or unowned).
fn many(prefix: &str, n: usize, owner: Option<&str>) -> Vec<Lease> {
    (0..n)
        .map(|i| {
            let key = format!("{prefix}{i:04}");
            match owner {
                Some(o) => owned(&key, o),
                None => free(&key),
            }
        })
        .collect()
}

/// Leases owned according to `shares` (worker, count), keys unique across workers.
fn distributed(shares: &[(&str, usize)]) -> Vec<Lease> {
    shares.iter().flat_map(|(owner, n)| many(&format!("{owner}-"), *n, Some(owner))).collect()
}

fn snapshot(me: &str, leases: Vec<Lease>, live: &[&str]) -> Snapshot {
    Snapshot {
        withheld: Default::default(),
        me: w(me),
        leases,
        live_workers: live.iter().map(|s| w(s)).collect(),
        max_leases_per_worker: None,
        max_claims_per_pass: None,
        expired_claims: BTreeSet::new(),
        seed: 7,
        loads: None,
    }
}

fn greedy(s: &Snapshot) -> Plan {
    GreedyBalancer::default().plan(s)
}

fn key_set(keys: &[LeaseKey]) -> BTreeSet<String> {
    keys.iter().map(|k| k.as_str().to_owned()).collect()
}

fn strs(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|s| (*s).to_owned()).collect()
}

fn victims(plan: &Plan) -> Vec<String> {
    plan.claims.iter().map(|(_, v)| v.as_str().to_owned()).collect()
}

/// Owned-lease count per worker (every worker in `workers` listed, with zero if it owns nothing).
fn shares_of(leases: &[Lease], workers: &[WorkerId]) -> BTreeMap<WorkerId, usize> {
    let mut shares: BTreeMap<WorkerId, usize> = workers.iter().map(|w| (w.clone(), 0)).collect();
    for owner in leases.iter().filter_map(|l| l.owner.as_ref()) {
        *shares.entry(owner.clone()).or_default() += 1;
    }
    shares
}

/// The fewest handoffs that balance `shares` to within one: the `total mod n` largest keep
/// `base + 1`, the others `base`; count what the over-full ones must give away.
fn min_moves(shares: &[usize]) -> usize {
    let n = shares.len();
    let total: usize = shares.iter().sum();
    let (base, extra) = (total / n, total % n);
    let mut sorted = shares.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.iter().enumerate().map(|(i, s)| s.saturating_sub(base + usize::from(i < extra))).sum()
}

// ---------------------------------------------------------------------------------------------
// Simulator

/// A namespace of leases shared by simulated workers, updated as compare-and-set writes would.
struct Sim {
    leases: Vec<Lease>,
    workers: Vec<WorkerId>,
    max_leases_per_worker: Option<usize>,
    max_claims_per_pass: Option<usize>,
    /// Ownership changes by handoff or take-over (not takes of available leases).
    moves: usize,
    /// Takes of available leases.
    takes: usize,
    /// Actions skipped because the lease changed under them.
    conflicts: usize,
    /// Passes whose plan was not empty, per worker.
    busy_passes: BTreeMap<WorkerId, usize>,
}

impl Sim {
    fn new(leases: Vec<Lease>, workers: &[&str]) -> Self {
        Sim {
            leases,
            workers: workers.iter().map(|s| w(s)).collect(),
            max_leases_per_worker: None,
            max_claims_per_pass: None,
            moves: 0,
            takes: 0,
            conflicts: 0,
            busy_passes: BTreeMap::new(),
        }
    }

    fn snapshot(&self, me: &WorkerId, seed: u64) -> Snapshot {
        Snapshot {
            withheld: Default::default(),
            me: me.clone(),
            leases: self.leases.clone(),
            live_workers: self.workers.iter().cloned().collect(),
            max_leases_per_worker: self.max_leases_per_worker,
            max_claims_per_pass: self.max_claims_per_pass,
            expired_claims: BTreeSet::new(),
            seed,
            loads: None,
        }
    }

    fn is_live(&self, worker: &WorkerId) -> bool {
        self.workers.contains(worker)
    }

    fn find(&mut self, key: &LeaseKey) -> Option<usize> {
        self.leases.iter().position(|l| &l.key == key)
    }

    /// Carries out `plan` for `me`, skipping every action whose precondition no longer holds.
    fn apply(&mut self, me: &WorkerId, plan: &Plan) {
        let mut taken = 0;
        for key in &plan.take_candidates {
            if taken == plan.take_count {
                break;
            }
            let Some(i) = self.find(key) else { continue };
            let available = self.leases[i].owner.as_ref().is_none_or(|o| !self.is_live(o));
            if available {
                self.leases[i] = self.leases[i].transferred_to(Some(me.clone()));
                taken += 1;
                self.takes += 1;
            } else {
                self.conflicts += 1;
            }
        }
        for (key, victim) in &plan.claims {
            let Some(i) = self.find(key) else { continue };
            let lease = &self.leases[i];
            let free_of_claims = lease.live_claim().is_none_or(|c| !self.is_live(&c.by));
            if lease.is_owned_by(victim) && free_of_claims {
                let at = lease.epoch;
                self.leases[i].claim = Some(Claim { by: me.clone(), at });
            } else {
                self.conflicts += 1;
            }
        }
        for key in &plan.take_over {
            let Some(i) = self.find(key) else { continue };
            if self.leases[i].live_claim().is_some_and(|c| &c.by == me) {
                self.leases[i] = self.leases[i].transferred_to(Some(me.clone()));
                self.moves += 1;
            } else {
                self.conflicts += 1;
            }
        }
        for (key, claimant) in &plan.handoffs {
            let Some(i) = self.find(key) else { continue };
            let lease = &self.leases[i];
            if lease.is_owned_by(me) && lease.live_claim().is_some_and(|c| &c.by == claimant) {
                self.leases[i] = lease.transferred_to(Some(claimant.clone()));
                self.moves += 1;
            } else {
                self.conflicts += 1;
            }
        }
        for key in &plan.clear_claims {
            let Some(i) = self.find(key) else { continue };
            if self.leases[i].is_owned_by(me) {
                self.leases[i].claim = None;
            } else {
                self.conflicts += 1;
            }
        }
    }

    /// One pass of `me`: plan from the current state, then apply.
    fn pass(&mut self, balancer: &dyn Balancer, me: &WorkerId, seed: u64) -> Plan {
        let plan = balancer.plan(&self.snapshot(me, seed));
        if !plan.is_empty() {
            *self.busy_passes.entry(me.clone()).or_default() += 1;
        }
        self.apply(me, &plan);
        plan
    }

    /// Rounds of one pass per worker (in id order, or shuffled per round when `order_seed` is
    /// set) until a whole round plans nothing. Returns the number of rounds that did something.
    fn run_until_stable(&mut self, balancer: &dyn Balancer, order_seed: Option<u64>) -> usize {
        let mut order_rng = StdRng::seed_from_u64(order_seed.unwrap_or(0));
        for round in 0..10_000u64 {
            let mut order = self.workers.clone();
            if order_seed.is_some() {
                order.shuffle(&mut order_rng);
            }
            let mut busy = false;
            for (i, me) in order.iter().enumerate() {
                let seed = round * 1_000 + i as u64 + order_seed.unwrap_or(0);
                busy |= !self.pass(balancer, me, seed).is_empty();
            }
            if !busy {
                return round as usize;
            }
        }
        panic!("no convergence after 10000 rounds: {:?}", self.shares());
    }

    fn shares(&self) -> BTreeMap<WorkerId, usize> {
        shares_of(&self.leases, &self.workers)
    }

    fn spread(&self) -> usize {
        let shares = self.shares();
        let max = shares.values().max().copied().unwrap_or(0);
        let min = shares.values().min().copied().unwrap_or(0);
        max - min
    }
}

// ---------------------------------------------------------------------------------------------
// Taking available leases

#[test]
fn lone_worker_takes_all_unowned_leases_in_one_pass() {
    // The reported bug: the Go port needed 100 passes for this.
    let table: [(Option<usize>, usize); 3] = [(None, 100), (Some(50), 50), (Some(100), 100)];
    for (max_leases, expected) in table {
        let mut s = snapshot("me", many("s", 100, None), &["me"]);
        s.max_leases_per_worker = max_leases;
        let plan = greedy(&s);
        assert_eq!(plan.take_count, expected, "max_leases_per_worker {max_leases:?}");
        assert_eq!(plan.take_candidates.len(), 100, "every available lease is a candidate");
        assert!(plan.claims.is_empty() && plan.handoffs.is_empty());
    }
    // `me` need not be listed among the live workers.
    assert_eq!(greedy(&snapshot("me", many("s", 100, None), &[])).take_count, 100);
}

#[test]
fn workers_starting_together_split_the_leases_in_one_pass_each() {
    let workers: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    let names: Vec<&str> = workers.iter().map(String::as_str).collect();
    let leases = many("s", 1024, None);
    // Everyone plans from the same empty snapshot, as at a simultaneous start.
    let plans: Vec<(WorkerId, Plan)> = names
        .iter()
        .enumerate()
        .map(|(i, me)| {
            let mut s = snapshot(me, leases.clone(), &names);
            s.seed = i as u64;
            (w(me), greedy(&s))
        })
        .collect();
    for (me, plan) in &plans {
        assert_eq!(plan.take_count, 128, "{me}: never more than the target");
        assert_eq!(plan.take_candidates.len(), 1024, "{me}");
    }
    // They then carry their plans out one after the other; a lease taken meanwhile is a conflict.
    let mut sim = Sim::new(leases, &names);
    for (me, plan) in &plans {
        sim.apply(me, plan);
    }
    assert!(sim.leases.iter().all(|l| l.owner.is_some()), "all 1024 owned after one pass each");
    assert!(sim.shares().values().all(|&n| n == 128), "{:?}", sim.shares());
    // Each starts at its own offset of the same list: nobody tries a lease another took first.
    assert_eq!(sim.conflicts, 0, "the candidate lists overlap");
    // And nothing is left to do.
    assert_eq!(sim.run_until_stable(&GreedyBalancer::default(), None), 0);
}

#[test]
fn finished_and_blocked_leases_count_for_nobody() {
    struct Row {
        name: &'static str,
        leases: Vec<Lease>,
        live: &'static [&'static str],
        candidates: &'static [&'static str],
        take_count: usize,
        claims: usize,
    }
    let table = vec![
        Row {
            name: "finished and child-of-unfinished are neither counted nor taken",
            leases: vec![free("a"), finished("b"), child("c", &["a"]), free("d")],
            live: &["me", "x"],
            // 2 active on 2 workers: target 1 (4 leases would have given 2).
            candidates: &["a", "d"],
            take_count: 1,
            claims: 0,
        },
        Row {
            name: "child of a finished parent is active",
            leases: vec![finished("p"), child("c", &["p"]), free("e")],
            live: &["me"],
            candidates: &["c", "e"],
            take_count: 2,
            claims: 0,
        },
        Row {
            name: "child of a parent absent from the snapshot is active",
            leases: vec![child("c", &["gone"]), free("e")],
            live: &["me"],
            candidates: &["c", "e"],
            take_count: 2,
            claims: 0,
        },
        Row {
            name: "merge child blocked while one parent is unfinished",
            leases: vec![finished("p1"), free("p2"), child("m", &["p1", "p2"])],
            live: &["me"],
            candidates: &["p2"],
            take_count: 1,
            claims: 0,
        },
        Row {
            name: "merge child blocked while both parents are unfinished",
            leases: vec![free("p1"), free("p2"), child("m", &["p1", "p2"])],
            live: &["me"],
            candidates: &["p1", "p2"],
            take_count: 2,
            claims: 0,
        },
        Row {
            name: "merge child active once both parents are finished",
            leases: vec![finished("p1"), finished("p2"), child("m", &["p1", "p2"])],
            live: &["me"],
            candidates: &["m"],
            take_count: 1,
            claims: 0,
        },
        Row {
            name: "merge child with one finished parent and one gone is active",
            leases: vec![finished("p1"), child("m", &["p1", "gone"])],
            live: &["me"],
            candidates: &["m"],
            take_count: 1,
            claims: 0,
        },
        Row {
            name: "finished and blocked leases do not count toward their owner's share",
            leases: {
                // x owns 3 finished and 1 blocked lease but no active one; 2 active are free.
                let mut v = vec![
                    Lease { owner: Some(w("x")), ..finished("f1") },
                    Lease { owner: Some(w("x")), ..finished("f2") },
                    Lease { owner: Some(w("x")), ..finished("f3") },
                    Lease { owner: Some(w("x")), ..child("blocked", &["a"]) },
                ];
                v.extend([free("a"), free("b")]);
                v
            },
            live: &["me", "x"],
            candidates: &["a", "b"],
            take_count: 1,
            claims: 0,
        },
        Row {
            name: "finished and blocked leases are never claimed",
            leases: {
                // x owns 4 active and 4 inactive; me owns 2 active: only x's active are claimed.
                let mut v = distributed(&[("x", 4), ("me", 2)]);
                v.push(Lease { owner: Some(w("x")), ..finished("f1") });
                v.push(Lease { owner: Some(w("x")), ..finished("f2") });
                v.push(Lease { owner: Some(w("x")), ..child("b1", &["x-0000"]) });
                v.push(Lease { owner: Some(w("x")), ..child("b2", &["x-0001"]) });
                v
            },
            live: &["me", "x"],
            candidates: &[],
            take_count: 0,
            claims: 1,
        },
    ];
    for row in table {
        let plan = greedy(&snapshot("me", row.leases, row.live));
        assert_eq!(key_set(&plan.take_candidates), strs(row.candidates), "{}", row.name);
        assert_eq!(plan.take_count, row.take_count, "{}", row.name);
        assert_eq!(plan.claims.len(), row.claims, "{}", row.name);
        for (key, _) in &plan.claims {
            assert!(key.as_str().starts_with("x-"), "{}: claimed {key}", row.name);
        }
    }
}

#[test]
fn leases_of_dead_owners_are_available() {
    let mut leases = many("dead-", 4, Some("dead"));
    leases.extend(many("b-", 2, Some("b")));
    let plan = greedy(&snapshot("me", leases, &["me", "b"]));
    // 6 active on 2 live workers: target 3; the dead owner's 4 leases are the candidates.
    assert_eq!(
        key_set(&plan.take_candidates),
        strs(&["dead-0000", "dead-0001", "dead-0002", "dead-0003"])
    );
    assert_eq!(plan.take_count, 3);
    assert!(plan.claims.is_empty(), "the dead owner is nobody's victim");
}

// ---------------------------------------------------------------------------------------------
// Claims

#[test]
fn plan_builders_set_each_action() {
    // A balancer outside the crate cannot write a `Plan` literal (`#[non_exhaustive]`): the
    // builders must reach every field.
    assert_eq!(Plan::new(), Plan::default());
    let plan = Plan::new()
        .with_takes(vec![k("s1"), k("s2")], 1)
        .with_claims(vec![(k("s3"), w("a"))])
        .with_handoffs(vec![(k("s4"), w("b"))])
        .with_clear_claims(vec![k("s5")])
        .with_take_over(vec![k("s6")]);
    let expected = Plan {
        take_candidates: vec![k("s1"), k("s2")],
        take_count: 1,
        claims: vec![(k("s3"), w("a"))],
        handoffs: vec![(k("s4"), w("b"))],
        clear_claims: vec![k("s5")],
        take_over: vec![k("s6")],
    };
    assert_eq!(plan, expected);
    assert!(!plan.is_empty());
}

#[test]
fn at_target_without_imbalance_of_two_the_plan_is_empty() {
    let table: [(&str, &[(&str, usize)]); 4] = [
        ("equal shares", &[("a", 3), ("b", 3), ("me", 3)]),
        ("spread of one, me above", &[("a", 3), ("b", 3), ("me", 4)]),
        ("spread of one, me below", &[("a", 4), ("b", 4), ("me", 3)]),
        ("lone worker owning everything", &[("me", 10)]),
    ];
    for (name, shares) in table {
        let live: Vec<&str> = shares.iter().map(|(w, _)| *w).collect();
        let plan = greedy(&snapshot("me", distributed(shares), &live));
        assert_eq!(plan, Plan::default(), "{name}");
    }
}

#[test]
fn claims_target_the_most_loaded_first() {
    // 36 leases on 4 workers: balanced at 9 each. b is most loaded, then a and b tie at 10.
    let leases = distributed(&[("a", 10), ("b", 12), ("c", 8), ("me", 6)]);
    let plan = greedy(&snapshot("me", leases, &["a", "b", "c", "me"]));
    assert_eq!(victims(&plan), ["b", "b", "a"]);
    for (key, victim) in &plan.claims {
        assert!(key.as_str().starts_with(&format!("{victim}-")), "{key} is not {victim}'s");
    }
    let distinct: BTreeSet<&LeaseKey> = plan.claims.iter().map(|(k, _)| k).collect();
    assert_eq!(distinct.len(), plan.claims.len(), "no lease claimed twice");
    assert_eq!(plan.take_count, 0);
}

#[test]
fn claim_rules_table() {
    struct Row {
        name: &'static str,
        leases: Vec<Lease>,
        live: &'static [&'static str],
        max_leases: Option<usize>,
        max_claims: Option<usize>,
        victims: &'static [&'static str],
    }
    let with_claims = |mut leases: Vec<Lease>, claims: &[(&str, &str)]| {
        for (key, by) in claims {
            if let Some(l) = leases.iter_mut().find(|l| l.key.as_str() == *key) {
                l.claim = Some(Claim { by: w(by), at: l.epoch });
            }
        }
        leases
    };
    let table = vec![
        Row {
            name: "newcomer claims up to its balanced share",
            leases: distributed(&[("o", 10)]),
            live: &["me", "o"],
            max_leases: None,
            max_claims: None,
            victims: &["o"; 5],
        },
        Row {
            name: "max_claims_per_pass caps claims",
            leases: distributed(&[("o", 10)]),
            live: &["me", "o"],
            max_leases: None,
            max_claims: Some(2),
            victims: &["o"; 2],
        },
        Row {
            name: "max_leases_per_worker caps claims",
            leases: distributed(&[("o", 10)]),
            live: &["me", "o"],
            max_leases: Some(3),
            max_claims: None,
            victims: &["o"; 3],
        },
        Row {
            name: "max_leases_per_worker counts leases I already hold",
            leases: distributed(&[("o", 10), ("me", 2)]),
            live: &["me", "o"],
            max_leases: Some(3),
            max_claims: None,
            victims: &["o"],
        },
        Row {
            name: "my pending claims count toward me",
            // o 5, me 3, but me already claimed one of o's: effectively 4 and 4.
            leases: with_claims(distributed(&[("o", 5), ("me", 3)]), &[("o-0000", "me")]),
            live: &["me", "o"],
            max_leases: None,
            max_claims: None,
            victims: &[],
        },
        Row {
            name: "others' pending claims count toward them",
            // o 8, x 0, me 4: x claimed 4 of o's, so effectively 4/4/4.
            leases: with_claims(
                distributed(&[("o", 8), ("me", 4)]),
                &[("o-0000", "x"), ("o-0001", "x"), ("o-0002", "x"), ("o-0003", "x")],
            ),
            live: &["me", "o", "x"],
            max_leases: None,
            max_claims: None,
            victims: &[],
        },
        Row {
            name: "a claim by a dead worker counts for nobody and does not protect the lease",
            leases: with_claims(
                distributed(&[("o", 2)]),
                &[("o-0000", "dead"), ("o-0001", "dead")],
            ),
            live: &["me", "o"],
            max_leases: None,
            max_claims: None,
            victims: &["o"],
        },
        Row {
            name: "leases already claimed by a live worker are not claimed again",
            // o 4 (3 of them claimed by x), x 2, me 0: effectively o 1, x 5, me 0, balanced at 2.
            // x is the victim (o is below its share), and only x's own leases are claimable.
            leases: with_claims(
                distributed(&[("o", 4), ("x", 2)]),
                &[("o-0000", "x"), ("o-0001", "x"), ("o-0002", "x")],
            ),
            live: &["me", "o", "x"],
            max_leases: None,
            max_claims: None,
            victims: &["x", "x"],
        },
        Row {
            name: "a victim with nothing claimable is skipped for the next",
            // a 6 (all claimed by b, so effectively 0), b 2 + 6 = 8, c 6, me 0: 14 leases,
            // balanced at 4, 4, 3, 3 (b, c, a, me).
            leases: with_claims(
                distributed(&[("a", 6), ("b", 2), ("c", 6)]),
                &[
                    ("a-0000", "b"),
                    ("a-0001", "b"),
                    ("a-0002", "b"),
                    ("a-0003", "b"),
                    ("a-0004", "b"),
                    ("a-0005", "b"),
                ],
            ),
            live: &["a", "b", "c", "me"],
            max_leases: None,
            max_claims: None,
            // b (eff 8) first while it tops c, but it owns only 2 leases of its own; then c.
            victims: &["b", "b", "c"],
        },
    ];
    for row in table {
        let mut s = snapshot("me", row.leases, row.live);
        s.max_leases_per_worker = row.max_leases;
        s.max_claims_per_pass = row.max_claims;
        let plan = greedy(&s);
        assert_eq!(victims(&plan), row.victims, "{}", row.name);
        let distinct: BTreeSet<&LeaseKey> = plan.claims.iter().map(|(k, _)| k).collect();
        assert_eq!(distinct.len(), plan.claims.len(), "{}: no lease claimed twice", row.name);
    }
}

#[test]
fn claims_converge_to_within_one_with_fewest_moves() {
    // 1024 leases on 7 workers: ceil gives a target of 147, which 142..147 already satisfies.
    // Claims must go on to 146..147, moving no lease more than needed.
    let table: [&[usize]; 9] = [
        &[142, 147, 147, 147, 147, 147, 147],
        &[147, 147, 147, 147, 147, 147, 142],
        &[143, 146, 147, 147, 147, 147, 147],
        &[144, 145, 147, 147, 147, 147, 147],
        &[145, 145, 146, 147, 147, 147, 147],
        &[171, 171, 171, 171, 170, 170, 0],
        &[0, 0, 0, 0, 0, 0, 1024],
        // Smaller cases where "claim while someone holds two more" alone would move extra
        // leases (b would claim from a and then be claimed from by c).
        &[10, 8, 6],
        &[10, 10, 10, 2],
    ];
    for shares in table {
        let names: Vec<String> = (0..shares.len()).map(|i| format!("w{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let start: Vec<(&str, usize)> = names.iter().copied().zip(shares.iter().copied()).collect();
        for order_seed in [None, Some(1), Some(2), Some(3)] {
            let mut sim = Sim::new(distributed(&start), &names);
            sim.run_until_stable(&GreedyBalancer::default(), order_seed);
            assert!(sim.spread() <= 1, "{shares:?} {order_seed:?}: {:?}", sim.shares());
            assert_eq!(sim.moves, min_moves(shares), "{shares:?} {order_seed:?}: fewest moves");
            assert_eq!(sim.takes, 0);
        }
        if shares.iter().sum::<usize>() == 1024 {
            let mut sim = Sim::new(distributed(&start), &names);
            sim.run_until_stable(&GreedyBalancer::default(), None);
            assert!(sim.shares().values().all(|n| (146..=147).contains(n)), "{:?}", sim.shares());
        }
    }
}

#[test]
fn random_distributions_converge_with_fewest_moves() {
    let mut rng = StdRng::seed_from_u64(42);
    for trial in 0..150 {
        let n = rng.random_range(2..=8);
        let total = rng.random_range(0..=200);
        // Skewed start: each lease goes to one of a random subset of the workers.
        let holders = rng.random_range(1..=n);
        let mut shares = vec![0usize; n];
        for _ in 0..total {
            shares[rng.random_range(0..holders)] += 1;
        }
        let names: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let start: Vec<(&str, usize)> = names.iter().copied().zip(shares.iter().copied()).collect();
        let mut sim = Sim::new(distributed(&start), &names);
        if trial % 3 == 0 {
            sim.max_claims_per_pass = Some(rng.random_range(1..=3));
        }
        sim.run_until_stable(&GreedyBalancer::default(), Some(trial));
        assert!(sim.spread() <= 1, "trial {trial} {shares:?}: {:?}", sim.shares());
        assert_eq!(sim.moves, min_moves(&shares), "trial {trial} {shares:?}: fewest moves");
    }
}

// ---------------------------------------------------------------------------------------------
// Handoffs, cleared claims, take-overs

#[test]
fn handoff_only_when_owner_holds_two_more_than_claimant() {
    struct Row {
        name: &'static str,
        /// (my share, claimant's share)
        shares: (usize, usize),
        /// How many of my leases (the first ones by key) the claimant claims.
        claims: usize,
        claimant_live: bool,
        /// Claims made against an older epoch.
        stale: bool,
        handoffs: usize,
        cleared: usize,
    }
    let rows = [
        Row {
            name: "5 vs 3: hand over",
            shares: (5, 3),
            claims: 1,
            claimant_live: true,
            stale: false,
            handoffs: 1,
            cleared: 0,
        },
        Row {
            name: "4 vs 3: clear",
            shares: (4, 3),
            claims: 1,
            claimant_live: true,
            stale: false,
            handoffs: 0,
            cleared: 1,
        },
        Row {
            name: "3 vs 3: clear",
            shares: (3, 3),
            claims: 1,
            claimant_live: true,
            stale: false,
            handoffs: 0,
            cleared: 1,
        },
        Row {
            name: "6 vs 2, three claims: 6/2 -> 5/3 -> 4/4, third cleared",
            shares: (6, 2),
            claims: 3,
            claimant_live: true,
            stale: false,
            handoffs: 2,
            cleared: 1,
        },
        Row {
            name: "10 vs 0, four claims: all handed over",
            shares: (10, 0),
            claims: 4,
            claimant_live: true,
            stale: false,
            handoffs: 4,
            cleared: 0,
        },
        Row {
            name: "claimant dead: clear",
            shares: (9, 0),
            claims: 2,
            claimant_live: false,
            stale: false,
            handoffs: 0,
            cleared: 2,
        },
        Row {
            name: "stale claim: ignored",
            shares: (9, 0),
            claims: 2,
            claimant_live: true,
            stale: true,
            handoffs: 0,
            cleared: 0,
        },
    ];
    for row in rows {
        let mut leases = distributed(&[("me", row.shares.0), ("c", row.shares.1)]);
        for lease in leases.iter_mut().filter(|l| l.is_owned_by(&w("me"))).take(row.claims) {
            lease.epoch = Epoch(3);
            let at = if row.stale { 2 } else { 3 };
            lease.claim = Some(Claim { by: w("c"), at: Epoch(at) });
        }
        let live: &[&str] = if row.claimant_live { &["me", "c"] } else { &["me"] };
        let plan = greedy(&snapshot("me", leases, live));
        assert_eq!(plan.handoffs.len(), row.handoffs, "{}", row.name);
        assert_eq!(plan.clear_claims.len(), row.cleared, "{}", row.name);
        assert!(plan.handoffs.iter().all(|(_, c)| c == &w("c")), "{}", row.name);
        // Handoffs are decided in key order: the first claimed leases are the ones handed over.
        let expected: Vec<LeaseKey> = (0..row.handoffs).map(|i| k(&format!("me-{i:04}"))).collect();
        let got: Vec<LeaseKey> = plan.handoffs.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(got, expected, "{}", row.name);
    }
}

#[test]
fn expired_claims_are_taken_over_when_the_owner_is_alive_but_silent() {
    struct Row {
        name: &'static str,
        lease: Lease,
        live: &'static [&'static str],
        take_over: bool,
    }
    let at_epoch = |mut l: Lease, e: u64| {
        l.epoch = Epoch(e);
        l
    };
    let rows = [
        Row {
            name: "live owner, my live claim",
            lease: claimed(at_epoch(owned("x", "o"), 4), "me", 4),
            live: &["me", "o"],
            take_over: true,
        },
        Row {
            name: "claim stale (the lease changed hands since)",
            lease: claimed(at_epoch(owned("x", "o"), 5), "me", 4),
            live: &["me", "o"],
            take_over: false,
        },
        Row {
            name: "claim by somebody else",
            lease: claimed(at_epoch(owned("x", "o"), 4), "z", 4),
            live: &["me", "o", "z"],
            take_over: false,
        },
        Row {
            name: "owner dead: the lease is available instead",
            lease: claimed(at_epoch(owned("x", "o"), 4), "me", 4),
            live: &["me"],
            take_over: false,
        },
        Row {
            name: "already mine",
            lease: claimed(at_epoch(owned("x", "me"), 4), "me", 4),
            live: &["me", "o"],
            take_over: false,
        },
        Row {
            name: "lease finished meanwhile",
            lease: Lease {
                checkpoint: Position::ShardEnd,
                ..claimed(at_epoch(owned("x", "o"), 4), "me", 4)
            },
            live: &["me", "o"],
            take_over: false,
        },
    ];
    for row in rows {
        let mut s = snapshot("me", vec![row.lease], row.live);
        s.expired_claims = [k("x"), k("not-in-snapshot")].into_iter().collect();
        let plan = greedy(&s);
        let expected = if row.take_over { vec![k("x")] } else { vec![] };
        assert_eq!(plan.take_over, expected, "{}", row.name);
    }
}

// ---------------------------------------------------------------------------------------------
// The one-per-pass baseline

#[test]
fn one_per_pass_takes_one_lease_per_pass() {
    let s = snapshot("me", many("s", 100, None), &["me"]);
    let plan = OnePerPassBalancer::default().plan(&s);
    assert_eq!(plan.take_count, 1);
    assert_eq!(plan.take_candidates.len(), 100);

    let mut sim = Sim::new(many("s", 100, None), &["me"]);
    sim.run_until_stable(&OnePerPassBalancer::default(), None);
    assert_eq!(sim.busy_passes.get(&w("me")), Some(&100), "the reported bug: 100 passes");

    let mut sim = Sim::new(distributed(&[("o", 10)]), &["me", "o"]);
    let plan = sim.pass(&OnePerPassBalancer::default(), &w("me"), 0);
    assert_eq!(victims(&plan), ["o"], "one claim per pass");
}

#[test]
fn one_per_pass_needs_a_pass_per_lease_on_a_fleet() {
    let names: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();

    let mut slow = Sim::new(many("s", 1024, None), &names);
    let rounds = slow.run_until_stable(&OnePerPassBalancer::default(), None);
    assert!(slow.leases.iter().all(|l| l.owner.is_some()));
    assert!(slow.shares().values().all(|&n| n == 128), "{:?}", slow.shares());
    assert!((128..=130).contains(&rounds), "{rounds} rounds");
    for (worker, passes) in &slow.busy_passes {
        assert!((128..=130).contains(passes), "{worker}: {passes} passes");
    }

    let mut fast = Sim::new(many("s", 1024, None), &names);
    assert_eq!(fast.run_until_stable(&GreedyBalancer::default(), None), 1, "greedy: one round");
    assert!(fast.busy_passes.values().all(|&p| p == 1), "{:?}", fast.busy_passes);
    assert!(fast.shares().values().all(|&n| n == 128), "{:?}", fast.shares());
}

#[test]
fn one_per_pass_keeps_greedy_handoffs_clears_and_take_overs() {
    let mut leases = distributed(&[("me", 10)]);
    for lease in leases.iter_mut().take(3) {
        lease.claim = Some(Claim { by: w("c"), at: lease.epoch });
    }
    let mut s = snapshot("me", leases, &["me", "c"]);
    s.expired_claims = [k("me-0000")].into_iter().collect();
    let slow = OnePerPassBalancer::default().plan(&s);
    let fast = greedy(&s);
    assert_eq!(slow.handoffs.len(), 3);
    assert_eq!(slow.handoffs, fast.handoffs);
    assert_eq!(slow.clear_claims, fast.clear_claims);
    assert_eq!(slow.take_over, fast.take_over);
}

// ---------------------------------------------------------------------------------------------
// Determinism

#[test]
fn plans_are_deterministic_for_a_seed() {
    let mut leases = many("s", 100, None);
    leases.extend(distributed(&[("o", 40)]));
    let s = snapshot("me", leases.clone(), &["me", "o"]);
    assert_eq!(greedy(&s), greedy(&s), "same snapshot and seed, same plan");

    let mut reversed = s.clone();
    reversed.leases.reverse();
    assert_eq!(greedy(&reversed), greedy(&s), "input order does not matter");

    // Workers seeing the same leases try them from different offsets, wrapping around.
    let other = snapshot("o", leases, &["me", "o"]);
    let (a, b) = (greedy(&s), greedy(&other));
    assert_ne!(a.take_candidates, b.take_candidates, "each worker starts at its own offset");
    assert_eq!(key_set(&a.take_candidates), key_set(&b.take_candidates));

    // Which of a victim's leases are claimed is seeded too.
    let s = snapshot("me", distributed(&[("o", 40)]), &["me", "o"]);
    let mut other_seed = s.clone();
    other_seed.seed = 8;
    let (a, b) = (greedy(&s), greedy(&other_seed));
    assert_eq!(a, greedy(&s));
    assert_eq!(victims(&a), ["o"; 20]);
    assert_eq!(victims(&a), victims(&b));
    assert_ne!(a.claims, b.claims, "different seeds pick different leases");
}

/// Workers starting together on the same listing try disjoint leases first: the first
/// `take_count` candidates of each are nobody else's (where the shares divide evenly; otherwise
/// neighbours overlap by at most one), so a synchronized start meets next to no conflicts (a
/// random order per worker met about two per lease taken at 10,000 × 16).
#[test]
fn workers_on_the_same_listing_take_disjoint_candidates_first() {
    for (leases, n) in [(1024, 16), (1000, 8), (64, 4), (1000, 7), (10_000, 16), (10, 16)] {
        let ids: Vec<String> = (0..n).map(|i| format!("w{i:02}")).collect();
        let live: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut seen = BTreeSet::new();
        let mut overlaps = 0;
        for me in &live {
            let plan = greedy(&snapshot(me, many("s", leases, None), &live));
            for k in &plan.take_candidates[..plan.take_count] {
                if !seen.insert(k.clone()) {
                    overlaps += 1;
                }
            }
        }
        assert_eq!(seen.len(), leases, "{leases} × {n}: every lease planned first by someone");
        // Shares that divide evenly do not overlap at all; otherwise the shares add up to more
        // than the leases and some must (one per worker at most).
        let allowed = if leases % n == 0 { 0 } else { n * leases.div_ceil(n) - leases };
        assert!(overlaps <= allowed, "{leases} × {n}: {overlaps} overlaps (at most {allowed})");
    }
}
