//! [`RedisStore`]: the [`LeaseStore`] contract on Redis (its builder is in `builder.rs`).
//!
//! Reads are plain commands (`HGETALL`, `ZRANGE … BYLEX` pages plus pipelined `HMGET`s, a `GET`
//! of the fleet signal);
//! every write that must be atomic per record is one of the Lua scripts of
//! [`scripts`](crate::scripts). On a single server the connection is a [`ConnectionManager`]:
//! one multiplexed connection shared by every clone of the store, re-established by itself when
//! the server restarts or the network drops (calls made meanwhile fail with a retryable error).
//! On a cluster it is the `redis` crate's cluster connection behind a `ClusterLink`
//! (`crate::relink`), which connects again from the seeds when calls keep timing out.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};
use shardlease_core::store::{
    check_distinct_keys, ChangeStream, CorruptRecord, CreateOutcome, FleetSignal, Lease,
    LeaseStore, LeaseUpdate, Listing, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Result, WorkerId};

use crate::builder::RedisStoreBuilder;
use crate::codec::{self, FieldSource, Fields};
use crate::conn::{RedisConnection, StoreConn};
use crate::errors::{backend, unexpected};
use crate::keys::Keys;
use crate::notify::Subscriber;
use crate::scripts::{Scripts, MAX_BATCH_ITEMS};
use shardlease_core::store::Redactor;

/// A [`LeaseStore`] on Redis, for one namespace.
///
/// Cheap to clone: clones share one connection (a connection manager, or a cluster
/// connection). Open one with [`RedisStore::builder`].
#[derive(Clone)]
pub struct RedisStore {
    conn: StoreConn,
    inner: Arc<Inner>,
}

struct Inner {
    namespace: Namespace,
    key_prefix: String,
    keys: Keys,
    /// Where the store connects, password redacted (for messages and `Debug`).
    target: String,
    page_size: usize,
    redactor: Redactor,
    scripts: Scripts,
    /// Notification on: what opens subscriptions (a connection each), and the namespace's
    /// change channel the scripts publish to (see `crate::notify`).
    notify: Option<(Subscriber, String)>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.inner.target)
            .field("namespace", &self.inner.namespace)
            .field("key_prefix", &self.inner.key_prefix)
            .finish_non_exhaustive()
    }
}

/// What one lease script replied.
enum Reply {
    /// `created`/`updated` with the new version.
    Version(Version),
    /// `exists` (create) or `deleted`.
    Done,
    /// `absent`: no record.
    Absent,
    /// `conflict` with the current hash.
    Conflict(Fields),
    /// `wrongtype`: the key holds another Redis type (named).
    WrongType(String),
    /// `conflict` with a current hash that is not even text.
    Undecodable(String),
}

impl RedisStore {
    /// A builder: the one way to open a store (a URL or a connection manager of your own, and
    /// options).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The store over `conn`, every setting checked by the builder.
    pub(crate) fn assemble(
        conn: StoreConn,
        namespace: Namespace,
        key_prefix: String,
        target: String,
        page_size: usize,
        redactor: Redactor,
        subscriber: Option<Subscriber>,
    ) -> RedisStore {
        let keys = Keys::new(&key_prefix, namespace.as_str());
        let notify = subscriber.map(|s| (s, keys.changes()));
        RedisStore {
            conn,
            inner: Arc::new(Inner {
                namespace,
                key_prefix,
                keys,
                target,
                page_size,
                redactor,
                scripts: Scripts::new(),
                notify,
            }),
        }
    }

    /// The key prefix in every key's hash tag.
    pub fn key_prefix(&self) -> &str {
        &self.inner.key_prefix
    }

    /// The hash tag every key of this namespace starts with, e.g. `{shardlease:orders}`.
    pub fn key_tag(&self) -> &str {
        self.inner.keys.base()
    }

    /// The Redis key holding lease `key` (for operators and tests).
    pub fn lease_redis_key(&self, key: &LeaseKey) -> String {
        self.inner.keys.lease(key.as_str())
    }

    /// The Redis key holding worker `id`'s record (for operators and tests).
    pub fn worker_redis_key(&self, id: &WorkerId) -> String {
        self.inner.keys.worker(id.as_str())
    }

