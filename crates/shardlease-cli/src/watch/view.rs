//! Draws one frame of `watch` from a [`Watch`]: a header, the health line, the workers, the
//! leases (those needing attention first) and the recent changes. Drawing is pure, so a test
//! renders it into ratatui's `TestBackend` and reads the text, and `--once` prints the same
//! buffer as plain text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Frame;
use tokio::time::Instant;

use super::model::{Change, Watch};
use crate::state::LeaseState;

/// What the frame says about the command itself.
#[derive(Clone, Debug)]
pub struct Meta {
    /// The store URL, redacted.
    pub url: String,
    /// The namespace.
    pub namespace: String,
    /// The refresh interval.
    pub interval: Duration,
    /// Whether to say that `q` quits (not in a `--once` capture).
    pub interactive: bool,
}

/// Wall-clock time of day, UTC, as `HH:MM:SS`.
pub fn time_of_day(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

/// A duration in a few characters: `0.4s`, `12s`, `3m05s`, `2h10m`.
pub fn short(d: Duration) -> String {
    let s = d.as_secs();
    if s < 10 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    }
}

/// Leases needing attention come first.
fn rank(state: LeaseState) -> u8 {
    match state {
        LeaseState::Corrupt => 0,
        LeaseState::OwnerDead => 1,
        LeaseState::Unowned => 2,
        LeaseState::Claimed => 3,
        LeaseState::Blocked => 4,
        LeaseState::Running => 5,
        LeaseState::Finished => 6,
    }
}

fn state_style(state: &str) -> Style {
    match state {
        "dead" | "owner dead" | "unowned" | "corrupt" => Style::new().fg(Color::Red),
        "claimed" | "blocked on parent" | "no beat yet" => Style::new().fg(Color::Yellow),
        _ => Style::new(),
    }
}

/// The last `n` characters of `s` (sequence numbers differ at their end), marked when cut.
fn tail(s: &str, n: usize) -> String {
    let len = s.chars().count();
    if len <= n {
        return s.to_owned();
    }
    let kept: String = s.chars().skip(len - (n - 1)).collect();
    format!("…{kept}")
}

fn opt(id: Option<&shardlease::WorkerId>) -> String {
    id.map_or_else(|| "-".to_owned(), |w| w.to_string())
}

/// How many rows the frame needs to show everything (capped by the caller).
pub fn height_for(w: &Watch, max_events: usize) -> u16 {
    let rows = 3 + (w.workers.len() + w.corrupt_workers.len()).max(1) + 3;
    let rows = rows + (w.leases.len() + w.corrupt_leases.len()).max(1) + 3;
    let rows = rows + w.events.len().clamp(1, max_events) + 2;
    u16::try_from(rows).unwrap_or(u16::MAX)
}

/// Draws the frame.
pub fn draw(f: &mut Frame, w: &Watch, meta: &Meta) {
    let now = w.refreshed_at.unwrap_or_else(Instant::now);
    let area = f.area();
    let worker_rows = (w.workers.len() + w.corrupt_workers.len()).max(1) as u16 + 3;
    let event_rows = w.events.len().clamp(1, 10) as u16 + 2;
    let third = (area.height / 3).max(4);
    let [header, health, workers, leases, events] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(1),
        Constraint::Length(worker_rows.min(third)),
        Constraint::Min(4),
        Constraint::Length(event_rows.min(third)),
    ])
    .areas(area);
    draw_header(f, header, w, meta);
    draw_health(f, health, w, meta, now);
    draw_workers(f, workers, w, now);
    draw_leases(f, leases, w, now);
    draw_events(f, events, w);
}

