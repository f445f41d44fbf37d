//! Log capture for tests that assert what a worker said (a WARN that must appear, or must not):
//! [`capture`] installs a subscriber for the current thread and returns what it collected;
//! [`capture_all`] takes every level and the `log` crate's records too (secrets checks).

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything logged at INFO and above since [`capture`], as text.
#[derive(Clone, Debug, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The captured text so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures the current thread's logs (INFO and above, no colours) until the guard is dropped.
/// Tests on a current-thread runtime see every task's logs.
pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(sub))
}

/// Captures everything the current thread logs, at every level down to TRACE (a library's
/// connection and handshake details included), until the guard is dropped; records of the `log`
/// crate (rustls logs through it) are captured too. For tests that check a secret shows in no
/// log line: run the code under test on a current-thread runtime so every task logs here.
pub fn capture_all() -> (Logs, tracing::subscriber::DefaultGuard) {
    // Forwards `log` records to `tracing`; the first call installs it for the process, later
    // calls (another test) find it there.
    let _ = tracing_log::LogTracer::init();
    let logs = Logs::default();
    let writer = logs.clone();
    let sub = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(sub))
}
