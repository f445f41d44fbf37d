//! The commands that write: `release`, `reset-checkpoint` and `delete-worker`. Each reads the
//! record, decides on what it read (refusing while the owner or worker is alive unless
//! `--force`), and writes with the store's compare-and-set against the version it read, so a
//! worker that wrote in between wins and the CLI reports a conflict instead of overwriting it.
//!
//! Ownership changes follow docs/algorithm.md: clearing an owner moves the epoch on by the
//! runtime's own epoch rule (`lease::transition::release`), which fences the old owner (its next checkpoint is refused
//! and its task stops), and the fleet takes the unowned lease at its checkpoint.

use shardlease::store::VersionedLease;
use shardlease::Epoch;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use shardlease::store::Lease;
use shardlease::{LeaseKey, Position, SequenceNumber, WorkerId};

use crate::error::CliError;
use crate::observe::Observation;
use crate::output::{emit, print_json};
use crate::store_url::Target;

/// Parses a checkpoint as the CLI takes it; the inverse of `Position`'s `Display`.
pub fn parse_position(s: &str) -> Result<Position, CliError> {
    let bad = |why: String| {
        CliError::Usage(format!(
            "bad POSITION {s:?}: {why} (expected TRIM_HORIZON, LATEST, AT_TIMESTAMP(MILLIS), \
             SHARD_END, SEQ or SEQ.SUB)"
        ))
    };
    let t = s.trim();
    match t.to_ascii_uppercase().as_str() {
        "TRIM_HORIZON" => return Ok(Position::TrimHorizon),
        "LATEST" => return Ok(Position::Latest),
        "SHARD_END" => return Ok(Position::ShardEnd),
        _ => {}
    }
    let upper = t.to_ascii_uppercase();
    if let Some(rest) = upper.strip_prefix("AT_TIMESTAMP(") {
        let millis = rest
            .strip_suffix(')')
            .ok_or_else(|| bad("missing `)`".into()))?
            .trim()
            .parse::<i64>()
            .map_err(|e| bad(format!("timestamp is not a number of milliseconds: {e}")))?;
        return Ok(Position::AtTimestamp { millis });
    }
    let (seq, sub) = match t.split_once('.') {
        Some((seq, sub)) => {
            (seq, sub.parse::<u64>().map_err(|e| bad(format!("bad sub-sequence number: {e}")))?)
        }
        None => (t, 0),
    };
    let seq = SequenceNumber::parse(seq).map_err(|e| bad(e.to_string()))?;
    Ok(Position::Sequence { seq, sub })
}

/// What a write command did, for `--json`.
#[derive(Debug, Serialize)]
struct Outcome {
    key: String,
    action: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    old_checkpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_checkpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<Epoch>,
}

fn report(json: bool, outcome: &Outcome) -> Result<ExitCode, CliError> {
    if json {
        print_json(outcome)?;
    } else {
        emit(&outcome.message);
    }
    Ok(ExitCode::SUCCESS)
}

fn owner_refusal(what: &str, key: &LeaseKey, owner: &WorkerId, window: Duration) -> CliError {
    CliError::Refused(format!(
        "refusing to {what} lease {key}: its owner {owner} is alive (its heartbeat moved within \
         {} ms). A running worker hands a lease over only to another worker that claims it; \
         to move it anyway, re-run with --force: the owner is fenced (its next checkpoint is \
         refused and it stops the lease), and records it processed after its last checkpoint \
         are processed again by the next owner",
        window.as_millis()
    ))
}

/// How often a write is retried when only the owner's checkpoints got in the way.
const ATTEMPTS: usize = 5;

