//! # shardlease-etcd
//!
//! A [`LeaseStore`](shardlease_core::store::LeaseStore) on etcd v3 (through the `etcd-client` crate,
//! gRPC), with change notification: an etcd watch lets workers act on a released lease, a claim,
//! a worker that joined or left, or a shard end at once instead of at their next heartbeat or
//! balance pass.
//!
//! Open a store with [`EtcdStore::builder`] (a URL, a list of endpoints, or an
//! `etcd_client::Client` you built, plus options), or through the `shardlease` facade with its
//! `etcd` feature: `shardlease::connect("etcd://127.0.0.1:2379?namespace=orders")`.
//!
//! ```no_run
//! # async fn demo() -> shardlease_core::Result<()> {
//! use shardlease_etcd::EtcdStore;
//! let store = EtcdStore::builder()
//!     .url("etcd://10.0.0.1:2379,10.0.0.2:2379?namespace=orders")
//!     .watch(false)
//!     .connect()
//!     .await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! The URL's options, each of which the builder has too (a value set on the builder wins):
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]...][/][?option=value&...]
//! etcds://...            TLS (needs this crate's `tls` feature; `etcd-tls` on the facade)
//!
//! namespace=NAME         the namespace, default `default`
//! prefix=PREFIX          key prefix, default `shardlease`
//! page_size=N            records per range request when listing, default 500 (at least 1)
//! timeout_ms=N           per-request timeout, default 5000 (1 to 3600000)
//! connect_timeout_ms=N   default 5000 (1 to 3600000)
//! tls=true               TLS with an etcd:// URL
//! ca_file=PATH           PEM of the CA to trust for TLS (the platform's roots otherwise)
//! cert_file=PATH         PEM client certificate for TLS (with key_file; for servers run
//! key_file=PATH          with --client-cert-auth)
//! watch=false            no change notification: the worker runs as on any other store
//!                        (an option given twice, or one not listed here, is refused)
//! ```
//!
//! The password never appears in an error, a log line or `Debug` output ([`redact_url`]).
//!
//! ## Layout, encoding, versions
//!
//! One key per lease and per worker record: `<prefix>/<namespace>/lease/<lease key>` and
//! `<prefix>/<namespace>/worker/<worker id>` (a `/` or `%` in the namespace is escaped, so no
//! namespace's range holds another's keys). Values are JSON documents with a `format` number (see
//! [`codec`]); a value that does not decode is `Error::Corrupt` for that key, never a panic.
//!
//! A lease's [`Version`](shardlease_core::store::Version) is a random 63-bit number the writer draws for
//! every write and stores in the value; it is not the key's `mod_revision`, because etcd restored
//! from a snapshot (without `--bump-revision`) hands out revisions it already gave, so a revision
//! can repeat for a key with other contents. Compare-and-set is one `Txn` comparing the key's
//! value with the bytes last seen at the expected version (the version is in those bytes, so
//! equal bytes mean the same write); create-if-absent compares `create_revision` with 0; a failed
//! compare returns the current record in the same round trip. The batch writes
//! (`update_leases`, `create_leases`) are one `Txn` per chunk of up to [`MAX_TXN_OPS`] items,
//! each item still judged on its own. Listings page with range limits, all pages read at the
//! first page's revision.
//!
//! ## Change notification
//!
//! [`LeaseStore::subscribe_changes`](shardlease_core::store::LeaseStore::subscribe_changes) reads the
//! namespace's leases once and opens one etcd watch on the namespace's prefix from the next
//! revision (the stream keeps each lease's previous state itself rather than asking etcd for
//! `prev_kv`), turned into `shardlease_core::store::StoreChange` notices; the core decides which call
//! for a listing (ownership changes, not checkpoints). Each worker holds one watch; every write
//! in the namespace (checkpoints and heartbeats included) is sent to every worker's watch.
//! `watch=false` (or [`EtcdStoreBuilder::watch`]) turns it off.
//!
//! ## Guides
//!
//! The [etcd guide][etcd] has the details and the measured figures; [choosing a
//! store][choosing-a-store] compares the stores, [TLS][tls] has the certificate options.
//!
//! [choosing-a-store]: https://github.com/shardlease/shardlease/blob/main/docs/choosing-a-store.md
//! [etcd]: https://github.com/shardlease/shardlease/blob/main/docs/etcd.md
//! [tls]: https://github.com/shardlease/shardlease/blob/main/docs/tls.md

#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
pub mod codec;
mod config;
mod connection;
mod errors;
mod keys;
mod store;
mod watch;

pub use builder::EtcdStoreBuilder;
pub use config::{
    redact_url, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEY_PREFIX, DEFAULT_PAGE_SIZE, DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT,
};
pub use store::batch::{MAX_TXN_BYTES, MAX_TXN_OPS, TXN_ATTEMPTS};
pub use store::EtcdStore;

/// Re-export of the `etcd-client` crate, so a client given to [`EtcdStoreBuilder::client`] is of
/// the same version this crate was built with.
pub use etcd_client;
