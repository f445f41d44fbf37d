//! [`RedisStore`]: the [`LeaseStore`] contract on Redis, and its builder.
//!
//! Reads are plain commands (`HGETALL`, `ZRANGE … BYLEX` pages plus pipelined `HGETALL`s);
//! every write that must be atomic per record is one of the Lua scripts of
//! [`scripts`](crate::scripts). The connection is a [`ConnectionManager`]: one multiplexed
//! connection shared by every clone of the store, re-established by itself when the server
//! restarts or the network drops (calls made meanwhile fail with a retryable error).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{RedisResult, Value};
use shardlease_core::store::{
    CorruptRecord, CreateOutcome, Lease, LeaseStore, Listing, Version, VersionedLease, WorkerRecord,
};
use shardlease_core::{Error, LeaseKey, Namespace, Result, WorkerId};
use tracing::debug;
use url::Url;

use crate::codec::{self, Fields};
use crate::errors::{backend, unexpected};
use crate::keys::Keys;
use crate::scripts::Scripts;
use shardlease_core::store::url::{self as store_url, redact_url, QueryOptions, NAMESPACE_OPTION};
use shardlease_core::store::Redactor;

/// The key prefix used unless another is configured.
pub const DEFAULT_KEY_PREFIX: &str = "shardlease";

/// The namespace used when the URL or builder names none (defined once, in core).
pub use shardlease_core::DEFAULT_NAMESPACE;

/// How many index entries one listing page reads, unless configured.
pub const DEFAULT_PAGE_SIZE: usize = 500;

/// How long one command may take before it fails (retryably), unless configured.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long connecting may take before it fails (retryably), unless configured.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// URL query parameters this crate reads (and strips before handing the URL to the driver).
const KEY_PREFIX_PARAM: &str = "key_prefix";

/// A [`LeaseStore`] on Redis, for one namespace.
///
/// Cheap to clone: clones share one connection manager. Build it with [`RedisStore::connect`],
/// [`RedisStore::builder`] or [`RedisStore::from_manager`].
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
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

/// Builds a [`RedisStore`]: see [`RedisStore::builder`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    url: String,
    namespace: Option<String>,
    key_prefix: Option<String>,
    page_size: usize,
    response_timeout: Duration,
    connection_timeout: Duration,
    /// PEM root certificates trusted for `rediss://` instead of the system's.
    #[cfg(feature = "tls")]
    tls_root_pem: Option<Vec<u8>>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("url", &redact_url(&self.url))
            .field("namespace", &self.namespace)
            .field("key_prefix", &self.key_prefix)
            .field("page_size", &self.page_size)
            .field("response_timeout", &self.response_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The namespace (application name) the store reads and writes. Overrides a `namespace`
    /// query parameter of the URL; the default is [`DEFAULT_NAMESPACE`].
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The first part of every key's hash tag (default [`DEFAULT_KEY_PREFIX`]), to keep
    /// shardlease's keys apart from other data in the same database. Overrides a `key_prefix`
    /// query parameter of the URL.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// How many leases one listing page reads (default [`DEFAULT_PAGE_SIZE`], at least 1).
    pub fn page_size(mut self, n: usize) -> Self {
        self.page_size = n.max(1);
        self
    }

    /// How long one command may take (default [`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// How long one connection attempt may take (default [`DEFAULT_CONNECTION_TIMEOUT`]).
    pub fn connection_timeout(mut self, d: Duration) -> Self {
        self.connection_timeout = d;
        self
    }

    /// Trusts these PEM root certificates for `rediss://` instead of the system's (a private
    /// CA, typically). Only with the `tls` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_pem = Some(pem.into());
        self
    }

    /// Connects to the server and returns the store. Fails with `Error::Config` for a malformed
    /// URL or options, and `Error::Backend` when the server cannot be reached (retryable) or
    /// refuses the credentials (permanent). No message ever holds the password.
    pub async fn connect(self) -> Result<RedisStore> {
        let parsed = parse_url(&self.url)?;
        let redactor = store_url::redactor(parsed.url.as_str());
        let target = redact_url(parsed.url.as_str());
        let namespace =
            self.namespace.or(parsed.namespace).unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        let key_prefix =
            self.key_prefix.or(parsed.key_prefix).unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_owned());
        let namespace = Namespace::new(namespace)?;
        validate_key_prefix(&key_prefix)?;
        if parsed.url.scheme() == "rediss" {
            prepare_tls()?;
        }
        #[cfg(feature = "tls")]
        let client = match self.tls_root_pem {
            Some(root) => redis::Client::build_with_tls(
                parsed.url.as_str(),
                redis::TlsCertificates { client_tls: None, root_cert: Some(root) },
            ),
            None => redis::Client::open(parsed.url.as_str()),
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(parsed.url.as_str());
        let client = client.map_err(|e| {
            Error::Config(format!(
                "Redis URL {target} is not usable: {}",
                redactor.scrub(&e.to_string())
            ))
        })?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| backend(&redactor, &format!("connecting to {target}"), e))?;
        debug!(target = %target, namespace = %namespace, "connected to Redis");
        Ok(RedisStore::assemble(conn, namespace, key_prefix, target, self.page_size, redactor))
    }
}