/// Reads lease `key`, lets `decide` compute the record to write from what it read (`None`:
/// nothing to write), and writes it by compare-and-set against the version read. A conflict
/// caused by the owner's own checkpoints (the re-read shows the same owner and epoch) is decided
/// again from the fresh record, a few times; a change of owner or epoch is reported as a conflict,
/// since the decision was made about that owner. Returns the record read and the one written.
async fn read_decide_write(
    target: &Target,
    key: &LeaseKey,
    what: &str,
    decide: impl Fn(&Lease) -> Result<Option<Lease>, CliError>,
) -> Result<(Lease, Option<Lease>), CliError> {
    let mut first: Option<(Option<WorkerId>, Epoch)> = None;
    let mut last_conflict = None;
    for _ in 0..ATTEMPTS {
        let VersionedLease { lease, version } = current(target, key).await?;
        let ownership = (lease.owner.clone(), lease.epoch);
        match &first {
            None => first = Some(ownership),
            Some(seen) if *seen != ownership => {
                return Err(CliError::Conflict(format!(
                    "lease {key} changed owner or epoch while {what} was writing it; nothing \
                     was written: look again and re-run"
                )))
            }
            Some(_) => {}
        }
        let Some(next) = decide(&lease)? else { return Ok((lease, None)) };
        match target.store.update_lease(&next, version).await {
            Ok(_) => return Ok((lease, Some(next))),
            Err(e @ shardlease::Error::Conflict { .. }) => last_conflict = Some(e),
            Err(e) => return Err(CliError::Store(e)),
        }
    }
    Err(match last_conflict {
        Some(e) => CliError::from_write(e, what),
        None => CliError::Conflict(format!("lease {key}: {what} did not get through")),
    })
}

/// `lease` released by the runtime's transition (owner cleared, epoch moved on by the epoch rule,
/// claim cleared, checkpoint kept). Only called on an owned lease.
fn released(lease: &Lease) -> Lease {
    let now_millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    shardlease::store::transition::release(lease, now_millis).unwrap_or_else(|_| lease.clone())
}

/// `release KEY [--force]`.
pub async fn release(
    target: &Target,
    observe: Duration,
    json: bool,
    key: &str,
    force: bool,
) -> Result<ExitCode, CliError> {
    let key = LeaseKey::from(key);
    let obs = Observation::take(&*target.store, observe).await?;
    let (old, new) = read_decide_write(target, &key, "release", |lease| match &lease.owner {
        None if lease.claim.is_some() => Ok(Some(Lease { claim: None, ..lease.clone() })),
        None => Ok(None),
        Some(owner) if obs.is_alive(owner) && !force => {
            Err(owner_refusal("release", &key, owner, obs.window))
        }
        Some(_) => Ok(Some(released(lease))),
    })
    .await?;
    let (action, message, epoch) = match (&old.owner, &new) {
        (_, None) => {
            ("nothing", format!("lease {key} is not owned: nothing to release"), old.epoch)
        }
        (None, Some(n)) => {
            ("cleared_claim", format!("lease {key} is unowned; cleared its pending claim"), n.epoch)
        }
        (Some(owner), Some(n)) => {
            let why = if obs.is_alive(owner) {
                "forced: the owner is alive and is fenced"
            } else {
                "the owner is not alive"
            };
            let msg = format!(
                "released lease {key} (was owned by {owner} at epoch {}; now unowned at epoch {}, \
                 checkpoint {} kept; {why})",
                old.epoch, n.epoch, n.checkpoint
            );
            ("released", msg, n.epoch)
        }
    };
    report(
        json,
        &Outcome {
            key: key.to_string(),
            action,
            message,
            old_checkpoint: None,
            new_checkpoint: None,
            epoch: Some(epoch),
        },
    )
}

async fn current(target: &Target, key: &LeaseKey) -> Result<VersionedLease, CliError> {
    target.store.get_lease(key).await.map_err(CliError::Store)?.ok_or_else(|| {
        CliError::NotFound(format!("no lease {key} in namespace {}", target.namespace))
    })
}

