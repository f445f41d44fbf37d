//! [`ChangeEvent`]: one change of a DynamoDB table, typed, and its raw form.
//!
//! Each [`Record`] the source delivers carries the change as JSON in `data`, in the shape AWS
//! Lambda hands a DynamoDB stream record to a function (`eventID`, `eventName`, `dynamodb` with
//! `Keys`, `NewImage`, `OldImage`, `SequenceNumber`, `ApproximateCreationDateTime` in seconds,
//! `userIdentity` for deletions by TTL), attribute values in DynamoDB's JSON (`{"S": "…"}`,
//! `{"N": "12"}`, binary as base64). That form is what a processor ported from Lambda or from the
//! KCL adapter already parses, and what a processor in another language (the MultiLang daemon)
//! receives unchanged. [`ChangeEvent::from_record`] turns it back into types.
//!
//! The record's partition key is the item's key attributes as canonical JSON (sorted names), so
//! two changes of one item carry the same partition key; its sequence number is the change's.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shardlease_core::{Error, Record, Result, SequenceNumber};

use crate::api::RawChange;

/// An item, or an item's key: attribute name → value.
pub type Item = BTreeMap<String, AttributeValue>;

/// One attribute value, as DynamoDB types it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum AttributeValue {
    /// A string.
    #[serde(rename = "S")]
    S(String),
    /// A number, as DynamoDB sends it: a decimal string (up to 38 digits, so not an `f64`).
    #[serde(rename = "N")]
    N(String),
    /// Binary.
    #[serde(rename = "B", with = "blob")]
    B(Bytes),
    /// A boolean.
    #[serde(rename = "BOOL")]
    Bool(bool),
    /// Null (the value is always `true`).
    #[serde(rename = "NULL")]
    Null(bool),
    /// A map.
    #[serde(rename = "M")]
    M(Item),
    /// A list.
    #[serde(rename = "L")]
    L(Vec<AttributeValue>),
    /// A string set.
    #[serde(rename = "SS")]
    Ss(Vec<String>),
    /// A number set.
    #[serde(rename = "NS")]
    Ns(Vec<String>),
    /// A binary set.
    #[serde(rename = "BS", with = "blobs")]
    Bs(Vec<Bytes>),
}

/// What happened to the item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventName {
    /// A new item was written.
    Insert,
    /// An existing item was changed.
    Modify,
    /// An item was deleted (by a caller, or by TTL: see [`ChangeEvent::removed_by_ttl`]).
    Remove,
}

/// One change of a table, as the stream recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChangeEvent {
    /// The change's unique id (`eventID`).
    pub event_id: String,
    /// What happened to the item.
    pub event_name: EventName,
    /// The change's sequence number in its shard (21 to 40 digits).
    pub sequence_number: SequenceNumber,
    /// When the change was made, approximately: milliseconds since the Unix epoch.
    pub approximate_creation_millis: i64,
    /// The item's key attributes.
    pub keys: Item,
    /// The item after the change, when the stream's view type includes new images.
    pub new_image: Option<Item>,
    /// The item before the change, when the stream's view type includes old images.
    pub old_image: Option<Item>,
    /// The size of the stream record in bytes, when the service reported it.
    pub size_bytes: Option<i64>,
    /// The stream's view type (`KEYS_ONLY`, `NEW_IMAGE`, `OLD_IMAGE`, `NEW_AND_OLD_IMAGES`).
    pub stream_view_type: Option<String>,
    /// Whether DynamoDB's time to live removed the item (a `REMOVE` made by the service).
    pub removed_by_ttl: bool,
}

/// The principal DynamoDB names in `userIdentity` of a deletion made by TTL.
const TTL_PRINCIPAL: &str = "dynamodb.amazonaws.com";