/// A URL taken apart: what the driver gets, and the options this crate reads from it.
struct ParsedUrl {
    url: Url,
    namespace: Option<String>,
    key_prefix: Option<String>,
}

fn parse_url(raw: &str) -> Result<ParsedUrl> {
    let mut url = Url::parse(raw).map_err(|e| {
        Error::Config(format!(
            "malformed Redis URL ({e}); expected redis://[:password@]host[:port][/db] or rediss://…"
        ))
    })?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(Error::Config(format!(
            "a Redis URL starts with redis:// or rediss://, not {}://",
            url.scheme()
        )));
    }
    let mut options = QueryOptions::from_url("Redis", &url)?;
    let namespace = options.string(NAMESPACE_OPTION)?;
    let key_prefix = options.string(KEY_PREFIX_PARAM)?;
    let rest = options.into_rest();
    if rest.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(rest);
    }
    Ok(ParsedUrl { url, namespace, key_prefix })
}

/// Checks a key prefix (the namespace is checked by [`Namespace::new`]; Redis keys take any
/// bytes, so the store adds no limit of its own).
fn validate_key_prefix(key_prefix: &str) -> Result<()> {
    if key_prefix.chars().any(char::is_control) {
        return Err(Error::Config("the key prefix must not contain control characters".into()));
    }
    Ok(())
}

/// Makes `rediss://` work: rustls needs a process-wide crypto provider, and panics at connect
/// time when several are compiled in and none was chosen; pick aws-lc-rs unless one is set.
#[cfg(feature = "tls")]
fn prepare_tls() -> Result<()> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Fails only when another thread installed one first, which is just as good.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
    Ok(())
}

