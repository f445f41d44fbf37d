//! The greedy balancer: the default distribution policy (DESIGN.md, "The balancer").
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
//! 5. take `min(target − effective share, available)` leases, from all available leases in a
//!    seeded shuffled order (the runtime skips candidates lost to a conflict);
//! 6. claim from the most loaded worker while it holds at least two more than me, moving only
//!    leases that have to move (see [`GreedyBalancer`] for the exact condition);
//! 7. take over expired claims whose owner is alive but did not answer.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{is_active, Balancer, Plan, Snapshot};
use crate::lease::{Lease, LeaseKey, WorkerId};

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

/// Per-worker lease counts, keyed by live worker.
type Counts<'a> = BTreeMap<&'a WorkerId, usize>;

fn count(counts: &Counts<'_>, worker: &WorkerId) -> usize {
    counts.get(worker).copied().unwrap_or(0)
}

fn add(counts: &mut Counts<'_>, worker: &WorkerId, n: usize) {
    if let Some(c) = counts.get_mut(worker) {
        *c = c.saturating_add(n);
    }
}

fn sub(counts: &mut Counts<'_>, worker: &WorkerId, n: usize) {
    if let Some(c) = counts.get_mut(worker) {
        *c = c.saturating_sub(n);
    }
}

/// What one pass derives from the snapshot before deciding anything.
struct Pass<'a> {
    me: &'a WorkerId,
    /// Active leases, sorted by key, one per key.
    active: Vec<&'a Lease>,
    /// Live workers, `me` included.
    live: BTreeSet<&'a WorkerId>,
}

