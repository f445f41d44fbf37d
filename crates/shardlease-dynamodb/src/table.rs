//! The table: checking it on connect, creating it on request, and waiting until it is `ACTIVE`.
//!
//! The store never creates a table behind a user's back: a missing table is a `Config` error
//! naming the option that would create it. A created table has the key schema of
//! [`layout`](crate::layout) (`pk` hash, `sk` range, both strings), on-demand billing unless
//! provisioned capacity is asked for. Two processes creating the same table at once is fine: the
//! loser sees `ResourceInUseException` and waits for the winner's table like anyone else.

use std::time::Duration;

use aws_sdk_dynamodb::client::Waiters;
use aws_sdk_dynamodb::operation::describe_table::DescribeTableError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ProvisionedThroughput,
    ScalarAttributeType, TableDescription, TableStatus,
};
use shardlease_core::{Error, Result};
use tracing::info;

use crate::errors::{backend, unexpected};
use crate::layout::{PK, SK};
use crate::store::DynamoDbStore;

/// How a table created by the store is billed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Billing {
    /// Pay per request (on-demand capacity): no capacity planning, no throttling below the
    /// account's limits. The default.
    #[default]
    OnDemand,
    /// Provisioned capacity units (cheaper for a steady, known load; see `docs/dynamodb.md`).
    Provisioned {
        /// Read capacity units.
        read_capacity: u64,
        /// Write capacity units.
        write_capacity: u64,
    },
}

/// What connecting does about the table.
#[derive(Clone, Debug)]
pub(crate) struct TableSetup {
    pub(crate) create: bool,
    pub(crate) billing: Billing,
    pub(crate) ready_timeout: Duration,
}

impl DynamoDbStore {
    /// Checks that the table exists with this crate's key schema, creating it first when
    /// `setup.create` says so, and waits until it is `ACTIVE`.
    pub(crate) async fn ensure_table(&self, setup: &TableSetup) -> Result<()> {
        let table = self.table();
        match self.describe_table().await? {
            Some(t) => check_key_schema(table, &t)?,
            None if setup.create => self.create(setup).await?,
            None => {
                return Err(Error::Config(format!(
                    "DynamoDB {} does not exist; create it (DynamoDbStoreBuilder::create_table, \
                     `create_table=true` in a dynamodb:// URL) or name an existing table",
                    self.target()
                )))
            }
        }
        self.wait_active(setup.ready_timeout).await
    }

    /// The table's description, or `None` when it does not exist.
    async fn describe_table(&self) -> Result<Option<TableDescription>> {
        match self.client().describe_table().table_name(self.table()).send().await {
            Ok(out) => Ok(out.table),
            Err(e)
                if matches!(
                    e.as_service_error(),
                    Some(DescribeTableError::ResourceNotFoundException(_))
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(backend(self.redactor(), &format!("describing {}", self.target()), e)),
        }
    }

    async fn create(&self, setup: &TableSetup) -> Result<()> {
        let attr = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let key = |name: &str, kind: KeyType| {
            KeySchemaElement::builder().attribute_name(name).key_type(kind).build()
        };
        let built = |what: &str, e: aws_sdk_dynamodb::error::BuildError| {
            unexpected(&format!("building the table definition ({what})"), e)
        };
        let mut request = self
            .client()
            .create_table()
            .table_name(self.table())
            .attribute_definitions(attr(PK).map_err(|e| built(PK, e))?)
            .attribute_definitions(attr(SK).map_err(|e| built(SK, e))?)
            .key_schema(key(PK, KeyType::Hash).map_err(|e| built(PK, e))?)
            .key_schema(key(SK, KeyType::Range).map_err(|e| built(SK, e))?);
        request = match setup.billing {
            Billing::OnDemand => request.billing_mode(BillingMode::PayPerRequest),
            Billing::Provisioned { read_capacity, write_capacity } => {
                let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                let throughput = ProvisionedThroughput::builder()
                    .read_capacity_units(to_i64(read_capacity))
                    .write_capacity_units(to_i64(write_capacity))
                    .build()
                    .map_err(|e| built("provisioned throughput", e))?;
                request.billing_mode(BillingMode::Provisioned).provisioned_throughput(throughput)
            }
        };
        match request.send().await {
            Ok(_) => {
                info!(table = self.table(), billing = ?setup.billing, "created DynamoDB table");
                Ok(())
            }
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {
                Ok(()) // someone else is creating it: wait for it below
            }
            Err(e) => Err(backend(self.redactor(), &format!("creating {}", self.target()), e)),
        }
    }

    async fn wait_active(&self, timeout: Duration) -> Result<()> {
        let outcome =
            self.client().wait_until_table_exists().table_name(self.table()).wait(timeout).await;
        match outcome {
            Ok(_) => Ok(()),
            Err(e) => Err(Error::backend(
                true,
                format!(
                    "dynamodb: waiting for {} to become ACTIVE (up to {timeout:?})",
                    self.target()
                ),
                self.redactor()
                    .scrub(&aws_sdk_dynamodb::error::DisplayErrorContext(&e).to_string()),
            )),
        }
    }
}

/// Fails with `Error::Config` unless the table is keyed the way this crate writes.
fn check_key_schema(table: &str, t: &TableDescription) -> Result<()> {
    let keys: Vec<(&str, &KeyType)> =
        t.key_schema().iter().map(|k| (k.attribute_name(), k.key_type())).collect();
    let want = [(PK, &KeyType::Hash), (SK, &KeyType::Range)];
    if keys.len() == 2 && want.iter().all(|w| keys.contains(w)) {
        if t.table_status() == Some(&TableStatus::Deleting) {
            return Err(Error::retryable(format!("dynamodb: table {table} is being deleted")));
        }
        Ok(())
    } else {
        Err(Error::Config(format!(
            "DynamoDB table {table} is not a shardlease lease table: its key is {keys:?}, expected \
             `{PK}` (hash, string) and `{SK}` (range, string)"
        )))
    }
}
