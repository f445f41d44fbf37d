//! The wire format against golden lines, both directions: every message the daemon writes (every
//! field present, nulls included, records tagged `"action":"record"`, the KCL's sentinels) and
//! every line a child may write (blank lines, null and missing sequence numbers, numbers where
//! strings are expected, unknown actions, stray output).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use shardlease::{Batch, Position, Record, SequenceNumber};
use shardlease_multilang::protocol::{decode_line, DecodeError, FromChild, ToChild};

/// Compares as JSON values (field order is not part of the protocol).
fn assert_line(msg: &ToChild, golden: &str) {
    let line = msg.to_line();
    assert!(!line.contains('\n'), "one line: {line}");
    let got: Value = serde_json::from_str(&line).unwrap();
    let want: Value = serde_json::from_str(golden).unwrap();
    assert_eq!(got, want, "\n got: {line}\nwant: {golden}");
}

#[test]
fn initialize_with_each_start() {
    let cases = [
        (Position::TrimHorizon, r#""TRIM_HORIZON","subSequenceNumber":0"#),
        (Position::Latest, r#""LATEST","subSequenceNumber":0"#),
        (
            Position::AtTimestamp { millis: 1_700_000_000_000 },
            r#""AT_TIMESTAMP","subSequenceNumber":0"#,
        ),
        (Position::ShardEnd, r#""SHARD_END","subSequenceNumber":0"#),
        (
            Position::Sequence {
                seq: SequenceNumber::parse(
                    "49590338271490256608559692538361571095921575989136588898",
                )
                .unwrap(),
                sub: 3,
            },
            r#""49590338271490256608559692538361571095921575989136588898","subSequenceNumber":3"#,
        ),
    ];
    for (start, tail) in cases {
        let golden = format!(
            r#"{{"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":{tail}}}"#
        );
        assert_line(&ToChild::initialize("shardId-000000000001", &start), &golden);
    }
}

#[test]
fn process_records_carries_every_field() {
    let mut r1 = Record::new(SequenceNumber::from(123u64), "pk-1", "hello");
    r1.arrival_millis = 1_700_000_000_123;
    let mut r2 = Record::new(SequenceNumber::from(124u64), "pk-2", vec![0u8, 255, 7]);
    r2.sub = 2;
    r2.arrival_millis = 1_700_000_000_456;
    let batch = Batch::new(vec![r1, r2]).with_millis_behind(42);
    assert_line(
        &ToChild::process_records(&batch),
        r#"{"action":"processRecords","millisBehindLatest":42,"records":[
            {"action":"record","data":"aGVsbG8=","partitionKey":"pk-1","sequenceNumber":"123","subSequenceNumber":0,"approximateArrivalTimestamp":1700000000123},
            {"action":"record","data":"AP8H","partitionKey":"pk-2","sequenceNumber":"124","subSequenceNumber":2,"approximateArrivalTimestamp":1700000000456}]}"#,
    );
    // Lag unknown and no records: both fields are still there.
    assert_line(
        &ToChild::process_records(&Batch::new(vec![])),
        r#"{"action":"processRecords","millisBehindLatest":null,"records":[]}"#,
    );
}

#[test]
fn farewells_and_checkpoint_replies() {
    assert_line(&ToChild::LeaseLost, r#"{"action":"leaseLost"}"#);
    assert_line(&ToChild::ShardEnded, r#"{"action":"shardEnded"}"#);
    assert_line(&ToChild::ShutdownRequested, r#"{"action":"shutdownRequested"}"#);
    assert_line(
        &ToChild::Checkpoint { sequence_number: None, sub_sequence_number: None, error: None },
        r#"{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null,"error":null}"#,
    );
    assert_line(
        &ToChild::Checkpoint {
            sequence_number: Some("123".into()),
            sub_sequence_number: Some(4),
            error: Some("ThrottlingException".into()),
        },
        r#"{"action":"checkpoint","sequenceNumber":"123","subSequenceNumber":4,"error":"ThrottlingException"}"#,
    );
    for (msg, action) in [
        (ToChild::LeaseLost, "leaseLost"),
        (ToChild::ShardEnded, "shardEnded"),
        (ToChild::ShutdownRequested, "shutdownRequested"),
        (ToChild::initialize("s", &Position::Latest), "initialize"),
        (ToChild::process_records(&Batch::new(vec![])), "processRecords"),
    ] {
        assert_eq!(msg.action(), action);
    }
}

#[test]
fn child_lines() {
    let status = |r: &str| Ok(Some(FromChild::Status { response_for: r.into() }));
    let cp = |s: Option<&str>, sub: Option<i64>| {
        Ok(Some(FromChild::Checkpoint {
            sequence_number: s.map(str::to_owned),
            sub_sequence_number: sub,
        }))
    };
    // What kclpy writes: a blank line around each message.
    assert_eq!(decode_line(""), Ok(None));
    assert_eq!(decode_line("   \t"), Ok(None));
    assert_eq!(
        decode_line(r#"{"action": "status", "responseFor": "initialize"}"#),
        status("initialize")
    );
    assert_eq!(
        decode_line(r#"  {"action":"status","responseFor":"processRecords"}  "#),
        status("processRecords")
    );
    assert_eq!(
        decode_line(
            r#"{"action": "checkpoint", "sequenceNumber": null, "subSequenceNumber": null}"#
        ),
        cp(None, None)
    );
    // Missing fields are nulls; an "error": null from a client is tolerated.
    assert_eq!(decode_line(r#"{"action":"checkpoint"}"#), cp(None, None));
    assert_eq!(
        decode_line(r#"{"action":"checkpoint","sequenceNumber":"4959","error":null}"#),
        cp(Some("4959"), None)
    );
    assert_eq!(
        decode_line(r#"{"action":"checkpoint","sequenceNumber":"4959","subSequenceNumber":7}"#),
        cp(Some("4959"), Some(7))
    );
    // A client sending a number keeps its digits; a sentinel string passes through (the
    // checkpoint itself then refuses it).
    assert_eq!(
        decode_line(r#"{"action":"checkpoint","sequenceNumber":4959}"#),
        cp(Some("4959"), None)
    );
    assert_eq!(
        decode_line(r#"{"action":"checkpoint","sequenceNumber":"SHARD_END"}"#),
        cp(Some("SHARD_END"), None)
    );
}

#[test]
fn bad_child_lines() {
    assert!(matches!(decode_line("hello from print()"), Err(DecodeError::NotJson(_))));
    assert!(matches!(decode_line("[1,2]"), Err(DecodeError::NotJson(_))));
    assert!(matches!(
        decode_line(r#"{"responseFor":"initialize"}"#),
        Err(DecodeError::Malformed(_))
    ));
    assert!(matches!(decode_line(r#"{"action":"status"}"#), Err(DecodeError::Malformed(_))));
    assert!(matches!(
        decode_line(r#"{"action":"checkpoint","subSequenceNumber":"x"}"#),
        Err(DecodeError::Malformed(_))
    ));
    assert_eq!(
        decode_line(r#"{"action":"bogus"}"#),
        Err(DecodeError::UnknownAction("bogus".into()))
    );
    // What the daemon sends is not what a child sends.
    assert_eq!(
        decode_line(r#"{"action":"processRecords","records":[]}"#),
        Err(DecodeError::UnknownAction("processRecords".into()))
    );
}
