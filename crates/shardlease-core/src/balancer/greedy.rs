//! The greedy balancer: the default distribution policy (docs/algorithm.md, "The balancer").
//!
//! It exists to fix the one-lease-per-pass bug of the Go KCL port without swinging to "the first
//! worker takes everything": a worker takes its whole missing share of available leases in one pass
//! but never more than its target, then evens out the remaining imbalance with claims (handoff
//! requests), most loaded worker first, until every share is within one of every other. It is a
//! pure function of the [`Snapshot`]: no I/O, no clock, and randomness only from the snapshot's
//! seed, so every decision can be replayed in a unit test.
//!
//! The pass:
//! 1. *active* leases are those not finished whose parents are all finished or gone; nothing else
//!    counts toward anyone's share, and nothing else is taken or claimed;
//! 2. an active lease is *available* when it has no owner or its owner is not live;
//! 3. claims on my leases are answered against *raw* shares (active leases owned): hand the lease
//!    over when I hold at least two more than the live claimant, otherwise clear the claim;
//! 4. each live worker's *effective* share counts a pending claim by a live worker for the
//!    claimant rather than the owner (except claims I clear in this pass);
//! 5. take `min(target − effective share, available)` leases, from all available leases in key
//!    order starting at my own offset (`my index × available / live workers`, wrapping around), so
//!    workers that see the same leases try disjoint ones first (the runtime skips candidates lost
//!    to a conflict);
//! 6. claim from the most loaded worker while it holds at least two more than me, moving only
//!    leases that have to move (see [`GreedyBalancer`] for the exact condition);
//! 7. take over expired claims whose owner is alive but did not answer.

use std::collections::{HashMap, HashSet};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{is_active, Balancer, Plan, Snapshot};
use crate::lease::{Lease, LeaseKey, WorkerId};

#[path = "by_load.rs"]
mod by_load;
#[cfg(test)]
#[path = "tests.rs"]
mod tests;

/// The default balancer: takes its whole share in one pass, then evens out shares with claims.
///
/// With `n` live workers (me included) and `a` active leases, my target is
/// `min(ceil(a / n), max_leases_per_worker)`. I take up to `target − mine` available leases, where
/// `mine` counts my pending claims. I then claim leases one at a time from the live worker with the
/// largest effective share (ties: lowest id), counting each claim at once (victim − 1, me + 1),
/// while all of these hold:
/// - the victim holds at least two more than I do;
/// - I am below my balanced share and the victim is above its own. Balanced shares give
///   `floor(a / n) + 1` to the `a mod n` most loaded workers (ties: lowest id) and `floor(a / n)`
///   to the others, so a worker that is receiving leases never gives any away and nobody is
///   topped up past its final share: the number of handoffs is the least that balances the shares;
/// - fewer than `max_claims_per_pass` claims were made and I hold fewer than
///   `max_leases_per_worker` (both unlimited when `None`).
///
/// Whenever the spread is two or more, the least loaded worker is below its balanced share and
/// the most loaded above its own, and then the first condition holds too, so repeated passes
/// converge to shares within one of each other.
///
/// Build it with `GreedyBalancer::default()`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct GreedyBalancer {}

impl Balancer for GreedyBalancer {
    fn plan(&self, snapshot: &Snapshot) -> Plan {
        Pass::new(snapshot).plan(snapshot)
    }
}

/// Per-worker lease counts, indexed like [`Pass::workers`].
type Counts = Vec<usize>;

/// What one pass derives from the snapshot before deciding anything.
///
/// Workers are interned once: every live worker gets an index into [`Pass::workers`] (sorted by
/// id, so index order is id order and nothing depends on hashing), and each active lease's live
/// owner and live claimant are looked up once. The rest of the pass counts in vectors: at 100,000
/// leases and 1,000 workers a pass does a few hundred thousand cheap steps, not string compares.
struct Pass<'a> {
    me: usize,
    /// Live workers, `me` included, sorted by id.
    workers: Vec<&'a WorkerId>,
    /// Active leases, sorted by key, one per key.
    active: Vec<&'a Lease>,
    /// Per active lease: the index of its owner if that owner is live.
    owner: Vec<Option<usize>>,
    /// Per active lease: the index of the worker with a valid claim on it, if live.
    claimant: Vec<Option<usize>>,
}

