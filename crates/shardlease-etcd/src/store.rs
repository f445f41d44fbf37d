//! [`EtcdStore`]: the `LeaseStore` contract translated into etcd v3 requests.
//!
//! Each record is one key (see `keys`), each value a JSON document carrying the record's
//! [`Version`] (see `codec`). Compare-and-set is one `Txn` comparing the key's **value** with the
//! bytes last seen at the expected version: a version names exactly one write and its bytes, so
//! equal bytes mean the record is still at that version, and a record restored from an older
//! snapshot (same revision numbers, other contents) can never be mistaken for it. The bytes of the
//! last version this store read or wrote are cached per lease; a compare-and-set at another
//! version reads the record first. A failed compare returns the current record in the same
//! round trip (`or_else: get`). The batch writes are in `batch`.
//!
//! The fleet signal is one key of the namespace outside the lease and worker ranges (see `keys`),
//! written with a plain `Put` and read with a `Range` of that key; [`LeaseStore::get_workers`]
//! is one `Txn` of `Get`s per [`WORKERS_PER_TXN`] ids.

pub(crate) mod batch;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use shardlease_core::store::Redactor;
use shardlease_core::store::{
    ChangeStream, CorruptRecord, CreateOutcome, FleetSignal, Lease, LeaseStore, LeaseUpdate,
    Listing, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Result, WorkerId};

use crate::builder::EtcdStoreBuilder;
use crate::codec;
use crate::errors::{backend, unexpected};
use crate::keys::{range_end, Keys, Record};

/// Per lease key, the version last read or written and the value bytes it had.
type Seen = HashMap<String, (Version, Vec<u8>)>;

/// A lease store on etcd v3, for one namespace. Open one with [`EtcdStore::builder`]. Cheap to
/// clone (clones share the connection and the cache of last-seen versions).
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    keys: Keys,
    namespace: Namespace,
    page_size: usize,
    watch: bool,
    redactor: Redactor,
    /// Per lease key, the version this store last read or wrote and the value bytes it had.
    seen: Arc<Mutex<Seen>>,
    /// Per worker key, the `mod_revision` and beat this store last wrote or read, so that a
    /// heartbeat is one transaction when nothing else wrote the record since.
    beats: Arc<Mutex<HashMap<String, (i64, u64)>>>,
}

/// Transactions a heartbeat tries before it gives up: each failure means the record changed
/// between two of its round trips (another process writing under the same id, a removal).
const HEARTBEAT_ATTEMPTS: usize = 4;

