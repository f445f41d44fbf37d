//! [`DynamoDbStore`]: the [`LeaseStore`] contract as DynamoDB conditional writes.
//!
//! Every write that must be atomic per record is one request with a `ConditionExpression`:
//! create is `PutItem` if `attribute_not_exists(pk)`, update is `PutItem` (the whole item) if
//! `version = :expected`, delete is `DeleteItem` if `version = :expected`, and removing a dead
//! worker is `DeleteItem` if `beat = :beat`. Each asks for
//! `ReturnValuesOnConditionCheckFailure = ALL_OLD`, so a failed condition hands back the current
//! item and a `Conflict` carries it without a second read. Reads are strongly consistent
//! (`GetItem`, `BatchGetItem` for named worker records, and `Query` pages followed through
//! `LastEvaluatedKey`). The fleet signal is one item of its own partition (see `store/fleet.rs`).
//!
//! The SDK retries throttled and failed attempts. A retried write whose first attempt did land
//! then fails its condition against the item it wrote itself; the store recognises its own write
//! by the version it drew (random 63 bits, so no one else wrote that version) and reports success.

pub(crate) mod batch;
mod fleet;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use shardlease_core::store::{
    CorruptRecord, CreateOutcome, FleetSignal, Lease, LeaseStore, LeaseUpdate, Listing, Version,
    VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Result, WorkerId};
use tracing::debug;

use crate::codec::{self, Item};
use crate::config::DynamoDbStoreBuilder;
use crate::errors::backend;
use crate::layout::{Layout, PK, SK};
use shardlease_core::store::Redactor;

/// A [`LeaseStore`] on one DynamoDB table, for one namespace.
///
/// Cheap to clone: clones share one SDK client. Open one with [`DynamoDbStore::builder`] (the
/// AWS default chains plus what you set, or a client of your own).
#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    inner: Arc<Inner>,
}

struct Inner {
    table: String,
    namespace: Namespace,
    layout: Layout,
    /// `table T in REGION [at ENDPOINT]`, for messages.
    target: String,
    page_size: Option<u32>,
    /// Batches as `TransactWriteItems` (else single writes; see `batch`).
    transact_batches: bool,
    redactor: Redactor,
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("target", &self.inner.target)
            .field("namespace", &self.inner.namespace)
            .field("page_size", &self.inner.page_size)
            .finish_non_exhaustive()
    }
}

/// What a conditional write's failed condition left us.
enum Failed {
    /// The condition failed; this is the item as it is now (`None`: there is none).
    Condition(Option<Item>),
    /// Any other failure, already mapped.
    Other(Error),
}

impl DynamoDbStore {
    /// A builder: the one way to open a store (a table or a `dynamodb://` URL, the AWS default
    /// chains or a client of your own, and options).
    pub fn builder() -> DynamoDbStoreBuilder {
        DynamoDbStoreBuilder::default()
    }

