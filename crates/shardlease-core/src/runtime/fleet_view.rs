//! What the heartbeat knows of the fleet between full listings of the worker records, and when it
//! lists them all (docs/algorithm.md, "A fleet too large to list each heartbeat").
//!
//! Listing every worker record on every heartbeat costs each worker W records and the fleet W²
//! per interval: 1,000 workers at a 2 s heartbeat read 500,000 records a second doing nothing.
//! Where the store keeps a fleet signal ([`LeaseStore::write_fleet_signal`]) and the fleet
//! balances by count, a heartbeat instead reads the signal, and:
//! - lists every record when the signal moved since the last full listing (someone joined, left,
//!   changed owners or announced a death), or when the safety net is due;
//! - otherwise reads only the few peers it watches (its successors in the ring of ids), so each
//!   peer is still timed on some observer's own clock every heartbeat, and merges them into the
//!   view of the last full listing.
//!
//! [`LeaseStore::write_fleet_signal`]: crate::store::LeaseStore::write_fleet_signal

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::{timeout, Instant};
use tracing::{debug, warn};

use super::events::{Event, Observation};
use super::shared::Shared;
use crate::ids::WorkerId;
use crate::lease::Version;
use crate::store::FleetSignal;
use crate::worker_record::WorkerRecord;

/// How many live-looking peers each worker watches: each worker is watched by as many, so a
/// crash is timed by two observers, and both must die with it for the crash to wait for the
/// ring to heal.
pub(crate) const WATCHED: usize = 2;

/// At most this many records are read per quiet heartbeat: watched peers whose beat stands still
/// (dead, or about to be judged so) are read too, and the next ones in the ring are added until
/// [`WATCHED`] live-looking ones are, so the ring heals before the dead are removed.
const MAX_WATCH_READS: usize = 2 * WATCHED + 2;

/// How many observations after a start list every record whatever the signal says: past the one
/// that ends the start hold (the second), so every peer that started together is in that view.
const FULL_AT_START: u32 = 3;

/// The safety net lists every record at least every this many heartbeats...
const NET_MIN_BEATS: u64 = 10;

/// ...and otherwise every `W / NET_RECORDS_PER_BEAT` heartbeats, so it costs each worker about
/// this many records per heartbeat whatever the fleet's size.
const NET_RECORDS_PER_BEAT: u64 = 2;

/// While the signal keeps moving (a fleet starting, a big rebalance), full listings cost each
/// worker about this many records per heartbeat once its burst is spent: one listing every
/// `W / CHURN_RECORDS_PER_BEAT` heartbeats. Without this a thousand workers starting together
/// each listed a thousand records every heartbeat for as long as leases moved, the store's reply
/// queue grew past the heartbeat timeout, workers fenced themselves, came back as new
/// incarnations and moved the signal again: the fleet never settled on Redis or PostgreSQL.
const CHURN_RECORDS_PER_BEAT: f64 = 32.0;

/// Full listings a worker may make back to back before the pacing applies, and so what a quiet
/// worker has at hand for the next join, leave or death (each listed at once). A worker starts
/// with this many, and the listings of a start ([`FULL_AT_START`]) leave it three for what
/// follows: a join at a thousand workers took two rounds of claims of two signals each, and
/// with a burst of three its second round waited for the pacing (balanced in 12.6 s).
const LISTING_BURST: f64 = 2.0 * FULL_AT_START as f64;

/// After this many heartbeats in a row that found the signal where this worker last listed it,
/// the fleet is quiet and the whole burst is at hand again, whatever the refill brought: a fleet
/// that just settled from a mass start (its credit spent) answers the next join at once instead of
/// `W / 32` heartbeats later (a join at a thousand workers right after the start balanced in
/// 9.9 s). A signal that keeps coming back at just this period costs each worker a listing per
/// period, `W / 10` records a heartbeat: the bound on what pacing lets through.
const QUIET_BEATS: u32 = 10;