fn draw_header(f: &mut Frame, area: Rect, w: &Watch, meta: &Meta) {
    let mut title = format!(
        "shardlease watch  namespace {}  every {}  failover {}  {} UTC",
        meta.namespace,
        short(meta.interval),
        short(w.failover()),
        time_of_day(SystemTime::now())
    );
    if meta.interactive {
        title.push_str("  (q quits)");
    }
    let reads = format!(
        "{}  reads: {} worker listings, {} lease listings",
        meta.url, w.reads.worker_listings, w.reads.lease_listings
    );
    let lines =
        vec![Line::styled(title, Style::new().add_modifier(Modifier::BOLD)), Line::raw(reads)];
    f.render_widget(Paragraph::new(lines), area);
}

fn draw_health(f: &mut Frame, area: Rect, w: &Watch, meta: &Meta, now: Instant) {
    let problems = w.problems(now);
    let mut counts: Vec<(LeaseState, usize)> = Vec::new();
    for s in w.leases.values() {
        match counts.iter_mut().find(|(st, _)| *st == s.state) {
            Some((_, n)) => *n += 1,
            None => counts.push((s.state, 1)),
        }
    }
    counts.sort_by_key(|(st, _)| rank(*st));
    let states: Vec<String> = counts.iter().map(|(st, n)| format!("{n} {}", st.label())).collect();
    let alive = w.workers.values().filter(|s| !s.dead).count();
    let mut summary = format!(
        "  {} leases ({})  {} workers ({alive} alive, {} dead)",
        w.leases.len() + w.corrupt_leases.len(),
        if states.is_empty() { "none".to_owned() } else { states.join(", ") },
        w.workers.len(),
        w.workers.len() - alive,
    );
    if is_empty(w) {
        summary.push_str(&empty_namespace_hint(&meta.namespace));
    }
    let line = if problems.is_empty() {
        Line::from(vec![
            Span::styled("health: ok", Style::new().fg(Color::Green)),
            Span::raw(summary),
        ])
    } else {
        Line::from(vec![
            Span::styled(
                format!("health: PROBLEM: {}", problems.join("; ")),
                Style::new().fg(Color::Red),
            ),
            Span::raw(summary),
        ])
    };
    f.render_widget(Paragraph::new(line), area);
}

/// Whether the namespace held no record at all when last listed (a fleet that never ran, or the
/// wrong namespace: a store holds many, and the CLI reads one).
fn is_empty(w: &Watch) -> bool {
    w.reads.lease_listings > 0
        && w.leases.is_empty()
        && w.corrupt_leases.is_empty()
        && w.workers.is_empty()
        && w.corrupt_workers.is_empty()
}

/// What the health line adds for an empty namespace: the fleet may be in another one
/// (`--namespace NAME`, or the URL's `?namespace=`).
fn empty_namespace_hint(namespace: &str) -> String {
    format!("  (namespace {namespace:?} is empty: wrong --namespace?)")
}