    /// The Redis key holding the namespace's fleet signal (a string, the token in decimal), e.g.
    /// `{shardlease:orders}:fleet` (for operators and tests).
    pub fn fleet_signal_redis_key(&self) -> String {
        self.inner.keys.fleet_signal()
    }

    /// A clone of the connection manager (to run other commands on the same connection), or
    /// `None` for a store on a Redis Cluster (see [`connection`](Self::connection)).
    pub fn manager(&self) -> Option<ConnectionManager> {
        match &self.conn {
            StoreConn::Single(manager) => Some(manager.clone()),
            StoreConn::Cluster(_) => None,
        }
    }

    /// A clone of the store's connection, to a single server or to a cluster (to run other
    /// commands on the same connection; a command is routed by its first key on a cluster).
    pub fn connection(&self) -> RedisConnection {
        self.conn.public()
    }

    /// Whether the store speaks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// Deletes every key of this namespace (leases, worker records, indexes, the fleet signal,
    /// the old version counter),
    /// found with `SCAN` (on a cluster, on the master of the namespace's slot, which holds them
    /// all) and removed with `UNLINK` in batches. Returns how many keys went.
    /// For tests and for operators retiring an application; running workers would recreate
    /// their records.
    pub async fn delete_namespace(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let pattern = self.inner.keys.scan_pattern();
        let mut cursor: u64 = 0;
        let mut removed = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(1000);
            let (next, keys): (u64, Vec<Vec<u8>>) = conn
                .query_in_slot_of(&scan, self.inner.keys.base())
                .await
                .map_err(|e| self.err("scanning the namespace's keys", e))?;
            if !keys.is_empty() {
                let n: u64 = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.err("deleting the namespace's keys", e))?;
                removed += n;
            }
            if next == 0 {
                return Ok(removed);
            }
            cursor = next;
        }
    }

    /// How worker records are read and decoded, by `list_workers` and `get_workers` alike.
    fn worker_reader(&self) -> RecordReader<'_, WorkerRecord> {
        RecordReader {
            what: "workers",
            keys: &self.inner.keys,
            hash_key: Keys::worker,
            names: codec::WORKER_FIELDS,
            decode: |id, f| codec::decode_worker(id, f),
        }
    }

    fn err(&self, what: &str, e: redis::RedisError) -> Error {
        backend(&self.inner.redactor, what, e)
    }

    fn corrupt(key: &LeaseKey, reason: String) -> Error {
        Error::Corrupt { key: key.as_str().to_owned(), reason }
    }

    /// Runs one of the lease scripts and parses its tagged reply.
    async fn run_lease_script(
        &self,
        what: &str,
        script: &redis::Script,
        key: &LeaseKey,
        args: &[String],
    ) -> Result<Reply> {
        let keys = &self.inner.keys;
        let mut invocation = script.prepare_invoke();
        invocation.key(keys.lease(key.as_str())).key(keys.lease_index()).arg(key.as_str());
        for a in args {
            invocation.arg(a);
        }
        let mut conn = self.conn.clone();
        let reply: Value = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(&format!("{what} of lease {key}"), e))?;
        parse_reply(&reply).map_err(|detail| unexpected(&format!("{what} of lease {key}"), detail))
    }

    /// The change channel the scripts publish to, or `""` (publish nothing) when notification
    /// is off.
    fn channel(&self) -> &str {
        self.inner.notify.as_ref().map_or("", |(_, channel)| channel.as_str())
    }

    /// A compare-and-set update, announced to subscribers when `announce`.
    async fn update(&self, lease: &Lease, expected: Version, announce: bool) -> Result<Version> {
        let fields = codec::lease_fields(lease).map_err(Error::InvalidInput)?;
        let new_version = Version::random_other_than(expected);
        let channel = if announce { self.channel() } else { "" };
        let mut args = vec![expected.0.to_string(), new_version.0.to_string(), channel.to_owned()];
        args.extend(flatten(fields));
        let script = &self.inner.scripts.update;
        match self.run_lease_script("update", script, &lease.key, &args).await? {
            Reply::Version(v) => Ok(v),
            other => Err(self.conflict(&lease.key, other)),
        }
    }

    /// `LeaseStore::update_leases`: the batch update script over chunks of up to
    /// [`MAX_BATCH_ITEMS`] items, one call (one round trip) per chunk. The script runs the
    /// single update's Lua function for each item in turn, so each item is its own
    /// compare-and-set, judged and written (index entry, announcement) as its `update_lease`
    /// would be, and its reply is the single script's, decoded by the same code.
    async fn update_many(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        check_distinct_keys(updates.iter().map(|u| &u.lease.key))?;
        // Every item is encoded before the first chunk goes: a lease that cannot be is refused
        // with nothing written.
        let mut items = Vec::with_capacity(updates.len());
        for u in updates {
            let fields = flatten(codec::lease_fields(&u.lease).map_err(Error::InvalidInput)?);
            let new_version = Version::random_other_than(u.expected);
            let mut args = vec![
                u.lease.key.as_str().to_owned(),
                u.expected.0.to_string(),
                new_version.0.to_string(),
                fields.len().to_string(),
            ];
            args.extend(fields);
            items.push((&u.lease.key, args));
        }
        let script = &self.inner.scripts.update_batch;
        // An undecodable reply is that item's error, not the batch's.
        self.run_batches("update leases", script, &items, |key, reply| {
            Ok(match parse_reply(&reply) {
                Ok(Reply::Version(v)) => Ok(v),
                Ok(other) => Err(self.conflict(key, other)),
                Err(detail) => Err(unexpected(&format!("update of lease {key}"), detail)),
            })
        })
        .await
    }

    /// `LeaseStore::create_leases`: the batch create script over chunks of up to
    /// [`MAX_BATCH_ITEMS`] leases, the chunks one after another and the leases of a chunk in
    /// order within one atomic script, so the leases are created in order. Each lease is
    /// created (or found to exist, whatever the type of its key) as its `create_lease` would.
    async fn create_many(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        check_distinct_keys(leases.iter().map(|l| &l.key))?;
        let mut items = Vec::with_capacity(leases.len());
        for lease in leases {
            let fields = flatten(codec::lease_fields(lease).map_err(Error::InvalidInput)?);
            let mut args = vec![
                lease.key.as_str().to_owned(),
                Version::random().0.to_string(),
                fields.len().to_string(),
            ];
            args.extend(fields);
            items.push((&lease.key, args));
        }
        let script = &self.inner.scripts.create_batch;
        self.run_batches("create leases", script, &items, |key, reply| {
            let what = || format!("create of lease {key}");
            match parse_reply(&reply).map_err(|d| unexpected(&what(), d))? {
                Reply::Version(v) => Ok(CreateOutcome::Created(v)),
                Reply::Done => Ok(CreateOutcome::AlreadyExists),
                _ => Err(unexpected(&what(), "unknown outcome")),
            }
        })
        .await
    }

    /// Runs a batch script over `items` in chunks of up to [`MAX_BATCH_ITEMS`], one call after
    /// another, and decodes each item's reply with `decode`; the first error that `decode`
    /// returns ends the batch.
    async fn run_batches<T>(
        &self,
        what: &str,
        script: &redis::Script,
        items: &[(&LeaseKey, Vec<String>)],
        decode: impl Fn(&LeaseKey, Value) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut outcomes = Vec::with_capacity(items.len());
        for chunk in items.chunks(MAX_BATCH_ITEMS) {
            let replies = self.run_batch_script(what, script, chunk).await?;
            for ((key, _), reply) in chunk.iter().zip(replies) {
                outcomes.push(decode(key, reply)?);
            }
        }
        Ok(outcomes)
    }

    /// Runs a batch script over `items` (each a lease key and its arguments after the change
    /// channel): the lease index and every item's hash as keys, all in the namespace's slot.
    /// Returns one reply per item, in order. The script is loaded again by itself when the
    /// server does not know it (`NOSCRIPT`, after a restart or a flush).
    async fn run_batch_script(
        &self,
        what: &str,
        script: &redis::Script,
        items: &[(&LeaseKey, Vec<String>)],
    ) -> Result<Vec<Value>> {
        let keys = &self.inner.keys;
        let mut invocation = script.prepare_invoke();
        invocation.key(keys.lease_index());
        for (key, _) in items {
            invocation.key(keys.lease(key.as_str()));
        }
        invocation.arg(self.channel());
        for (_, args) in items {
            for a in args {
                invocation.arg(a);
            }
        }
        let mut conn = self.conn.clone();
        let reply: Value =
            invocation.invoke_async(&mut conn).await.map_err(|e| self.err(what, e))?;
        match reply {
            Value::Array(replies) if replies.len() == items.len() => Ok(replies),
            Value::Array(_) => Err(unexpected(what, "a reply count unlike the batch's")),
            other => Err(unexpected(what, format!("{other:?}"))),
        }
    }

    /// The current record of a conflict, decoded; `Error::Corrupt` when it cannot be.
    fn conflict(&self, key: &LeaseKey, reply: Reply) -> Error {
        match reply {
            Reply::Absent => Error::Conflict { key: key.clone(), current: None },
            Reply::Conflict(fields) => match codec::decode_lease(key.as_str(), &fields) {
                Ok(current) => {
                    Error::Conflict { key: key.clone(), current: Some(Box::new(current)) }
                }
                Err(reason) => RedisStore::corrupt(key, reason),
            },
            Reply::WrongType(t) => {
                RedisStore::corrupt(key, wrong_type(&self.inner.keys.lease(key.as_str()), &t))
            }
            Reply::Undecodable(reason) => RedisStore::corrupt(key, reason),
            Reply::Version(_) | Reply::Done => unexpected(
                &format!("write of lease {key}"),
                "success where a conflict was expected",
            ),
        }
    }

    /// Lists an index page by page: `ZRANGE … BYLEX` after the last member seen, then one
    /// pipelined `HMGET` of the fields `reader.names` per member, the pipeline ending with the
    /// next page's `ZRANGE` (one round trip per page). Members added or removed meanwhile may or
    /// may not be listed; every member present throughout is listed exactly once. The rows are
    /// decoded by [`read_rows`](Self::read_rows).
    async fn list_index<T: Send>(
        &self,
        index: String,
        reader: &RecordReader<'_, T>,
    ) -> Result<Listing<T>> {
        let what = reader.what;
        let mut conn = self.conn.clone();
        let mut listing = Listing { items: Vec::new(), corrupt: Vec::new() };
        let page = self.inner.page_size;
        let range = |after: Option<&[u8]>| {
            let mut cmd = redis::cmd("ZRANGEBYLEX");
            match after {
                Some(last) => cmd.arg(&index).arg([b"(".as_slice(), last].concat()),
                None => cmd.arg(&index).arg("-"),
            };
            cmd.arg("+").arg("LIMIT").arg(0).arg(page);
            cmd
        };
        let mut members: Vec<Vec<u8>> = range(None)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err(&format!("listing {what}"), e))?;
        while !members.is_empty() {
            let names_read: Vec<std::result::Result<&str, String>> = members
                .iter()
                .map(|m| {
                    std::str::from_utf8(m).map_err(|_| String::from_utf8_lossy(m).into_owned())
                })
                .collect();
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            reader.push_reads(&mut pipe, names_read.iter().flatten().copied());
            let more = members.len() >= page;
            if more {
                pipe.add_command(range(members.last().map(Vec::as_slice)));
            }
            let mut replies: Vec<RedisResult<Value>> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err(&format!("reading a page of {what}"), e))?;
            let next: Vec<Vec<u8>> = if more {
                let reply = replies.pop().ok_or_else(|| {
                    unexpected(&format!("reading a page of {what}"), "fewer replies than commands")
                })?;
                let reply = reply.map_err(|e| self.err(&format!("listing {what}"), e))?;
                redis::from_redis_value(reply)
                    .map_err(|e| self.err(&format!("listing {what}"), e.into()))?
            } else {
                Vec::new()
            };
            self.read_rows(&mut conn, reader, names_read, replies, &mut listing).await?;
            members = next;
        }
        Ok(listing)
    }

    /// Decodes the replies of the `HMGET`s [`RecordReader::push_reads`] queued, one per name
    /// of `names_read` that is text (in order), into `listing`. A record whose hash has vanished
    /// is skipped; one that cannot be decoded (a name that is not UTF-8, a key of another type
    /// included) goes to `listing.corrupt`. A row with none of the fields (rare: a vanished hash,
    /// or one holding none of them) is read again with `HGETALL`, so a hash without any known
    /// field is reported as corrupt, not skipped. Shared by the listings and `get_workers`, so a
    /// record decodes the same whichever read it.
    async fn read_rows<T: Send>(
        &self,
        conn: &mut StoreConn,
        reader: &RecordReader<'_, T>,
        names_read: Vec<std::result::Result<&str, String>>,
        replies: Vec<RedisResult<Value>>,
        listing: &mut Listing<T>,
    ) -> Result<()> {
        let RecordReader { what, names, decode, .. } = *reader;
        let hash_key = |name: &str| reader.key_of(name);
        if replies.len() != names_read.iter().flatten().count() {
            return Err(unexpected(
                &format!("reading a page of {what}"),
                "a reply count unlike the commands'",
            ));
        }
        // Rows with none of the fields, read again whole (rare).
        let mut whole: Vec<Option<RedisResult<Value>>> = Vec::new();
        let empty: Vec<&str> = names_read
            .iter()
            .flatten()
            .zip(&replies)
            .filter(|(_, r)| matches!(r, Ok(v) if codec::lacks_every_field(names, v)))
            .map(|(n, _)| *n)
            .collect();
        if !empty.is_empty() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for name in &empty {
                pipe.cmd("HGETALL").arg(hash_key(name));
            }
            let again: Vec<RedisResult<Value>> = pipe
                .query_async(conn)
                .await
                .map_err(|e| self.err(&format!("reading a page of {what}"), e))?;
            if again.len() != empty.len() {
                return Err(unexpected(
                    &format!("reading a page of {what}"),
                    "a reply count unlike the commands'",
                ));
            }
            whole = again.into_iter().map(Some).collect();
        }
        let mut whole = whole.into_iter();
        let mut replies = replies.into_iter();
        for name in names_read {
            let name = match name {
                Ok(n) => n,
                Err(lossy) => {
                    listing.corrupt.push(CorruptRecord {
                        key: lossy,
                        reason: format!("the {what} index holds a member that is not UTF-8"),
                    });
                    continue;
                }
            };
            let reply = replies.next().ok_or_else(|| {
                unexpected(&format!("reading a page of {what}"), "fewer replies than commands")
            })?;
            let corrupt = |reason: String| CorruptRecord { key: name.to_owned(), reason };
            let decoded = match reply {
                Err(e) if e.code() == Some("WRONGTYPE") => {
                    listing.corrupt.push(corrupt(wrong_type(&hash_key(name), "another type")));
                    continue;
                }
                Err(e) => return Err(self.err(&format!("reading {what} {name}"), e)),
                Ok(v) => match codec::row_of(names, &v) {
                    Ok(Some(row)) => decode(name, &row),
                    Ok(None) => match whole.next().flatten() {
                        Some(Err(e)) if e.code() == Some("WRONGTYPE") => {
                            Err(wrong_type(&hash_key(name), "another type"))
                        }
                        Some(Err(e)) => return Err(self.err(&format!("reading {what} {name}"), e)),
                        Some(Ok(v)) => match codec::fields_of(&v) {
                            Ok(fields) if fields.is_empty() => continue, // deleted meanwhile
                            Ok(fields) => decode(name, &fields),
                            Err(reason) => Err(reason),
                        },
                        None => {
                            return Err(unexpected(
                                &format!("reading a page of {what}"),
                                "fewer replies than commands",
                            ))
                        }
                    },
                    Err(reason) => Err(reason),
                },
            };
            match decoded {
                Ok(item) => listing.items.push(item),
                Err(reason) => listing.corrupt.push(corrupt(reason)),
            }
        }
        Ok(())
    }
}

