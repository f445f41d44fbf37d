//! When the balance loop runs its next pass, and whether that pass lists the leases: the pass
//! scheduler, owned by the balance loop and fed by the events it applies.
//!
//! A pass lists the leases only when it may have something to do (docs/algorithm.md, "Listing
//! only when something changed"): the last listing showed work in progress, or a reason to list
//! arrived since (each reason bumps one counter, and a listing records the value it started
//! with, so a reason that arrives during a pass is kept for the next), or the safety net is due.
//! Passes run every (jittered) balance interval, and sooner for three kinds of reason:
//! - at once, when an event asks (`want_pass_now`: a peer left or died, a fence ended, a test);
//! - after a store notice, a few milliseconds later so that a burst of notices is one listing,
//!   and no sooner than [`NOTICE_GAP`](super::NOTICE_GAP) after the last pass a notice brought
//!   forward (two workers that disagree for a moment would otherwise answer each other's notices
//!   back to back);
//! - after a peer published a change (a claim on one of this worker's leases, a lease handed to
//!   it), but no sooner than half a balance interval after the last listing, so a fleet changing
//!   owners together does not list back to back. Such a signal only ever brings the pass closer.
//!
//! Nothing here reads a clock or the store: each decision takes `now`, so the rules are
//! table-tested on their own (below).

use std::time::Duration;

use tokio::time::Instant;

/// The pass scheduler's state (see the module documentation).
#[derive(Debug)]
pub(crate) struct PassScheduler {
    /// Bumped for every reason to list the leases at the next pass.
    wanted: u64,
    /// The value of `wanted` the last listing started with, and when it started.
    listed: Option<(u64, Instant)>,
    /// Whether the last listing found nothing in progress.
    settled: bool,
    /// How long a settled worker goes without listing when nothing signals a change (the safety
    /// net, jittered at the last listing).
    safety_net: Duration,
    /// An event asked for a pass at once.
    pass_now: bool,
    /// A peer published a change since the last wait began.
    peer_moved: bool,
    /// A store notice asked for a pass at this moment.
    notice_pass_at: Option<Instant>,
    /// When the last pass a notice brought forward started.
    noticed_listing: Option<Instant>,
}

/// What the scheduler says of the coming pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassKind {
    /// Nothing may have changed: the pass need not list the leases.
    Quiet,
    /// List the leases; hand the token to [`PassScheduler::listed`] when the listing is done.
    List(ListingToken),
}

/// The reasons a listing covers: those that arrived before it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListingToken {
    wanted: u64,
    started: Instant,
}

impl PassScheduler {
    /// A scheduler whose first pass lists.
    pub(crate) fn new(safety_net: Duration) -> Self {
        PassScheduler {
            wanted: 0,
            listed: None,
            settled: false,
            safety_net,
            pass_now: false,
            peer_moved: false,
            notice_pass_at: None,
            noticed_listing: None,
        }
    }

    /// A reason to list the leases at the next pass, whenever it runs.
    pub(crate) fn want_listing(&mut self) {
        self.wanted += 1;
    }

    /// A reason to list the leases, at a pass run at once.
    pub(crate) fn want_pass_now(&mut self) {
        self.wanted += 1;
        self.pass_now = true;
    }

    /// A peer published a change: list at a pass brought forward to half a balance interval
    /// after the last listing (see [`wake`](Self::wake)).
    pub(crate) fn peer_moved(&mut self) {
        self.wanted += 1;
        self.peer_moved = true;
    }

    /// A store notice at `now`: a listing at a pass `coalesce()` later (the caller jitters it;
    /// drawn only when a pass is set), no sooner than the notice gap after the last pass a notice
    /// brought forward. A pass already set by an earlier notice stands.
    pub(crate) fn noticed(&mut self, now: Instant, coalesce: impl FnOnce() -> Duration) {
        self.wanted += 1;
        if self.notice_pass_at.is_none() {
            let soonest = self.noticed_listing.map_or(now, |at| at + super::NOTICE_GAP);
            self.notice_pass_at = Some((now + coalesce()).max(soonest));
        }
    }

    /// A pass begins at `now`: what it does. The requests it answers are cleared, and a notice's
    /// pass that is due counts as run now (the gap to the next one starts here).
    pub(crate) fn begin(&mut self, now: Instant) -> PassKind {
        self.pass_now = false;
        self.peer_moved = false;
        if self.notice_pass_at.is_some_and(|at| at <= now) {
            self.notice_pass_at = None;
            self.noticed_listing = Some(now);
        }
        let quiet = self.settled
            && self.listed.is_some_and(|(seen, at)| {
                seen == self.wanted && now.saturating_duration_since(at) < self.safety_net
            });
        if quiet {
            PassKind::Quiet
        } else {
            PassKind::List(ListingToken { wanted: self.wanted, started: now })
        }
    }

    /// A pass [`begin`](Self::begin) called quiet lists after all (balancing by load, the loads
    /// moved enough for a plan): the token of a listing starting at `now`.
    pub(crate) fn listing_now(&self, now: Instant) -> ListingToken {
        ListingToken { wanted: self.wanted, started: now }
    }

    /// A listing pass ended: `Some((settled, safety_net))` when it listed (the safety net is the
    /// next one, jittered by the caller), `None` when the listing failed (the next pass lists
    /// again).
    pub(crate) fn listed(&mut self, token: ListingToken, outcome: Option<(bool, Duration)>) {
        match outcome {
            Some((settled, safety_net)) => {
                self.listed = Some((token.wanted, token.started));
                self.settled = settled;
                self.safety_net = safety_net;
            }
            None => self.settled = false,
        }
    }