fn draw_workers(f: &mut Frame, area: Rect, w: &Watch, now: Instant) {
    let held = w.held();
    let mut rows: Vec<Row> = w
        .workers
        .iter()
        .map(|(id, s)| {
            let state = s.state();
            Row::new(vec![
                id.to_string(),
                state.to_owned(),
                held.get(id).copied().unwrap_or(0).to_string(),
                s.record.load.map_or_else(|| "-".to_owned(), |l| format!("{l:.2}")),
                s.record.beats_written().to_string(),
                s.record.changes.to_string(),
                short(now.saturating_duration_since(s.beat_since)),
            ])
            .style(state_style(state))
        })
        .collect();
    rows.extend(w.corrupt_workers.iter().map(|c| {
        Row::new(vec![c.key.clone(), format!("corrupt: {}", c.reason)])
            .style(state_style("corrupt"))
    }));
    let table = Table::new(
        rows,
        [
            Constraint::Min(20),
            Constraint::Length(11),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Length(7),
            Constraint::Length(9),
        ],
    )
    .header(
        Row::new(["worker", "state", "leases", "load", "beats", "changes", "beat age"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(format!(" workers ({}) ", w.workers.len())));
    f.render_widget(table, area);
}

fn draw_leases(f: &mut Frame, area: Rect, w: &Watch, now: Instant) {
    let mut leases: Vec<_> = w.leases.values().collect();
    leases.sort_by(|a, b| rank(a.state).cmp(&rank(b.state)).then(a.lease.key.cmp(&b.lease.key)));
    let watched = now.saturating_duration_since(w.started);
    let mut rows: Vec<Row> = w
        .corrupt_leases
        .iter()
        .map(|c| {
            Row::new(vec![c.key.clone(), "-".into(), format!("corrupt: {}", c.reason)])
                .style(state_style("corrupt"))
        })
        .collect();
    rows.extend(leases.iter().map(|s| {
        let state = s.state.label();
        let age = match (s.state, s.checkpoint_since) {
            (LeaseState::Finished, _) => "-".to_owned(),
            (_, Some(t)) => short(now.saturating_duration_since(t)),
            (_, None) => format!(">{}", short(watched)),
        };
        let state_text = match s.lease.live_claim() {
            Some(c) if s.state == LeaseState::Claimed => format!("claimed by {}", c.by),
            _ => state.to_owned(),
        };
        Row::new(vec![
            s.lease.key.to_string(),
            opt(s.lease.owner.as_ref()),
            state_text,
            s.lease.epoch.get().to_string(),
            tail(&s.lease.checkpoint.to_string(), 12),
            age,
        ])
        .style(state_style(state))
    }));
    // Borders and the header take three rows; say how many did not fit.
    let fits = usize::from(area.height.saturating_sub(3));
    let total = rows.len();
    if total > fits && fits > 0 {
        rows.truncate(fits - 1);
        rows.push(Row::new(vec![format!("... {} more", total - (fits - 1))]));
    }
    let table = Table::new(
        rows,
        [
            Constraint::Min(20),
            Constraint::Min(17),
            Constraint::Length(17),
            Constraint::Length(13),
            Constraint::Length(12),
            Constraint::Length(8),
        ],
    )
    .header(
        Row::new(["lease", "owner", "state", "epoch", "checkpoint", "ckpt age"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(format!(
        " leases ({}, listed {} ago) ",
        w.leases.len() + w.corrupt_leases.len(),
        w.listed_at.map_or_else(|| "never".to_owned(), |t| short(now.saturating_duration_since(t)))
    )));
    f.render_widget(table, area);
}

fn draw_events(f: &mut Frame, area: Rect, w: &Watch) {
    let fits = usize::from(area.height.saturating_sub(2));
    let lines: Vec<Line> = if w.events.is_empty() {
        vec![Line::from("no change seen yet")]
    } else {
        w.events
            .iter()
            .take(fits)
            .map(|e| {
                let (text, style) = match &e.change {
                    Change::Joined(id) => {
                        (format!("worker {id} joined"), Style::new().fg(Color::Green))
                    }
                    Change::Left(id) => {
                        (format!("worker {id} left (record removed)"), Style::new())
                    }
                    Change::Died(id) => (
                        format!("worker {id} dead: no beat for {}", short(w.failover())),
                        Style::new().fg(Color::Red),
                    ),
                    Change::Revived(id) => (format!("worker {id} beats again"), Style::new()),
                    Change::Moved { key, from, to } => (
                        format!("{key}  {} -> {}", opt(from.as_ref()), opt(to.as_ref())),
                        Style::new(),
                    ),
                    Change::Added(key) => (format!("{key} added"), Style::new()),
                    Change::Removed(key) => (format!("{key} removed"), Style::new()),
                };
                Line::from(vec![
                    Span::raw(format!("{}  ", time_of_day(e.at))),
                    Span::styled(text, style),
                ])
            })
            .collect()
    };
    f.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" recent changes (newest first) ")),
        area,
    );
}

/// The buffer as plain text, one line per row, trailing spaces trimmed.
pub fn buffer_text(buf: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..buf.area.height {
        let mut line = String::new();
        for x in 0..buf.area.width {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
