//! The `dynamodb://` URL of the facade, read into the builder's options (a builder holding only
//! what the URL says, which [`DynamoDbStoreBuilder`]'s own values are then laid over). Errors
//! never echo the keys a URL may hold.

use shardlease_core::store::url::{self as store_url, redact_url, QueryOptions, NAMESPACE_OPTION};
use shardlease_core::{Error, Result};
use url::Url;

use super::DynamoDbStoreBuilder;
use crate::table::Billing;

/// The most read or write capacity units a URL may ask for.
const MAX_CAPACITY: u64 = 1_000_000;

/// The longest attempt timeout a URL may set (an hour), in milliseconds.
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Query parameters of a `dynamodb://` URL.
const PARAMS: &[&str] = &[
    "namespace",
    "region",
    "endpoint",
    "ca_file",
    "profile",
    "create_table",
    "billing",
    "read_capacity",
    "write_capacity",
    "page_size",
    "max_attempts",
    "attempt_timeout_ms",
    "session_token",
];

/// What a URL `dynamodb://[access_key_id:secret_access_key@]table?region=...&endpoint=...&
/// ca_file=...&namespace=...&profile=...&create_table=true&billing=on-demand|provisioned&read_capacity=N&
/// write_capacity=N&page_size=N&max_attempts=N&attempt_timeout_ms=N&session_token=...` sets, as
/// a builder with only those values. Errors never echo the keys.
pub(super) fn parse_url(raw: &str) -> Result<DynamoDbStoreBuilder> {
    let shown = redact_url(raw);
    let url = Url::parse(raw).map_err(|e| {
        Error::Config(format!(
            "malformed DynamoDB URL {shown} ({e}); expected dynamodb://table?region=...&endpoint=..."
        ))
    })?;
    if url.scheme() != "dynamodb" {
        return Err(Error::Config(format!(
            "a DynamoDB URL starts with dynamodb://, not {}://",
            url.scheme()
        )));
    }
    let table = url.host_str().unwrap_or_default();
    if table.is_empty() {
        return Err(Error::Config(format!(
            "the DynamoDB URL {shown} names no table (dynamodb://TABLE)"
        )));
    }
    let mut b = DynamoDbStoreBuilder::default().table(table);
    if let Some((key_id, secret)) = store_url::credentials(&url) {
        if secret.is_empty() {
            return Err(Error::Config(format!(
                "the DynamoDB URL {shown} has an access key id but no secret key (KEY:SECRET@table)"
            )));
        }
        b = b.credentials(key_id, secret, None);
    }
    let mut q = QueryOptions::from_url("DynamoDB", &url)?;
    b.namespace = q.string(NAMESPACE_OPTION)?;
    b.region = q.non_empty("region")?;
    b.endpoint = q.non_empty("endpoint")?;
    b.ca_file = q.non_empty("ca_file")?;
    b.profile = q.non_empty("profile")?;
    b.create_table = q.bool("create_table")?;
    let provisioned = match q.string("billing")?.as_deref() {
        None => None,
        Some("on-demand" | "on_demand" | "pay-per-request" | "PAY_PER_REQUEST") => Some(false),
        Some("provisioned" | "PROVISIONED") => Some(true),
        Some(other) => {
            return Err(Error::Config(format!(
                "DynamoDB URL option `billing` must be on-demand or provisioned, not {:?}",
                other.chars().take(40).collect::<String>()
            )))
        }
    };
    let read = q.integer("read_capacity", 1..=MAX_CAPACITY)?;
    let write = q.integer("write_capacity", 1..=MAX_CAPACITY)?;
    let u32_max = u64::from(u32::MAX);
    b.page_size =
        q.integer("page_size", 1..=u32_max)?.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    b.max_attempts =
        q.integer("max_attempts", 1..=u32_max)?.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    b.attempt_timeout = q.millis("attempt_timeout_ms", 1..=MAX_TIMEOUT_MS)?;
    if let Some(token) = q.string("session_token")? {
        if let Some(k) = b.keys.as_mut() {
            k.session_token = Some(token);
        }
    }
    q.finish(PARAMS)?;
    if provisioned == Some(true) || read.is_some() || write.is_some() {
        b.billing = Some(Billing::Provisioned {
            read_capacity: read.unwrap_or(5),
            write_capacity: write.unwrap_or(5),
        });
    } else if provisioned == Some(false) {
        b.billing = Some(Billing::OnDemand);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::super::validate_table_name;
    use super::*;

    #[test]
    fn urls_set_every_option() {
        let b = parse_url(
            "dynamodb://AKID:se%2Fcret@my-leases?region=eu-west-1&endpoint=http://127.0.0.1:8000\
             &namespace=orders&create_table=true&billing=provisioned&read_capacity=10&page_size=7\
             &attempt_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(b.table.as_deref(), Some("my-leases"));
        assert_eq!(b.namespace.as_deref(), Some("orders"));
        assert_eq!(b.region.as_deref(), Some("eu-west-1"));
        assert_eq!(b.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(b.create_table, Some(true));
        assert_eq!(b.billing, Some(Billing::Provisioned { read_capacity: 10, write_capacity: 5 }));
        assert_eq!(b.page_size, Some(7));
        assert_eq!(b.attempt_timeout, Some(Duration::from_millis(250)));
        let keys = b.keys.as_ref().unwrap();
        assert_eq!(
            (keys.access_key_id.as_str(), keys.secret_access_key.as_str()),
            ("AKID", "se/cret")
        );
        let debug = format!("{b:?}");
        assert!(!debug.contains("AKID") && !debug.contains("cret"), "{debug}");
        let plain = parse_url("dynamodb://Leases.Table_1").unwrap();
        assert_eq!(plain.table.as_deref(), Some("Leases.Table_1"));
        assert!(plain.create_table.is_none() && plain.keys.is_none() && plain.billing.is_none());
    }

    #[test]
    fn bad_urls_are_config_errors_without_keys() {
        for bad in [
            "dynamodb://AKID:s3cr3t@?region=x",
            "redis://AKID:s3cr3t@t",
            "dynamodb://AKID:s3cr3t@t?colour=blue",
            "dynamodb://AKID:s3cr3t@t?create_table=maybe",
            "dynamodb://AKID:s3cr3t@t?page_size=0",
            "dynamodb://AKID:s3cr3t@t?region=a&region=b",
            "dynamodb://AKID:s3cr3t@t?session_token=s3cr3t&session_token=s3cr3t",
            "dynamodb://AKID@tab",
            "dynamodb://AKID:s3cr3t@[::1",
        ] {
            match parse_url(bad) {
                Err(Error::Config(m)) => {
                    assert!(!m.contains("s3cr3t") && !m.contains("AKID"), "{m}")
                }
                other => panic!("{bad}: expected a config error, got {other:?}"),
            }
        }
        assert!(validate_table_name("ab").is_err());
        assert!(validate_table_name("has space").is_err());
        assert!(validate_table_name("ok-table_1.x").is_ok());
    }
}
