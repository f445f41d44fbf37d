//! The batch writes of [`EtcdStore`] (`LeaseStore::update_leases` and `create_leases`): many
//! compare-and-sets or creations per `Txn`, so that a worker taking thousands of leases at
//! start-up, or shard sync creating them, does not pay one round trip per lease.
//!
//! An etcd `Txn` is all-or-nothing over its compares, while the contract wants one outcome per
//! item. So a chunk of the batch is one `Txn` whose compares are every item's own compare (the
//! value bytes at the expected version for an update, `create_revision = 0` for a creation),
//! whose success branch is every item's write and whose failure branch reads every item's key.
//! When it succeeds, every item was written. When it fails, nothing was, and the reads (one
//! snapshot, at the revision the compares failed at) say which compares held: the items whose
//! compare failed get exactly the outcome the single write reports from its own failure branch
//! (`Conflict` with the record as read, `Corrupt`, `AlreadyExists`), and the others go into a
//! second `Txn`, and so on, at most [`TXN_ATTEMPTS`] times; what is still left then (items
//! whose peers kept changing under it) is written one by one with the single writes. Each
//! outcome is therefore one the item's own single write would have had at some moment of the
//! call, and the versions are drawn exactly as the single writes draw them.
//!
//! A chunk holds at most [`MAX_TXN_OPS`] items and about [`MAX_TXN_BYTES`] of values, within
//! etcd's default limits; chunks are written one after the other, so creations stay in order
//! (a chunk's creations become visible together, and only after every earlier chunk's).

use std::ops::Range;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use shardlease_core::store::{
    check_distinct_keys, CreateOutcome, Lease, LeaseStore, LeaseUpdate, Version,
};
use shardlease_core::{Error, Result};

use super::EtcdStore;
use crate::codec;
use crate::errors::{backend, unexpected};

/// Items per `Txn` at most: etcd refuses a transaction with more compares, or more operations
/// in one of its branches, than its `--max-txn-ops` (128 unless the server was started with
/// another value). A batch item takes one compare, one put and one read.
pub const MAX_TXN_OPS: usize = 128;

/// Bytes of keys and values per `Txn`, roughly, at most: etcd refuses a request larger than its
/// `--max-request-bytes` (1.5 MiB by default), and an update sends a record's bytes twice (the
/// compare and the put). An item larger than this on its own is sent alone.
pub const MAX_TXN_BYTES: usize = 1 << 20;

/// Transactions tried per chunk: each one that fails leaves out the items whose compare failed,
/// so a retry fails only when another item changed in between; after that many the items left
/// are written one by one.
pub const TXN_ATTEMPTS: usize = 3;

/// One update of a chunk, encoded.
struct UpdateItem<'a> {
    update: &'a LeaseUpdate,
    key: String,
    /// The value the record holds at `update.expected`, once known.
    old: Option<Vec<u8>>,
    version: Version,
    bytes: Vec<u8>,
}

/// One creation of a chunk, encoded.
struct CreateItem<'a> {
    lease: &'a Lease,
    key: String,
    version: Version,
    bytes: Vec<u8>,
}

