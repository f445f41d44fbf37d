//! Reading a KCL lease table: the DynamoDB client (the SDK's default credential chain, with
//! the region and endpoint the command line gives), a full consistent scan turned into plain
//! [`Item`]s, and the comparison of two scans that tells a running KCL fleet from a stopped one.
//! Messages name the table, region and endpoint, never a credential.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;

use super::schema::{Attr, Item, Schema};
use crate::error::CliError;

/// Where the KCL table is.
#[derive(Clone, Debug)]
pub struct TableRef {
    /// The table name (the KCL application name, by default).
    pub table: String,
    /// The AWS region (else the SDK's chain: AWS_REGION, the profile).
    pub region: Option<String>,
    /// The endpoint, for emulators (else AWS_ENDPOINT_URL_DYNAMODB or AWS).
    pub endpoint_url: Option<String>,
}

/// A DynamoDB client for `t`.
pub async fn client(t: &TableRef) -> Result<Client, CliError> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(r) = &t.region {
        loader = loader.region(aws_config::Region::new(r.clone()));
    }
    if let Some(e) = &t.endpoint_url {
        loader = loader.endpoint_url(e.clone());
    }
    let sdk = loader
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .operation_attempt_timeout(Duration::from_secs(10))
                .build(),
        )
        .load()
        .await;
    if sdk.region().is_none() {
        return Err(CliError::Usage(
            "no AWS region for the KCL table: pass --region or set AWS_REGION".into(),
        ));
    }
    Ok(Client::new(&sdk))
}

/// Every item of the table (a consistent scan, paged).
pub async fn scan(client: &Client, t: &TableRef) -> Result<Vec<Item>, CliError> {
    let mut items = Vec::new();
    let mut start: Option<std::collections::HashMap<String, AttributeValue>> = None;
    loop {
        let reply = client
            .scan()
            .table_name(&t.table)
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .map_err(|e| {
                let text = DisplayErrorContext(&e).to_string();
                let missing = e.as_service_error().is_some_and(
                    aws_sdk_dynamodb::operation::scan::ScanError::is_resource_not_found_exception,
                );
                let place = match &t.endpoint_url {
                    Some(u) => format!(" at {}", shardlease::redact_url(u)),
                    None => String::new(),
                };
                if missing {
                    CliError::NotFound(format!("no KCL lease table {}{place}", t.table))
                } else {
                    CliError::Source(format!(
                        "cannot scan the KCL table {}{place}: {text}",
                        t.table
                    ))
                }
            })?;
        items.extend(reply.items().iter().map(convert));
        match reply.last_evaluated_key() {
            Some(k) if !k.is_empty() => start = Some(k.clone()),
            _ => break,
        }
    }
    Ok(items)
}

fn convert(raw: &std::collections::HashMap<String, AttributeValue>) -> Item {
    raw.iter()
        .map(|(k, v)| {
            let a = match v {
                AttributeValue::S(s) => Attr::S(s.clone()),
                AttributeValue::N(n) => Attr::N(n.clone()),
                AttributeValue::Ss(v) => Attr::Ss(v.clone()),
                AttributeValue::Bool(_) => Attr::Other("a boolean"),
                AttributeValue::B(_) => Attr::Other("binary"),
                AttributeValue::L(_) => Attr::Other("a list"),
                AttributeValue::M(_) => Attr::Other("a map"),
                AttributeValue::Null(_) => Attr::Other("null"),
                AttributeValue::Ns(_) => Attr::Other("a number set"),
                AttributeValue::Bs(_) => Attr::Other("a binary set"),
                _ => Attr::Other("an unknown type"),
            };
            (k.clone(), a)
        })
        .collect()
}

/// What a live KCL worker changes in its rows, per key: the renewal attribute, the checkpoint
/// and the owner.
fn fingerprints(schema: Schema, items: &[Item]) -> BTreeMap<String, Vec<Option<Attr>>> {
    let watched: &[&str] = match schema {
        Schema::Java => {
            &["leaseCounter", "checkpoint", "checkpointSubSequenceNumber", "leaseOwner"]
        }
        Schema::Go => &["LeaseTimeout", "Checkpoint", "AssignedTo"],
    };
    items
        .iter()
        .filter_map(|i| {
            let key = match i.get(schema.key_attribute()) {
                Some(Attr::S(k)) => k.clone(),
                _ => return None,
            };
            Some((key, watched.iter().map(|w| i.get(*w).cloned()).collect()))
        })
        .collect()
}

/// The first sign, between two scans, that a KCL worker is running: a lease whose renewal
/// attribute, checkpoint or owner moved, or one that appeared or vanished.
pub fn movement(schema: Schema, before: &[Item], after: &[Item]) -> Option<String> {
    let a = fingerprints(schema, before);
    let b = fingerprints(schema, after);
    let renewal = schema.renewal_attribute();
    for (key, now) in &b {
        match a.get(key) {
            None => return Some(format!("lease {key} appeared")),
            Some(was) if was.first() != now.first() => {
                return Some(format!("the {renewal} of lease {key} moved"))
            }
            Some(was) if was != now => {
                return Some(format!("the checkpoint or owner of lease {key} changed"))
            }
            Some(_) => {}
        }
    }
    a.keys().find(|k| !b.contains_key(*k)).map(|k| format!("lease {k} vanished"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, counter: &str) -> Item {
        [
            ("leaseKey".to_owned(), Attr::S(key.into())),
            ("leaseCounter".to_owned(), Attr::N(counter.into())),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn movement_is_seen_in_renewals_and_rows() {
        let before = vec![row("a", "1"), row("b", "4")];
        assert_eq!(movement(Schema::Java, &before, &before), None);
        let renewed = vec![row("a", "2"), row("b", "4")];
        let m = movement(Schema::Java, &before, &renewed).unwrap_or_default();
        assert!(m.contains("leaseCounter of lease a"), "{m}");
        let fewer = vec![row("a", "1")];
        assert!(movement(Schema::Java, &before, &fewer).is_some());
        let more = vec![row("a", "1"), row("b", "4"), row("c", "0")];
        assert!(movement(Schema::Java, &before, &more).is_some());
    }
}
