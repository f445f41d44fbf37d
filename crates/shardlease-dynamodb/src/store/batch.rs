//! The batch writes of [`DynamoDbStore`] (`LeaseStore::update_leases` and `create_leases`).
//!
//! By default a batch is single conditional writes: the updates [`PARALLEL_BATCH_WRITES`] at a
//! time, the creations one after another (the contract wants them visible in order). With
//! `transact_batches(true)` a batch is `TransactWriteItems` of up to [`MAX_TRANSACT_ITEMS`]
//! conditional `Put`s, one request per chunk instead of one per lease, at twice the write
//! units; on moto, which copies the whole table for every transaction, they are slower, which
//! is why they are not the default (`docs/dynamodb.md`, "Batch writes", has the figures).
//!
//! A transaction is all-or-nothing, while the contract wants one outcome per item. When one
//! item's condition fails, DynamoDB cancels the whole transaction and says why item by item
//! (`CancellationReasons`, in the order of the items, with the current item of each failed
//! condition, since every `Put` asks for `ReturnValuesOnConditionCheckFailure = ALL_OLD`). The
//! items whose condition failed get exactly the outcome the single write reports for a failed
//! condition (`Conflict` with the current record, `Corrupt`, `AlreadyExists`), and the others go
//! into a new transaction, at most [`TRANSACT_ATTEMPTS`] times; what is still left then is
//! written one by one with the single writes. A transaction cancelled for another reason on an
//! item (throttling, a conflict with another transaction) is tried again the same way; a reason
//! that will not go away is that item's error. Versions are drawn exactly as the single writes
//! draw them, and an item already holding the version drawn for it (an SDK retry of a
//! transaction that had landed) is the store's own write, as with the single writes.
//!
//! Chunks go one after the other, so creations stay in order: a chunk's leases become visible
//! together, after every earlier chunk's.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    CancellationReason, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use shardlease_core::store::{
    check_distinct_keys, CreateOutcome, Lease, LeaseStore, LeaseUpdate, Version,
};
use shardlease_core::{Error, Result};

use super::{has_version, DynamoDbStore};
use crate::codec::{self, Item};
use crate::errors::unexpected;
use crate::layout::PK;

/// Updates of a batch in flight at once when batches are single writes (the default): enough
/// to keep DynamoDB busy without a burst that throttles one partition.
pub const PARALLEL_BATCH_WRITES: usize = 32;

/// Items per `TransactWriteItems` at most: DynamoDB's limit (100 actions, 4 MB).
pub const MAX_TRANSACT_ITEMS: usize = 100;

/// Transactions tried per chunk: each one cancelled leaves out the items whose condition failed,
/// so a retry is cancelled only when another item changed in between; after that many the items
/// left are written one by one.
pub const TRANSACT_ATTEMPTS: usize = 3;

/// What a cancelled transaction says of one of its items.
enum Reason {
    /// Nothing against this item: try it again.
    Retry,
    /// Its condition failed; the item as it is now.
    Condition(Option<Item>),
    /// A reason that concerns this item and will not go away by trying again at once.
    Failed(Error),
}

/// One conditional `Put` of a transaction.
struct Write {
    item: Item,
    version: Version,
    /// The version the stored item must hold (`None`: no item may exist).
    expected: Option<Version>,
}

impl DynamoDbStore {
    /// `LeaseStore::update_leases`.
    pub(super) async fn update_batch(
        &self,
        updates: &[LeaseUpdate],
    ) -> Result<Vec<Result<Version>>> {
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        if !self.inner.transact_batches {
            use futures::StreamExt;
            // Futures do nothing until polled: `buffered` starts them a few at a time.
            let writes: Vec<_> =
                updates.iter().map(|u| self.update_lease(&u.lease, u.expected)).collect();
            let stream = futures::stream::iter(writes).buffered(PARALLEL_BATCH_WRITES);
            return Ok(stream.collect().await);
        }
        let mut outcomes = Vec::with_capacity(updates.len());
        for chunk in updates.chunks(MAX_TRANSACT_ITEMS) {
            let mut writes = Vec::with_capacity(chunk.len());
            for u in chunk {
                let version = Version::random_other_than(u.expected);
                let item = codec::lease_item(self.inner.layout.leases(), &u.lease, version)
                    .map_err(Error::InvalidInput)?;
                writes.push(Write { item, version, expected: Some(u.expected) });
            }
            let results = self.transact(&writes, "updating leases").await?;
            for ((u, w), result) in chunk.iter().zip(&writes).zip(results) {
                outcomes.push(match result {
                    Some(Ok(())) => Ok(w.version),
                    Some(Err(Reason::Condition(current))) => {
                        Err(DynamoDbStore::conflict(&u.lease.key, current))
                    }
                    Some(Err(Reason::Failed(e))) => Err(e),
                    Some(Err(Reason::Retry)) | None => {
                        self.update_lease(&u.lease, u.expected).await
                    }
                });
            }
        }
        Ok(outcomes)
    }