impl<'a> Pass<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        let by_key: HashMap<&LeaseKey, &Lease> =
            snapshot.leases.iter().map(|l| (&l.key, l)).collect();
        let mut active: Vec<&Lease> =
            snapshot.leases.iter().filter(|l| is_active(l, &by_key, &snapshot.withheld)).collect();
        active.sort_by(|a, b| a.key.cmp(&b.key));
        active.dedup_by(|a, b| a.key == b.key);
        let live = snapshot.live_workers.iter().chain(std::iter::once(&snapshot.me)).collect();
        Pass { me: &snapshot.me, active, live }
    }

    /// The owner of `lease` if it is alive; `None` means the lease is available.
    fn live_owner(&self, lease: &'a Lease) -> Option<&'a WorkerId> {
        lease.owner.as_ref().filter(|o| self.live.contains(o))
    }

    /// The worker with a valid (current-epoch) claim on `lease`, if it is alive.
    fn live_claimant(&self, lease: &'a Lease) -> Option<&'a WorkerId> {
        lease.live_claim().map(|c| &c.by).filter(|by| self.live.contains(by))
    }

    fn plan(&self, snapshot: &Snapshot) -> Plan {
        let me = self.me;
        let mut rng = StdRng::seed_from_u64(snapshot.seed);
        let mut plan = Plan::default();

        // Shares. `raw` is what each live worker owns; `eff` moves pending claims to the claimant.
        let mut raw: Counts<'a> = self.live.iter().map(|w| (*w, 0)).collect();
        let mut available: Vec<&LeaseKey> = Vec::new();
        for lease in &self.active {
            match self.live_owner(lease) {
                Some(owner) => add(&mut raw, owner, 1),
                None => available.push(&lease.key),
            }
        }
        // Answer claims on my leases first (in key order, against raw shares), so that a claim I
        // am about to clear does not count for its claimant below.
        let mut cleared: BTreeSet<&LeaseKey> = BTreeSet::new();
        let mut after_handoffs = raw.clone();
        for lease in self.active.iter().filter(|l| l.is_owned_by(me)) {
            let Some(claim) = lease.live_claim() else { continue };
            if &claim.by == me {
                continue;
            }
            let claimant = &claim.by;
            let worth_it = count(&after_handoffs, me) >= count(&after_handoffs, claimant) + 2;
            if self.live.contains(claimant) && worth_it {
                plan.handoffs.push((lease.key.clone(), claimant.clone()));
                sub(&mut after_handoffs, me, 1);
                add(&mut after_handoffs, claimant, 1);
            } else {
                plan.clear_claims.push(lease.key.clone());
                cleared.insert(&lease.key);
            }
        }

        let mut eff = raw;
        for lease in &self.active {
            if cleared.contains(&lease.key) {
                continue;
            }
            if let (Some(owner), Some(claimant)) =
                (self.live_owner(lease), self.live_claimant(lease))
            {
                if owner != claimant {
                    sub(&mut eff, owner, 1);
                    add(&mut eff, claimant, 1);
                }
            }
        }

        // Take: my whole missing share in this pass, never beyond the target.
        let lease_cap = snapshot.max_leases_per_worker.unwrap_or(usize::MAX);
        let target = self.active.len().div_ceil(self.live.len().max(1)).min(lease_cap);
        let need = target.saturating_sub(count(&eff, me));
        // `available` follows `self.active`, sorted by key, so input order does not matter.
        available.shuffle(&mut rng);
        plan.take_count = need.min(available.len());
        plan.take_candidates = available.into_iter().cloned().collect();
        add(&mut eff, me, plan.take_count);

        self.claims(snapshot, &mut eff, &mut rng, &mut plan);

        // Take over claims whose live owner did not answer within the claim timeout. A dead
        // owner's leases are available and already among the take candidates.
        let active_by_key: HashMap<&LeaseKey, &Lease> =
            self.active.iter().map(|l| (&l.key, *l)).collect();
        for key in &snapshot.expired_claims {
            let Some(lease) = active_by_key.get(key) else { continue };
            let mine = lease.live_claim().is_some_and(|c| &c.by == me);
            let owner_live_other = self.live_owner(lease).is_some_and(|o| o != me);
            if mine && owner_live_other {
                plan.take_over.push(key.clone());
            }
        }

        plan
    }

    /// Balanced shares of the active leases: `base + 1` for the `active mod live` most loaded
    /// workers by `eff` (ties: lowest id), `base` for the others.
    fn balanced_shares(&self, eff: &Counts<'a>) -> Counts<'a> {
        let n = self.live.len().max(1);
        let (base, extra) = (self.active.len() / n, self.active.len() % n);
        let mut ranked: Vec<(&WorkerId, usize)> = eff.iter().map(|(w, c)| (*w, *c)).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        ranked
            .into_iter()
            .enumerate()
            .map(|(i, (w, _))| (w, base + usize::from(i < extra)))
            .collect()
    }

    /// Claims from the most loaded workers, counting each claim in `eff` as it is made.
    fn claims(&self, snapshot: &Snapshot, eff: &mut Counts<'a>, rng: &mut StdRng, plan: &mut Plan) {
        let me = self.me;
        let claim_cap = snapshot.max_claims_per_pass.unwrap_or(usize::MAX);
        let lease_cap = snapshot.max_leases_per_worker.unwrap_or(usize::MAX);
        let finals = self.balanced_shares(eff);
        let my_final = count(&finals, me);
        let mut exhausted: BTreeSet<&WorkerId> = BTreeSet::new();
        // Each victim's claimable leases (active, no valid claim by a live worker), shuffled once.
        let mut pools: BTreeMap<&WorkerId, Vec<&LeaseKey>> = BTreeMap::new();
        loop {
            let mine = count(eff, me);
            if plan.claims.len() >= claim_cap || mine >= lease_cap || mine >= my_final {
                break;
            }
            let victim = eff
                .iter()
                .filter(|(w, c)| **w != me && !exhausted.contains(*w) && **c > count(&finals, w))
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(w, c)| (*w, *c));
            let Some((victim, victim_count)) = victim else { break };
            if victim_count < mine + 2 {
                break;
            }
            let pool = pools.entry(victim).or_insert_with(|| {
                let mut keys: Vec<&LeaseKey> = self
                    .active
                    .iter()
                    .filter(|l| {
                        self.live_owner(l) == Some(victim) && self.live_claimant(l).is_none()
                    })
                    .map(|l| &l.key)
                    .collect();
                keys.shuffle(rng);
                keys
            });
            match pool.pop() {
                Some(key) => {
                    plan.claims.push((key.clone(), victim.clone()));
                    sub(eff, victim, 1);
                    add(eff, me, 1);
                }
                None => {
                    exhausted.insert(victim);
                }
            }
        }
    }
}
