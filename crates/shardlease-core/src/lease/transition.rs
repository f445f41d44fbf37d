//! Every change of a lease record's ownership, as a pure function.
//!
//! A lease moves through a small set of transitions: a worker **takes** it, **claims** it from its
//! owner, the owner **acknowledges** the claim (a write that changes nothing but the version, to
//! restart the claimant's clock) and **hands it over**, or **clears** the claim; an owner
//! **releases** it at shutdown or after a panic; a leaving worker **withdraws** its claims; an
//! operator **releases** it from the CLI. Each transition here takes the record as it stands now,
//! who acts and what they observed, and returns the record to write in its place, or a
//! [`Refusal`] saying why nothing should be written. None of them reads a clock or a store: the
//! caller passes the wall-clock milliseconds in, and issues the write as a compare-and-set against
//! the version it read (the runtime through its one CAS loop, the CLI through its own).
//!
//! The module also owns the **one epoch rule** ([`next_epoch`]): every change of owner, a release
//! too, moves the epoch to one more than the current and at least the wall clock in milliseconds.
//! The runtime, the recovery of lost leases and the CLI all call it, so no path can hand out an
//! epoch some earlier owner already had, even after a store rolled back (docs/algorithm.md,
//! "Epochs"). Table tests at the bottom pin every transition's answers.

use super::{Claim, Epoch, Lease, LeaseToken, WorkerId};

/// Why a transition writes nothing: the record is no longer what the decision was made on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The acting worker does not own the lease (at the expected epoch).
    NotOwner,
    /// The record changed in more than its checkpoint since it was listed: another owner or epoch,
    /// a claim written or cleared, other parents, or the shard finished.
    Moved,
    /// The claim the action answers is no longer on the record (answered, cleared, or stale).
    ClaimGone,
    /// The acting worker neither owns nor claims the lease: nothing to withdraw.
    NothingToWithdraw,
    /// The lease has no owner: nothing to release.
    NotOwned,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NotOwner => "the lease is not owned by this worker at this epoch",
            Refusal::Moved => "the lease record moved on since it was listed",
            Refusal::ClaimGone => "the claim is no longer on the record",
            Refusal::NothingToWithdraw => "this worker neither owns nor claims the lease",
            Refusal::NotOwned => "the lease has no owner",
        })
    }
}

/// What a transition returns: the record to write by compare-and-set, or why not.
pub type Transition = Result<Lease, Refusal>;

/// The epoch a lease starts at when it is created: the wall clock in milliseconds. Any lease
/// created before had its epoch bumped once per change of owner, which is far slower than one per
/// millisecond, so a lease created again after the store lost its data starts above every epoch a
/// sink has seen.
pub fn creation_epoch(now_millis: u64) -> Epoch {
    Epoch(now_millis)
}

/// The epoch of a lease's next owner (or of its release): one more than `current`, and at least
/// the wall clock in milliseconds. A store that rolled back shows an older epoch; a new owner
/// taking the lease from there must not be handed a number an owner before the rollback already
/// had (a sink fencing on epochs could not tell the two apart). Owner changes are far rarer than
/// one per millisecond, so the clock is ahead of every epoch handed out earlier; where it is not
/// (a skewed clock), the epoch still grows by one. Saturates at `u64::MAX`.
pub fn next_epoch(current: Epoch, now_millis: u64) -> Epoch {
    current.next().max(creation_epoch(now_millis))
}

/// The record with a new owner (or none): the epoch by [`next_epoch`], the claim cleared, the
/// checkpoint, parents and attributes kept.
fn moved_to(current: &Lease, owner: Option<WorkerId>, now_millis: u64) -> Lease {
    Lease { owner, epoch: next_epoch(current.epoch, now_millis), claim: None, ..current.clone() }
}

/// `me` takes the lease: it was judged available (no owner, a dead owner, a claim of `me`'s that
/// timed out, or a lease the store says `me` owns at an epoch this process was not granted). The
/// judgement belongs to the balancer; the write is a compare-and-set against the record it was made
/// on, so it never refuses here.
pub fn take(current: &Lease, me: &WorkerId, now_millis: u64) -> Transition {
    Ok(moved_to(current, Some(me.clone()), now_millis))
}