    /// While the loop waits for the pass due at `regular`, after events were applied: `None` to
    /// run the pass now, or the moment to wake (`regular` or sooner; a signal never puts the pass
    /// off). `half_interval` is half a balance interval.
    pub(crate) fn wake(
        &mut self,
        regular: Instant,
        now: Instant,
        half_interval: Duration,
    ) -> Option<Instant> {
        if self.pass_now {
            return None;
        }
        let mut wake = regular;
        if let Some(at) = self.notice_pass_at {
            wake = wake.min(at);
        }
        if std::mem::take(&mut self.peer_moved) {
            match self.listed.map(|(_, at)| at + half_interval) {
                Some(soonest) if soonest > now => wake = wake.min(soonest),
                _ => return None,
            }
        }
        Some(wake)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);
    const NET: Duration = Duration::from_secs(30);

    /// A scheduler whose last listing started at `t0` with every reason seen, `settled` as given.
    fn after_listing(t0: Instant, settled: bool) -> PassScheduler {
        let mut s = PassScheduler::new(NET);
        let PassKind::List(token) = s.begin(t0) else { panic!("the first pass lists") };
        s.listed(token, Some((settled, NET)));
        s
    }

    #[test]
    fn whether_a_pass_lists() {
        let t0 = Instant::now();
        // (what happened since the last listing, settled, seconds later, lists?)
        type Case = (&'static str, fn(&mut PassScheduler, Instant), bool, u64, bool);
        let cases: &[Case] = &[
            ("nothing, settled", |_, _| {}, true, 5, false),
            ("nothing, work in progress", |_, _| {}, false, 5, true),
            ("nothing, safety net due", |_, _| {}, true, 30, true),
            ("a reason to list", |s, _| s.want_listing(), true, 5, true),
            ("a pass asked at once", |s, _| s.want_pass_now(), true, 5, true),
            ("a peer moved", |s, _| s.peer_moved(), true, 5, true),
            ("a store notice", |s, t| s.noticed(t, || Duration::ZERO), true, 5, true),
        ];
        for (what, event, settled, later, lists) in cases {
            let mut s = after_listing(t0, *settled);
            event(&mut s, t0 + SEC);
            let kind = s.begin(t0 + SEC * (*later as u32));
            assert_eq!(matches!(kind, PassKind::List(_)), *lists, "{what}");
        }
    }

    #[test]
    fn a_reason_that_arrives_during_a_listing_is_kept_for_the_next_pass() {
        let t0 = Instant::now();
        let mut s = after_listing(t0, true);
        s.want_listing();
        let PassKind::List(token) = s.begin(t0 + SEC) else { panic!("lists") };
        s.want_listing(); // during the pass
        s.listed(token, Some((true, NET)));
        assert!(matches!(s.begin(t0 + SEC * 2), PassKind::List(_)));
        // A failed listing leaves the next pass listing too.
        let mut s = after_listing(t0, true);
        let PassKind::List(token) = s.begin(t0 + NET) else { panic!("safety net") };
        s.listed(token, None);
        assert!(matches!(s.begin(t0 + NET + SEC), PassKind::List(_)));
    }

    #[test]
    fn when_the_loop_wakes() {
        let t0 = Instant::now();
        let half = Duration::from_millis(500);
        let regular = t0 + SEC * 2;
        // (what, event at t0 + 100 ms, expected wake: None = at once)
        type Case = (&'static str, fn(&mut PassScheduler, Instant), Option<Duration>);
        let cases: &[Case] = &[
            ("nothing: the regular pass", |_, _| {}, Some(SEC * 2)),
            ("a pass asked at once", |s, _| s.want_pass_now(), None),
            // The last listing started at t0: no sooner than half an interval after it.
            ("a peer moved", |s, _| s.peer_moved(), Some(half)),
            (
                "a notice: coalesced",
                |s, t| s.noticed(t, || Duration::from_millis(5)),
                Some(Duration::from_millis(105)),
            ),
        ];
        for (what, event, expected) in cases {
            let mut s = after_listing(t0, true);
            let now = t0 + Duration::from_millis(100);
            event(&mut s, now);
            assert_eq!(s.wake(regular, now, half), expected.map(|d| t0 + d), "{what}");
        }
        // A peer that moves once the half interval is over: the pass runs at once.
        let mut s = after_listing(t0, true);
        s.peer_moved();
        assert_eq!(s.wake(regular, t0 + SEC, half), None);
        // The signal is consumed: the next wait goes back to the regular pass.
        assert_eq!(s.wake(regular, t0 + SEC, half), Some(regular));
        // A signal never puts the pass off.
        let mut s = after_listing(t0, true);
        s.peer_moved();
        assert_eq!(
            s.wake(t0 + Duration::from_millis(200), t0, half),
            Some(t0 + Duration::from_millis(200))
        );
    }

    #[test]
    fn notices_are_spaced_by_the_gap() {
        let t0 = Instant::now();
        let coalesce = Duration::from_millis(5);
        let mut s = after_listing(t0, true);
        s.noticed(t0, || coalesce);
        // A second notice before the pass keeps the first one's moment.
        s.noticed(t0 + Duration::from_millis(3), || coalesce);
        assert_eq!(s.wake(t0 + SEC, t0, SEC), Some(t0 + coalesce));
        // The notice's pass runs; the next notice waits out the gap from it.
        let ran = t0 + coalesce;
        assert!(matches!(s.begin(ran), PassKind::List(_)));
        s.noticed(ran + Duration::from_millis(1), || coalesce);
        assert_eq!(s.wake(t0 + SEC, ran, SEC), Some(ran + super::super::NOTICE_GAP));
    }
}