/// The heartbeat's view of the fleet (see the module documentation).
pub(crate) struct FleetView {
    /// Whether observations read the signal and the watched peers (the store keeps a signal and
    /// the fleet balances by count), rather than every record.
    gated: bool,
    /// The worker records of the last full listing, with the watched peers' records read since,
    /// sorted by id (the ring); shared with the balance loop.
    records: Arc<Vec<WorkerRecord>>,
    /// The death notices of the last full listing: `(dead worker, its beat)`.
    notices: Vec<(WorkerId, u64)>,
    /// The signal read before the last full listing (`None`: no full listing yet).
    token: Option<FleetSignal>,
    /// Observations since the last full listing.
    since_full: u64,
    /// Each known peer's last beat and when this heartbeat saw it move (or first saw it).
    moved: HashMap<WorkerId, (u64, Instant)>,
    /// The peers whose beat stood still for the failover timeout when this heartbeat last read
    /// them: they look dead, and the watch reaches past them.
    standing: BTreeSet<WorkerId>,
    /// The failover timeout.
    failover: Duration,
    /// Full listings still owed whatever the signal says: the first ones after a start (the
    /// observation that ends the start hold must show every peer that started with this one,
    /// including one whose signal write has not landed yet), and one after the store announced
    /// a worker record created or removed (its signal may land after the notice).
    full_owed: u32,
    /// Full listings this worker may make before waiting for more: refilled by about
    /// `min(1, CHURN_RECORDS_PER_BEAT / W)` per observation, at most [`LISTING_BURST`].
    credit: f64,
    /// When the start hold's full view is due (one heartbeat interval after the first
    /// successful heartbeat), until a full listing sent at or after it has been applied: every
    /// observation before it lists every record (credit allowing), however many observations the
    /// store's notices brought first (a read of the watched peers ends no start hold).
    hold_view_at: Option<Instant>,
    /// Whether that full listing has been applied.
    hold_listed: bool,
    /// Heartbeats in a row that read the signal where this worker last listed it.
    quiet_beats: u32,
    /// Draws each refill between none and twice the mean: workers that started together spent
    /// their credit together, and refilled alike they all listed at the same heartbeat again
    /// (512 listings timed out at once in one Redis bench run).
    rng: StdRng,
}

impl FleetView {
    /// A view with nothing listed yet; `gated` when the fleet balances by count (balancing by
    /// load reads every peer's loads each heartbeat, so it lists every record).
    pub(crate) fn new(gated: bool, failover: Duration, rng: StdRng) -> Self {
        FleetView {
            gated,
            records: Arc::new(Vec::new()),
            notices: Vec::new(),
            token: None,
            since_full: 0,
            moved: HashMap::new(),
            standing: BTreeSet::new(),
            failover,
            full_owed: FULL_AT_START,
            credit: LISTING_BURST,
            hold_view_at: None,
            hold_listed: false,
            quiet_beats: 0,
            rng,
        }
    }

    /// Whether observations are gated by the fleet signal.
    pub(crate) fn gated(&self) -> bool {
        self.gated
    }

    /// Whether the next observation must list every record, given the signal just read: the
    /// pacing allows one, and nothing is listed yet, a listing is owed, the signal moved or the
    /// safety net is due. A listing the pacing defers stays due: the token is taken only when a
    /// full listing succeeds.
    fn full_due(&self, signal: FleetSignal) -> bool {
        let net = NET_MIN_BEATS.max(self.records.len() as u64 / NET_RECORDS_PER_BEAT);
        self.credit >= 1.0
            && (self.token.is_none()
                || !self.hold_listed
                || self.full_owed > 0
                || self.token != Some(signal)
                || self.since_full >= net)
    }

    /// Counts a heartbeat that read `signal`: after [`QUIET_BEATS`] in a row that found it where
    /// the last full listing did (nothing owed), the whole burst is at hand again.
    fn note_signal(&mut self, signal: FleetSignal) {
        if self.token == Some(signal) && self.full_owed == 0 && self.hold_listed {
            self.quiet_beats = self.quiet_beats.saturating_add(1);
            if self.quiet_beats >= QUIET_BEATS {
                self.credit = LISTING_BURST;
            }
        } else {
            self.quiet_beats = 0;
        }
    }

    /// Charges one full listing to the pacing's credit.
    fn spend(&mut self) {
        self.credit = (self.credit - 1.0).max(0.0);
    }