/// `reset-checkpoint KEY POSITION [--force]`.
pub async fn reset_checkpoint(
    target: &Target,
    observe: Duration,
    json: bool,
    key: &str,
    position: &str,
    force: bool,
) -> Result<ExitCode, CliError> {
    let key = LeaseKey::from(key);
    let position = parse_position(position)?;
    let obs = Observation::take(&*target.store, observe).await?;
    let (old, new) = read_decide_write(target, &key, "reset-checkpoint", |lease| {
        let mut next = match &lease.owner {
            Some(owner) if obs.is_alive(owner) && !force => {
                return Err(owner_refusal("reset the checkpoint of", &key, owner, obs.window));
            }
            // Released at the new checkpoint: the owner's own checkpoints are fenced by the new
            // epoch, so they cannot overwrite the reset.
            Some(_) => released(lease),
            None => lease.clone(),
        };
        next.checkpoint = position.clone();
        Ok(Some(next))
    })
    .await?;
    let next = new.unwrap_or_else(|| old.clone());
    let released = match &old.owner {
        Some(o) => format!("; released from {o} (epoch {} -> {})", old.epoch, next.epoch),
        None => String::new(),
    };
    report(
        json,
        &Outcome {
            key: key.to_string(),
            action: "reset_checkpoint",
            message: format!(
                "lease {key}: checkpoint {} -> {}{released}",
                old.checkpoint, next.checkpoint
            ),
            old_checkpoint: Some(old.checkpoint.to_string()),
            new_checkpoint: Some(next.checkpoint.to_string()),
            epoch: Some(next.epoch),
        },
    )
}

/// `delete-worker ID [--force]`.
pub async fn delete_worker(
    target: &Target,
    observe: Duration,
    json: bool,
    id: &str,
    force: bool,
) -> Result<ExitCode, CliError> {
    let id = WorkerId::from(id);
    let obs = Observation::take(&*target.store, observe).await?;
    let Some(view) = obs.workers.get(&id) else {
        return Err(CliError::NotFound(format!(
            "no worker record {id} in namespace {}",
            target.namespace
        )));
    };
    if view.alive && !force {
        return Err(CliError::Refused(format!(
            "refusing to delete worker {id}: it is alive (its heartbeat moved within {} ms); a \
             live worker writes its record again on its next heartbeat. --force deletes it anyway",
            obs.window.as_millis()
        )));
    }
    let removed =
        target.store.remove_worker_if(&id, view.record.beat).await.map_err(CliError::Store)?;
    if !removed {
        return Err(CliError::Conflict(format!(
            "worker {id} heartbeat after it was observed (or its record vanished); nothing was \
             deleted: look again and re-run"
        )));
    }
    let held = obs.leases.iter().filter(|v| v.lease.owner.as_ref() == Some(&id)).count();
    let note = if held > 0 {
        format!(
            "; {held} lease(s) still name it as owner: peers take them once the failover \
             timeout has passed, or free them now with `release`"
        )
    } else {
        String::new()
    };
    report(
        json,
        &Outcome {
            key: id.to_string(),
            action: "deleted_worker",
            message: format!("deleted the record of worker {id}{note}"),
            old_checkpoint: None,
            new_checkpoint: None,
            epoch: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_parse_as_they_print() {
        for p in [
            Position::TrimHorizon,
            Position::Latest,
            Position::ShardEnd,
            Position::AtTimestamp { millis: 1_700_000_000_000 },
            Position::sequence(u128::MAX),
            Position::Sequence {
                seq: SequenceNumber::parse(
                    "49590338271490256608559692538361571095921575989136588898",
                )
                .unwrap_or_else(|e| panic!("{e}")),
                sub: 0,
            },
            Position::Sequence { seq: SequenceNumber::from(12u64), sub: 3 },
        ] {
            let text = p.to_string();
            assert_eq!(parse_position(&text).ok(), Some(p), "{text}");
        }
        assert_eq!(parse_position("latest").ok(), Some(Position::Latest));
        for bad in ["", "AT_TIMESTAMP(x)", "AT_TIMESTAMP(12", "12.x", "-5", "soon"] {
            assert!(matches!(parse_position(bad), Err(CliError::Usage(_))), "{bad}");
        }
    }
}