    /// The store over `client`, every setting checked by the builder.
    pub(crate) fn assemble(
        client: Client,
        table: &str,
        namespace: Namespace,
        target: String,
        page_size: Option<u32>,
        transact_batches: bool,
        redactor: Redactor,
    ) -> DynamoDbStore {
        DynamoDbStore {
            client,
            inner: Arc::new(Inner {
                table: table.to_owned(),
                layout: Layout::new(namespace.as_str()),
                namespace,
                target,
                page_size,
                transact_batches,
                redactor,
            }),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The SDK client (to run other requests with the same configuration).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The partition key holding this namespace's leases (for operators and tests).
    pub fn lease_partition_key(&self) -> &str {
        self.inner.layout.leases()
    }

    /// The partition key holding this namespace's worker records (for operators and tests).
    pub fn worker_partition_key(&self) -> &str {
        self.inner.layout.workers()
    }

    /// The partition key holding this namespace's fleet signal, one item with sort key
    /// `signal` (for operators and tests).
    pub fn fleet_partition_key(&self) -> &str {
        self.inner.layout.fleet()
    }

    pub(crate) fn target(&self) -> &str {
        &self.inner.target
    }

    pub(crate) fn redactor(&self) -> &Redactor {
        &self.inner.redactor
    }

    /// Deletes every item of this namespace (leases, worker records and the fleet signal), in
    /// batches of 25. Returns how many went. For tests and for operators retiring an
    /// application; running workers would recreate their records.
    pub async fn delete_namespace(&self) -> Result<u64> {
        let mut removed = 0;
        let layout = &self.inner.layout;
        for pk in [layout.leases(), layout.workers(), layout.fleet()] {
            let items = self.query_all(pk, "the namespace's items").await?;
            for chunk in items.chunks(25) {
                let mut requests = Vec::with_capacity(chunk.len());
                for item in chunk {
                    let key = key_of(item);
                    let delete = aws_sdk_dynamodb::types::DeleteRequest::builder()
                        .set_key(Some(key))
                        .build()
                        .map_err(|e| crate::errors::unexpected("building a batch delete", e))?;
                    requests.push(
                        aws_sdk_dynamodb::types::WriteRequest::builder()
                            .delete_request(delete)
                            .build(),
                    );
                }
                let mut pending = HashMap::from([(self.table().to_owned(), requests)]);
                while !pending.values().all(Vec::is_empty) {
                    let out = self
                        .client
                        .batch_write_item()
                        .set_request_items(Some(pending))
                        .send()
                        .await
                        .map_err(|e| self.err("deleting the namespace's items", e))?;
                    pending = out.unprocessed_items.unwrap_or_default();
                }
                removed += chunk.len() as u64;
            }
        }
        Ok(removed)
    }

    fn err<E, R>(&self, what: &str, e: aws_sdk_dynamodb::error::SdkError<E, R>) -> Error
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata
            + std::error::Error
            + Send
            + Sync
            + 'static,
        R: crate::errors::HttpStatus + fmt::Debug + Send + Sync + 'static,
    {
        backend(&self.inner.redactor, &format!("{what} ({})", self.inner.table), e)
    }

    fn lease_key(&self, key: &LeaseKey) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (PK.to_owned(), AttributeValue::S(self.inner.layout.leases().to_owned())),
            (SK.to_owned(), AttributeValue::S(key.as_str().to_owned())),
        ])
    }

    fn worker_key(&self, id: &WorkerId) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (PK.to_owned(), AttributeValue::S(self.inner.layout.workers().to_owned())),
            (SK.to_owned(), AttributeValue::S(id.as_str().to_owned())),
        ])
    }

    /// Every item under partition key `pk`: consistent `Query` pages of at most `page_size`
    /// items (DynamoDB's 1 MB otherwise), followed through `LastEvaluatedKey` until there is none.
    async fn query_all(&self, pk: &str, what: &str) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        let mut pages = 0u32;
        loop {
            let mut request = self
                .client
                .query()
                .table_name(self.table())
                .consistent_read(true)
                .key_condition_expression("#pk = :pk")
                .expression_attribute_names("#pk", PK)
                .expression_attribute_values(":pk", AttributeValue::S(pk.to_owned()))
                .set_exclusive_start_key(start.take());
            if let Some(limit) = self.inner.page_size {
                request = request.limit(i32::try_from(limit).unwrap_or(i32::MAX));
            }
            let out = request.send().await.map_err(|e| self.err(&format!("listing {what}"), e))?;
            pages += 1;
            items.extend(out.items.unwrap_or_default());
            match out.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        debug!(namespace = %self.inner.namespace, what, pages, items = items.len(), "listed");
        Ok(items)
    }

    /// Sends a conditional `PutItem` of `item`; the current item when the condition fails.
    async fn put_if(
        &self,
        what: &str,
        item: Item,
        condition: &str,
        values: Vec<(&str, AttributeValue)>,
    ) -> std::result::Result<(), Failed> {
        let mut request = self
            .client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if condition.contains("#pk") {
            request = request.expression_attribute_names("#pk", PK);
        }
        if condition.contains("#v") {
            request = request.expression_attribute_names("#v", codec::VERSION);
        }
        if condition.contains("#b") {
            request = request.expression_attribute_names("#b", codec::BEAT);
        }
        for (name, value) in values {
            request = request.expression_attribute_values(name, value);
        }
        match request.send().await {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(c)) => {
                    Err(Failed::Condition(c.item().cloned()))
                }
                _ => Err(Failed::Other(self.err(what, e))),
            },
        }
    }

    /// Sends a conditional `DeleteItem`; the current item when the condition fails.
    async fn delete_if(
        &self,
        what: &str,
        key: HashMap<String, AttributeValue>,
        attribute: &str,
        value: AttributeValue,
    ) -> std::result::Result<(), Failed> {
        let request = self
            .client
            .delete_item()
            .table_name(self.table())
            .set_key(Some(key))
            .condition_expression("#a = :a")
            .expression_attribute_names("#a", attribute)
            .expression_attribute_values(":a", value)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        match request.send().await {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(c)) => {
                    Err(Failed::Condition(c.item().cloned()))
                }
                _ => Err(Failed::Other(self.err(what, e))),
            },
        }
    }

    /// The error for a failed condition on lease `key`: `Conflict` with the current record, or
    /// `Corrupt` when it does not decode.
    fn conflict(key: &LeaseKey, current: Option<Item>) -> Error {
        match current.map(|item| codec::decode_lease(&item)) {
            None => Error::Conflict { key: key.clone(), current: None },
            Some(Ok(current)) => {
                Error::Conflict { key: key.clone(), current: Some(Box::new(current)) }
            }
            Some(Err(reason)) => corrupt(key, reason),
        }
    }
}

