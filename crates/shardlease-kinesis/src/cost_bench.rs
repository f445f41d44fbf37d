//! A repeatable cost measurement of the per-record read path, without a Kinesis service: the
//! conversion of `GetRecords` pages ([`Unpacker`]) and the whole reader (source open, fetcher,
//! read-ahead task, channel) over pages handed out by an in-memory [`Api`]. Wall-clock figures on
//! a shared machine are noise, so this is meant for `valgrind --tool=callgrind` with
//! `--toggle-collect` on the measured functions (instruction counts do not depend on the load):
//!
//! ```text
//! SHARDLEASE_COST_RECORDS=20000 valgrind --tool=callgrind \
//!   --toggle-collect='*cost_bench::measured_*' target/release/deps/shardlease_kinesis-<hash> \
//!   --ignored --exact cost_bench::plain_records_cost --test-threads=1
//! ```
//!
//! Run at two sizes; the difference of the totals over the difference of the sizes is the cost
//! per record (docs/kinesis.md, "Performance"). Ignored by default: it checks counts, not speed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use shardlease_core::{LeaseKey, Position, ShardInfo, ShardSource};

use crate::api::{
    Api, ApiError, IteratorStart, ListPage, RawRecord, RecordsPage, ShardPage, StreamRef,
};
use crate::config::ReadConfig;
use crate::convert::Unpacker;
use crate::kpl::{self, UserRecord};
use crate::source::KinesisSource;

/// Records per run: `SHARDLEASE_COST_RECORDS`, default 20 000.
fn records() -> usize {
    std::env::var("SHARDLEASE_COST_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

/// `n` plain records shaped like the throughput bench's (56-digit sequence numbers, short
/// partition keys, 100-byte payloads), in pages of `page` records.
fn pages(n: usize, page: usize, aggregated: bool) -> Vec<Vec<RawRecord>> {
    let all: Vec<RawRecord> = (0..n)
        .map(|i| RawRecord {
            seq: format!("4959033827149025660855969253836157109592157598913{i:07}"),
            partition_key: format!("k{}-{}", i / 500, i % 500),
            data: if aggregated {
                let users: Vec<UserRecord> = (0..4)
                    .map(|j| UserRecord {
                        partition_key: format!("u{i}-{j}"),
                        explicit_hash_key: None,
                        data: Bytes::from(vec![b'x'; 25]),
                    })
                    .collect();
                kpl::aggregate(&users)
            } else {
                Bytes::from(vec![b'x'; 100])
            },
            arrival_millis: 1,
        })
        .collect();
    all.chunks(page.max(1)).map(<[RawRecord]>::to_vec).collect()
}

#[inline(never)]
fn measured_convert(unpacker: &mut Unpacker, pages: Vec<Vec<RawRecord>>) -> usize {
    let mut n = 0;
    for p in pages {
        let out = unpacker.convert(p).unwrap_or_else(|e| panic!("{e}"));
        n += out.len();
        drop(std::hint::black_box(out));
    }
    n
}

/// Hands out prepared pages, then empty pages at the tip.
#[derive(Debug)]
struct Pages(Mutex<VecDeque<Vec<RawRecord>>>);

#[async_trait]
impl Api for Pages {
    async fn list_shards(&self, _page: ListPage) -> Result<ShardPage, ApiError> {
        Ok(ShardPage { shards: vec![ShardInfo::new("s0")], next_token: None })
    }
    async fn get_shard_iterator(&self, _: &str, _: &IteratorStart) -> Result<String, ApiError> {
        Ok("it".to_owned())
    }
    async fn get_records(&self, _: &str, _: i32) -> Result<RecordsPage, ApiError> {
        let page = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        let millis_behind = Some(if page.is_some() { 1000 } else { 0 });
        Ok(RecordsPage {
            records: page.unwrap_or_default(),
            next_iterator: Some("it".to_owned()),
            millis_behind,
            children: vec![],
        })
    }
}

#[inline(never)]
async fn measured_reader(source: &KinesisSource, n: usize) -> usize {
    let mut reader = source
        .open(&LeaseKey::from("s0"), &Position::TrimHorizon)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut got = 0;
    while got < n {
        let batch = reader.next_batch().await.unwrap_or_else(|e| panic!("{e}"));
        got += batch.records.len();
        drop(std::hint::black_box(batch));
    }
    got
}

fn read_config() -> ReadConfig {
    ReadConfig {
        min_call_interval: std::time::Duration::ZERO,
        max_bytes_per_second: 1 << 40,
        ..ReadConfig::default()
    }
}

#[test]
#[ignore = "a cost measurement; run under callgrind (see the module comment)"]
fn plain_records_cost() {
    let n = records();
    let c = read_config();
    let mut unpacker = Unpacker::new("stream".into(), LeaseKey::from("s0"), None, &c, None);
    assert_eq!(measured_convert(&mut unpacker, pages(n, 10_000, false)), n);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let api = Arc::new(Pages(Mutex::new(pages(n, 10_000, false).into())));
    let source = KinesisSource::with_api(api, StreamRef::parse("stream"), c)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rt.block_on(measured_reader(&source, n)), n);
}

#[test]
#[ignore = "a cost measurement; run under callgrind (see the module comment)"]
fn aggregated_records_cost() {
    let n = records();
    let c = read_config();
    let mut unpacker = Unpacker::new("stream".into(), LeaseKey::from("s0"), None, &c, None);
    assert_eq!(measured_convert(&mut unpacker, pages(n, 10_000, true)), 4 * n);
}