/// Worker records read per `Txn` by [`LeaseStore::get_workers`] at most: one `Get` each, well
/// within etcd's default `--max-txn-ops` (128).
const WORKERS_PER_TXN: usize = 100;

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("namespace", &self.namespace.as_str())
            .field("root", &self.keys.root())
            .field("page_size", &self.page_size)
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// A builder: the one way to open a store (a URL, endpoints or a client of your own, and
    /// options).
    pub fn builder() -> EtcdStoreBuilder {
        EtcdStoreBuilder::default()
    }

    /// The store over `client`, every setting checked by the builder.
    pub(crate) fn assemble(
        client: Client,
        namespace: Namespace,
        key_prefix: &str,
        page_size: usize,
        watch: bool,
        redactor: Redactor,
    ) -> EtcdStore {
        // Core's rule is all etcd needs: keys take any bytes, and a `/` in a namespace is
        // escaped (see `keys.rs`).
        EtcdStore {
            client,
            keys: Keys::new(key_prefix, namespace.as_str()),
            namespace,
            page_size,
            watch,
            redactor,
            seen: Arc::new(Mutex::new(HashMap::new())),
            beats: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The client, for raw access (tests, tools).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The etcd key that holds lease `key`.
    pub fn lease_etcd_key(&self, key: &LeaseKey) -> String {
        self.keys.lease(key.as_str())
    }

    /// The etcd key that holds worker `id`'s record.
    pub fn worker_etcd_key(&self, id: &WorkerId) -> String {
        self.keys.worker(id.as_str())
    }

    /// The etcd key that holds the namespace's fleet signal
    /// ([`LeaseStore::write_fleet_signal`]): in the namespace's range, outside the lease and
    /// worker ranges.
    pub fn fleet_signal_etcd_key(&self) -> String {
        self.keys.fleet_signal()
    }

    /// Deletes every key of the namespace (its fleet signal included); returns how many there
    /// were.
    pub async fn delete_namespace(&self) -> Result<u64> {
        let root = self.keys.root().to_owned();
        let opts = etcd_client::DeleteOptions::new().with_range(range_end(&root));
        let resp = self
            .client
            .kv_client()
            .delete(root, Some(opts))
            .await
            .map_err(|e| backend(&self.redactor, "delete namespace", e))?;
        self.cache().clear();
        Ok(resp.deleted().max(0) as u64)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, key: &str, version: Version, bytes: &[u8]) {
        self.cache().insert(key.to_owned(), (version, bytes.to_vec()));
    }

    fn forget(&self, key: &str) {
        self.cache().remove(key);
    }

    fn beats(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, u64)>> {
        self.beats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every key-value under `prefix`, in pages of `page_size`, all read at the revision of the
    /// first page (one consistent snapshot).
    async fn range(&self, prefix: &str, what: &str) -> Result<Vec<KeyValue>> {
        let end = range_end(prefix);
        let mut start = prefix.as_bytes().to_vec();
        let mut revision = 0;
        let mut out = Vec::new();
        let mut kv = self.client.kv_client();
        loop {
            let mut opts =
                GetOptions::new().with_range(end.clone()).with_limit(self.page_size as i64);
            if revision > 0 {
                opts = opts.with_revision(revision);
            }
            let mut resp = kv
                .get(start.clone(), Some(opts))
                .await
                .map_err(|e| backend(&self.redactor, what, e))?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let Some(last) = kvs.last() else { break };
            start = last.key().to_vec();
            start.push(0);
            out.extend(kvs);
            if !more {
                break;
            }
        }
        Ok(out)
    }

    /// Adds the worker record `kv` (a key of the worker range) to `listing`: to `items` when it
    /// decodes, to `corrupt` (named by the worker id) otherwise; a key of another kind is skipped.
    /// The one decoding of [`LeaseStore::list_workers`] and [`LeaseStore::get_workers`].
    fn push_worker(&self, listing: &mut Listing<WorkerRecord>, kv: &KeyValue) {
        let id = match self.keys.classify(kv.key()) {
            Record::Worker(id) => String::from_utf8_lossy(id).into_owned(),
            _ => return,
        };
        match codec::decode_worker(&id, kv.value()) {
            Ok(record) => listing.items.push(record),
            Err(reason) => listing.corrupt.push(CorruptRecord { key: id, reason }),
        }
    }

    /// Decodes a lease value, remembering its version; `Err(Corrupt)` when it does not decode.
    fn decode_lease(&self, key: &str, value: &[u8]) -> Result<VersionedLease> {
        match codec::decode_lease(key, value) {
            Ok(VersionedLease { lease, version }) => {
                self.remember(key, version, value);
                Ok(VersionedLease::new(lease, version))
            }
            Err(reason) => {
                self.forget(key);
                Err(Error::Corrupt { key: key.to_owned(), reason })
            }
        }
    }

    /// The current record of `key` with its raw bytes, `None` when absent.
    async fn read(&self, key: &LeaseKey) -> Result<Option<(VersionedLease, Vec<u8>)>> {
        let resp = self
            .client
            .kv_client()
            .get(self.keys.lease(key.as_str()), None)
            .await
            .map_err(|e| backend(&self.redactor, "get lease", e))?;
        match resp.kvs().first() {
            None => {
                self.forget(key.as_str());
                Ok(None)
            }
            Some(kv) => {
                let lease = self.decode_lease(key.as_str(), kv.value())?;
                Ok(Some((lease, kv.value().to_vec())))
            }
        }
    }

    /// The value bytes of `key` at `expected`, or the `Conflict` to return when the record is
    /// not at that version.
    async fn bytes_at(&self, key: &LeaseKey, expected: Version) -> Result<Vec<u8>> {
        if let Some((v, bytes)) = self.cache().get(key.as_str()) {
            if *v == expected {
                return Ok(bytes.clone());
            }
        }
        match self.read(key).await? {
            Some((VersionedLease { version: v, .. }, bytes)) if v == expected => Ok(bytes),
            Some((current, _)) => {
                Err(Error::Conflict { key: key.clone(), current: Some(Box::new(current)) })
            }
            None => Err(Error::Conflict { key: key.clone(), current: None }),
        }
    }

    /// A compare-and-set on the value of lease `key`: `op` if it still holds `expected`
    /// bytes; otherwise the `Conflict` carrying the record as the same transaction read it.
    async fn cas(&self, key: &LeaseKey, expected: Vec<u8>, op: TxnOp, what: &str) -> Result<()> {
        let k = self.keys.lease(key.as_str());
        let txn = Txn::new()
            .when([Compare::value(k.clone(), CompareOp::Equal, expected)])
            .and_then([op])
            .or_else([TxnOp::get(k, None)]);
        let resp =
            self.client.kv_client().txn(txn).await.map_err(|e| backend(&self.redactor, what, e))?;
        if resp.succeeded() {
            return Ok(());
        }
        let current = match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
                Some(kv) => Some(Box::new(self.decode_lease(key.as_str(), kv.value())?)),
                None => {
                    self.forget(key.as_str());
                    None
                }
            },
            _ => return Err(unexpected(what)),
        };
        Err(Error::Conflict { key: key.clone(), current })
    }
}