/// The worker records of `items` (worker items), and the ones that do not decode, named by
/// their sort key: how `list_workers` and `get_workers` report what they read.
fn worker_listing(items: Vec<Item>) -> Listing<WorkerRecord> {
    let mut listing = Listing::default();
    for item in items {
        match codec::decode_worker(&item) {
            Ok(w) => listing.items.push(w),
            Err(reason) => {
                listing.corrupt.push(CorruptRecord { key: codec::item_key(&item), reason })
            }
        }
    }
    listing
}

fn corrupt(key: &LeaseKey, reason: String) -> Error {
    Error::Corrupt { key: key.as_str().to_owned(), reason }
}

/// The primary key of an item.
fn key_of(item: &Item) -> HashMap<String, AttributeValue> {
    item.iter()
        .filter(|(k, _)| k.as_str() == PK || k.as_str() == SK)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether `item` holds version `v` (the store's own write, when `v` was drawn for it).
fn has_version(item: Option<&Item>, v: Version) -> bool {
    matches!(item.and_then(|i| i.get(codec::VERSION)), Some(AttributeValue::N(n)) if *n == v.0.to_string())
}

#[async_trait]
impl LeaseStore for DynamoDbStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let version = Version::random();
        let item = codec::lease_item(self.inner.layout.leases(), lease, version)
            .map_err(Error::InvalidInput)?;
        let what = format!("creating lease {}", lease.key);
        match self.put_if(&what, item, "attribute_not_exists(#pk)", Vec::new()).await {
            Ok(()) => Ok(CreateOutcome::Created(version)),
            Err(Failed::Condition(current)) if has_version(current.as_ref(), version) => {
                Ok(CreateOutcome::Created(version)) // a retry of our own create that landed
            }
            Err(Failed::Condition(_)) => Ok(CreateOutcome::AlreadyExists),
            Err(Failed::Other(e)) => Err(e),
        }
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        let out = self
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(self.lease_key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err(&format!("reading lease {key}"), e))?;
        match out.item {
            None => Ok(None),
            Some(item) => codec::decode_lease(&item).map(Some).map_err(|r| corrupt(key, r)),
        }
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let items = self.query_all(self.inner.layout.leases(), "leases").await?;
        let mut listing = Listing::default();
        for item in items {
            match codec::decode_lease(&item) {
                Ok(lease) => listing.items.push(lease),
                Err(reason) => {
                    listing.corrupt.push(CorruptRecord { key: codec::item_key(&item), reason })
                }
            }
        }
        Ok(listing)
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let version = Version::random_other_than(expected);
        let item = codec::lease_item(self.inner.layout.leases(), lease, version)
            .map_err(Error::InvalidInput)?;
        let what = format!("updating lease {}", lease.key);
        let values = vec![(":v", codec::n(expected.0))];
        match self.put_if(&what, item, "#v = :v", values).await {
            Ok(()) => Ok(version),
            Err(Failed::Condition(current)) if has_version(current.as_ref(), version) => {
                Ok(version) // a retry of our own update that landed
            }
            Err(Failed::Condition(current)) => Err(DynamoDbStore::conflict(&lease.key, current)),
            Err(Failed::Other(e)) => Err(e),
        }
    }

    /// Single conditional puts, [`PARALLEL_BATCH_WRITES`](crate::PARALLEL_BATCH_WRITES) at a
    /// time; or, with `transact_batches(true)`, `TransactWriteItems` of up to 100 conditional
    /// puts, the items whose condition held tried again when another's failed (see
    /// `store/batch.rs`).
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        self.update_batch(updates).await
    }

    /// Single conditional puts one after another; or, with `transact_batches(true)`,
    /// `TransactWriteItems` of up to 100 conditional puts, the chunks in order (see
    /// `store/batch.rs`).
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        self.create_batch(leases).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        let what = format!("deleting lease {key}");
        let value = codec::n(expected.0);
        match self.delete_if(&what, self.lease_key(key), codec::VERSION, value).await {
            Ok(()) => Ok(()),
            Err(Failed::Condition(current)) => Err(DynamoDbStore::conflict(key, current)),
            Err(Failed::Other(e)) => Err(e),
        }
    }

    /// A conditional `PutItem`: it replaces the item unless that holds a beat of the same process
    /// at least as high (see [`LeaseStore::heartbeat`]), that is a number between the new beat
    /// and the last beat of its process (`WorkerRecord::last_beat_of_process`). A missing item, or
    /// one whose beat is missing or not a number, is replaced.
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let item = codec::worker_item(self.inner.layout.workers(), record);
        let what = format!("heartbeat of worker {}", record.id);
        let condition = "attribute_not_exists(#b) OR NOT attribute_type(#b, :number) \
                         OR #b < :beat OR #b > :last";
        let values = vec![
            (":number", AttributeValue::S("N".to_owned())),
            (":beat", codec::n(record.beat)),
            (":last", codec::n(WorkerRecord::last_beat_of_process(record.beat))),
        ];
        match self.put_if(&what, item, condition, values).await {
            Ok(()) | Err(Failed::Condition(_)) => Ok(()),
            Err(Failed::Other(e)) => Err(e),
        }
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        let items = self.query_all(self.inner.layout.workers(), "workers").await?;
        Ok(worker_listing(items))
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.client
            .delete_item()
            .table_name(self.table())
            .set_key(Some(self.worker_key(id)))
            .send()
            .await
            .map_err(|e| self.err(&format!("removing worker {id}"), e))?;
        Ok(())
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let what = format!("removing worker {id} at beat {beat}");
        match self.delete_if(&what, self.worker_key(id), codec::BEAT, codec::n(beat)).await {
            Ok(()) => Ok(true),
            Err(Failed::Condition(_)) => Ok(false),
            Err(Failed::Other(e)) => Err(e),
        }
    }

    fn namespace(&self) -> Option<Namespace> {
        Some(self.inner.namespace.clone())
    }

    /// A plain `PutItem` of the namespace's one signal item (partition `<namespace>/fleet`).
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.put_fleet_signal(token).await
    }

    /// A consistent `GetItem` of the signal item (one read unit).
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        self.get_fleet_signal().await
    }

    /// Consistent `BatchGetItem`s of the distinct ids, 100 keys each, unprocessed keys asked for
    /// again until every one was read (see `store/fleet.rs`).
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        self.batch_get_workers(ids).await
    }
}
