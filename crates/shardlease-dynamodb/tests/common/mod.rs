//! Helpers shared by the integration tests: the conformance factory over the DynamoDB emulator
//! named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT` (moto's server, started by `scripts/services.sh`),
//! raw item access for the corruption and rollback tests, and a fresh table name per test.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use shardlease_core::store::VersionedLease;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::store::{Lease, LeaseStore, Version};
use shardlease_core::{Error, Result};
use shardlease_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use shardlease_dynamodb::{DynamoDbStore, DynamoDbStoreBuilder};
use shardlease_testkit::suite::{env_or_skip, fresh_namespace};
use shardlease_testkit::StoreFactory;

/// The variable naming the emulator's endpoint.
pub const ENDPOINT_VAR: &str = "SHARDLEASE_TEST_DYNAMODB_ENDPOINT";

/// The dummy keys the emulator accepts.
pub const KEY_ID: &str = "test-key-id";
pub const SECRET: &str = "test-secret";

/// The conformance suite's factory: one store per namespace in one shared table.
pub struct DynamoFactory {
    endpoint: String,
    table: String,
    /// Whether the stores write batches as `TransactWriteItems`.
    transact: bool,
}

impl DynamoFactory {
    /// A factory over the emulator at `endpoint`, on `table`.
    pub fn new(endpoint: String, table: &str) -> Self {
        DynamoFactory { endpoint, table: table.to_owned(), transact: false }
    }

    /// This factory, its stores writing batches as `TransactWriteItems`.
    pub fn transact_batches(mut self) -> Self {
        self.transact = true;
        self
    }

    /// The emulator's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A builder for `table` on the emulator, with the test keys and region.
    pub fn builder(&self, table: &str) -> DynamoDbStoreBuilder {
        DynamoDbStore::builder()
            .table(table)
            .endpoint_url(&self.endpoint)
            .region("us-east-1")
            .credentials(KEY_ID, SECRET, None)
            .attempt_timeout(Duration::from_secs(30))
            .transact_batches(self.transact)
    }

    /// A store for `namespace` in the factory's table (created when missing).
    pub async fn open(&self, namespace: &str) -> Result<DynamoDbStore> {
        self.builder(&self.table).namespace(namespace).create_table(true).connect().await
    }

    /// Replaces an attribute of a lease item by hand (no condition).
    pub async fn set_lease_attribute(
        &self,
        store: &DynamoDbStore,
        key: &str,
        name: &str,
        value: AttributeValue,
    ) {
        store
            .client()
            .update_item()
            .table_name(store.table())
            .key("pk", AttributeValue::S(store.lease_partition_key().to_owned()))
            .key("sk", AttributeValue::S(key.to_owned()))
            .update_expression("SET #a = :v")
            .expression_attribute_names("#a", name)
            .expression_attribute_values(":v", value)
            .send()
            .await
            .unwrap_or_else(|e| panic!("raw update of {key}.{name}: {e:?}"));
    }

    /// Writes an item by hand (no condition).
    pub async fn put_raw(&self, store: &DynamoDbStore, item: HashMap<String, AttributeValue>) {
        store
            .client()
            .put_item()
            .table_name(store.table())
            .set_item(Some(item))
            .send()
            .await
            .unwrap_or_else(|e| panic!("raw put: {e:?}"));
    }
}

#[async_trait]
impl StoreFactory for DynamoFactory {
    async fn store(&self, namespace: &str) -> Result<Arc<dyn LeaseStore>> {
        Ok(Arc::new(self.open(namespace).await?))
    }

    /// Deletes the factory's table (each test has its own), which removes every namespace in
    /// it; a table already deleted by an earlier cleanup of the same test is fine.
    async fn cleanup(&self, _namespace: &str) -> Result<()> {
        delete_table(&self.endpoint, &self.table).await
    }

    fn name(&self) -> String {
        "dynamodb".to_owned()
    }

    /// moto answers a few hundred writes a second on one Python process: the lease-loop cases
    /// run ten times slower than on Redis (1 s heartbeats), with the same checks.
    fn timing_scale(&self) -> u32 {
        10
    }

    /// Writes the content through `store` (its own encoding: an update at the current version,
    /// or a create), then sets the item's `version` attribute by hand with a raw `UpdateItem`.
    async fn restore_raw(
        &self,
        store: &Arc<dyn LeaseStore>,
        namespace: &str,
        lease: &Lease,
        version: Version,
    ) -> Result<bool> {
        match store.get_lease(&lease.key).await? {
            Some(VersionedLease { version: current, .. }) => {
                store.update_lease(lease, current).await?;
            }
            None => {
                store.create_lease(lease).await?;
            }
        }
        let raw = self.open(namespace).await?;
        raw.client()
            .update_item()
            .table_name(raw.table())
            .key("pk", AttributeValue::S(raw.lease_partition_key().to_owned()))
            .key("sk", AttributeValue::S(lease.key.as_str().to_owned()))
            .update_expression("SET #v = :v")
            .condition_expression("attribute_exists(#v)")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":v", AttributeValue::N(version.0.to_string()))
            .send()
            .await
            .map_err(|e| Error::permanent(format!("restore_raw: UpdateItem failed: {e:?}")))?;
        Ok(true)
    }
}

/// The emulator's endpoint, or `None` (skipped; a failure under CI=true).
pub fn endpoint() -> Option<String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    env_or_skip(ENDPOINT_VAR)
}

/// A factory over a table of its own (created on first use, deleted at cleanup), or `None`
/// (skipped; a failure under CI=true). The namespaces one test opens share that table.
pub async fn factory() -> Option<DynamoFactory> {
    endpoint().map(|e| DynamoFactory::new(e, &fresh_table("conformance")))
}

/// Deletes `table` on the emulator at `endpoint`; a missing table is not an error.
pub async fn delete_table(endpoint: &str, table: &str) -> Result<()> {
    let store = DynamoFactory::new(endpoint.to_owned(), table).builder(table).connect().await;
    let store = match store {
        Ok(s) => s,
        Err(Error::Config(_)) => return Ok(()), // already gone
        Err(e) => return Err(e),
    };
    match store.client().delete_table().table_name(table).send().await {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_not_found_exception()) => {
            Ok(())
        }
        Err(e) => Err(Error::permanent(format!("deleting table {table}: {e:?}"))),
    }
}

/// A table name nobody else uses.
pub fn fresh_table(prefix: &str) -> String {
    fresh_namespace(&format!("sl-{prefix}"))
}