impl ChangeEvent {
    /// A change with no images, size or view type; set them with the fields (tests, fakes).
    pub fn new(
        event_name: EventName,
        sequence_number: SequenceNumber,
        approximate_creation_millis: i64,
        keys: Item,
    ) -> Self {
        ChangeEvent {
            event_id: format!("{sequence_number}"),
            event_name,
            sequence_number,
            approximate_creation_millis,
            keys,
            new_image: None,
            old_image: None,
            size_bytes: None,
            stream_view_type: None,
            removed_by_ttl: false,
        }
    }

    /// The change a record of this source carries. An error (`InvalidInput`) when `data` is not
    /// a DynamoDB stream record in JSON: a record of another source, or one edited on the way.
    pub fn from_record(record: &Record) -> Result<Self> {
        Self::from_json(&record.data)
    }

    /// The change in its raw JSON form (the `data` of the source's records).
    pub fn from_json(json: &[u8]) -> Result<Self> {
        let wire: Wire = serde_json::from_slice(json).map_err(|e| {
            Error::InvalidInput(format!("not a DynamoDB stream record in JSON: {e}"))
        })?;
        let d = wire.dynamodb;
        let seq = SequenceNumber::parse(&d.sequence_number)?;
        Ok(ChangeEvent {
            event_id: wire.event_id,
            event_name: wire.event_name,
            sequence_number: seq,
            approximate_creation_millis: seconds_to_millis(d.approximate_creation_date_time),
            keys: d.keys,
            new_image: d.new_image,
            old_image: d.old_image,
            size_bytes: d.size_bytes,
            stream_view_type: d.stream_view_type,
            removed_by_ttl: wire.user_identity.is_some_and(|u| {
                u.kind.eq_ignore_ascii_case("Service") && u.principal_id == TTL_PRINCIPAL
            }),
        })
    }

    /// The raw JSON form.
    pub fn to_json(&self) -> Bytes {
        let wire = Wire {
            event_id: self.event_id.clone(),
            event_name: self.event_name,
            event_version: "1.1".into(),
            event_source: "aws:dynamodb".into(),
            dynamodb: WireChange {
                approximate_creation_date_time: self.approximate_creation_millis as f64 / 1000.0,
                keys: self.keys.clone(),
                new_image: self.new_image.clone(),
                old_image: self.old_image.clone(),
                sequence_number: self.sequence_number.as_str().to_owned(),
                size_bytes: self.size_bytes,
                stream_view_type: self.stream_view_type.clone(),
            },
            user_identity: self.removed_by_ttl.then(|| WireIdentity {
                kind: "Service".into(),
                principal_id: TTL_PRINCIPAL.into(),
            }),
        };
        // Serializing plain strings, numbers and maps with string keys cannot fail.
        Bytes::from(serde_json::to_vec(&wire).unwrap_or_default())
    }

    /// The item's key as canonical JSON: the partition key of the source's records.
    pub fn key_json(&self) -> String {
        serde_json::to_string(&self.keys).unwrap_or_default()
    }

    /// The record of the source that carries this change.
    pub(crate) fn to_raw(&self) -> RawChange {
        RawChange {
            seq: self.sequence_number.as_str().to_owned(),
            created_millis: self.approximate_creation_millis,
            keys: self.key_json(),
            json: self.to_json(),
        }
    }
}

fn seconds_to_millis(seconds: f64) -> i64 {
    if seconds.is_finite() {
        (seconds * 1000.0).round() as i64
    } else {
        0
    }
}