    /// `LeaseStore::create_leases`.
    pub(super) async fn create_batch(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        if !self.inner.transact_batches {
            // In order, as the contract wants: one create after another.
            let mut outcomes = Vec::with_capacity(leases.len());
            for lease in leases {
                outcomes.push(self.create_lease(lease).await?);
            }
            return Ok(outcomes);
        }
        let mut outcomes = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(MAX_TRANSACT_ITEMS) {
            let mut writes = Vec::with_capacity(chunk.len());
            for lease in chunk {
                let version = Version::random();
                let item = codec::lease_item(self.inner.layout.leases(), lease, version)
                    .map_err(Error::InvalidInput)?;
                writes.push(Write { item, version, expected: None });
            }
            let results = self.transact(&writes, "creating leases").await?;
            // Leases left unsettled are created one after another, in order, after the chunk's
            // others: those were created together, or existed already.
            for ((lease, w), result) in chunk.iter().zip(&writes).zip(results) {
                outcomes.push(match result {
                    Some(Ok(())) => CreateOutcome::Created(w.version),
                    Some(Err(Reason::Condition(_))) => CreateOutcome::AlreadyExists,
                    Some(Err(Reason::Failed(e))) => return Err(e),
                    Some(Err(Reason::Retry)) | None => self.create_lease(lease).await?,
                });
            }
        }
        Ok(outcomes)
    }

    /// Writes `writes` (at most [`MAX_TRANSACT_ITEMS`]) in transactions: per write, `Ok` when it
    /// was written, the reason it was not, or `None` when it is still unsettled after
    /// [`TRANSACT_ATTEMPTS`] transactions. A failed condition on an item that holds the version
    /// drawn for it counts as written (the store's own write, landed by an earlier attempt).
    async fn transact(
        &self,
        writes: &[Write],
        what: &str,
    ) -> Result<Vec<Option<std::result::Result<(), Reason>>>> {
        let mut results: Vec<Option<std::result::Result<(), Reason>>> =
            writes.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..writes.len()).collect();
        for _ in 0..TRANSACT_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let mut items = Vec::with_capacity(pending.len());
            for &i in &pending {
                items.push(self.transact_put(&writes[i])?);
            }
            let request =
                self.client.transact_write_items().set_transact_items(Some(items)).send().await;
            let reasons = match request {
                Ok(_) => {
                    for &i in &pending {
                        results[i] = Some(Ok(()));
                    }
                    break;
                }
                Err(e) => match e.as_service_error() {
                    Some(TransactWriteItemsError::TransactionCanceledException(c))
                        if c.cancellation_reasons().len() == pending.len() =>
                    {
                        c.cancellation_reasons().iter().map(reason).collect::<Vec<_>>()
                    }
                    _ => return Err(self.err(what, e)),
                },
            };
            let mut again = Vec::new();
            for (&i, reason) in pending.iter().zip(reasons) {
                match reason {
                    Reason::Retry => again.push(i),
                    Reason::Condition(current)
                        if has_version(current.as_ref(), writes[i].version) =>
                    {
                        results[i] = Some(Ok(()));
                    }
                    other => results[i] = Some(Err(other)),
                }
            }
            pending = again;
        }
        Ok(results)
    }

    /// The transaction item of one write.
    fn transact_put(&self, write: &Write) -> Result<TransactWriteItem> {
        let put = Put::builder()
            .table_name(self.table())
            .set_item(Some(write.item.clone()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let put = match write.expected {
            Some(v) => put
                .condition_expression("#v = :v")
                .expression_attribute_names("#v", codec::VERSION)
                .expression_attribute_values(":v", codec::n(v.0)),
            None => put
                .condition_expression("attribute_not_exists(#pk)")
                .expression_attribute_names("#pk", PK),
        };
        let put = put.build().map_err(|e| unexpected("building a transaction", e))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

/// What a cancellation reason says of its item (the codes DynamoDB documents): a failed
/// condition; nothing, a conflict with another transaction or throttling (try again); or a
/// refusal of the item itself (a validation error, an item collection over its size limit).
fn reason(r: &CancellationReason) -> Reason {
    match r.code() {
        Some("ConditionalCheckFailed") => Reason::Condition(r.item().cloned()),
        None
        | Some("None" | "TransactionConflict" | "ThrottlingError")
        | Some("ProvisionedThroughputExceeded" | "RequestLimitExceeded") => Reason::Retry,
        Some(code) => Reason::Failed(Error::permanent(format!(
            "dynamodb: a transaction refused the item: {code}: {}",
            r.message().unwrap_or_default()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;

    fn judged(code: Option<&str>, item: Option<Item>) -> Reason {
        let mut r = CancellationReason::builder().set_code(code.map(str::to_owned));
        r = r.set_item(item).message("m");
        reason(&r.build())
    }

    #[test]
    fn each_cancellation_reason_settles_or_retries_its_item() {
        let item = Item::from([("version".to_owned(), AttributeValue::N("7".to_owned()))]);
        assert!(matches!(
            judged(Some("ConditionalCheckFailed"), Some(item.clone())),
            Reason::Condition(Some(i)) if i == item
        ));
        assert!(matches!(judged(Some("ConditionalCheckFailed"), None), Reason::Condition(None)));
        for code in [None, Some("None"), Some("TransactionConflict"), Some("ThrottlingError")] {
            assert!(matches!(judged(code, None), Reason::Retry), "{code:?}");
        }
        match judged(Some("ValidationError"), None) {
            Reason::Failed(e) => assert!(!e.is_retryable() && e.to_string().contains("Valid")),
            _ => panic!("a validation error is the item's own error"),
        }
    }
}