#[async_trait]
impl LeaseStore for EtcdStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let version = Version::random();
        let bytes = codec::encode_lease(lease, version);
        let k = self.keys.lease(lease.key.as_str());
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k, bytes.clone(), None)]);
        let resp = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(|e| backend(&self.redactor, "create lease", e))?;
        if resp.succeeded() {
            self.remember(lease.key.as_str(), version, &bytes);
            Ok(CreateOutcome::Created(version))
        } else {
            Ok(CreateOutcome::AlreadyExists)
        }
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        Ok(self.read(key).await?.map(|(lease, _)| lease))
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let prefix = self.keys.lease_prefix();
        let mut listing = Listing::default();
        for kv in self.range(&prefix, "list leases").await? {
            let key = match self.keys.classify(kv.key()) {
                Record::Lease(k) => String::from_utf8_lossy(k).into_owned(),
                _ => continue,
            };
            match self.decode_lease(&key, kv.value()) {
                Ok(lease) => listing.items.push(lease),
                Err(Error::Corrupt { key, reason }) => {
                    listing.corrupt.push(CorruptRecord { key, reason })
                }
                Err(e) => return Err(e),
            }
        }
        Ok(listing)
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let old = self.bytes_at(&lease.key, expected).await?;
        let version = Version::random_other_than(expected);
        let bytes = codec::encode_lease(lease, version);
        let put = TxnOp::put(self.keys.lease(lease.key.as_str()), bytes.clone(), None);
        self.cas(&lease.key, old, put, "update lease").await?;
        self.remember(lease.key.as_str(), version, &bytes);
        Ok(version)
    }

    /// One `Txn` per chunk of up to 128 items, whose failure branch reads the items so that the
    /// ones whose compare held are tried again without the others (see `store/batch.rs`).
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        self.update_batch(updates).await
    }

    /// One `Txn` per chunk of up to 128 leases, the chunks in order (see `store/batch.rs`).
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        self.create_batch(leases).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        let old = self.bytes_at(key, expected).await?;
        let delete = TxnOp::delete(self.keys.lease(key.as_str()), None);
        self.cas(key, old, delete, "delete lease").await?;
        self.forget(key.as_str());
        Ok(())
    }

    /// A `Txn` that puts the record if it is still at the `mod_revision` this store last wrote or
    /// read it at (absent, when it knows none) and reads it otherwise. A record read that way
    /// which holds a beat of the same process at least as high is kept (see
    /// [`LeaseStore::heartbeat`]); any other is replaced by a `Txn` on the revision just read.
    /// An etcd comparison cannot shift a beat, so the rule is applied here, on a record read
    /// after the call began, and the revision compare makes the write that follows atomic with
    /// it. A remembered record the rule would keep is read again first: it may have changed.
    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let k = self.keys.worker(record.id.as_str());
        let bytes = codec::encode_worker(record);
        let mut kv = self.client.kv_client();
        let remembered = self.beats().get(&k).copied();
        let mut expected = remembered
            .filter(|&(_, beat)| WorkerRecord::heartbeat_replaces(beat, record.beat))
            .map(|(revision, _)| revision);
        for _ in 0..HEARTBEAT_ATTEMPTS {
            let unchanged = match expected {
                Some(revision) => Compare::mod_revision(k.clone(), CompareOp::Equal, revision),
                None => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
            };
            let txn = Txn::new()
                .when([unchanged])
                .and_then([TxnOp::put(k.clone(), bytes.clone(), None)])
                .or_else([TxnOp::get(k.clone(), None)]);
            let resp = kv.txn(txn).await.map_err(|e| backend(&self.redactor, "heartbeat", e))?;
            if resp.succeeded() {
                match resp.header() {
                    Some(header) => self.beats().insert(k, (header.revision(), record.beat)),
                    None => self.beats().remove(&k),
                };
                return Ok(());
            }
            let Some(TxnOpResponse::Get(get)) = resp.op_responses().into_iter().next() else {
                return Err(unexpected("heartbeat"));
            };
            let found = get.kvs().first();
            expected = found.map(KeyValue::mod_revision);
            let stored = found.and_then(|kv| {
                let beat = codec::decode_worker(record.id.as_str(), kv.value()).ok()?.beat;
                Some((kv.mod_revision(), beat))
            });
            if let Some((revision, beat)) = stored {
                if !WorkerRecord::heartbeat_replaces(beat, record.beat) {
                    self.beats().insert(k, (revision, beat));
                    return Ok(());
                }
            }
        }
        Err(Error::retryable(format!(
            "etcd: heartbeat: the record of worker {} kept changing",
            record.id
        )))
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        let prefix = self.keys.worker_prefix();
        let mut listing = Listing::default();
        for kv in self.range(&prefix, "list workers").await? {
            self.push_worker(&mut listing, &kv);
        }
        Ok(listing)
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        self.client
            .kv_client()
            .delete(self.keys.worker(id.as_str()), None)
            .await
            .map_err(|e| backend(&self.redactor, "remove worker", e))?;
        Ok(())
    }

    /// Reads the record, and deletes it in a `Txn` comparing its `mod_revision` with the one just
    /// read, so a heartbeat landing in between is never deleted (the read is then repeated).
    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let k = self.keys.worker(id.as_str());
        let mut kv = self.client.kv_client();
        for _ in 0..3 {
            let resp = kv
                .get(k.clone(), None)
                .await
                .map_err(|e| backend(&self.redactor, "get worker", e))?;
            let Some(found) = resp.kvs().first() else { return Ok(false) };
            match codec::decode_worker(id.as_str(), found.value()) {
                Ok(record) if record.beat == beat => {}
                _ => return Ok(false),
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(k.clone(), CompareOp::Equal, found.mod_revision())])
                .and_then([TxnOp::delete(k.clone(), None)]);
            let resp =
                kv.txn(txn).await.map_err(|e| backend(&self.redactor, "remove worker", e))?;
            if resp.succeeded() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn namespace(&self) -> Option<Namespace> {
        Some(self.namespace.clone())
    }

    /// A plain `Put` of the signal's key (see `keys`): no compare, and no watch notice (the
    /// watch skips the key).
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        self.client
            .kv_client()
            .put(self.keys.fleet_signal(), codec::encode_fleet_signal(token), None)
            .await
            .map_err(|e| backend(&self.redactor, "write fleet signal", e))?;
        Ok(())
    }

    /// A `Range` of the signal's key alone; a value that does not decode is `Err(Corrupt)` named
    /// by that key.
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        let key = self.keys.fleet_signal();
        let resp = self
            .client
            .kv_client()
            .get(key.clone(), None)
            .await
            .map_err(|e| backend(&self.redactor, "read fleet signal", e))?;
        let Some(kv) = resp.kvs().first() else { return Ok(FleetSignal::Missing) };
        match codec::decode_fleet_signal(kv.value()) {
            Ok(token) => Ok(FleetSignal::Token(token)),
            Err(reason) => Err(Error::Corrupt { key, reason }),
        }
    }

    /// One `Txn` of a `Get` per distinct id, `WORKERS_PER_TXN` ids per `Txn` (the chunks one
    /// after the other), each record decoded as [`list_workers`](LeaseStore::list_workers)
    /// decodes it.
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        let mut seen = HashSet::new();
        let keys: Vec<String> = ids
            .iter()
            .filter(|id| seen.insert(id.as_str()))
            .map(|id| self.keys.worker(id.as_str()))
            .collect();
        let mut listing = Listing::default();
        let mut kv = self.client.kv_client();
        for chunk in keys.chunks(WORKERS_PER_TXN) {
            let gets: Vec<TxnOp> = chunk.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let resp = kv
                .txn(Txn::new().and_then(gets))
                .await
                .map_err(|e| backend(&self.redactor, "get workers", e))?;
            for op in resp.op_responses() {
                let TxnOpResponse::Get(get) = op else { return Err(unexpected("get workers")) };
                for found in get.kvs() {
                    self.push_worker(&mut listing, found);
                }
            }
        }
        Ok(listing)
    }

    /// An etcd watch on the namespace's keys (unless turned off with `watch=false`): every lease
    /// write, and worker records appearing or vanishing (not heartbeats). See `watch`.
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        if !self.watch {
            return Ok(None);
        }
        crate::watch::subscribe(&self.client, &self.keys, &self.redactor).await.map(Some)
    }
}
