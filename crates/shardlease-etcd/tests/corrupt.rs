//! Values that do not decode (not JSON, another format number, a document naming another record)
//! are reported as `Error::Corrupt` / `Listing::corrupt` for that record only: nothing panics,
//! and every other lease and worker keeps working, also across listing pages and for a running
//! worker. The cases live in `shardlease_testkit::extensions::corrupt`; this file says how to
//! damage an etcd value. Runs on the server named by `SHARDLEASE_TEST_ETCD_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use async_trait::async_trait;
use common::EtcdFactory;
use shardlease_core::store::{Lease, Version};
use shardlease_core::{Error, LeaseKey, Position, Result, WorkerId};
use shardlease_etcd::EtcdStore;
use shardlease_testkit::extensions::{CorruptRecords, Corruption};

/// The shared test server's factory (no watch), with pages of two so damaged records fall on
/// several.
async fn corrupting() -> Option<EtcdFactory> {
    let url = common::factory().await?.url().to_owned();
    Some(EtcdFactory::new(url, false).with_page_size(2))
}

async fn put(store: &EtcdStore, key: String, value: Vec<u8>) -> Result<()> {
    let r = store.client().kv_client().put(key, value, None).await;
    r.map(|_| ()).map_err(|e| Error::permanent(format!("raw put: {e}")))
}

#[async_trait]
impl CorruptRecords for EtcdFactory {
    fn lease_corruptions(&self) -> Vec<Corruption> {
        vec![
            Corruption::new("garbled", "not a lease"),
            Corruption::new("format-9", "format 9"),
            // A document naming another record.
            Corruption::new("elsewhere", ""),
        ]
    }

    fn worker_corruptions(&self) -> Vec<Corruption> {
        vec![Corruption::new("w-bad", "")]
    }

    async fn corrupt_lease(&self, ns: &str, key: &LeaseKey, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        let encode = |key: &str| {
            shardlease_etcd::codec::encode_lease(&Lease::new(key, Position::Latest), Version(5))
        };
        let value = match damage.name {
            "garbled" => b"{not json \xff".to_vec(),
            "format-9" => String::from_utf8(encode(key.as_str()))
                .unwrap()
                .replace("\"format\":1", "\"format\":9")
                .into_bytes(),
            "elsewhere" => encode("someone-else"),
            other => panic!("no such damage: {other}"),
        };
        put(&store, store.lease_etcd_key(key), value).await
    }

    async fn corrupt_worker(&self, ns: &str, id: &WorkerId, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        assert_eq!(damage.name, "w-bad");
        put(&store, store.worker_etcd_key(id), b"[]".to_vec()).await
    }
}

shardlease_testkit::corrupt_record_tests!(corrupting());
