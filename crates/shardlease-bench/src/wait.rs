//! Waiting on conditions: poll with a deadline, never sleep and hope.
//!
//! A scenario's figures are the instants at which polled conditions were first seen true, so the
//! poll period bounds their resolution; it is derived from the heartbeat (see [`poll_period`]).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// The answer of one poll.
#[derive(Debug)]
pub enum Check<T> {
    /// The condition holds; here is what was observed.
    Done(T),
    /// Not yet; a short description of what was seen, reported if the deadline passes.
    NotYet(String),
}

/// How often to poll: a tenth of the heartbeat, between 2 ms and 50 ms, but no more often than
/// every `leases / 200` ms (at most 50 ms), so that listing and tallying a large lease table does
/// not take a noticeable share of the CPU the workers under test run on.
pub fn poll_period(heartbeat: Duration, leases: usize) -> Duration {
    let by_heartbeat = (heartbeat / 10).clamp(Duration::from_millis(2), Duration::from_millis(50));
    let by_size = Duration::from_micros(5 * leases as u64).min(Duration::from_millis(50));
    by_heartbeat.max(by_size)
}

/// Polls `check` every `every` until it answers [`Check::Done`]; returns the observation and the
/// instant it completed. A failed poll (a store error) counts as "not yet". Fails with
/// [`BenchError::Timeout`] once `timeout` has passed.
pub async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Result<(T, Instant), BenchError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>, BenchError>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(Check::Done(v)) => return Ok((v, Instant::now())),
            Ok(Check::NotYet(seen)) => seen,
            Err(e) => format!("error: {e}"),
        };
        if start.elapsed() >= timeout {
            return Err(BenchError::Timeout {
                what: what.to_owned(),
                after: start.elapsed(),
                last,
            });
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_period_follows_the_heartbeat_and_the_table_size() {
        let ms = Duration::from_millis;
        assert_eq!(poll_period(ms(100), 64), ms(10));
        assert_eq!(poll_period(ms(5), 64), ms(2));
        assert_eq!(poll_period(ms(100), 10_000), ms(50));
        assert_eq!(poll_period(ms(10_000), 1), ms(50));
    }

    #[tokio::test]
    async fn reports_the_last_observation_on_timeout() {
        let r: Result<((), Instant), _> =
            until("nothing", Duration::from_millis(20), Duration::from_millis(5), || async {
                Ok(Check::NotYet("still 3".into()))
            })
            .await;
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("waiting for nothing") && e.contains("still 3"), "{e}");
        let mut n = 0;
        let (v, _) = until("three polls", Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            let done = n >= 3;
            async move { Ok(if done { Check::Done(n) } else { Check::NotYet(String::new()) }) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }
}