impl<'a> Pass<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        // Parents are looked up only for leases that have some; most streams have few.
        let parents: HashSet<&LeaseKey> =
            snapshot.leases.iter().flat_map(|l| l.parents.iter()).collect();
        let by_key: HashMap<&LeaseKey, &Lease> = if parents.is_empty() {
            HashMap::new()
        } else {
            snapshot
                .leases
                .iter()
                .filter(|l| parents.contains(&l.key))
                .map(|l| (&l.key, l))
                .collect()
        };
        let mut active: Vec<&Lease> =
            snapshot.leases.iter().filter(|l| is_active(l, &by_key, &snapshot.withheld)).collect();
        active.sort_by(|a, b| a.key.cmp(&b.key));
        active.dedup_by(|a, b| a.key == b.key);
        let mut workers: Vec<&WorkerId> =
            snapshot.live_workers.iter().chain(std::iter::once(&snapshot.me)).collect();
        workers.sort();
        workers.dedup();
        let index: HashMap<&WorkerId, usize> =
            workers.iter().enumerate().map(|(i, w)| (*w, i)).collect();
        let me = index.get(&snapshot.me).copied().unwrap_or(0);
        let owner =
            active.iter().map(|l| l.owner.as_ref().and_then(|o| index.get(o).copied())).collect();
        let claimant =
            active.iter().map(|l| l.live_claim().and_then(|c| index.get(&c.by).copied())).collect();
        Pass { me, workers, active, owner, claimant }
    }

    fn plan(&self, snapshot: &Snapshot) -> Plan {
        let me = self.me;
        let n = self.workers.len();
        let mut rng = StdRng::seed_from_u64(snapshot.seed);
        let mut plan = Plan::default();

        // Shares. `raw` is what each live worker owns; `eff` moves pending claims to the claimant.
        let mut raw: Counts = vec![0; n];
        let mut available: Vec<&LeaseKey> = Vec::new();
        for (i, lease) in self.active.iter().enumerate() {
            match self.owner[i] {
                Some(o) => raw[o] += 1,
                None => available.push(&lease.key),
            }
        }
        // Answer claims on my leases first (in key order, against raw shares), so that a claim I
        // am about to clear does not count for its claimant below.
        // Balancing by load, each lease has a cost (see `by_load`) and shares are sums of costs.
        let costs = snapshot.loads.as_ref().map(|view| (view, self.costs(view)));
        let mut raw_cost = vec![0.0f64; n];
        if let Some((_, c)) = &costs {
            for (i, owner) in self.owner.iter().enumerate() {
                if let Some(o) = owner {
                    raw_cost[*o] += c.lease[i];
                }
            }
        }
        let mut cleared = vec![false; self.active.len()];
        let mut after_handoffs = raw.clone();
        let mut after_cost = raw_cost.clone();
        for (i, lease) in self.active.iter().enumerate() {
            if self.owner[i] != Some(me) {
                continue;
            }
            let Some(claim) = lease.live_claim() else { continue };
            if &claim.by == self.workers[me] {
                continue;
            }
            let live_claimant = self.claimant[i];
            // By count: when I hold at least two more. By load: when the move lowers the pair's
            // peak (the same rule with every cost 1).
            let worth_it = live_claimant.is_some_and(|c| match &costs {
                Some((_, costs)) => after_cost[c] + costs.lease[i] < after_cost[me],
                None => after_handoffs[me] >= after_handoffs[c].saturating_add(2),
            });
            match live_claimant {
                Some(c) if worth_it => {
                    plan.handoffs.push((lease.key.clone(), claim.by.clone()));
                    after_handoffs[me] -= 1;
                    after_handoffs[c] += 1;
                    if let Some((_, costs)) = &costs {
                        after_cost[me] -= costs.lease[i];
                        after_cost[c] += costs.lease[i];
                    }
                }
                _ => {
                    plan.clear_claims.push(lease.key.clone());
                    cleared[i] = true;
                }
            }
        }

        let mut eff = raw;
        let mut eff_cost = raw_cost;
        for (i, ((cleared, owner), claimant)) in
            cleared.iter().zip(&self.owner).zip(&self.claimant).enumerate()
        {
            if *cleared {
                continue;
            }
            if let (Some(owner), Some(claimant)) = (*owner, *claimant) {
                if owner != claimant {
                    eff[owner] -= 1;
                    eff[claimant] += 1;
                    if let Some((_, costs)) = &costs {
                        eff_cost[owner] -= costs.lease[i];
                        eff_cost[claimant] += costs.lease[i];
                    }
                }
            }
        }

        // Take: my whole missing share in this pass, never beyond the target.
        let lease_cap = snapshot.max_leases_per_worker.unwrap_or(usize::MAX);
        let target = self.active.len().div_ceil(n.max(1)).min(lease_cap);
        let need = target.saturating_sub(eff[me]);
        // `available` follows `self.active`, sorted by key, so input order does not matter. Every
        // worker that lists the same leases sees the same `available`; each starts at its own
        // offset, so workers starting together try disjoint leases first instead of racing for the
        // same ones (a random order per worker made about two conflicts per lease taken at
        // 10,000 × 16, each a round trip).
        if n > 0 && !available.is_empty() {
            let offset = me * available.len() / n;
            available.rotate_left(offset);
        }
        plan.take_count = need.min(available.len());
        plan.take_candidates = available.into_iter().cloned().collect();
        eff[me] += plan.take_count;

        match &costs {
            Some((view, costs)) => {
                eff_cost[me] += plan.take_count as f64 * costs.base();
                self.load_claims(snapshot, view, costs, &mut eff_cost, &mut eff, &mut plan);
            }
            None => self.claims(snapshot, &mut eff, &mut rng, &mut plan),
        }

        // Take over claims whose live owner did not answer within the claim timeout. A dead
        // owner's leases are available and already among the take candidates.
        if !snapshot.expired_claims.is_empty() {
            for (i, lease) in self.active.iter().enumerate() {
                if !snapshot.expired_claims.contains(&lease.key) {
                    continue;
                }
                let mine = lease.live_claim().is_some_and(|c| &c.by == self.workers[me]);
                let owner_live_other = self.owner[i].is_some_and(|o| o != me);
                if mine && owner_live_other {
                    plan.take_over.push(lease.key.clone());
                }
            }
        }

        plan
    }

    /// Balanced shares of the active leases: `base + 1` for the `active mod live` most loaded
    /// workers by `eff` (ties: lowest id), `base` for the others.
    fn balanced_shares(&self, eff: &Counts) -> Counts {
        let n = self.workers.len().max(1);
        let (base, extra) = (self.active.len() / n, self.active.len() % n);
        // Index order is id order, so a stable sort by count keeps ties by lowest id.
        let mut ranked: Vec<usize> = (0..eff.len()).collect();
        ranked.sort_by(|a, b| eff[*b].cmp(&eff[*a]));
        let mut finals = vec![base; eff.len()];
        for w in ranked.into_iter().take(extra) {
            finals[w] = base + 1;
        }
        finals
    }

    /// Claims from the most loaded workers, counting each claim in `eff` as it is made.
    fn claims(&self, snapshot: &Snapshot, eff: &mut Counts, rng: &mut StdRng, plan: &mut Plan) {
        let me = self.me;
        let claim_cap = snapshot.max_claims_per_pass.unwrap_or(usize::MAX);
        let lease_cap = snapshot.max_leases_per_worker.unwrap_or(usize::MAX);
        let finals = self.balanced_shares(eff);
        let my_final = finals[me];
        let mut exhausted = vec![false; eff.len()];
        // Each victim's claimable leases (active, no valid claim by a live worker), gathered for
        // every worker in one scan of the leases the first time a claim is due (not one scan per
        // victim: a newcomer among 1,000 workers claims from a hundred of them), and shuffled
        // when the victim is first drawn.
        let mut pools: Option<Vec<Vec<&LeaseKey>>> = None;
        let mut shuffled = vec![false; eff.len()];
        loop {
            let mine = eff[me];
            if plan.claims.len() >= claim_cap || mine >= lease_cap || mine >= my_final {
                break;
            }
            // The most loaded worker above its balanced share (ties: lowest id).
            let mut victim: Option<usize> = None;
            for w in 0..eff.len() {
                if w == me || exhausted[w] || eff[w] <= finals[w] {
                    continue;
                }
                if victim.is_none_or(|v| eff[w] > eff[v]) {
                    victim = Some(w);
                }
            }
            let Some(victim) = victim else { break };
            if eff[victim] < mine + 2 {
                break;
            }
            let pools = pools.get_or_insert_with(|| {
                let mut by_owner: Vec<Vec<&LeaseKey>> = vec![Vec::new(); eff.len()];
                for (i, l) in self.active.iter().enumerate() {
                    if let (Some(o), None) = (self.owner[i], self.claimant[i]) {
                        by_owner[o].push(&l.key);
                    }
                }
                by_owner
            });
            let pool = &mut pools[victim];
            if !shuffled[victim] {
                shuffled[victim] = true;
                pool.shuffle(rng);
            }
            match pool.pop() {
                Some(key) => {
                    plan.claims.push((key.clone(), self.workers[victim].clone()));
                    eff[victim] -= 1;
                    eff[me] += 1;
                }
                None => exhausted[victim] = true,
            }
        }
    }
}
