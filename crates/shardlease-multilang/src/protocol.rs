//! The MultiLang protocol's messages, one JSON object per line, as the KCL's Java daemon (3.x)
//! writes and reads them: what the daemon sends a child ([`ToChild`]) and what a child sends back
//! ([`FromChild`]). Kept apart from the process handling so the wire format can be tested alone
//! against golden lines.
//!
//! Every field is written even when it is null: amazon-kclpy indexes the fields directly, and its
//! decoder dispatches every nested object on its `action` (so each record carries
//! `"action":"record"`).

use base64::Engine as _;
use serde::Serialize;
use serde_json::Value;
use shardlease::{Batch, Position, Record};

/// The sentinel a child sees for a lease that starts at the oldest record.
pub const TRIM_HORIZON: &str = "TRIM_HORIZON";
/// The sentinel for a lease that starts at the tip.
pub const LATEST: &str = "LATEST";
/// The sentinel for a lease that starts at a timestamp.
pub const AT_TIMESTAMP: &str = "AT_TIMESTAMP";
/// The sentinel for a shard read to its end.
pub const SHARD_END: &str = "SHARD_END";

/// A message from the daemon to a child, on the child's stdin.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "action")]
pub enum ToChild {
    /// Before anything else: the shard and where its lease starts.
    #[serde(rename = "initialize", rename_all = "camelCase")]
    Initialize {
        /// The shard id.
        shard_id: String,
        /// A sequence number or one of the sentinels (`TRIM_HORIZON`, `LATEST`, ...).
        sequence_number: Option<String>,
        /// The index inside a KPL aggregate (0 for a sentinel or a plain record).
        sub_sequence_number: Option<u64>,
    },
    /// A batch of records.
    #[serde(rename = "processRecords", rename_all = "camelCase")]
    ProcessRecords {
        /// How far behind the tip of the shard the read was, when known.
        millis_behind_latest: Option<u64>,
        /// The records, in order.
        records: Vec<RecordJson>,
    },
    /// The lease was lost: checkpointing is no longer possible.
    #[serde(rename = "leaseLost")]
    LeaseLost,
    /// The shard is read to its end: checkpoint (with no sequence number) to finish it.
    #[serde(rename = "shardEnded")]
    ShardEnded,
    /// The daemon is stopping or the lease is handed over: checkpoint what is done.
    #[serde(rename = "shutdownRequested")]
    ShutdownRequested,
    /// The answer to a child's checkpoint: what it asked for, and the name of the exception the
    /// KCL would have thrown (null when the checkpoint was written).
    #[serde(rename = "checkpoint", rename_all = "camelCase")]
    Checkpoint {
        /// The sequence number the child sent (null when it sent none).
        sequence_number: Option<String>,
        /// The sub-sequence number the child sent.
        sub_sequence_number: Option<i64>,
        /// `ThrottlingException`, `ShutdownException`, ... or null.
        error: Option<String>,
    },
}

impl ToChild {
    /// The action name a child answers for in its `status`.
    pub fn action(&self) -> &'static str {
        match self {
            ToChild::Initialize { .. } => "initialize",
            ToChild::ProcessRecords { .. } => "processRecords",
            ToChild::LeaseLost => "leaseLost",
            ToChild::ShardEnded => "shardEnded",
            ToChild::ShutdownRequested => "shutdownRequested",
            ToChild::Checkpoint { .. } => "checkpoint",
        }
    }

    /// The `initialize` message of `shard`, whose lease starts at `start`.
    pub fn initialize(shard: &str, start: &Position) -> ToChild {
        let (seq, sub) = match start {
            Position::TrimHorizon => (TRIM_HORIZON.to_owned(), 0),
            Position::Latest => (LATEST.to_owned(), 0),
            Position::AtTimestamp { .. } => (AT_TIMESTAMP.to_owned(), 0),
            Position::ShardEnd => (SHARD_END.to_owned(), 0),
            Position::Sequence { seq, sub } => (seq.to_string(), *sub),
        };
        ToChild::Initialize {
            shard_id: shard.to_owned(),
            sequence_number: Some(seq),
            sub_sequence_number: Some(sub),
        }
    }

    /// The `processRecords` message of `batch`.
    pub fn process_records(batch: &Batch) -> ToChild {
        ToChild::ProcessRecords {
            millis_behind_latest: batch.millis_behind,
            records: batch.records.iter().map(RecordJson::from).collect(),
        }
    }

    /// The message as one line of JSON, without its line feed.
    pub fn to_line(&self) -> String {
        // Serializing these plain structs cannot fail (string keys, no maps of other keys).
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!("{{\"action\":\"{}\",\"encodingError\":\"{e}\"}}", self.action())
        })
    }
}