/// `me` asks the owner to hand the lease over. Written only while the record differs from the
/// `listed` one the claim was decided on by its checkpoint (and attributes) alone: an owner
/// checkpointing between the listing and the claim does not change the decision, but any other
/// move (a new owner or epoch, a claim written or cleared, the shard ended) does, and the next
/// pass decides again.
pub fn claim(listed: &Lease, current: &Lease, me: &WorkerId) -> Transition {
    let only_checkpoint_moved = current.owner == listed.owner
        && current.epoch == listed.epoch
        && current.claim == listed.claim
        && current.parents == listed.parents
        && !current.is_finished();
    if !only_checkpoint_moved {
        return Err(Refusal::Moved);
    }
    Ok(Lease { claim: Some(Claim { by: me.clone(), at: current.epoch }), ..current.clone() })
}

/// The owner `me` clears the claim `seen` on its lease (the balancer decided to keep the lease).
/// Re-decided on every record the compare-and-set meets: the owner keeps checkpointing, and the
/// claim must still be the one decided on.
pub fn clear_claim(current: &Lease, me: &WorkerId, seen: Option<&Claim>) -> Transition {
    if !current.is_owned_by(me) {
        return Err(Refusal::NotOwner);
    }
    if current.live_claim() != seen {
        return Err(Refusal::ClaimGone);
    }
    Ok(Lease { claim: None, ..current.clone() })
}

/// The owner `me`, running the lease at `epoch`, acknowledges `to`'s claim before handing over:
/// the record is written unchanged, so only its version moves, which restarts the claimant's claim
/// timeout while the processor flushes.
pub fn acknowledge(current: &Lease, me: &WorkerId, epoch: Epoch, to: &WorkerId) -> Transition {
    if !current.is_owned_by(me) || current.epoch != epoch {
        return Err(Refusal::NotOwner);
    }
    if current.live_claim().is_none_or(|c| &c.by != to) {
        return Err(Refusal::ClaimGone);
    }
    Ok(current.clone())
}

/// The owner holding `token` gives the lease up: to `to` when `to`'s claim still stands (a
/// handoff), unowned otherwise (a release: a shutdown, a processor panic, a claim withdrawn
/// meanwhile). Only while `token` is still current; a lease that moved on is left alone.
pub fn hand_over(
    current: &Lease,
    token: &LeaseToken,
    to: Option<&WorkerId>,
    now_millis: u64,
) -> Transition {
    if !token.matches(current) {
        return Err(Refusal::NotOwner);
    }
    let next_owner = to.filter(|w| current.live_claim().is_some_and(|c| &c.by == *w)).cloned();
    Ok(moved_to(current, next_owner, now_millis))
}

/// `me` is leaving and withdraws what it asked for: a lease a peer already handed to it is
/// released at once (rather than left to a departed owner for a failover timeout), and a claim
/// still standing is cleared.
pub fn withdraw_claim(current: &Lease, me: &WorkerId, now_millis: u64) -> Transition {
    if current.is_owned_by(me) {
        return Ok(moved_to(current, None, now_millis));
    }
    if current.live_claim().is_some_and(|c| &c.by == me) {
        return Ok(Lease { claim: None, ..current.clone() });
    }
    Err(Refusal::NothingToWithdraw)
}

/// An operator releases the lease, whoever owns it: unowned under a new epoch, which fences the
/// old owner (its next checkpoint is refused and its task stops), checkpoint kept. Deciding
/// whether the owner may be alive is the caller's business (the CLI refuses unless forced).
pub fn release(current: &Lease, now_millis: u64) -> Transition {
    if current.owner.is_none() {
        return Err(Refusal::NotOwned);
    }
    Ok(moved_to(current, None, now_millis))
}