#[cfg(not(feature = "tls"))]
fn prepare_tls() -> Result<()> {
    Err(Error::Config(
        "rediss:// (TLS) needs the `tls` feature of shardlease-redis (or `redis-tls` of shardlease)"
            .into(),
    ))
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
    /// Connects to `url` (`redis://[[user]:password@]host[:port][/db]`, or `rediss://` with the
    /// `tls` feature) and opens `namespace` with the default options.
    pub async fn connect(url: &str, namespace: &str) -> Result<RedisStore> {
        RedisStore::builder(url).namespace(namespace).connect().await
    }

    /// A builder for a store on `url`, for options beyond the namespace.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            namespace: None,
            key_prefix: None,
            page_size: DEFAULT_PAGE_SIZE,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            #[cfg(feature = "tls")]
            tls_root_pem: None,
        }
    }

    /// A store for `namespace` over an existing connection manager, with the default key prefix.
    pub fn from_manager(manager: ConnectionManager, namespace: &str) -> Result<RedisStore> {
        RedisStore::from_manager_with_prefix(manager, namespace, DEFAULT_KEY_PREFIX)
    }

    /// A store for `namespace` over an existing connection manager, under `key_prefix`.
    pub fn from_manager_with_prefix(
        manager: ConnectionManager,
        namespace: &str,
        key_prefix: &str,
    ) -> Result<RedisStore> {
        let namespace = Namespace::new(namespace)?;
        validate_key_prefix(key_prefix)?;
        Ok(RedisStore::assemble(
            manager,
            namespace,
            key_prefix.to_owned(),
            "<connection manager>".to_owned(),
            DEFAULT_PAGE_SIZE,
            Redactor::default(),
        ))
    }

    fn assemble(
        conn: ConnectionManager,
        namespace: Namespace,
        key_prefix: String,
        target: String,
        page_size: usize,
        redactor: Redactor,
    ) -> RedisStore {
        let keys = Keys::new(&key_prefix, namespace.as_str());
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
            }),
        }
    }

    /// The namespace this store reads and writes.
    pub fn namespace(&self) -> &Namespace {
        &self.inner.namespace
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

    /// A clone of the connection manager (to run other commands on the same connection).
    pub fn manager(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Deletes every key of this namespace (leases, worker records, indexes, version counter),
    /// found with `SCAN` and removed with `UNLINK` in batches. Returns how many keys went.
    /// For tests and for operators retiring an application; running workers would recreate
    /// their records.
    pub async fn delete_namespace(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let pattern = self.inner.keys.scan_pattern();
        let mut cursor: u64 = 0;
        let mut removed = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
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
    /// pipelined `HGETALL` per member. Members added or removed meanwhile may or may not be
    /// listed; every member present throughout is listed exactly once. A member whose hash has
    /// vanished is skipped; one that cannot be decoded is reported as corrupt.
    async fn list_index<T>(
        &self,
        what: &str,
        index: String,
        hash_key: impl Fn(&str) -> String,
        decode: impl Fn(&str, &Fields) -> std::result::Result<T, String>,
    ) -> Result<Listing<T>> {
        let mut conn = self.conn.clone();
        let mut listing = Listing { items: Vec::new(), corrupt: Vec::new() };
        let mut start: Vec<u8> = b"-".to_vec();
        let page = self.inner.page_size;
        loop {
            let members: Vec<Vec<u8>> = redis::cmd("ZRANGEBYLEX")
                .arg(&index)
                .arg(&start)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(page)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err(&format!("listing {what}"), e))?;
            let Some(last) = members.last() else { break };
            let mut next = Vec::with_capacity(last.len() + 1);
            next.push(b'(');
            next.extend_from_slice(last);
            let names: Vec<std::result::Result<&str, String>> = members
                .iter()
                .map(|m| {
                    std::str::from_utf8(m).map_err(|_| String::from_utf8_lossy(m).into_owned())
                })
                .collect();
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for name in names.iter().flatten() {
                pipe.cmd("HGETALL").arg(hash_key(name));
            }
            let replies: Vec<RedisResult<Value>> = if pipe.is_empty() {
                Vec::new()
            } else {
                pipe.query_async(&mut conn)
                    .await
                    .map_err(|e| self.err(&format!("reading a page of {what}"), e))?
            };
            let mut replies = replies.into_iter();
            for name in names {
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
                match reply {
                    Err(e) if e.code() == Some("WRONGTYPE") => {
                        listing.corrupt.push(corrupt(wrong_type(&hash_key(name), "another type")));
                    }
                    Err(e) => return Err(self.err(&format!("reading {what} {name}"), e)),
                    Ok(v) => match codec::fields_of(&v) {
                        Ok(fields) if fields.is_empty() => {} // deleted since the index was read
                        Ok(fields) => match decode(name, &fields) {
                            Ok(item) => listing.items.push(item),
                            Err(reason) => listing.corrupt.push(corrupt(reason)),
                        },
                        Err(reason) => listing.corrupt.push(corrupt(reason)),
                    },
                }
            }
            if members.len() < page {
                break;
            }
            start = next;
        }
        Ok(listing)
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

/// Flattens field/value pairs into script arguments.
fn flatten(pairs: Vec<(&'static str, String)>) -> Vec<String> {
    pairs.into_iter().flat_map(|(k, v)| [k.to_owned(), v]).collect()
}

#[async_trait]
impl LeaseStore for RedisStore {
    async fn create_lease(&self, lease: &Lease) -> Result<CreateOutcome> {
        let fields = codec::lease_fields(lease).map_err(Error::InvalidInput)?;
        let mut args = vec![Version::random().0.to_string()];
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
        self.list_index("leases", keys.lease_index(), |k| keys.lease(k), codec::decode_lease).await
    }

    async fn update_lease(&self, lease: &Lease, expected: Version) -> Result<Version> {
        let fields = codec::lease_fields(lease).map_err(Error::InvalidInput)?;
        let new_version = Version::random_other_than(expected);
        let mut args = vec![expected.0.to_string(), new_version.0.to_string()];
        args.extend(flatten(fields));
        let script = &self.inner.scripts.update;
        match self.run_lease_script("update", script, &lease.key, &args).await? {
            Reply::Version(v) => Ok(v),
            other => Err(self.conflict(&lease.key, other)),
        }
    }

    async fn delete_lease(&self, key: &LeaseKey, expected: Version) -> Result<()> {
        let script = &self.inner.scripts.delete;
        match self.run_lease_script("delete", script, key, &[expected.0.to_string()]).await? {
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
            .arg(WorkerRecord::last_beat_of_process(record.beat).to_string());
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
        let keys = &self.inner.keys;
        self.list_index("workers", keys.worker_index(), |id| keys.worker(id), codec::decode_worker)
            .await
    }

    async fn remove_worker(&self, id: &WorkerId) -> Result<()> {
        let keys = &self.inner.keys;
        let mut conn = self.conn.clone();
        let _: Value = redis::pipe()
            .atomic()
            .cmd("DEL")
            .arg(keys.worker(id.as_str()))
            .ignore()
            .cmd("ZREM")
            .arg(keys.worker_index())
            .arg(id.as_str())
            .ignore()
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
            .arg(beat.to_string());
        let mut conn = self.conn.clone();
        let removed: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(&format!("removing worker {id} at beat {beat}"), e))?;
        Ok(removed == 1)
    }

    fn namespace(&self) -> Option<Namespace> {
        Some(self.inner.namespace.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_give_up_their_options_and_keep_the_rest() {
        let p =
            parse_url("redis://:pw@h:1/2?namespace=orders&key_prefix=sl&protocol=resp3").unwrap();
        assert_eq!(p.namespace.as_deref(), Some("orders"));
        assert_eq!(p.key_prefix.as_deref(), Some("sl"));
        assert_eq!(p.url.as_str(), "redis://:pw@h:1/2?protocol=resp3");
        let p = parse_url("rediss://h/?namespace=x").unwrap();
        assert_eq!(p.url.as_str(), "rediss://h/");
        for bad in [
            "http://h/",
            "not a url :pw@",
            "redis://:s3cr3t@[bad/",
            "redis://:s3cr3t@h/?namespace=a&namespace=b",
        ] {
            match parse_url(bad) {
                Err(Error::Config(m)) => assert!(!m.contains("s3cr3t"), "{m}"),
                _ => panic!("{bad} must be refused"),
            }
        }
    }

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
}
