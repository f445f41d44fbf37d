//! Table tests of the load rules (see `by_load`): what one pass claims, hands over and leaves.

use std::collections::BTreeSet;

use crate::balancer::{Balancer, GreedyBalancer, LoadView, Plan, PublishedLoad, Snapshot};
use crate::lease::{Claim, Epoch, Lease, LeaseKey, WorkerId};
use crate::load::LeaseLoad;
use crate::position::Position;

const MARGIN: f64 = 0.15;
const FLOOR: f64 = 0.02;

/// A worker's leases with their loads.
struct Holds<'a>(&'a str, &'a [(&'a str, f64)]);

fn lease(key: &str, owner: &str) -> Lease {
    Lease { owner: Some(WorkerId::from(owner)), ..Lease::new(key, Position::TrimHorizon) }
}

/// The snapshot `me` sees: every worker publishes all its leases' loads (as `me` does).
fn snapshot(me: &str, fleet: &[Holds<'_>], cooling: &[&str]) -> Snapshot {
    let mut leases = Vec::new();
    let mut view = LoadView::new(MARGIN, FLOOR)
        .with_cooling(cooling.iter().map(|k| LeaseKey::from(*k)).collect());
    for Holds(w, held) in fleet {
        leases.extend(held.iter().map(|(k, _)| lease(k, w)));
        let loads: Vec<LeaseLoad> = held.iter().map(|(k, l)| LeaseLoad::new(*k, *l)).collect();
        let total = loads.iter().map(|l| l.load).sum();
        view = view.with_worker(WorkerId::from(*w), PublishedLoad::new(total, loads));
    }
    let live: BTreeSet<WorkerId> = fleet.iter().map(|Holds(w, _)| WorkerId::from(*w)).collect();
    Snapshot::new(WorkerId::from(me), leases, live).with_seed(7).with_loads(Some(view))
}

fn claimed(plan: &Plan) -> Vec<String> {
    let mut v: Vec<String> = plan.claims.iter().map(|(k, _)| k.to_string()).collect();
    v.sort();
    v
}

fn plan(s: &Snapshot) -> Plan {
    GreedyBalancer::default().plan(s)
}

#[test]
fn the_light_worker_claims_the_leases_that_even_the_load_and_leaves_the_hot_one() {
    let fleet = [
        Holds("a", &[("hot", 1.0), ("a1", 0.1), ("a2", 0.1), ("a3", 0.1)]),
        Holds("b", &[("b1", 0.1), ("b2", 0.1), ("b3", 0.1), ("b4", 0.1)]),
    ];
    let p = plan(&snapshot("b", &fleet, &[]));
    // By count nothing moves (4 and 4); by load b takes the three light leases, not the hot one.
    assert_eq!(claimed(&p), ["a1", "a2", "a3"]);
    assert!(p.claims.iter().all(|(_, from)| from.as_str() == "a"));
    assert!(plan(&Snapshot { loads: None, ..snapshot("b", &fleet, &[]) }).is_empty());
}

#[test]
fn a_lease_heavier_than_the_mean_never_moves() {
    let fleet = [Holds("a", &[("hot", 3.0)]), Holds("b", &[("b1", 0.1)]), Holds("c", &[])];
    assert!(plan(&snapshot("c", &fleet, &[])).claims.is_empty());
    assert!(plan(&snapshot("b", &fleet, &[])).claims.is_empty());
}

#[test]
fn loads_near_zero_move_nothing_and_a_quiet_fleet_balances_by_count() {
    // Noise far below the floor: 4 and 4 leases, nothing moves whatever the loads say.
    let noisy = [
        Holds("a", &[("a1", 0.004), ("a2", 0.005), ("a3", 0.003), ("a4", 0.006)]),
        Holds("b", &[("b1", 0.0), ("b2", 0.0), ("b3", 0.0), ("b4", 0.0)]),
    ];
    assert!(plan(&snapshot("b", &noisy, &[])).is_empty());
    assert!(plan(&snapshot("a", &noisy, &[])).is_empty());
    // A newcomer on a quiet stream claims its share by count: 8, 8 → 6, 5, 5 (or 5, 6, 5).
    let l: Vec<(String, f64)> = (0..16).map(|i| (format!("k{i:02}"), 0.0)).collect();
    let a: Vec<(&str, f64)> = l[..8].iter().map(|(k, x)| (k.as_str(), *x)).collect();
    let b: Vec<(&str, f64)> = l[8..].iter().map(|(k, x)| (k.as_str(), *x)).collect();
    let join = [Holds("a", &a), Holds("b", &b), Holds("c", &[])];
    let p = plan(&snapshot("c", &join, &[]));
    assert_eq!(p.claims.len(), 5, "{p:?}");
    let from_a = p.claims.iter().filter(|(_, w)| w.as_str() == "a").count();
    assert!((2..=3).contains(&from_a), "{p:?}");
}

#[test]
fn leases_in_their_cooldown_are_not_claimed() {
    let fleet = [
        Holds("a", &[("hot", 1.0), ("a1", 0.1), ("a2", 0.1), ("a3", 0.1)]),
        Holds("b", &[("b1", 0.1), ("b2", 0.1), ("b3", 0.1), ("b4", 0.1)]),
    ];
    let p = plan(&snapshot("b", &fleet, &["a1", "a3"]));
    assert_eq!(claimed(&p), ["a2"]);
}

#[test]
fn the_owner_hands_over_a_claim_that_evens_the_load_and_clears_one_that_would_not() {
    let fleet = [
        Holds("a", &[("hot", 1.0), ("a1", 0.1)]),
        Holds("b", &[("b1", 0.1), ("b2", 0.1), ("b3", 0.1)]),
    ];
    let mut s = snapshot("a", &fleet, &[]);
    for l in &mut s.leases {
        if l.key.as_str() == "a1" || l.key.as_str() == "hot" {
            l.claim = Some(Claim { by: WorkerId::from("b"), at: Epoch(0) });
        }
    }
    let p = plan(&s);
    // a1 to b lowers the pair's peak (1.14 → 1.0); the hot lease to b would raise it.
    let handed: Vec<&str> = p.handoffs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(handed, ["a1"]);
    let cleared: Vec<&str> = p.clear_claims.iter().map(|k| k.as_str()).collect();
    assert_eq!(cleared, ["hot"]);
}

#[test]
fn settled_loads_within_the_margin_move_nothing() {
    // 1.0 against a mean of 0.93: within 15%.
    let fleet = [
        Holds("a", &[("a1", 0.5), ("a2", 0.5)]),
        Holds("b", &[("b1", 0.45), ("b2", 0.45)]),
        Holds("c", &[("c1", 0.42), ("c2", 0.48)]),
    ];
    for me in ["a", "b", "c"] {
        assert!(plan(&snapshot(me, &fleet, &[])).is_empty(), "{me} moved something");
    }
}

#[test]
fn an_unpublished_lease_counts_as_the_average_of_its_owners_rest() {
    // a publishes only its heaviest lease and a total of 1.6 over four leases: the three others
    // are estimated at 0.2 each, so c (idle) claims some of them, never the published 1.0.
    let mut s = snapshot(
        "c",
        &[Holds("a", &[("big", 1.0), ("x", 0.0), ("y", 0.0), ("z", 0.0)]), Holds("c", &[])],
        &[],
    );
    if let Some(view) = s.loads.as_mut() {
        view.published
            .insert(WorkerId::from("a"), PublishedLoad::new(1.6, vec![LeaseLoad::new("big", 1.0)]));
    }
    let p = plan(&s);
    assert!(!p.claims.is_empty(), "{p:?}");
    assert!(p.claims.iter().all(|(k, _)| k.as_str() != "big"), "{p:?}");
}

#[test]
fn light_workers_planning_on_one_snapshot_do_not_both_fill_up_from_the_same_heavy_one() {
    // a carries everything; b and c each plan on the same snapshot. Each planning only its own
    // claims, both took half of a's load (3 leases each) and left a with nothing, the lightest,
    // and the leases went back. One plan for the fleet: a keeps 2, b and c take 2 each, apart.
    let a: Vec<(String, f64)> = (0..6).map(|i| (format!("a{i}"), 0.1)).collect();
    let a: Vec<(&str, f64)> = a.iter().map(|(k, l)| (k.as_str(), *l)).collect();
    let fleet = [Holds("a", &a), Holds("b", &[]), Holds("c", &[])];
    let b = claimed(&plan(&snapshot("b", &fleet, &[])));
    let c = claimed(&plan(&snapshot("c", &fleet, &[])));
    assert_eq!((b.len(), c.len()), (2, 2), "b {b:?}, c {c:?}");
    assert!(b.iter().all(|k| !c.contains(k)), "b {b:?} and c {c:?} claim apart");
    assert!(plan(&snapshot("a", &fleet, &[])).claims.is_empty(), "a gives, it does not claim");
}

#[test]
fn a_lease_in_its_cooldown_counts_at_its_load_from_before_the_move() {
    // b just received "m" and measures it at 0.9 while it catches up on what waited during the
    // handoff; its steady load is 0.3. Counted at 0.9, b looks overloaded and a claims b's other
    // lease; counted at the pinned 0.3, the fleet is within the margin and nothing moves.
    let fleet = [
        Holds("a", &[("a1", 0.2), ("a2", 0.2)]),
        Holds("b", &[("m", 0.9), ("b1", 0.3)]),
        Holds("c", &[("c1", 0.3), ("c2", 0.3)]),
    ];
    let transient = snapshot("a", &fleet, &["m"]);
    assert_eq!(claimed(&plan(&transient)), ["b1"], "the catch-up alone makes b look overloaded");
    let mut pinned = transient.clone();
    if let Some(view) = pinned.loads.take() {
        let pins = [(LeaseKey::from("m"), 0.3)].into_iter().collect();
        pinned.loads = Some(view.with_pinned(pins));
    }
    assert!(plan(&pinned).is_empty(), "{:?}", plan(&pinned));
}

#[test]
fn a_quiet_fleet_evens_counts_even_when_the_mean_falls_between_two_shares() {
    // 6 leases over 4 workers (a mean of 1.5): 3, 1, 1, 1 must become 2, 2, 1, 1. In costs the
    // receiver ends exactly on the mean plus the threshold, so float rounding, or loads left
    // over from a faded stream (far below the floor), used to stop the move (seed 1499).
    for residue in [0.0, 1e-6, 0.003] {
        let fleet = [
            Holds("a", &[("a1", residue), ("a2", residue), ("a3", residue)]),
            Holds("b", &[("b1", 0.0)]),
            Holds("c", &[("c1", 0.0)]),
            Holds("d", &[("d1", 0.0)]),
        ];
        let claims: usize =
            ["b", "c", "d"].iter().map(|me| plan(&snapshot(me, &fleet, &[])).claims.len()).sum();
        assert_eq!(claims, 1, "residue {residue}");
    }
    // 12 over 5 (a mean of 2.4): 4, 2, 2, 2, 2 must give one lease (the count rules' cap is 3).
    let keys: Vec<String> = (0..12).map(|i| format!("k{i:02}")).collect();
    let held = |r: std::ops::Range<usize>| -> Vec<(&str, f64)> {
        keys[r].iter().map(|k| (k.as_str(), 0.0)).collect()
    };
    let (a, b, c, d, e) = (held(0..4), held(4..6), held(6..8), held(8..10), held(10..12));
    let fleet = [Holds("a", &a), Holds("b", &b), Holds("c", &c), Holds("d", &d), Holds("e", &e)];
    let claims: usize =
        ["b", "c", "d", "e"].iter().map(|me| plan(&snapshot(me, &fleet, &[])).claims.len()).sum();
    assert_eq!(claims, 1);
}

#[test]
fn a_worker_whose_figures_settle_after_a_move_neither_gives_nor_takes() {
    let fleet = [
        Holds("a", &[("a1", 0.3), ("a2", 0.3), ("a3", 0.3), ("a4", 0.3)]),
        Holds("b", &[("b1", 0.1)]),
        Holds("c", &[("c1", 0.2)]),
    ];
    let settling = |me: &str, workers: &[&str]| {
        let mut s = snapshot(me, &fleet, &[]);
        if let Some(view) = s.loads.as_mut() {
            view.settling = workers.iter().map(|w| WorkerId::from(*w)).collect();
        }
        claimed(&plan(&s)).len()
    };
    // Nobody settling: b, the lightest, takes from a.
    assert_eq!(settling("b", &[]), 1);
    // b just moved a lease: its figures are not yet to be trusted, so c takes instead.
    assert_eq!(settling("b", &["b"]), 0);
    assert_eq!(settling("c", &["b"]), 1);
    // a just received one: nothing moves until its figures show it.
    assert_eq!(settling("b", &["a"]) + settling("c", &["a"]), 0);
}

#[test]
fn a_worker_that_just_gave_a_lease_gives_the_next_but_takes_none() {
    // a gave one of its leases to c a moment ago (c: 0.3, settling); the plan every worker made
    // then also had a give one to b. The giver's figures are right at once (the moved lease left
    // its list), so b still claims it; when a sat out like a receiver, b waited two balance
    // intervals more (the `skew` bench settled in five intervals instead of two).
    let fleet = [
        Holds("a", &[("a1", 0.3), ("a2", 0.3), ("a3", 0.3)]),
        Holds("b", &[("b1", 0.1)]),
        Holds("c", &[("c1", 0.2), ("c2", 0.3)]),
    ];
    let view = |me: &str, settling: &[&str], gave: &[&str]| {
        let mut s = snapshot(me, &fleet, &["c2"]);
        let ids = |w: &[&str]| w.iter().map(|w| WorkerId::from(*w)).collect();
        s.loads = s.loads.map(|v| v.with_settling(ids(settling)).with_gave(ids(gave)));
        claimed(&plan(&s))
    };
    assert_eq!(view("b", &["c"], &["a"]).len(), 1);
    assert!(view("b", &["a", "c"], &[]).is_empty(), "a giver sitting out gives nothing");
    // Nor does the giver take a lease back in the same round: a light giver takes nothing.
    let fleet = [
        Holds("a", &[("a1", 0.05)]),
        Holds("b", &[("b1", 0.3), ("b2", 0.3), ("b3", 0.3)]),
        Holds("c", &[("c1", 0.4)]),
    ];
    let mut s = snapshot("a", &fleet, &[]);
    assert_eq!(claimed(&plan(&s)).len(), 1);
    s.loads = s.loads.map(|v| v.with_gave([WorkerId::from("a")].into()));
    assert!(claimed(&plan(&s)).is_empty());
}

#[test]
fn nothing_moves_while_every_worker_is_within_the_band_even_if_a_pair_could_be_evened() {
    // Loads 0.57, 0.50, 0.43 (mean 0.5, threshold 0.075; costs 0.69, 0.62, 0.55 around a mean
    // cost of 0.62): a3 from a to c would lower the pair's peak by more than the threshold
    // (0.55 + 0.06 + 0.075 < 0.69), yet every worker is within the threshold of the mean, so
    // noise this size moves nothing. Pushed outside the band, the same pair moves.
    let inside = [
        Holds("a", &[("a1", 0.29), ("a2", 0.26), ("a3", 0.02)]),
        Holds("b", &[("b1", 0.25), ("b2", 0.2), ("b3", 0.05)]),
        Holds("c", &[("c1", 0.2), ("c2", 0.21), ("c3", 0.02)]),
    ];
    for me in ["a", "b", "c"] {
        assert!(plan(&snapshot(me, &inside, &[])).is_empty(), "{me} moved something");
    }
    let outside = [
        Holds("a", &[("a1", 0.29), ("a2", 0.30), ("a3", 0.02)]),
        Holds("b", &[("b1", 0.25), ("b2", 0.2), ("b3", 0.05)]),
        Holds("c", &[("c1", 0.2), ("c2", 0.17), ("c3", 0.02)]),
    ];
    assert_eq!(claimed(&plan(&snapshot("c", &outside, &[]))), ["a3"]);
    assert!(plan(&snapshot("b", &outside, &[])).claims.is_empty());
}

#[test]
fn a_worker_far_below_the_mean_still_gets_its_share_on_a_quiet_stream() {
    // 8 leases over 5 workers, a newcomer with none: 2, 2, 2, 2, 0. No worker is above the mean
    // share (1.6) by half a lease, but the newcomer is below it by more: it claims one, as by
    // count.
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let held = |r: std::ops::Range<usize>| -> Vec<(&str, f64)> {
        keys[r].iter().map(|k| (k.as_str(), 0.0)).collect()
    };
    let (a, b, c, d) = (held(0..2), held(2..4), held(4..6), held(6..8));
    let fleet = [Holds("a", &a), Holds("b", &b), Holds("c", &c), Holds("d", &d), Holds("e", &[])];
    assert_eq!(plan(&snapshot("e", &fleet, &[])).claims.len(), 1);
    for me in ["a", "b", "c", "d"] {
        assert!(plan(&snapshot(me, &fleet, &[])).claims.is_empty(), "{me}");
    }
}

#[test]
fn a_fleet_with_nothing_cooling_starts_moving_only_for_a_clear_gain() {
    // Costs a 0.505, b 0.40 (mean 0.4525, threshold 0.0499): a is outside the band, and a3
    // (cost 0.045) to b lowers the pair's peak by 0.060, more than the threshold but less than
    // 1.5 thresholds. Noise on figures sitting at that line made simulation seed 4795 move
    // leases in a steady fleet, so a settled fleet does not start on it.
    let fleet = [
        Holds("a", &[("a1", 0.32), ("a2", 0.06), ("a3", 0.005)]),
        Holds("b", &[("b1", 0.22), ("b2", 0.06), ("b3", 0.0)]),
    ];
    assert!(plan(&snapshot("b", &fleet, &[])).is_empty());
    // A lease cooling from an earlier round does not lower the line: one move for noise would
    // let the next pair across the tight line for the whole cooldown.
    assert!(plan(&snapshot("b", &fleet, &["b1"])).is_empty());
    // While a round is under way (an owner changed a moment ago) the round's line is enough.
    let mut s = snapshot("b", &fleet, &["b1"]);
    s.loads = s.loads.map(|v| v.with_round_in_progress(true));
    assert_eq!(claimed(&plan(&s)), ["a3"]);
    // So it is while a claim of the round is pending (here d's on c2, a lease of no load).
    let fleet = [
        Holds("a", &[("a1", 0.32), ("a2", 0.06), ("a3", 0.005)]),
        Holds("b", &[("b1", 0.22), ("b2", 0.06), ("b3", 0.0)]),
        Holds("c", &[("c1", 0.36), ("c2", 0.0)]),
        Holds("d", &[("d1", 0.40)]),
    ];
    let quiet = snapshot("b", &fleet, &[]);
    let mut claimed_elsewhere = quiet.clone();
    if let Some(l) = claimed_elsewhere.leases.iter_mut().find(|l| l.key.as_str() == "c2") {
        l.claim = Some(Claim { by: WorkerId::from("d"), at: l.epoch });
    }
    let (before, during) = (claimed(&plan(&quiet)), claimed(&plan(&claimed_elsewhere)));
    assert!(before.is_empty() && during == ["a3"], "{before:?} {during:?}");
}

#[test]
fn on_a_busy_stream_a_round_starts_only_for_a_gain_of_about_two_thresholds() {
    // Loads a 0.54, b 0.36, c 0.56 (mean 0.487, threshold 0.073); a is outside the band. a2 to b
    // lowers the pair's peak by 0.12 (cost 0.10), more than 1.5 thresholds (0.11) but less than
    // the threshold plus its relative part again (0.126). Figures smoothed over a few seconds
    // wander by more than half a threshold on a stream whose rates wander by ±20%, and the
    // `skew` bench started a round for that noise about once in five minutes.
    let fleet = [
        Holds("a", &[("a1", 0.48), ("a2", 0.06)]),
        Holds("b", &[("b1", 0.36)]),
        Holds("c", &[("c1", 0.56)]),
    ];
    assert!(plan(&snapshot("b", &fleet, &[])).is_empty());
    // Within a round the round's line (half the threshold) is enough.
    let mut s = snapshot("b", &fleet, &[]);
    s.loads = s.loads.map(|v| v.with_round_in_progress(true));
    assert_eq!(claimed(&plan(&s)), ["a2"]);
}

#[test]
fn within_a_round_moves_go_on_until_the_fleet_is_within_half_the_threshold() {
    let in_round =
        |s: Snapshot| Snapshot { loads: s.loads.map(|v| v.with_round_in_progress(true)), ..s };
    // Loads a 0.45, b 0.36, c 0.40 (mean 0.403, threshold 0.0605); costs a 0.53, b 0.40, c 0.44
    // (mean 0.457): a is outside the band. a2 (cost 0.07) to b lowers the pair's peak by 0.06,
    // less than the threshold but more than half of it. A round that stopped at the threshold
    // left the `skew` bench's fleet at 1.16 of the mean for a target of 1.15; a round goes on to
    // half the threshold, so the fleet ends well inside the band. Outside a round the start line
    // (about two thresholds) holds. With a1 at 0.395 every worker is within the threshold of the
    // mean (a 0.057 above a mean cost of 0.448, b 0.048 below it), but not within half of it:
    // within a round the pair still evens.
    for a1 in [0.42, 0.395] {
        let fleet = [
            Holds("a", &[("a1", a1), ("a2", 0.03)]),
            Holds("b", &[("b1", 0.36)]),
            Holds("c", &[("c1", 0.40)]),
        ];
        assert!(plan(&snapshot("b", &fleet, &[])).is_empty(), "{a1}");
        assert_eq!(claimed(&plan(&in_round(snapshot("b", &fleet, &[])))), ["a2"], "{a1}");
    }
    // A one-lease difference on a quiet stream is still no move, round or not.
    let quiet = [Holds("a", &[("a1", 0.0), ("a2", 0.0)]), Holds("b", &[("b1", 0.0)])];
    assert!(plan(&in_round(snapshot("b", &quiet, &[]))).is_empty());
}

#[test]
fn within_one_plan_a_worker_gives_or_receives_not_both() {
    // Planned move by move, w1 (the heaviest) gave s02 to w2 and s01 to w3, and then w2 (now
    // above w3) gave its own s04 to w3: a chain through w2, whose figures the move it received
    // has not yet reached (simulation seed 943's settle check caught one).
    let fleet = [
        Holds("w1", &[("s01", 0.4), ("s02", 0.35), ("s03", 0.9)]),
        Holds("w2", &[("s04", 0.0), ("s05", 0.2)]),
        Holds("w3", &[]),
    ];
    let mut moves = Vec::new();
    for me in ["w1", "w2", "w3"] {
        for (key, from) in plan(&snapshot(me, &fleet, &[])).claims {
            moves.push((key.to_string(), from.to_string(), me.to_string()));
        }
    }
    moves.sort();
    let givers: BTreeSet<&str> = moves.iter().map(|(_, from, _)| from.as_str()).collect();
    let receivers: BTreeSet<&str> = moves.iter().map(|(_, _, to)| to.as_str()).collect();
    assert!(givers.is_disjoint(&receivers), "{moves:?}");
    // The heavy worker still gives to both light ones.
    let expect = |k: &str, to: &str| (k.to_owned(), "w1".to_owned(), to.to_owned());
    assert_eq!(moves, [expect("s01", "w3"), expect("s02", "w2")], "{moves:?}");
}

#[test]
fn a_worker_that_received_in_the_round_under_way_gives_nothing_in_it() {
    // b received a1 from a earlier in the round (its figures have settled: it is not sitting
    // out) and now looks heavier than a. Within the round's lower margin b would give b1 back to
    // a; a round's moves go one way, so it waits for the next round, which needs a clear gain
    // (simulation seed 1630).
    let fleet = [
        Holds("a", &[("a2", 0.26)]),
        Holds("b", &[("a1", 0.22), ("b1", 0.06), ("b2", 0.05), ("b3", 0.05)]),
        Holds("c", &[("c1", 0.36)]),
    ];
    let claims = |received: &[&str]| {
        let mut s = snapshot("a", &fleet, &["a1"]);
        let ids: BTreeSet<WorkerId> = received.iter().map(|w| WorkerId::from(*w)).collect();
        s.loads = s.loads.map(|v| v.with_round_in_progress(true).with_received(ids));
        claimed(&plan(&s))
    };
    assert_eq!(claims(&[]).len(), 1, "within the round's margin, a evens the pair");
    assert!(claims(&["b"]).is_empty(), "b received in this round: it gives nothing");
    // A worker that received in the round still receives.
    let mut s = snapshot("b", &[Holds("a", &[("a1", 0.5), ("a2", 0.3)]), Holds("b", &[])], &[]);
    s.loads = s.loads.map(|v| v.with_received([WorkerId::from("b")].into()));
    assert_eq!(claimed(&plan(&s)).len(), 1);
}
