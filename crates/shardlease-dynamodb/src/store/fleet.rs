//! The reads that keep a large fleet's heartbeats flat (`LeaseStore::write_fleet_signal`,
//! `read_fleet_signal` and `get_workers`).
//!
//! The fleet signal is one item of its own partition (`<namespace>/fleet`, sort key `signal`,
//! see [`layout`](crate::layout)): a plain `PutItem` writes it, a consistent `GetItem` reads it
//! (one read unit), and neither listing ever sees it. `get_workers` is `BatchGetItem` of the
//! named worker keys, [`MAX_BATCH_GET_KEYS`] per request, consistent reads; keys DynamoDB hands
//! back unprocessed (throttling, or a reply over 16 MB) are asked for again after a pause that
//! follows the client's retry settings (the SDK's standard backoff: the configured initial
//! backoff doubling up to its ceiling, full jitter), until every key has been read.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use aws_sdk_dynamodb::config::AsyncSleep;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use shardlease_core::store::{FleetSignal, Listing, Version, WorkerRecord};
use shardlease_core::{Error, Result, WorkerId};
use tracing::debug;

use super::{worker_listing, DynamoDbStore};
use crate::codec::{self, Item};
use crate::errors::unexpected;
use crate::layout::{FLEET_SIGNAL, PK, SK};

/// Keys per `BatchGetItem` at most: DynamoDB's limit.
pub(crate) const MAX_BATCH_GET_KEYS: usize = 100;

/// Rounds in a row that read nothing at all (every key sent came back unprocessed) before
/// `get_workers` gives up with a retryable error, when the client has no retry settings.
const STALLED_ROUNDS: u32 = 4;

impl DynamoDbStore {
    /// The key of the fleet signal's item.
    fn fleet_signal_key(&self) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (PK.to_owned(), AttributeValue::S(self.inner.layout.fleet().to_owned())),
            (SK.to_owned(), AttributeValue::S(FLEET_SIGNAL.to_owned())),
        ])
    }

    /// `LeaseStore::write_fleet_signal`: a plain `PutItem`.
    pub(super) async fn put_fleet_signal(&self, token: Version) -> Result<()> {
        let item = codec::fleet_signal_item(self.inner.layout.fleet(), FLEET_SIGNAL, token);
        self.client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| self.err("writing the fleet signal", e))?;
        Ok(())
    }

    /// `LeaseStore::read_fleet_signal`: a consistent `GetItem`.
    pub(super) async fn get_fleet_signal(&self) -> Result<FleetSignal> {
        let out = self
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(self.fleet_signal_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err("reading the fleet signal", e))?;
        match out.item {
            None => Ok(FleetSignal::Missing),
            Some(item) => {
                codec::decode_fleet_signal(&item).map(FleetSignal::Token).map_err(|reason| {
                    Error::Corrupt {
                        key: format!("{}/{FLEET_SIGNAL}", self.inner.layout.fleet()),
                        reason,
                    }
                })
            }
        }
    }

    /// `LeaseStore::get_workers`: `BatchGetItem` of the distinct ids, decoded as `list_workers`
    /// decodes its items.
    pub(super) async fn batch_get_workers(
        &self,
        ids: &[WorkerId],
    ) -> Result<Listing<WorkerRecord>> {
        let mut seen = HashSet::with_capacity(ids.len());
        let distinct: Vec<&WorkerId> = ids.iter().filter(|id| seen.insert(*id)).collect();
        let mut items = Vec::with_capacity(distinct.len());
        for chunk in distinct.chunks(MAX_BATCH_GET_KEYS) {
            let keys = chunk.iter().map(|id| self.worker_key(id)).collect();
            items.extend(self.batch_get(keys).await?);
        }
        debug!(
            namespace = %self.inner.namespace,
            asked = distinct.len(),
            found = items.len(),
            "read named workers"
        );
        Ok(worker_listing(items))
    }

    /// Reads the items of `keys` (at most [`MAX_BATCH_GET_KEYS`]) with consistent
    /// `BatchGetItem`s, asking again for the unprocessed keys until none is left.
    async fn batch_get(&self, keys: Vec<HashMap<String, AttributeValue>>) -> Result<Vec<Item>> {
        let mut items = Vec::with_capacity(keys.len());
        let mut pending = keys;
        let retry = self.client.config().retry_config();
        let stall_limit = retry.map_or(STALLED_ROUNDS, |r| r.max_attempts().max(1));
        let mut stalled = 0u32;
        let mut round = 0u32;
        while !pending.is_empty() {
            if round > 0 {
                self.pause(round).await;
            }
            round += 1;
            let asked = pending.len();
            let request = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut pending)))
                .consistent_read(true)
                .build()
                .map_err(|e| unexpected("building a batch read of worker records", e))?;
            let out = self
                .client
                .batch_get_item()
                .request_items(self.table(), request)
                .send()
                .await
                .map_err(|e| self.err("reading worker records", e))?;
            let got = out.responses.and_then(|mut r| r.remove(self.table())).unwrap_or_default();
            pending = out
                .unprocessed_keys
                .and_then(|mut u| u.remove(self.table()))
                .map(|k| k.keys)
                .unwrap_or_default();
            if got.is_empty() && pending.len() >= asked {
                stalled += 1;
                if stalled >= stall_limit {
                    return Err(Error::retryable(format!(
                        "dynamodb: reading worker records ({}): {} keys still unprocessed after \
                         {round} requests",
                        self.table(),
                        pending.len()
                    )));
                }
            } else {
                stalled = 0;
            }
            items.extend(got);
        }
        Ok(items)
    }

    /// Waits before asking again for unprocessed keys, the `round`-th time (1 for the first):
    /// full jitter below the client's initial backoff doubled per round, up to its ceiling.
    async fn pause(&self, round: u32) {
        let config = self.client.config();
        let Some(sleep) = config.sleep_impl() else { return };
        let (initial, ceiling) = config
            .retry_config()
            .map_or((crate::DEFAULT_INITIAL_BACKOFF, Duration::from_secs(5)), |r| {
                (r.initial_backoff(), r.max_backoff())
            });
        let cap = initial.saturating_mul(1u32 << (round - 1).min(16)).min(ceiling);
        let cap_micros = u64::try_from(cap.as_micros()).unwrap_or(u64::MAX);
        // Full jitter: uniform in 0..=cap (a random version is 63 uniform bits).
        let wait = Duration::from_micros(Version::random().0 % cap_micros.saturating_add(1));
        sleep.sleep(wait).await;
    }
}
