//! `watch`: a live terminal view of one namespace (ratatui on crossterm), refreshed every
//! interval, reading the store only (see [`model`] for what a refresh reads). It quits on `q`,
//! Esc or Ctrl-C and puts the terminal back as it found it, on error and on panic too (the
//! guard's `Drop`). `--once` draws the same frame into an in-memory buffer after watching for a
//! while and prints it as text: no terminal needed, so it can be captured or piped.

pub mod model;
pub mod view;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::CliError;
use crate::output::emit_raw;
use crate::store_url::Target;
use model::Watch;
use view::Meta;

/// How `watch` runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Time between refreshes.
    pub interval: Duration,
    /// After how long without a moved beat a worker counts as dead.
    pub failover: Duration,
    /// List the leases at least this often (checkpoint ages); `None`: only on a change.
    pub list_every: Option<Duration>,
    /// Print one frame as text after watching for this long, instead of the live view.
    pub once: Option<Duration>,
    /// Width of a `--once` frame.
    pub width: u16,
    /// Height of a `--once` frame (`None`: tall enough for everything, up to 200 rows).
    pub height: Option<u16>,
}

fn terminal_error(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(format!("terminal: {e}"))
}

/// Runs `watch`.
pub async fn run(target: &Target, opts: Options) -> Result<ExitCode, CliError> {
    let meta = Meta {
        url: target.redacted_url.clone(),
        namespace: target.namespace.clone(),
        interval: opts.interval,
        interactive: opts.once.is_none(),
    };
    let mut watch = Watch::new(opts.failover, opts.list_every);
    if let Some(window) = opts.once {
        let text = once(target, &mut watch, &meta, &opts, window).await?;
        emit_raw(&text);
        return Ok(ExitCode::SUCCESS);
    }
    if !std::io::stdout().is_terminal() {
        return Err(CliError::Usage(
            "watch draws on a terminal; use --once to print one frame as text".into(),
        ));
    }
    live(target, &mut watch, &meta, &opts).await
}

/// Refreshes for `window` (at least once), then renders one frame as text.
pub async fn once(
    target: &Target,
    watch: &mut Watch,
    meta: &Meta,
    opts: &Options,
    window: Duration,
) -> Result<String, CliError> {
    let deadline = Instant::now() + window;
    loop {
        watch.refresh(&*target.store).await.map_err(CliError::Store)?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(opts.interval)).await;
    }
    let height = opts.height.unwrap_or_else(|| view::height_for(watch, 10).min(200));
    render_text(watch, meta, opts.width, height)
}

/// One frame of `watch` as plain text, `width` by `height`.
pub fn render_text(
    watch: &Watch,
    meta: &Meta,
    width: u16,
    height: u16,
) -> Result<String, CliError> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).map_err(terminal_error)?;
    terminal.draw(|f| view::draw(f, watch, meta)).map_err(terminal_error)?;
    Ok(view::buffer_text(terminal.backend().buffer()))
}

/// Whether a key quits: `q`, Esc, or Ctrl-C (in raw mode Ctrl-C is a key, not a signal).
pub fn quits(event: &Event) -> bool {
    match event {
        Event::Key(KeyEvent { code, modifiers, kind: KeyEventKind::Press, .. }) => {
            matches!(code, KeyCode::Char('q') | KeyCode::Esc)
                || (*code == KeyCode::Char('c') && modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    }
}

/// Raw mode and the alternate screen while it lives; both undone when it is dropped, however the
/// view ends.
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> Result<TerminalGuard, CliError> {
        crossterm::terminal::enable_raw_mode().map_err(terminal_error)?;
        let guard = TerminalGuard;
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )
        .map_err(terminal_error)?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::LeaveAlternateScreen,
            crossterm::cursor::Show
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// Reads keys on a blocking thread and says when one quits (or reading fails).
fn key_reader() -> (mpsc::Receiver<()>, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (tx, rx) = mpsc::channel(1);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        while !stopped.load(Ordering::Relaxed) {
            match crossterm::event::poll(Duration::from_millis(100)) {
                Ok(false) => {}
                Ok(true) => match crossterm::event::read() {
                    Ok(e) if quits(&e) => break,
                    Ok(_) => {}
                    Err(_) => break,
                },
                Err(_) => break,
            }
        }
        let _ = tx.blocking_send(());
    });
    (rx, stop)
}

async fn live(
    target: &Target,
    watch: &mut Watch,
    meta: &Meta,
    opts: &Options,
) -> Result<ExitCode, CliError> {
    let guard = TerminalGuard::enter()?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut terminal = Terminal::new(backend).map_err(terminal_error)?;
    terminal.clear().map_err(terminal_error)?;
    let (mut quit, stop) = key_reader();
    let result = async {
        loop {
            tokio::select! {
                // A failed refresh is shown in the health line; the view keeps what it saw.
                _ = watch.refresh(&*target.store) => {}
                _ = quit.recv() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
            terminal.draw(|f| view::draw(f, watch, meta)).map_err(terminal_error)?;
            tokio::select! {
                _ = tokio::time::sleep(opts.interval) => {}
                _ = quit.recv() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(terminal);
    drop(guard);
    result.map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests;