    /// One observation's refill of the pacing's credit: on average a listing's worth every
    /// `W / CHURN_RECORDS_PER_BEAT` observations, each refill drawn between none and twice that;
    /// the whole burst in a fleet of at most `CHURN_RECORDS_PER_BEAT` workers.
    fn refill(&mut self) {
        let per_beat = CHURN_RECORDS_PER_BEAT / self.records.len().max(1) as f64;
        if per_beat >= 1.0 {
            // A fleet this small lists whenever it is due: nothing to pace.
            self.credit = LISTING_BURST;
            return;
        }
        let drawn = per_beat * self.rng.random_range(0.0..=2.0);
        self.credit = (self.credit + drawn).min(LISTING_BURST);
    }

    /// The start hold's full view is due at `at` (set once, at the first successful heartbeat).
    pub(crate) fn start_hold_view_at(&mut self, at: Instant) {
        self.hold_view_at.get_or_insert(at);
    }

    /// The next observation lists every record (the store announced a worker record created
    /// or removed).
    pub(crate) fn list_next(&mut self) {
        self.full_owed = self.full_owed.max(1);
    }

    /// Where `id` is (`Ok`) or would be (`Err`) in the records, sorted by id.
    fn find(&self, id: &WorkerId) -> Result<usize, usize> {
        self.records.binary_search_by(|r| r.id.cmp(id))
    }

    /// The peers to read on a quiet heartbeat: `me`'s successors in the ring of known ids, until
    /// [`WATCHED`] of them look alive (their beat moved within the failover timeout, as this
    /// heartbeat read it), at most [`MAX_WATCH_READS`].
    pub(crate) fn watched(&self, me: &WorkerId) -> Vec<WorkerId> {
        let n = self.records.len();
        let first = match self.find(me) {
            Ok(i) => i + 1,
            Err(i) => i,
        };
        let mut ids = Vec::new();
        let mut alive = 0;
        for k in 0..n {
            if alive == WATCHED || ids.len() == MAX_WATCH_READS {
                break;
            }
            let id = &self.records[(first + k) % n].id;
            if id == me {
                continue;
            }
            if !self.standing.contains(id) {
                alive += 1;
            }
            ids.push(id.clone());
        }
        ids
    }

    /// Remembers, for each watched record read at `at`, when its beat moved (or was first
    /// read), and whether it has stood still for the failover timeout since.
    fn note_beats(&mut self, records: &[WorkerRecord], at: Instant) {
        for r in records {
            let since = match self.moved.get_mut(&r.id) {
                Some((beat, since)) if *beat == r.beat => *since,
                Some(entry) => {
                    *entry = (r.beat, at);
                    at
                }
                None => {
                    self.moved.insert(r.id.clone(), (r.beat, at));
                    at
                }
            };
            if at.saturating_duration_since(since) >= self.failover {
                self.standing.insert(r.id.clone());
            } else {
                self.standing.remove(&r.id);
            }
        }
    }

    /// A full listing: the view is exactly it. Returns the stale death notices (their worker's
    /// record is gone or shows another beat), for removal. Cheap for a large fleet: the records
    /// are moved, sorted, and shared with the balance loop, never copied.
    fn apply_full(
        &mut self,
        items: Vec<WorkerRecord>,
        token: Option<FleetSignal>,
        sent: Instant,
    ) -> Vec<WorkerRecord> {
        self.hold_listed |= self.hold_view_at.is_some_and(|at| sent >= at);
        let (notices, mut records): (Vec<_>, Vec<_>) =
            items.into_iter().partition(|r| r.notice_of().is_some());
        records.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        records.dedup_by(|a, b| a.id == b.id);
        self.records = Arc::new(records);
        let listed = |id: &WorkerId| self.records.binary_search_by(|r| r.id.cmp(id)).is_ok();
        self.moved.retain(|id, _| listed(id));
        self.standing.retain(|id| listed(id));
        self.notices.clear();
        let mut stale = Vec::new();
        for n in notices {
            let Some(dead) = n.notice_of() else { continue };
            let holds = self.find(&dead).is_ok_and(|i| self.records[i].beat == n.beat);
            if holds {
                self.notices.push((dead, n.beat));
            } else {
                stale.push(n);
            }
        }
        if token.is_some() {
            self.token = token;
        }
        self.since_full = 0;
        self.full_owed = self.full_owed.saturating_sub(1);
        stale
    }