/// How one kind of record is read and decoded: what it is called in messages, the Redis key
/// of the hash named `name`, the fields the decoder reads (one `HMGET` of them per record), and
/// the decoder.
struct RecordReader<'a, T> {
    what: &'static str,
    keys: &'a Keys,
    hash_key: fn(&Keys, &str) -> String,
    names: &'static [&'static str],
    decode: fn(&str, &dyn FieldSource) -> std::result::Result<T, String>,
}

impl<T> RecordReader<'_, T> {
    /// The Redis key of the hash of record `name`.
    fn key_of(&self, name: &str) -> String {
        (self.hash_key)(self.keys, name)
    }

    /// Queues on `pipe` one `HMGET` of the decoder's fields per name, in order.
    fn push_reads<'n>(&self, pipe: &mut redis::Pipeline, names: impl Iterator<Item = &'n str>) {
        for name in names {
            pipe.cmd("HMGET").arg(self.key_of(name)).arg(self.names);
        }
    }
}

/// Why a record whose Redis key holds type `t` (or "another type") is corrupt.
fn wrong_type(redis_key: &str, t: &str) -> String {
    format!("the Redis key {redis_key:?} holds {t}, not a hash (WRONGTYPE)")
}

/// Parses a lease script's tagged reply.
fn parse_reply(v: &Value) -> std::result::Result<Reply, String> {
    let Value::Array(items) = v else { return Err(format!("{v:?}")) };
    let tag = items.first().and_then(codec::text).ok_or_else(|| format!("{v:?}"))?;
    let version = || -> std::result::Result<Version, String> {
        match items.get(1) {
            Some(Value::Int(n)) => u64::try_from(*n).map(Version).map_err(|e| e.to_string()),
            Some(other) => codec::text(other)
                .and_then(|s| s.parse().ok())
                .map(Version)
                .ok_or_else(|| format!("bad version {other:?}")),
            None => Err("missing version".to_owned()),
        }
    };
    match tag {
        "created" | "updated" => version().map(Reply::Version),
        "exists" | "deleted" => Ok(Reply::Done),
        "absent" => Ok(Reply::Absent),
        "conflict" => {
            let current = items.get(1).ok_or_else(|| "conflict without a record".to_owned())?;
            // A record whose fields are not text is corrupt, not an unexpected reply.
            Ok(match codec::fields_of(current) {
                Ok(fields) => Reply::Conflict(fields),
                Err(reason) => Reply::Undecodable(reason),
            })
        }
        "wrongtype" => {
            let t = items.get(1).and_then(codec::text).unwrap_or("another type");
            Ok(Reply::WrongType(format!("a {t}")))
        }
        other => Err(format!("unknown tag {other:?}")),
    }
}