/// One record as the protocol carries it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordJson {
    /// Always `record`: kclpy decodes every object by its action.
    pub action: &'static str,
    /// The payload, base64 (standard alphabet, padded).
    pub data: String,
    /// The partition key.
    pub partition_key: String,
    /// The Kinesis sequence number.
    pub sequence_number: String,
    /// The index inside a KPL aggregate; 0 for a plain record.
    pub sub_sequence_number: u64,
    /// When the stream accepted the record, milliseconds since the Unix epoch.
    pub approximate_arrival_timestamp: i64,
}

impl From<&Record> for RecordJson {
    fn from(r: &Record) -> Self {
        RecordJson {
            action: "record",
            data: base64::engine::general_purpose::STANDARD.encode(&r.data),
            partition_key: r.partition_key.clone(),
            sequence_number: r.seq.to_string(),
            sub_sequence_number: r.sub,
            approximate_arrival_timestamp: r.arrival_millis,
        }
    }
}

/// A message from a child, on its stdout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromChild {
    /// The child is done with the message it names.
    Status {
        /// The action answered (`initialize`, `processRecords`, ...).
        response_for: String,
    },
    /// The child asks for a checkpoint. No sequence number means "after the last record
    /// delivered" (or the shard's end, answering `shardEnded`).
    Checkpoint {
        /// The sequence number, or `None`.
        sequence_number: Option<String>,
        /// The sub-sequence number, or `None`.
        sub_sequence_number: Option<i64>,
    },
}

/// Why a line from a child is not a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON at all (a stray print to stdout, say).
    #[error("not a JSON object: {0:?}")]
    NotJson(String),
    /// JSON without a string `action`, or with a field of the wrong type.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// An action a child never sends.
    #[error("unknown action {0:?}")]
    UnknownAction(String),
}

/// The first characters of `line`, for a message.
fn excerpt(line: &str) -> String {
    let mut s: String = line.chars().take(120).collect();
    if s.len() < line.len() {
        s.push('…');
    }
    s
}

/// Decodes one line of a child's stdout: `Ok(None)` for a blank line (kclpy writes a line feed
/// before and after each message), a message, or why it is none.
pub fn decode_line(line: &str) -> Result<Option<FromChild>, DecodeError> {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_str(trimmed).map_err(|_| DecodeError::NotJson(excerpt(trimmed)))?;
    let Value::Object(map) = value else {
        return Err(DecodeError::NotJson(excerpt(trimmed)));
    };
    let action = match map.get("action") {
        Some(Value::String(a)) => a.as_str(),
        _ => return Err(DecodeError::Malformed(format!("no action: {}", excerpt(trimmed)))),
    };
    match action {
        "status" => match map.get("responseFor") {
            Some(Value::String(r)) => Ok(Some(FromChild::Status { response_for: r.clone() })),
            _ => Err(DecodeError::Malformed(format!(
                "status without a responseFor: {}",
                excerpt(trimmed)
            ))),
        },
        "checkpoint" => {
            let sequence_number = match map.get("sequenceNumber") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                // Some clients send a number; keep its digits.
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(other) => {
                    return Err(DecodeError::Malformed(format!(
                        "checkpoint sequenceNumber must be a string, got {other}"
                    )))
                }
            };
            let sub_sequence_number = match map.get("subSequenceNumber") {
                None | Some(Value::Null) => None,
                Some(Value::Number(n)) => match n.as_i64() {
                    Some(v) => Some(v),
                    None => {
                        return Err(DecodeError::Malformed(format!(
                            "checkpoint subSequenceNumber must be a whole number, got {n}"
                        )))
                    }
                },
                Some(other) => {
                    return Err(DecodeError::Malformed(format!(
                        "checkpoint subSequenceNumber must be a number, got {other}"
                    )))
                }
            };
            Ok(Some(FromChild::Checkpoint { sequence_number, sub_sequence_number }))
        }
        other => Err(DecodeError::UnknownAction(excerpt(other))),
    }
}
