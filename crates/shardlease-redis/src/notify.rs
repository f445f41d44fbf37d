//! Change notification for Redis: the scripts `PUBLISH` what changed to the namespace's channel
//! (see `crate::scripts`), and a subscription reads it on a connection of its own.
//!
//! **What is announced.** Every lease creation and deletion, every update the core writes with
//! `update_lease` (an ownership change: take, claim, release, handoff, finish), and a worker
//! record appearing (a join) or being removed (a leave, or a dead worker's record collected). A
//! checkpoint (`update_lease_quietly`) and a heartbeat that updates an existing record publish
//! nothing, so notification adds no writes and no reads in a steady state.
//!
//! **What pub/sub does not promise.** A message is delivered at most once, to the subscribers
//! connected when it is published: one published while a subscriber is reconnecting is lost,
//! and Redis drops a subscriber that falls too far behind (`client-output-buffer-limit pubsub`).
//! That is safe here because a notice is only a hint: when the subscription's connection drops,
//! the stream ends, and the runtime subscribes again and lists the leases and workers once,
//! which finds every change the lost messages would have announced. A lost notice costs time
//! (the change is seen at the next heartbeat or pass, as without notification), never a lease.
//!
//! **Payloads.** `L<lease key>`, `J<worker id>` or `X<worker id>`. The channel is the
//! namespace's own (`{prefix:namespace}:changes`), so no payload names the namespace. A payload
//! that does not parse becomes `StoreChange::Unknown` (a listing of both kinds).
//!
//! **On Redis Cluster** a `PUBLISH` reaches every node, and a subscription is a RESP3 cluster
//! connection of its own (see `crate::cluster`); it ends, like a single server's, when one of
//! its connections drops.

use std::sync::Arc;

use futures::StreamExt;
use shardlease_core::store::{ChangeStream, Redactor, StoreChange};
use shardlease_core::{LeaseKey, Result, WorkerId};
use tracing::debug;

use crate::cluster::Seeds;
use crate::errors::backend;
use crate::relink::ClusterLink;

/// The change a payload announces.
pub(crate) fn parse(payload: &[u8]) -> StoreChange {
    let Ok(text) = std::str::from_utf8(payload) else { return StoreChange::Unknown };
    let mut chars = text.chars();
    let kind = chars.next();
    let name = chars.as_str().to_owned();
    match kind {
        Some('L') => StoreChange::Lease { key: LeaseKey::new(name), before: None, after: None },
        Some('J') => StoreChange::Worker { id: WorkerId::new(name), present: true },
        Some('X') => StoreChange::Worker { id: WorkerId::new(name), present: false },
        _ => StoreChange::Unknown,
    }
}

/// What opens a store's subscriptions: the single server's client, or a cluster's seeds.
pub(crate) enum Subscriber {
    /// A single server: one pub/sub connection per subscription.
    Single(redis::Client),
    /// A Redis Cluster: one RESP3 cluster connection per subscription (see `crate::cluster`).
    Cluster {
        /// The seeds and settings of the store's own connection.
        seeds: Seeds,
        /// The cluster's URL, redacted, for messages.
        target: String,
        /// The store's connection, whose reconnection ends every subscription.
        link: Arc<ClusterLink>,
    },
}

/// Subscribes to `channel` and returns the notices as a stream that ends when the connection
/// does. Redis confirms the subscription before this returns, so every message published
/// afterwards is delivered (while the connection lasts).
pub(crate) async fn subscribe(
    subscriber: &Subscriber,
    channel: &str,
    redactor: &Redactor,
) -> Result<ChangeStream> {
    match subscriber {
        Subscriber::Single(client) => subscribe_single(client, channel, redactor).await,
        Subscriber::Cluster { seeds, target, link } => {
            seeds.subscribe(channel, target, redactor, link.relinked()).await
        }
    }
}

/// A subscription on a single server's pub/sub connection.
async fn subscribe_single(
    client: &redis::Client,
    channel: &str,
    redactor: &Redactor,
) -> Result<ChangeStream> {
    let mut pubsub = client
        .get_async_pubsub()
        .await
        .map_err(|e| backend(redactor, "opening the change subscription", e))?;
    pubsub
        .subscribe(channel)
        .await
        .map_err(|e| backend(redactor, "subscribing to the change channel", e))?;
    debug!(channel, "subscribed to lease changes");
    let messages = pubsub.into_on_message();
    Ok(messages.map(|message| parse(message.get_payload_bytes())).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse() {
        assert_eq!(
            parse(b"Lshard-1"),
            StoreChange::Lease { key: LeaseKey::new("shard-1"), before: None, after: None }
        );
        assert_eq!(parse(b"Jw1"), StoreChange::Worker { id: WorkerId::new("w1"), present: true });
        assert_eq!(parse(b"Xw1"), StoreChange::Worker { id: WorkerId::new("w1"), present: false });
        for bad in [&b""[..], b"Q", b"\xff\xfe"] {
            assert_eq!(parse(bad), StoreChange::Unknown, "{bad:?}");
        }
    }
}