/// Splits `sizes` (the bytes of each item) into consecutive ranges of at most [`MAX_TXN_OPS`]
/// items and about [`MAX_TXN_BYTES`] bytes (never an empty range).
fn chunks(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, &size) in sizes.iter().enumerate() {
        let full = i - start == MAX_TXN_OPS || bytes + size > MAX_TXN_BYTES;
        if i > start && full {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

impl EtcdStore {
    /// `LeaseStore::update_leases`.
    pub(super) async fn update_batch(
        &self,
        updates: &[LeaseUpdate],
    ) -> Result<Vec<Result<Version>>> {
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        let mut items: Vec<UpdateItem<'_>> = updates
            .iter()
            .map(|update| {
                let version = Version::random_other_than(update.expected);
                UpdateItem {
                    update,
                    key: self.keys.lease(update.lease.key.as_str()),
                    old: None,
                    version,
                    bytes: codec::encode_lease(&update.lease, version),
                }
            })
            .collect();
        let sizes: Vec<usize> = items.iter().map(|i| 2 * (i.key.len() + i.bytes.len())).collect();
        let mut outcomes = Vec::with_capacity(items.len());
        for range in chunks(&sizes) {
            outcomes.extend(self.update_chunk(&mut items[range]).await?);
        }
        Ok(outcomes)
    }

    /// `LeaseStore::create_leases`.
    pub(super) async fn create_batch(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        let items: Vec<CreateItem<'_>> = leases
            .iter()
            .map(|lease| {
                let version = Version::random();
                CreateItem {
                    lease,
                    key: self.keys.lease(lease.key.as_str()),
                    version,
                    bytes: codec::encode_lease(lease, version),
                }
            })
            .collect();
        let sizes: Vec<usize> = items.iter().map(|i| i.key.len() + i.bytes.len()).collect();
        let mut outcomes = Vec::with_capacity(items.len());
        for range in chunks(&sizes) {
            outcomes.extend(self.create_chunk(&items[range]).await?);
        }
        Ok(outcomes)
    }

    /// The outcomes of one chunk of updates (at most [`MAX_TXN_OPS`] items).
    async fn update_chunk(&self, items: &mut [UpdateItem<'_>]) -> Result<Vec<Result<Version>>> {
        let mut outcomes: Vec<Option<Result<Version>>> = items.iter().map(|_| None).collect();
        // The bytes at the expected version: remembered, or read (one `Txn` of reads for all the
        // items this store has not seen at that version).
        let mut unknown = Vec::new();
        {
            let cache = self.cache();
            for (i, item) in items.iter_mut().enumerate() {
                match cache.get(item.update.lease.key.as_str()) {
                    Some((v, bytes)) if *v == item.update.expected => {
                        item.old = Some(bytes.clone())
                    }
                    _ => unknown.push(i),
                }
            }
        }
        if !unknown.is_empty() {
            let reads: Vec<TxnOp> =
                unknown.iter().map(|&i| TxnOp::get(items[i].key.clone(), None)).collect();
            let resp = self
                .client
                .kv_client()
                .txn(Txn::new().and_then(reads))
                .await
                .map_err(|e| backend(&self.redactor, "read leases", e))?;
            let reads = resp.op_responses();
            if reads.len() != unknown.len() {
                return Err(unexpected("read leases"));
            }
            for (&i, read) in unknown.iter().zip(reads) {
                let TxnOpResponse::Get(get) = read else { return Err(unexpected("read leases")) };
                let value = get.kvs().first().map(|kv| kv.value().to_vec());
                let item = &mut items[i];
                match self.at_expected(item.update, value.as_deref()) {
                    Ok(true) => item.old = value,
                    Ok(false) => {
                        outcomes[i] = Some(Err(self.conflict(item.update, value.as_deref())))
                    }
                    Err(e) => outcomes[i] = Some(Err(e)),
                }
            }
        }
        let mut pending: Vec<usize> = (0..items.len()).filter(|&i| outcomes[i].is_none()).collect();
        for _ in 0..TXN_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let mut compares = Vec::with_capacity(pending.len());
            let mut puts = Vec::with_capacity(pending.len());
            let mut reads = Vec::with_capacity(pending.len());
            for &i in &pending {
                let item = &items[i];
                let old = item.old.clone().unwrap_or_default();
                compares.push(Compare::value(item.key.clone(), CompareOp::Equal, old));
                puts.push(TxnOp::put(item.key.clone(), item.bytes.clone(), None));
                reads.push(TxnOp::get(item.key.clone(), None));
            }
            let txn = Txn::new().when(compares).and_then(puts).or_else(reads);
            let resp = self
                .client
                .kv_client()
                .txn(txn)
                .await
                .map_err(|e| backend(&self.redactor, "update leases", e))?;
            if resp.succeeded() {
                for &i in &pending {
                    let item = &items[i];
                    self.remember(item.update.lease.key.as_str(), item.version, &item.bytes);
                    outcomes[i] = Some(Ok(item.version));
                }
                pending.clear();
                break;
            }
            let reads = resp.op_responses();
            if reads.len() != pending.len() {
                return Err(unexpected("update leases"));
            }
            let mut held = Vec::new();
            for (&i, read) in pending.iter().zip(reads) {
                let TxnOpResponse::Get(get) = read else {
                    return Err(unexpected("update leases"));
                };
                let value = get.kvs().first().map(|kv| kv.value());
                if value.is_some() && value == items[i].old.as_deref() {
                    held.push(i);
                } else {
                    outcomes[i] = Some(Err(self.conflict(items[i].update, value)));
                }
            }
            pending = held;
        }
        // Items whose peers kept failing the transactions: one compare-and-set each.
        for i in pending {
            let u = items[i].update;
            outcomes[i] = Some(self.update_lease(&u.lease, u.expected).await);
        }
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| unexpected("update leases")))
            .collect::<Result<Vec<_>>>()
    }

    /// Whether the stored `value` of an update's lease holds the expected version (`false`
    /// when absent); `Err(Corrupt)` when it does not decode. Remembers or forgets what it read,
    /// as the single path does.
    fn at_expected(&self, update: &LeaseUpdate, value: Option<&[u8]>) -> Result<bool> {
        let key = update.lease.key.as_str();
        match value {
            None => {
                self.forget(key);
                Ok(false)
            }
            Some(value) => Ok(self.decode_lease(key, value)?.version == update.expected),
        }
    }

    /// The error of an update whose compare failed on the stored `value` (`None`: absent), as
    /// the single update reports it: `Conflict` with the record as read, or `Corrupt`.
    fn conflict(&self, update: &LeaseUpdate, value: Option<&[u8]>) -> Error {
        let key = &update.lease.key;
        let Some(value) = value else {
            self.forget(key.as_str());
            return Error::Conflict { key: key.clone(), current: None };
        };
        match self.decode_lease(key.as_str(), value) {
            Ok(current) => Error::Conflict { key: key.clone(), current: Some(Box::new(current)) },
            Err(e) => e,
        }
    }

    /// The outcomes of one chunk of creations (at most [`MAX_TXN_OPS`] items).
    async fn create_chunk(&self, items: &[CreateItem<'_>]) -> Result<Vec<CreateOutcome>> {
        let mut outcomes: Vec<Option<CreateOutcome>> = items.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        for _ in 0..TXN_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let mut compares = Vec::with_capacity(pending.len());
            let mut puts = Vec::with_capacity(pending.len());
            let mut reads = Vec::with_capacity(pending.len());
            for &i in &pending {
                let k = items[i].key.clone();
                compares.push(Compare::create_revision(k.clone(), CompareOp::Equal, 0));
                puts.push(TxnOp::put(k.clone(), items[i].bytes.clone(), None));
                reads.push(TxnOp::get(k, Some(GetOptions::new().with_count_only())));
            }
            let txn = Txn::new().when(compares).and_then(puts).or_else(reads);
            let resp = self
                .client
                .kv_client()
                .txn(txn)
                .await
                .map_err(|e| backend(&self.redactor, "create leases", e))?;
            if resp.succeeded() {
                for &i in &pending {
                    let item = &items[i];
                    self.remember(item.lease.key.as_str(), item.version, &item.bytes);
                    outcomes[i] = Some(CreateOutcome::Created(item.version));
                }
                pending.clear();
                break;
            }
            let reads = resp.op_responses();
            if reads.len() != pending.len() {
                return Err(unexpected("create leases"));
            }
            let mut absent = Vec::new();
            for (&i, read) in pending.iter().zip(reads) {
                let TxnOpResponse::Get(get) = read else {
                    return Err(unexpected("create leases"));
                };
                if get.count() > 0 {
                    outcomes[i] = Some(CreateOutcome::AlreadyExists);
                } else {
                    absent.push(i);
                }
            }
            pending = absent;
        }
        // Leases still not settled: one create after another, in order.
        for i in pending {
            outcomes[i] = Some(self.create_lease(items[i].lease).await?);
        }
        outcomes.into_iter().map(|o| o.ok_or_else(|| unexpected("create leases"))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_to_the_op_and_byte_limits() {
        assert_eq!(chunks(&[]), Vec::<Range<usize>>::new());
        assert_eq!(chunks(&[10; 300]), vec![0..128, 128..256, 256..300]);
        let big = MAX_TXN_BYTES / 2;
        assert_eq!(chunks(&[big, big, 1, big + 1, 5]), vec![0..2, 2..5]);
        // An item over the limit on its own is sent alone, never dropped.
        assert_eq!(chunks(&[1, MAX_TXN_BYTES * 3, 1]), vec![0..1, 1..2, 2..3]);
    }
}