/// The token a fleet signal holds: decimal text in `1..=Version::MAX_RANDOM`.
fn parse_token(v: &Value) -> std::result::Result<Version, String> {
    let text = codec::text(v).ok_or_else(|| "the fleet signal is not UTF-8 text".to_owned())?;
    match text.parse::<u64>() {
        Ok(n) if (1..=Version::MAX_RANDOM).contains(&n) => Ok(Version(n)),
        _ => {
            let shown: String = text.chars().take(40).collect();
            Err(format!("the fleet signal is not a token: {shown:?}"))
        }
    }
}

/// Flattens field/value pairs into script arguments.
fn flatten(pairs: Vec<(&'static str, String)>) -> Vec<String> {
    pairs.into_iter().flat_map(|(k, v)| [k.to_owned(), v]).collect()
}

#[async_trait]
impl LeaseStore for RedisStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let fields = codec::lease_fields(lease).map_err(Error::InvalidInput)?;
        let mut args = vec![Version::random().0.to_string(), self.channel().to_owned()];
        args.extend(flatten(fields));
        let script = &self.inner.scripts.create;
        match self.run_lease_script("create", script, &lease.key, &args).await? {
            Reply::Version(v) => Ok(CreateOutcome::Created(v)),
            Reply::Done => Ok(CreateOutcome::AlreadyExists),
            _ => Err(unexpected(&format!("create of lease {}", lease.key), "unknown outcome")),
        }
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<VersionedLease>> {
        let mut conn = self.conn.clone();
        let reply: RedisResult<Value> = redis::cmd("HGETALL")
            .arg(self.inner.keys.lease(key.as_str()))
            .query_async(&mut conn)
            .await;
        let value = match reply {
            Ok(v) => v,
            Err(e) if e.code() == Some("WRONGTYPE") => {
                let redis_key = self.inner.keys.lease(key.as_str());
                return Err(RedisStore::corrupt(key, wrong_type(&redis_key, "another type")));
            }
            Err(e) => return Err(self.err(&format!("reading lease {key}"), e)),
        };
        let fields = codec::fields_of(&value).map_err(|r| RedisStore::corrupt(key, r))?;
        if fields.is_empty() {
            return Ok(None);
        }
        codec::decode_lease(key.as_str(), &fields)
            .map(Some)
            .map_err(|r| RedisStore::corrupt(key, r))
    }

    async fn list_leases(&self) -> Result<Listing<VersionedLease>> {
        let keys = &self.inner.keys;
        let reader = RecordReader {
            what: "leases",
            keys,
            hash_key: Keys::lease,
            names: codec::LEASE_FIELDS,
            decode: |key, f| codec::decode_lease(key, f),
        };
        self.list_index(keys.lease_index(), &reader).await
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update(lease, expected, true).await
    }

    /// The same script, publishing nothing.
    async fn update_lease_quietly(&self, lease: &Lease, expected: Version) -> Result<Version> {
        self.update(lease, expected, false).await
    }

    /// One script call (one round trip, one atomic step) per chunk of up to 128 items
    /// (`update_many`).
    async fn update_leases(&self, updates: &[LeaseUpdate]) -> Result<Vec<Result<Version>>> {
        self.update_many(updates).await
    }

    /// One script call (one round trip, one atomic step) per chunk of up to 128 leases, the
    /// chunks in order (`create_many`).
    async fn create_leases(&self, leases: &[Lease]) -> Result<Vec<CreateOutcome>> {
        self.create_many(leases).await
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        let script = &self.inner.scripts.delete;
        let args = [expected.0.to_string(), self.channel().to_owned()];
        match self.run_lease_script("delete", script, key, &args).await? {
            Reply::Done => Ok(()),
            other => Err(self.conflict(key, other)),
        }
    }

    async fn heartbeat(&self, record: &WorkerRecord) -> Result<()> {
        let keys = &self.inner.keys;
        let mut invocation = self.inner.scripts.heartbeat.prepare_invoke();
        invocation
            .key(keys.worker(record.id.as_str()))
            .key(keys.worker_index())
            .arg(record.id.as_str())
            .arg(record.beat.to_string())
            .arg(WorkerRecord::last_beat_of_process(record.beat).to_string())
            .arg(self.channel());
        for a in flatten(codec::worker_fields(record)) {
            invocation.arg(a);
        }
        let mut conn = self.conn.clone();
        let _: Value = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(&format!("heartbeat of worker {}", record.id), e))?;
        Ok(())
    }

    async fn list_workers(&self) -> Result<Listing<WorkerRecord>> {
        self.list_index(self.inner.keys.worker_index(), &self.worker_reader()).await
    }

    /// One pipeline of `HMGET`s of the worker hashes (the reads `list_workers` makes, decoded by
    /// the same code) per chunk of up to `page_size` distinct ids: one round trip per chunk, plus
    /// one `HGETALL` round trip for the ids whose hash has none of the fields (a missing worker).
    async fn get_workers(&self, ids: &[WorkerId]) -> Result<Listing<WorkerRecord>> {
        let reader = self.worker_reader();
        let mut wanted: Vec<&str> = ids.iter().map(WorkerId::as_str).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut conn = self.conn.clone();
        let mut listing = Listing { items: Vec::new(), corrupt: Vec::new() };
        for chunk in wanted.chunks(self.inner.page_size) {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            reader.push_reads(&mut pipe, chunk.iter().copied());
            let replies: Vec<RedisResult<Value>> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err("reading named workers", e))?;
            let names_read = chunk.iter().map(|id| Ok(*id)).collect();
            self.read_rows(&mut conn, &reader, names_read, replies, &mut listing).await?;
        }
        Ok(listing)
    }

    /// `SET` of the namespace's signal key (`{prefix:namespace}:fleet`) to the token in decimal.
    async fn write_fleet_signal(&self, token: Version) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: Value = redis::cmd("SET")
            .arg(self.inner.keys.fleet_signal())
            .arg(token.0.to_string())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("writing the fleet signal", e))?;
        Ok(())
    }

    /// `GET` of the signal key: `Missing` when it does not exist; `Error::Corrupt` (keyed by the
    /// Redis key) when it holds another type or anything but a token in decimal.
    async fn read_fleet_signal(&self) -> Result<FleetSignal> {
        let redis_key = self.inner.keys.fleet_signal();
        let mut conn = self.conn.clone();
        let reply: RedisResult<Value> =
            redis::cmd("GET").arg(&redis_key).query_async(&mut conn).await;
        let corrupt = |reason: String| Error::Corrupt { key: redis_key.clone(), reason };
        let value = match reply {
            Ok(Value::Nil) => return Ok(FleetSignal::Missing),
            Ok(v) => v,
            Err(e) if e.code() == Some("WRONGTYPE") => {
                return Err(corrupt(format!(
                    "the Redis key {redis_key:?} holds another type, not a string (WRONGTYPE)"
                )));
            }
            Err(e) => return Err(self.err("reading the fleet signal", e)),
        };
        parse_token(&value).map(FleetSignal::Token).map_err(corrupt)
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        let keys = &self.inner.keys;
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(keys.worker(id.as_str()))
            .ignore()
            .cmd("ZREM")
            .arg(keys.worker_index())
            .arg(id.as_str())
            .ignore();
        if let Some((_, channel)) = &self.inner.notify {
            pipe.cmd("PUBLISH").arg(channel).arg(format!("X{id}")).ignore();
        }
        let _: Value = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err(&format!("removing worker {id}"), e))?;
        Ok(())
    }

    async fn remove_worker_if(&self, id: &WorkerId, beat: u64) -> Result<bool> {
        let keys = &self.inner.keys;
        let mut invocation = self.inner.scripts.remove_worker_if.prepare_invoke();
        invocation
            .key(keys.worker(id.as_str()))
            .key(keys.worker_index())
            .arg(id.as_str())
            .arg(beat.to_string())
            .arg(self.channel());
        let mut conn = self.conn.clone();
        let removed: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(&format!("removing worker {id} at beat {beat}"), e))?;
        Ok(removed == 1)
    }

    /// `Some` of the namespace this store reads and writes (the builder's, else the URL's, else
    /// `default`), so the runtime can reject a `Config` naming another. This is the one way to
    /// read it: `RedisStore` has no inherent `namespace()` shadowing it with another return type.
    fn namespace(&self) -> Option<Namespace> {
        Some(self.inner.namespace.clone())
    }

    /// With notification on (the default for a store opened from a URL; see
    /// [`RedisStoreBuilder::notify`](crate::RedisStoreBuilder::notify)): a subscription to the
    /// namespace's change channel, on a connection of its own.
    async fn subscribe_changes(&self) -> Result<Option<ChangeStream>> {
        match &self.inner.notify {
            Some((client, channel)) => {
                crate::notify::subscribe(client, channel, &self.inner.redactor).await.map(Some)
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn script_replies_parse() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = |items: Vec<Value>| parse_reply(&Value::Array(items)).unwrap();
        assert!(matches!(reply(vec![b("created"), b("17")]), Reply::Version(Version(17))));
        assert!(matches!(reply(vec![b("updated"), Value::Int(5)]), Reply::Version(Version(5))));
        assert!(matches!(reply(vec![b("exists"), b("hash")]), Reply::Done));
        assert!(matches!(reply(vec![b("absent")]), Reply::Absent));
        assert!(matches!(reply(vec![b("wrongtype"), b("string")]), Reply::WrongType(_)));
        match reply(vec![b("conflict"), Value::Array(vec![b("epoch"), b("3")])]) {
            Reply::Conflict(f) => assert_eq!(f["epoch"], "3"),
            _ => panic!("expected a conflict"),
        }
        assert!(parse_reply(&Value::Int(1)).is_err());
        assert!(parse_reply(&Value::Array(vec![b("what")])).is_err());
        assert!(parse_reply(&Value::Array(vec![b("created"), b("-1")])).is_err());
    }

    #[test]
    fn fleet_tokens_parse() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(parse_token(&b("17")).unwrap(), Version(17));
        let max = Version::MAX_RANDOM.to_string();
        assert_eq!(parse_token(&b(&max)).unwrap(), Version(Version::MAX_RANDOM));
        for bad in ["0", "-3", "", "x", "9223372036854775808", " 5"] {
            assert!(parse_token(&b(bad)).is_err(), "{bad:?}");
        }
        assert!(parse_token(&Value::BulkString(vec![0xff])).is_err());
        assert!(parse_token(&Value::Int(5)).is_err());
    }
}
