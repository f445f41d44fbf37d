//! The stream consumer of an enhanced fan-out application: registered by the first worker that
//! builds a source (the others find it), waited for until `ACTIVE`, and deregistered only when
//! asked to ([`KinesisSource::deregister_consumer`](crate::KinesisSource::deregister_consumer),
//! `shardlease efo deregister`), never because a worker stops: the other workers, and the
//! next deployment, still subscribe with it.

use shardlease_core::{Error, Result};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::api::{ApiError, ConsumerState, FanOutApi};
use crate::config::ReadConfig;
use crate::fanout::FanOutConfig;

/// Registers the consumer or finds it, and waits until it is `ACTIVE`; returns its ARN.
///
/// Several workers starting at once race to register: the losers get `ResourceInUseException`
/// and find the winner's consumer. A consumer being deleted (a deregistration in progress) is
/// waited out and registered again. Throttling and retryable failures are retried with backoff
/// until [`FanOutConfig::consumer_wait`] runs out.
pub(crate) async fn register_or_find(
    api: &dyn FanOutApi,
    fan: &FanOutConfig,
    read: &ReadConfig,
) -> Result<String> {
    let deadline = Instant::now() + fan.consumer_wait;
    let name = fan.consumer_name.as_str();
    let mut attempt = 0u32;
    let mut stream_arn = None;
    loop {
        let step = async {
            let arn = match &stream_arn {
                Some(a) => a,
                None => stream_arn.insert(api.stream_arn().await?),
            };
            let found = match api.describe_consumer(arn, name).await? {
                Some(c) => c,
                None => match api.register_consumer(arn, name).await {
                    Ok(c) => {
                        info!(consumer = name, "registered the stream consumer");
                        c
                    }
                    // Registered by another worker a moment ago: look again next round.
                    Err(ApiError::InUse(_)) => return Ok(None),
                    Err(e) => return Err(e),
                },
            };
            Ok::<_, ApiError>(Some(found))
        };
        let wait = match step.await {
            Ok(Some(c)) if c.state == ConsumerState::Active => return Ok(c.arn),
            Ok(Some(c)) => {
                debug!(consumer = name, state = ?c.state, "waiting for the stream consumer");
                attempt = 0;
                fan.consumer_poll_interval
            }
            Ok(None) => fan.consumer_poll_interval,
            Err(ApiError::Other(e)) if !e.is_retryable() => return Err(e),
            Err(e) => {
                attempt = attempt.saturating_add(1);
                debug!(consumer = name, error = %e.into_error(), "consumer lookup failed; retrying");
                read.backoff(attempt)
            }
        };
        if Instant::now() + wait > deadline {
            return Err(Error::retryable(format!(
                "the stream consumer {name} did not become ACTIVE within {:?}",
                fan.consumer_wait
            )));
        }
        tokio::time::sleep(wait).await;
    }
}

/// Deregisters the consumer; `Ok(false)` when none of that name was registered.
pub(crate) async fn deregister(api: &dyn FanOutApi, name: &str) -> Result<bool> {
    let stream_arn = api.stream_arn().await.map_err(ApiError::into_error)?;
    let removed = api.deregister_consumer(&stream_arn, name).await.map_err(ApiError::into_error)?;
    if removed {
        info!(consumer = name, "deregistered the stream consumer");
    }
    Ok(removed)
}