    /// A read of the watched peers `ids`: their records replace the listed ones, and an id
    /// without a record is dropped from the view.
    fn apply_watched(&mut self, ids: &[WorkerId], items: &[WorkerRecord], at: Instant) {
        self.note_beats(items, at);
        let records = Arc::make_mut(&mut self.records);
        for id in ids {
            let read = items.iter().find(|r| &r.id == id);
            match (records.binary_search_by(|r| r.id.cmp(id)), read) {
                (Ok(i), Some(r)) => records[i] = r.clone(),
                (Err(i), Some(r)) => records.insert(i, r.clone()),
                (Ok(i), None) => {
                    records.remove(i);
                    self.moved.remove(id);
                    self.standing.remove(id);
                }
                (Err(_), None) => {}
            }
        }
        self.since_full += 1;
    }

    /// The event telling the balance loop what this observation saw: `records`, the records
    /// read (every one, when `observed` is `None`).
    fn event(
        &self,
        records: Arc<Vec<WorkerRecord>>,
        observed: Option<BTreeSet<WorkerId>>,
        sent: Instant,
        received: Instant,
    ) -> Event {
        Event::Workers(Observation {
            records,
            notices: self.notices.clone(),
            observed,
            gated: self.gated,
            sent,
            received,
        })
    }
}

/// One observation of the fleet after a heartbeat: the signal and the watched peers, or every
/// record (see the module documentation). `None` when the store could not be read (nothing is
/// judged from a stale view).
pub(crate) async fn observe(shared: &Shared, view: &mut FleetView) -> Option<Event> {
    let hb = shared.cfg.heartbeat_interval();
    let mut token = None;
    view.refill();
    if view.gated {
        let signal = match timeout(hb, shared.store.read_fleet_signal()).await {
            Ok(Ok(signal)) => signal,
            Ok(Err(e)) => {
                warn!(error = %crate::error::ErrorChain(&e), "reading the fleet signal failed");
                return None;
            }
            Err(_) => {
                warn!("reading the fleet signal timed out");
                return None;
            }
        };
        view.note_signal(signal);
        if signal == FleetSignal::Unsupported {
            debug!("the store keeps no fleet signal: listing every worker record each heartbeat");
            view.gated = false;
        } else if !view.full_due(signal) {
            // Nothing listed yet (the first listings failed and the pacing holds the next):
            // there is no ring to watch, and nothing to judge.
            view.token?;
            let me = shared.id();
            let sent = Instant::now();
            let ids = view.watched(&me);
            return match timeout(hb, shared.store.get_workers(&ids)).await {
                Ok(Ok(listing)) => {
                    for c in &listing.corrupt {
                        warn!(worker = %c.key, reason = %c.reason, "corrupt worker record skipped");
                    }
                    let received = Instant::now();
                    view.apply_watched(&ids, &listing.items, received);
                    let read = Arc::new(listing.items);
                    Some(view.event(read, Some(ids.into_iter().collect()), sent, received))
                }
                Ok(Err(e)) => {
                    warn!(error = %crate::error::ErrorChain(&e), "reading the watched workers failed");
                    None
                }
                Err(_) => {
                    warn!("reading the watched workers timed out");
                    None
                }
            };
        } else {
            token = Some(signal);
        }
    }
    // A listing is charged when it is tried: one that failed or timed out (the store is
    // overloaded, most likely by everyone's listings) waits its turn like any other.
    view.spend();
    let sent = Instant::now();
    match timeout(hb, shared.store.list_workers()).await {
        Ok(Ok(listing)) => {
            for c in &listing.corrupt {
                warn!(worker = %c.key, reason = %c.reason, "corrupt worker record skipped");
            }
            let received = Instant::now();
            let stale = view.apply_full(listing.items, token, sent);
            remove_stale_notices(shared, stale);
            Some(view.event(view.records.clone(), None, sent, received))
        }
        Ok(Err(e)) => {
            warn!(error = %crate::error::ErrorChain(&e), "listing workers failed");
            None
        }
        Err(_) => {
            warn!("listing workers timed out");
            None
        }
    }
}

/// Removes death notices whose worker's record is gone or moved on (each on the condition that
/// the notice is still the one listed), from a task of its own.
fn remove_stale_notices(shared: &Shared, stale: Vec<WorkerRecord>) {
    if stale.is_empty() {
        return;
    }
    let store = shared.store.clone();
    let limit = shared.cfg.heartbeat_interval();
    tokio::spawn(async move {
        for n in stale {
            if let Ok(Err(e)) = timeout(limit, store.remove_worker_if(&n.id, n.beat)).await {
                debug!(notice = %n.id, error = %crate::error::ErrorChain(&e), "removing a stale death notice failed");
            }
        }
    });
}

