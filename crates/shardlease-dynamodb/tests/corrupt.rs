//! Items that do not decode (an attribute of the wrong type, a missing attribute, a garbled
//! checkpoint, an item written by someone else) are reported as `Error::Corrupt` /
//! `Listing::corrupt` for that key only: nothing panics, and every other lease and worker keeps
//! working, for the store and for a running worker. The cases live in
//! `shardlease_testkit::extensions::corrupt`; this file says how to damage a DynamoDB item. Runs
//! on the emulator named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, LeaseKey, Result, WorkerId};
use shardlease_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use shardlease_dynamodb::DynamoDbStore;
use shardlease_testkit::extensions::{CorruptRecords, Corruption};
use shardlease_testkit::StoreFactory;

/// A factory over a table of its own, with pages of two so damaged items fall on several.
struct Corrupting {
    inner: common::DynamoFactory,
    table: String,
}

impl Corrupting {
    async fn open(&self, namespace: &str) -> Result<DynamoDbStore> {
        let builder = self.inner.builder(&self.table).namespace(namespace).create_table(true);
        builder.page_size(2).connect().await
    }

    /// Runs `UpdateItem` with `expression` on the item `sk` under `pk`, by hand.
    async fn update(
        &self,
        pk: &str,
        sk: &str,
        expression: &str,
        value: Option<&str>,
    ) -> Result<()> {
        let store = self.inner.builder(&self.table).connect().await?;
        let mut call = store
            .client()
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .update_expression(expression);
        if let Some(v) = value {
            call = call.expression_attribute_values(":v", s(v));
        }
        call.send().await.map(|_| ()).map_err(|e| Error::permanent(format!("raw update: {e:?}")))
    }
}

async fn corrupting() -> Option<Corrupting> {
    let endpoint = common::endpoint()?;
    let table = common::fresh_table("corrupt");
    Some(Corrupting { inner: common::DynamoFactory::new(endpoint, &table), table })
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

#[async_trait]
impl StoreFactory for Corrupting {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.open(namespace).await?))
    }
    async fn cleanup(&self, namespace: &str) -> Result<()> {
        self.inner.cleanup(namespace).await
    }
    fn name(&self) -> String {
        self.inner.name()
    }
    fn timing_scale(&self) -> u32 {
        self.inner.timing_scale()
    }
}

#[async_trait]
impl CorruptRecords for Corrupting {
    fn lease_corruptions(&self) -> Vec<Corruption> {
        vec![
            Corruption::new("wrong-type", "epoch").repairable(),
            Corruption::new("missing", "epoch"),
            Corruption::new("garbled", "checkpoint"),
            // Written by someone else entirely: no version at all, a number where a list goes.
            Corruption::new("stranger", "version"),
        ]
    }

    fn worker_corruptions(&self) -> Vec<Corruption> {
        vec![
            Corruption::new("garbled-beat", "beat").repairable(),
            Corruption::new("no-count", "lease_count").beat_intact(),
            Corruption::new("garbled-loads", "lease_loads").repairable().beat_intact(),
        ]
    }

    async fn corrupt_lease(&self, ns: &str, key: &LeaseKey, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        let (pk, sk) = (store.lease_partition_key(), key.as_str());
        match damage.name {
            "wrong-type" => self.update(pk, sk, "SET epoch = :v", Some("seven")).await,
            "missing" => self.update(pk, sk, "REMOVE epoch", None).await,
            "garbled" => self.update(pk, sk, "SET checkpoint = :v", Some("{not json")).await,
            "stranger" => {
                let mut item = HashMap::new();
                item.insert("pk".to_owned(), s(pk));
                item.insert("sk".to_owned(), s(sk));
                item.insert("parents".to_owned(), AttributeValue::N("1".into()));
                self.inner.put_raw(&store, item).await;
                Ok(())
            }
            other => panic!("no such damage: {other}"),
        }
    }

    async fn corrupt_worker(&self, ns: &str, id: &WorkerId, damage: &Corruption) -> Result<()> {
        let store = self.open(ns).await?;
        let (pk, sk) = (store.worker_partition_key(), id.as_str());
        match damage.name {
            "garbled-beat" => self.update(pk, sk, "SET beat = :v", Some("many")).await,
            "no-count" => self.update(pk, sk, "REMOVE lease_count", None).await,
            "garbled-loads" => self.update(pk, sk, "SET lease_loads = :v", Some("lots s/1")).await,
            other => panic!("no such damage: {other}"),
        }
    }
}

shardlease_testkit::corrupt_record_tests!(corrupting());
