//! The read-only commands: `leases`, `workers` and `status`. They list, observe heartbeats for a
//! window and report; they never write to the store.

use shardlease::store::VersionedLease;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use shardlease::store::now_millis;

use crate::error::{code, CliError};
use crate::observe::Observation;
use crate::output::{emit, emit_raw, print_json, table};
use crate::state::{classify, LeaseState};
use crate::store_url::Target;

/// One lease as printed.
#[derive(Debug, Serialize)]
pub struct LeaseRow {
    key: String,
    owner: Option<String>,
    epoch: Option<u64>,
    checkpoint: Option<String>,
    state: LeaseState,
    /// The live claim's claimant (a stale claim is not shown).
    claim: Option<String>,
    parents: Vec<String>,
    /// Why the record is corrupt (corrupt rows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

fn lease_rows(obs: &Observation) -> Vec<LeaseRow> {
    let states = classify(obs);
    let mut rows: Vec<LeaseRow> = obs
        .leases
        .iter()
        .zip(states)
        .map(|(VersionedLease { lease: l, .. }, state)| LeaseRow {
            key: l.key.to_string(),
            owner: l.owner.as_ref().map(|o| o.to_string()),
            epoch: Some(l.epoch.get()),
            checkpoint: Some(l.checkpoint.to_string()),
            state,
            claim: l.live_claim().map(|c| c.by.to_string()),
            parents: l.parents.iter().map(|p| p.to_string()).collect(),
            reason: None,
        })
        .collect();
    rows.sort_by(|a, b| a.key.cmp(&b.key));
    rows.extend(obs.corrupt_leases.iter().map(|c| LeaseRow {
        key: c.key.clone(),
        owner: None,
        epoch: None,
        checkpoint: None,
        state: LeaseState::Corrupt,
        claim: None,
        parents: Vec::new(),
        reason: Some(c.reason.clone()),
    }));
    rows
}

fn print_leases(target: &Target, obs: &Observation, json: bool) -> Result<(), CliError> {
    let rows = lease_rows(obs);
    if json {
        return print_json(&rows);
    }
    let mut t = table(&["key", "owner", "epoch", "checkpoint", "state", "claim", "parents"]);
    for r in &rows {
        let state = match &r.reason {
            Some(reason) => format!("corrupt: {reason}"),
            None => r.state.label().to_owned(),
        };
        t.add_row(vec![
            r.key.clone(),
            r.owner.clone().unwrap_or_else(|| "-".into()),
            r.epoch.map_or_else(|| "-".into(), |e| e.to_string()),
            r.checkpoint.clone().unwrap_or_else(|| "-".into()),
            state,
            r.claim.clone().unwrap_or_else(|| "-".into()),
            if r.parents.is_empty() { "-".into() } else { r.parents.join(",") },
        ]);
    }
    emit(&format!(
        "{} namespace {} ({} leases)",
        target.redacted_url,
        target.namespace,
        rows.len()
    ));
    emit(&t.to_string());
    Ok(())
}

/// `leases [--watch N]`.
pub async fn leases(
    target: &Target,
    observe: Duration,
    json: bool,
    watch: Option<u64>,
) -> Result<ExitCode, CliError> {
    let Some(every) = watch else {
        let obs = Observation::take(&*target.store, observe).await?;
        print_leases(target, &obs, json)?;
        return Ok(ExitCode::SUCCESS);
    };
    loop {
        let obs = Observation::take(&*target.store, observe).await?;
        if !json {
            // Clear the screen and go home, so the table refreshes in place.
            emit_raw("\x1b[2J\x1b[H");
        }
        print_leases(target, &obs, json)?;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(every)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// One worker as printed.
#[derive(Debug, Serialize)]
pub struct WorkerRow {
    id: String,
    alive: bool,
    /// Leases naming it as owner in the listing.
    leases_held: usize,
    /// The count it reports in its own record.
    lease_count_reported: u32,
    /// Heartbeats its current process has written.
    beats: u64,
    /// Seconds since its last heartbeat by its own wall clock (informational: clocks differ).
    last_beat_age_s: f64,
    /// Ownership changes its process has made.
    changes: u64,
}

fn worker_rows(obs: &Observation) -> Vec<WorkerRow> {
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for VersionedLease { lease: l, .. } in &obs.leases {
        if let Some(o) = &l.owner {
            *held.entry(o.as_str()).or_default() += 1;
        }
    }
    let now = now_millis();
    obs.workers
        .values()
        .map(|w| WorkerRow {
            id: w.record.id.to_string(),
            alive: w.alive,
            leases_held: held.get(w.record.id.as_str()).copied().unwrap_or(0),
            lease_count_reported: w.record.lease_count,
            beats: w.record.beats_written(),
            last_beat_age_s: now.saturating_sub(w.record.updated_at_millis) as f64 / 1000.0,
            changes: w.record.changes,
        })
        .collect()
}

/// `workers`.
pub async fn workers(target: &Target, observe: Duration, json: bool) -> Result<ExitCode, CliError> {
    let obs = Observation::take(&*target.store, observe).await?;
    let rows = worker_rows(&obs);
    if json {
        print_json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = table(&["worker", "alive", "leases held", "beats", "last beat (s ago)", "changes"]);
    for r in &rows {
        t.add_row(vec![
            r.id.clone(),
            if r.alive { "alive".into() } else { "dead".into() },
            r.leases_held.to_string(),
            r.beats.to_string(),
            format!("{:.1}", r.last_beat_age_s),
            r.changes.to_string(),
        ]);
    }
    for c in &obs.corrupt_workers {
        t.add_row(vec![c.key.clone(), format!("corrupt: {}", c.reason)]);
    }
    emit(&format!(
        "{} namespace {}: {} workers (alive = beat moved within {} ms)",
        target.redacted_url,
        target.namespace,
        rows.len(),
        obs.window.as_millis()
    ));
    emit(&t.to_string());
    Ok(ExitCode::SUCCESS)
}

/// The `status` summary.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    namespace: String,
    leases: usize,
    owned: usize,
    unowned: usize,
    claimed: usize,
    owner_dead: usize,
    blocked: usize,
    finished: usize,
    corrupt_leases: usize,
    corrupt_workers: usize,
    workers_alive: usize,
    workers_dead: usize,
    /// Most active leases held by one live worker.
    max_share: usize,
    /// Fewest active leases held by one live worker.
    min_share: usize,
    /// Leases without a live owner, unchanged for the whole window.
    stuck: Vec<String>,
    /// How long the fleet was observed, in milliseconds.
    observed_ms: u128,
    healthy: bool,
    problems: Vec<String>,
}

/// `status`: observe for the failover timeout, summarise, exit 1 on a problem.
pub async fn status(target: &Target, failover: Duration, json: bool) -> Result<ExitCode, CliError> {
    let obs = Observation::take(&*target.store, failover).await?;
    let states = classify(&obs);
    let mut s = Summary {
        namespace: target.namespace.clone(),
        leases: obs.leases.len() + obs.corrupt_leases.len(),
        corrupt_leases: obs.corrupt_leases.len(),
        corrupt_workers: obs.corrupt_workers.len(),
        observed_ms: obs.window.as_millis(),
        ..Summary::default()
    };
    let mut shares: BTreeMap<&str, usize> =
        obs.workers.values().filter(|w| w.alive).map(|w| (w.record.id.as_str(), 0)).collect();
    for (VersionedLease { lease, version }, state) in obs.leases.iter().zip(&states) {
        if lease.owner.is_some() {
            s.owned += 1;
        }
        match state {
            LeaseState::Unowned => s.unowned += 1,
            LeaseState::Claimed => s.claimed += 1,
            LeaseState::OwnerDead => s.owner_dead += 1,
            LeaseState::Blocked => s.blocked += 1,
            LeaseState::Finished => s.finished += 1,
            LeaseState::Running | LeaseState::Corrupt => {}
        }
        if matches!(state, LeaseState::Running | LeaseState::Claimed) {
            if let Some(share) = lease.owner.as_ref().and_then(|o| shares.get_mut(o.as_str())) {
                *share += 1;
            }
        }
        if matches!(state, LeaseState::Unowned | LeaseState::OwnerDead)
            && obs.unchanged(&lease.key, *version)
        {
            s.stuck.push(lease.key.to_string());
        }
    }
    s.workers_alive = obs.workers.values().filter(|w| w.alive).count();
    s.workers_dead = obs.workers.len() - s.workers_alive;
    s.max_share = shares.values().copied().max().unwrap_or(0);
    s.min_share = shares.values().copied().min().unwrap_or(0);
    if !s.stuck.is_empty() {
        s.problems.push(format!(
            "{} lease(s) without a live owner and unchanged for {} ms (the failover timeout): {}",
            s.stuck.len(),
            s.observed_ms,
            s.stuck.join(", ")
        ));
    }
    for c in obs.corrupt_leases.iter().chain(&obs.corrupt_workers) {
        s.problems.push(format!("corrupt record {}: {}", c.key, c.reason));
    }
    s.healthy = s.problems.is_empty();
    if json {
        print_json(&s)?;
    } else {
        let mut t = table(&[]);
        let rows: [(&str, String); 14] = [
            ("leases", s.leases.to_string()),
            ("owned", s.owned.to_string()),
            ("unowned", s.unowned.to_string()),
            ("claimed", s.claimed.to_string()),
            ("owner dead", s.owner_dead.to_string()),
            ("blocked on parent", s.blocked.to_string()),
            ("finished", s.finished.to_string()),
            ("corrupt", (s.corrupt_leases + s.corrupt_workers).to_string()),
            ("workers alive", s.workers_alive.to_string()),
            ("workers dead", s.workers_dead.to_string()),
            ("max share", s.max_share.to_string()),
            ("min share", s.min_share.to_string()),
            ("observed", format!("{} ms", s.observed_ms)),
            ("health", if s.healthy { "ok".into() } else { "PROBLEM".into() }),
        ];
        for (k, v) in rows {
            t.add_row(vec![k.to_owned(), v]);
        }
        emit(&format!("{} namespace {}", target.redacted_url, target.namespace));
        emit(&t.to_string());
        for p in &s.problems {
            emit(&format!("problem: {p}"));
        }
    }
    Ok(ExitCode::from(if s.healthy { code::OK } else { code::UNHEALTHY }))
}
