//! The one wall clock the engine reads.
//!
//! Epochs of new leases, pinned `AT_TIMESTAMP` starts, the in-memory stream's arrival times and the
//! informational `updated_at` of worker records all need milliseconds since the Unix epoch. They
//! read them here: the system clock read once per process, advanced by tokio's monotonic clock.
//! In production that is the system clock (without its steps backwards when NTP corrects it,
//! which only helps epochs grow). Under tokio's paused time (the simulation, tests) it advances
//! with the simulated time rather than the real one, so a seed replays the same way however fast
//! the machine runs it: epochs and timestamps differ between runs only by a constant offset,
//! never in their order or spacing.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The system clock at the first reading, and tokio's clock at that moment.
static ANCHOR: OnceLock<(Duration, Instant)> = OnceLock::new();

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn now_millis() -> u64 {
    let (wall, at) = *ANCHOR.get_or_init(|| {
        (SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default(), Instant::now())
    });
    // A paused clock of a later runtime can read earlier than the anchor: never go below it.
    let elapsed = Instant::now().saturating_duration_since(at);
    u64::try_from(wall.saturating_add(elapsed).as_millis()).unwrap_or(u64::MAX)
}

/// [`now_millis`] as the signed milliseconds of `AT_TIMESTAMP` positions.
pub fn now_millis_i64() -> i64 {
    i64::try_from(now_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_time_and_never_goes_back() {
        let a = now_millis();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let b = now_millis();
        assert!(b >= a + 10_000, "{a} then {b}");
        assert!(now_millis() >= b);
    }
}