/// The runtime retires the lease of a stream its source stopped reading for good: finished
/// (`ShardEnd`) and unowned under a new epoch, which fences the owner (its next checkpoint is
/// refused and its task stops). Refused when the lease is already finished.
pub fn retire(current: &Lease, now_millis: u64) -> Transition {
    if current.is_finished() {
        return Err(Refusal::Moved);
    }
    Ok(Lease {
        checkpoint: crate::position::Position::ShardEnd,
        ..moved_to(current, None, now_millis)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::Position;

    const NOW: u64 = 1_000_000;

    fn w(s: &str) -> WorkerId {
        WorkerId::new(s)
    }

    /// A lease owned by `owner` at `epoch`, claimed by `claim` at that epoch.
    fn lease(owner: Option<&str>, epoch: u64, claim: Option<&str>) -> Lease {
        Lease {
            owner: owner.map(w),
            epoch: Epoch(epoch),
            claim: claim.map(|c| Claim { by: w(c), at: Epoch(epoch) }),
            ..Lease::new("shard-1", Position::TrimHorizon)
        }
    }

    fn token(owner: &str, epoch: u64) -> LeaseToken {
        LeaseToken { key: "shard-1".into(), owner: w(owner), epoch: Epoch(epoch) }
    }

    #[test]
    fn the_epoch_rule_grows_by_one_and_never_below_the_clock() {
        for (current, now, want) in [
            (0, NOW, NOW),             // a fresh lease jumps to the clock
            (NOW + 5, NOW, NOW + 6),   // ahead of a skewed clock: still + 1
            (NOW - 1, NOW, NOW),       // just behind: the clock
            (NOW, NOW, NOW + 1),       // level: + 1
            (u64::MAX, NOW, u64::MAX), // saturates, never wraps to zero
            (7, 0, 8),                 // a clock before 1970 reads 0: + 1
        ] {
            assert_eq!(next_epoch(Epoch(current), now), Epoch(want), "from {current} at {now}");
        }
        assert_eq!(creation_epoch(NOW), Epoch(NOW));
    }

    /// Every change of owner moves the epoch by the rule, clears the claim and keeps the rest.
    #[test]
    fn owner_changes_keep_the_checkpoint_and_clear_the_claim() {
        let mut current = lease(Some("a"), 3, Some("b"));
        current.checkpoint = Position::sequence(42u64);
        current.parents = vec!["p".into()];
        current.attributes.insert("k".into(), "v".into());
        let cases: Vec<(&str, Transition, Option<&str>)> = vec![
            ("take", take(&current, &w("c"), NOW), Some("c")),
            ("hand over", hand_over(&current, &token("a", 3), Some(&w("b")), NOW), Some("b")),
            ("release", release(&current, NOW), None),
            ("withdraw as owner", withdraw_claim(&current, &w("a"), NOW), None),
        ];
        for (what, next, owner) in cases {
            let next = next.unwrap_or_else(|r| panic!("{what} refused: {r}"));
            assert_eq!(next.owner, owner.map(w), "{what}");
            assert_eq!(next.epoch, Epoch(NOW), "{what}");
            assert_eq!(next.claim, None, "{what}");
            assert_eq!(
                (&next.key, &next.checkpoint, &next.parents, &next.attributes),
                (&current.key, &current.checkpoint, &current.parents, &current.attributes),
                "{what}"
            );
        }
    }

    #[test]
    fn a_claim_is_written_only_over_a_record_whose_checkpoint_alone_moved() {
        let listed = lease(Some("a"), 3, None);
        let checkpointed = Lease { checkpoint: Position::sequence(9u64), ..listed.clone() };
        let finished = Lease { checkpoint: Position::ShardEnd, ..listed.clone() };
        let reparented = Lease { parents: vec!["p".into()], ..listed.clone() };
        for (what, current, ok) in [
            ("unchanged", listed.clone(), true),
            ("checkpointed", checkpointed, true),
            ("another owner", lease(Some("c"), 3, None), false),
            ("another epoch", lease(Some("a"), 4, None), false),
            ("claimed by another", lease(Some("a"), 3, Some("c")), false),
            ("finished", finished, false),
            ("other parents", reparented, false),
        ] {
            match claim(&listed, &current, &w("b")) {
                Ok(next) => {
                    assert!(ok, "{what}: claimed");
                    assert_eq!(next.claim, Some(Claim { by: w("b"), at: Epoch(3) }), "{what}");
                    assert_eq!((next.owner, next.epoch), (current.owner, current.epoch), "{what}");
                }
                Err(r) => {
                    assert!(!ok, "{what}: refused ({r})");
                    assert_eq!(r, Refusal::Moved, "{what}");
                }
            }
        }
    }

    #[test]
    fn the_owner_answers_only_the_claim_still_standing() {
        let claimed = lease(Some("a"), 3, Some("b"));
        let seen = claimed.claim.clone();
        let stale =
            Lease { claim: Some(Claim { by: w("b"), at: Epoch(2) }), ..lease(Some("a"), 3, None) };
        // (what, record, acknowledge's answer, clear's answer)
        type Answer = Result<(), Refusal>;
        let table: Vec<(&str, Lease, Answer, Answer)> = vec![
            ("standing", claimed.clone(), Ok(()), Ok(())),
            (
                "claim gone",
                lease(Some("a"), 3, None),
                Err(Refusal::ClaimGone),
                Err(Refusal::ClaimGone),
            ),
            ("stale claim", stale, Err(Refusal::ClaimGone), Err(Refusal::ClaimGone)),
            (
                "another claimant",
                lease(Some("a"), 3, Some("c")),
                Err(Refusal::ClaimGone),
                Err(Refusal::ClaimGone),
            ),
            (
                "not mine",
                lease(Some("c"), 3, Some("b")),
                Err(Refusal::NotOwner),
                Err(Refusal::NotOwner),
            ),
            (
                "another epoch",
                lease(Some("a"), 4, Some("b")),
                Err(Refusal::NotOwner),
                Err(Refusal::ClaimGone),
            ),
        ];
        for (what, current, ack, clear) in table {
            let acked = acknowledge(&current, &w("a"), Epoch(3), &w("b"));
            assert_eq!(acked.as_ref().map(|_| ()), ack.as_ref().map(|_| ()), "acknowledge, {what}");
            if let Ok(next) = acked {
                assert_eq!(next, current, "an acknowledgement rewrites the record unchanged");
            }
            let cleared = clear_claim(&current, &w("a"), seen.as_ref());
            assert_eq!(cleared.as_ref().map(|_| ()), clear.as_ref().map(|_| ()), "clear, {what}");
            if let Ok(next) = cleared {
                assert_eq!(next, Lease { claim: None, ..current }, "clear, {what}");
            }
        }
    }

    #[test]
    fn a_handoff_goes_to_the_claimant_only_while_its_claim_stands() {
        for (what, current, to, want) in [
            ("claim standing", lease(Some("a"), 3, Some("b")), Some("b"), Ok(Some("b"))),
            ("claim withdrawn", lease(Some("a"), 3, None), Some("b"), Ok(None)),
            ("another claimant", lease(Some("a"), 3, Some("c")), Some("b"), Ok(None)),
            ("a release", lease(Some("a"), 3, Some("b")), None, Ok(None)),
            ("moved on", lease(Some("c"), 4, None), Some("b"), Err(Refusal::NotOwner)),
            ("epoch moved", lease(Some("a"), 4, Some("b")), Some("b"), Err(Refusal::NotOwner)),
        ] {
            let next = hand_over(&current, &token("a", 3), to.map(w).as_ref(), NOW);
            assert_eq!(next.map(|l| l.owner), want.map(|o| o.map(w)), "{what}");
        }
    }

    #[test]
    fn a_leaving_worker_withdraws_what_it_asked_for() {
        for (what, current, want_owner, want_claim, refused) in [
            ("handed to me", lease(Some("me"), 3, None), None, None, false),
            ("my claim", lease(Some("a"), 3, Some("me")), Some("a"), None, false),
            ("another's claim", lease(Some("a"), 3, Some("c")), None, None, true),
            ("not mine at all", lease(None, 3, None), None, None, true),
        ] {
            match withdraw_claim(&current, &w("me"), NOW) {
                Ok(next) => {
                    assert!(!refused, "{what}");
                    assert_eq!(next.owner, want_owner.map(w), "{what}");
                    assert_eq!(next.claim.map(|c| c.by), want_claim.map(w), "{what}");
                    // Clearing a claim changes no owner, so no epoch.
                    let moved = current.owner != next.owner;
                    assert_eq!(next.epoch != current.epoch, moved, "{what}");
                }
                Err(r) => {
                    assert!(refused, "{what}: {r}");
                    assert_eq!(r, Refusal::NothingToWithdraw);
                }
            }
        }
    }

    #[test]
    fn an_operator_release_needs_an_owner() {
        assert_eq!(release(&lease(None, 3, None), NOW), Err(Refusal::NotOwned));
        let released = release(&lease(Some("a"), NOW + 10, None), NOW);
        assert_eq!(released.map(|l| (l.owner, l.epoch)), Ok((None, Epoch(NOW + 11))));
    }
}