/// The record as JSON (Lambda's DynamoDB event record).
#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(rename = "eventID")]
    event_id: String,
    #[serde(rename = "eventName")]
    event_name: EventName,
    #[serde(rename = "eventVersion", default)]
    event_version: String,
    #[serde(rename = "eventSource", default)]
    event_source: String,
    dynamodb: WireChange,
    #[serde(rename = "userIdentity", default, skip_serializing_if = "Option::is_none")]
    user_identity: Option<WireIdentity>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireChange {
    #[serde(default)]
    approximate_creation_date_time: f64,
    #[serde(default)]
    keys: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    new_image: Option<Item>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    old_image: Option<Item>,
    sequence_number: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stream_view_type: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct WireIdentity {
    #[serde(rename = "type")]
    kind: String,
    #[serde(rename = "principalId")]
    principal_id: String,
}

/// Binary values as base64 strings.
mod blob {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

/// Binary sets as lists of base64 strings.
mod blobs {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(v: &[Bytes], s: S) -> Result<S::Ok, S::Error> {
        let engine = &base64::engine::general_purpose::STANDARD;
        s.collect_seq(v.iter().map(|b| engine.encode(b)))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<Bytes>, D::Error> {
        let texts = Vec::<String>::deserialize(d)?;
        let engine = &base64::engine::general_purpose::STANDARD;
        texts
            .into_iter()
            .map(|t| engine.decode(t).map(Bytes::from).map_err(serde::de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn seq(s: &str) -> SequenceNumber {
        SequenceNumber::parse(s).unwrap()
    }

    fn key(id: &str) -> Item {
        Item::from([("pk".to_owned(), AttributeValue::S(id.into()))])
    }

    #[test]
    fn a_change_survives_its_raw_form() {
        let mut c = ChangeEvent::new(
            EventName::Modify,
            seq("100000000000000000001234"),
            1_700_000_000_123,
            key("a"),
        );
        c.new_image = Some(Item::from([
            ("pk".to_owned(), AttributeValue::S("a".into())),
            ("n".to_owned(), AttributeValue::N("12345678901234567890123456789012345678".into())),
            ("b".to_owned(), AttributeValue::B(Bytes::from_static(b"\x00\xff"))),
            ("bs".to_owned(), AttributeValue::Bs(vec![Bytes::from_static(b"x")])),
            (
                "m".to_owned(),
                AttributeValue::M(Item::from([("z".to_owned(), AttributeValue::Null(true))])),
            ),
            ("l".to_owned(), AttributeValue::L(vec![AttributeValue::Bool(false)])),
            ("ss".to_owned(), AttributeValue::Ss(vec!["p".into()])),
            ("ns".to_owned(), AttributeValue::Ns(vec!["1".into()])),
        ]));
        c.old_image = Some(key("a"));
        c.size_bytes = Some(42);
        c.stream_view_type = Some("NEW_AND_OLD_IMAGES".into());
        let raw = c.to_raw();
        assert_eq!(raw.keys, r#"{"pk":{"S":"a"}}"#);
        assert_eq!(raw.created_millis, 1_700_000_000_123);
        let back = ChangeEvent::from_json(&raw.json).unwrap();
        assert_eq!(back, c);
        let text = String::from_utf8(raw.json.to_vec()).unwrap();
        assert!(text.contains(r#""eventName":"MODIFY""#), "{text}");
        assert!(text.contains(r#""b":{"B":"AP8="}"#), "{text}");
    }

    #[test]
    fn a_ttl_deletion_is_told_apart() {
        let mut c = ChangeEvent::new(EventName::Remove, seq("100"), 0, key("a"));
        c.removed_by_ttl = true;
        let back = ChangeEvent::from_json(&c.to_json()).unwrap();
        assert!(back.removed_by_ttl);
        let lambda = br#"{"eventID":"1","eventName":"REMOVE","dynamodb":{"Keys":{"pk":{"S":"a"}},"SequenceNumber":"100"},"userIdentity":{"type":"Service","principalId":"dynamodb.amazonaws.com"}}"#;
        assert!(ChangeEvent::from_json(lambda).unwrap().removed_by_ttl);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for bad in [
            &b"not json"[..],
            br#"{"eventID":"1"}"#,
            br#"{"eventID":"1","eventName":"UPSERT","dynamodb":{"SequenceNumber":"1"}}"#,
            br#"{"eventID":"1","eventName":"INSERT","dynamodb":{"SequenceNumber":"x1"}}"#,
        ] {
            let err = ChangeEvent::from_json(bad);
            assert!(matches!(err, Err(Error::InvalidInput(_))), "{err:?}");
        }
    }
}