/// Writes a fresh fleet signal: peers list every worker record at their next heartbeat.
pub(crate) async fn signal(shared: &Shared, why: &str) -> bool {
    write_signal(&*shared.store, shared.cfg.heartbeat_interval(), why).await
}

/// [`signal`] on `store`, waiting at most `limit`.
async fn write_signal(store: &dyn crate::store::LeaseStore, limit: Duration, why: &str) -> bool {
    match timeout(limit, store.write_fleet_signal(Version::random())).await {
        Ok(Ok(())) => {
            debug!(why, "fleet signal written");
            true
        }
        Ok(Err(e)) => {
            warn!(why, error = %crate::error::ErrorChain(&e), "writing the fleet signal failed");
            false
        }
        Err(_) => {
            warn!(why, "writing the fleet signal timed out");
            false
        }
    }
}

/// Announces the peers this worker judged dead from its own observation (`dead`: id and beat),
/// from a task of its own: a death notice each, then the signal, so every peer lists and takes
/// them for dead too without waiting for a failover timeout of its own (docs/algorithm.md, "A
/// fleet too large to list each heartbeat").
pub(crate) fn announce_deaths(shared: &Shared, dead: Vec<(WorkerId, u64)>) {
    if dead.is_empty() {
        return;
    }
    let store = shared.store.clone();
    let limit = shared.cfg.heartbeat_interval();
    tokio::spawn(async move {
        let mut wrote = false;
        for (id, beat) in dead {
            let notice = WorkerRecord::death_notice(&id, beat);
            match timeout(limit, store.heartbeat(&notice)).await {
                Ok(Ok(())) => wrote = true,
                Ok(Err(e)) => {
                    warn!(worker = %id, error = %crate::error::ErrorChain(&e), "writing a death notice failed")
                }
                Err(_) => warn!(worker = %id, "writing a death notice timed out"),
            }
        }
        if wrote {
            write_signal(&*store, limit, "a watched peer died").await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, beat: u64) -> WorkerRecord {
        WorkerRecord::new(WorkerId::from(id), beat)
    }

    /// A full listing as `observe` makes it: charged, then applied.
    fn list(view: &mut FleetView, items: Vec<WorkerRecord>, token: FleetSignal) {
        view.spend();
        view.apply_full(items, Some(token), Instant::now());
    }

    /// A view whose start hold is over (its full view was listed).
    fn view_of(gated: bool) -> FleetView {
        use rand::SeedableRng;
        let mut view = FleetView::new(gated, Duration::from_secs(10), StdRng::seed_from_u64(7));
        view.hold_listed = true;
        view
    }

    fn ids(v: &[&str]) -> Vec<WorkerId> {
        v.iter().map(|s| WorkerId::from(*s)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn each_worker_watches_its_successors_in_the_ring() {
        let mut view = view_of(true);
        let all = ["a", "b", "c", "d", "e"].map(|id| rec(id, 1)).to_vec();
        view.apply_full(all, Some(FleetSignal::Missing), Instant::now());
        assert_eq!(view.watched(&"a".into()), ids(&["b", "c"]));
        assert_eq!(view.watched(&"d".into()), ids(&["e", "a"]), "the ring wraps");
        assert_eq!(view.watched(&"e".into()), ids(&["a", "b"]));
        // A worker the view does not list yet still watches the next ones.
        assert_eq!(view.watched(&"bb".into()), ids(&["c", "d"]));
        let mut two = view_of(true);
        two.apply_full(vec![rec("a", 1), rec("b", 1)], Some(FleetSignal::Missing), Instant::now());
        assert_eq!(two.watched(&"a".into()), ids(&["b"]), "never itself");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_peer_that_stands_still_adds_the_next_one() {
        let mut view = view_of(true);
        let t0 = Instant::now();
        let all = ["a", "b", "c", "d", "e"].map(|id| rec(id, 1)).to_vec();
        view.apply_full(all, Some(FleetSignal::Missing), Instant::now());
        let fo = Duration::from_secs(10);
        let later = t0 + fo;
        view.apply_watched(&ids(&["b", "c"]), &[rec("b", 1), rec("c", 1)], t0);
        assert_eq!(view.watched(&"a".into()), ids(&["b", "c"]));
        // A failover timeout later b stood still; c moved.
        view.apply_watched(&ids(&["b", "c"]), &[rec("b", 1), rec("c", 2)], later);
        assert_eq!(view.watched(&"a".into()), ids(&["b", "c", "d"]), "d was not read: unknown");
        // Read moving again, b counts again.
        view.apply_watched(&ids(&["b"]), &[rec("b", 2)], later);
        assert_eq!(view.watched(&"a".into()), ids(&["b", "c"]));
        // Once gone from the records, b is not read at all.
        view.apply_watched(&ids(&["b"]), &[], later);
        assert_eq!(view.watched(&"a".into()), ids(&["c", "d"]));
    }

    #[tokio::test(start_paused = true)]
    async fn the_signal_or_the_safety_net_calls_for_a_full_listing() {
        let mut view = view_of(true);
        let t = Instant::now();
        let token = FleetSignal::Token(Version(7));
        assert!(view.full_due(token), "nothing listed yet");
        for _ in 0..FULL_AT_START {
            view.credit = LISTING_BURST;
            assert!(view.full_due(token), "the first listings after a start are full");
            list(&mut view, vec![rec("a", 1), rec("b", 1)], token);
        }
        assert!(!view.full_due(token), "quiet");
        view.credit = LISTING_BURST; // pacing is another test's
        view.list_next();
        assert!(view.full_due(token), "a worker record came or went");
        list(&mut view, vec![rec("a", 1), rec("b", 1)], token);
        assert!(!view.full_due(token), "quiet again");
        view.credit = LISTING_BURST; // pacing is another test's
        assert!(view.full_due(FleetSignal::Token(Version(8))), "the signal moved");
        assert!(view.full_due(FleetSignal::Missing), "the signal was lost");
        view.credit = LISTING_BURST;
        for _ in 0..NET_MIN_BEATS {
            view.apply_watched(&ids(&["b"]), &[rec("b", 2)], t);
        }
        assert!(view.full_due(token), "the safety net is due");
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_that_keeps_moving_is_listed_at_a_paced_rate() {
        let fleet: Vec<WorkerRecord> = (0..320).map(|i| rec(&format!("w{i:03}"), 1)).collect();
        let mut view = view_of(true);
        let t = Instant::now();
        // A start: its listings are never paced, whatever the signal does.
        for i in 0..FULL_AT_START {
            view.refill();
            let token = FleetSignal::Token(Version(u64::from(i) + 1));
            assert!(view.full_due(token), "start listing {i}");
            list(&mut view, fleet.clone(), token);
        }
        // Then the signal moves at every heartbeat: 320 workers at 32 records a heartbeat list
        // once every ten heartbeats (the safety net, every 160, is not reached).
        let mut full = 0;
        for beat in 0..100u64 {
            view.refill();
            let token = FleetSignal::Token(Version(1_000 + beat));
            if view.full_due(token) {
                list(&mut view, fleet.clone(), token);
                full += 1;
            } else {
                view.apply_watched(&ids(&["w001"]), &[rec("w001", beat + 2)], t);
            }
        }
        let left = LISTING_BURST as usize - FULL_AT_START as usize;
        assert!(
            (8 + left..=12 + left).contains(&full),
            "{full} full listings in 100 heartbeats of churn"
        );
        // A deferred listing stays due: the signal stops moving, and it is listed once credit
        // has come back, then the fleet is quiet.
        let quiet = FleetSignal::Token(Version(5_000));
        let mut waited = 0;
        loop {
            view.refill();
            if view.full_due(quiet) {
                list(&mut view, fleet.clone(), quiet);
                break;
            }
            view.apply_watched(&ids(&["w001"]), &[rec("w001", 200)], t);
            waited += 1;
        }
        assert!(waited <= 14, "listed after {waited} heartbeats");
        view.refill();
        assert!(!view.full_due(quiet), "quiet");
        // A quiet fleet earns its burst back, so the next join, leave or death is listed at
        // once.
        for _ in 0..(2 * LISTING_BURST as usize * 10) {
            view.refill();
            assert!(!view.full_due(quiet));
            view.apply_watched(&ids(&["w001"]), &[rec("w001", 300)], t);
        }
        for i in 0..LISTING_BURST as u64 {
            let moved = FleetSignal::Token(Version(6_000 + i));
            view.refill();
            assert!(view.full_due(moved), "burst listing {i}");
            list(&mut view, fleet.clone(), moved);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_start_holds_full_view_is_a_full_listing_however_many_came_first() {
        use rand::SeedableRng;
        let hb = Duration::from_secs(60);
        let mut view = FleetView::new(true, hb * 5, StdRng::seed_from_u64(1));
        let token = FleetSignal::Token(Version(3));
        let first = Instant::now();
        view.start_hold_view_at(first + hb);
        // The store's notices bring five observations in the first second: all full.
        for i in 0..5 {
            view.refill();
            assert!(view.full_due(token), "observation {i}");
            list(&mut view, vec![rec("a", 1), rec("b", 1)], token);
        }
        tokio::time::advance(hb).await;
        view.refill();
        assert!(view.full_due(token), "the observation that ends the start hold lists");
        view.spend();
        view.apply_full(vec![rec("a", 2), rec("b", 2)], Some(token), Instant::now());
        view.refill();
        assert!(!view.full_due(token), "then the fleet is quiet");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_spell_brings_the_whole_burst_back() {
        let fleet: Vec<WorkerRecord> = (0..1000).map(|i| rec(&format!("w{i:04}"), 1)).collect();
        let mut view = view_of(true);
        let t = Instant::now();
        // Churn spent the credit.
        for i in 0..LISTING_BURST as u64 {
            let moved = FleetSignal::Token(Version(10 + i));
            view.refill();
            view.note_signal(moved);
            assert!(view.full_due(moved));
            list(&mut view, fleet.clone(), moved);
        }
        assert!(view.credit < 1.0, "the churn spent the credit");
        let quiet = FleetSignal::Token(Version(99));
        view.apply_full(fleet.clone(), Some(quiet), Instant::now());
        // Then the signal stands still for QUIET_BEATS heartbeats: a refill at 32 / 1000 a
        // heartbeat would bring back a third of a listing; the quiet spell brings all of it.
        for _ in 0..QUIET_BEATS {
            view.refill();
            view.note_signal(quiet);
            assert!(!view.full_due(quiet), "quiet");
            view.apply_watched(&ids(&["w0001"]), &[rec("w0001", 2)], t);
        }
        for i in 0..LISTING_BURST as u64 {
            let moved = FleetSignal::Token(Version(500 + i));
            view.refill();
            view.note_signal(moved);
            assert!(view.full_due(moved), "a join, a claim, a handoff...: listing {i}");
            list(&mut view, fleet.clone(), moved);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_that_failed_is_charged_like_one_that_succeeded() {
        let fleet: Vec<WorkerRecord> = (0..320).map(|i| rec(&format!("w{i:03}"), 1)).collect();
        let mut view = view_of(true);
        view.apply_full(fleet, Some(FleetSignal::Missing), Instant::now());
        let moved = FleetSignal::Token(Version(9));
        // Its whole burst of listings of an overloaded store times out: the next waits its paced turn
        // instead of piling onto the store at every heartbeat.
        for i in 0..LISTING_BURST as usize {
            view.refill();
            assert!(view.full_due(moved), "try {i}");
            view.spend();
        }
        let mut waited = 0;
        while {
            view.refill();
            !view.full_due(moved)
        } {
            waited += 1;
        }
        assert!((3..=14).contains(&waited), "the next try came {waited} heartbeats later");
    }

    #[tokio::test(start_paused = true)]
    async fn death_notices_hold_while_their_worker_shows_that_beat() {
        let mut view = view_of(true);
        let listing = vec![
            rec("a", 5),
            rec("b", 9),
            WorkerRecord::death_notice(&"a".into(), 5),
            WorkerRecord::death_notice(&"b".into(), 8),
            WorkerRecord::death_notice(&"gone".into(), 3),
        ];
        let stale = view.apply_full(listing, Some(FleetSignal::Missing), Instant::now());
        assert_eq!(view.notices, [(WorkerId::from("a"), 5)]);
        let stale: Vec<String> = stale.iter().map(|r| r.id.to_string()).collect();
        assert_eq!(stale, ["b#dead", "gone#dead"]);
        assert_eq!(view.records.len(), 2, "notices are not workers");
    }
}
