//! A scripted, in-memory [`Api`] for unit tests of the reading loop: shards with records, pages
//! of a chosen size, and injected throttling, iterator expiry and failures. It logs every call.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use shardlease_core::{Error, LeaseKey, ShardInfo};
use tokio::time::Instant;

use crate::api::{Api, ApiError, IteratorStart, ListPage, RawRecord, RecordsPage, ShardPage};

#[derive(Debug, Default)]
pub(crate) struct FakeState {
    pub shards: Vec<ShardInfo>,
    pub records: HashMap<String, Vec<RawRecord>>,
    pub page_size: usize,
    pub throttle_next: u32,
    pub expire_next: u32,
    pub fail_next: u32,
    pub calls: Vec<String>,
    pub get_records_at: Vec<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct FakeApi {
    pub state: Mutex<FakeState>,
}

impl FakeApi {
    /// `shards` open shards (no hash ranges), listed `page_size` at a time.
    pub fn new(shards: usize, page_size: usize) -> Self {
        let state = FakeState {
            shards: (0..shards).map(|i| ShardInfo::new(format!("s{i}").as_str())).collect(),
            page_size,
            ..FakeState::default()
        };
        FakeApi { state: Mutex::new(state) }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends plain records `data` to `shard`; sequence numbers continue from the last.
    pub fn put(&self, shard: &str, data: &[&str]) {
        let mut s = self.lock();
        let records = s.records.entry(shard.to_owned()).or_default();
        for d in data {
            let seq = format!("{}", 1000 + records.len());
            records.push(RawRecord {
                seq,
                partition_key: (*d).to_owned(),
                data: Bytes::from((*d).to_owned()),
                arrival_millis: 1,
            });
        }
    }

    pub fn close_with_child(&self, shard: &str, child: &str) {
        let mut s = self.lock();
        for info in s.shards.iter_mut().filter(|i| i.id.as_str() == shard) {
            info.closed = true;
        }
        s.shards.push(ShardInfo::new(child).with_parents([LeaseKey::from(shard)]));
    }
}

fn parse_iterator(it: &str) -> Option<(String, usize)> {
    let (shard, index) = it.split_once(':')?;
    Some((shard.to_owned(), index.parse().ok()?))
}

#[async_trait]
impl Api for FakeApi {
    async fn list_shards(&self, page: ListPage) -> Result<ShardPage, ApiError> {
        let mut s = self.lock();
        let start = match &page {
            ListPage::First { .. } => 0,
            ListPage::Next { token, .. } => {
                token.parse().map_err(|_| ApiError::Other(Error::permanent("bad token")))?
            }
        };
        s.calls.push(match &page {
            ListPage::First { .. } => "list".to_owned(),
            ListPage::Next { token, .. } => format!("list next {token}"),
        });
        let end = (start + s.page_size.max(1)).min(s.shards.len());
        let shards = s.shards[start..end].to_vec();
        let next_token = (end < s.shards.len()).then(|| end.to_string());
        Ok(ShardPage { shards, next_token })
    }

    async fn get_shard_iterator(
        &self,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<String, ApiError> {
        let mut s = self.lock();
        s.calls.push(format!("iterator {start:?}"));
        let records = s.records.get(shard).cloned().unwrap_or_default();
        let index = match start {
            IteratorStart::TrimHorizon => 0,
            IteratorStart::Latest => records.len(),
            IteratorStart::AtTimestamp(t) => records.partition_point(|r| r.arrival_millis < *t),
            IteratorStart::AtSequence(seq) => records
                .iter()
                .position(|r| &r.seq == seq)
                .ok_or_else(|| ApiError::Other(Error::permanent("no such sequence number")))?,
        };
        Ok(format!("{shard}:{index}"))
    }

    async fn get_records(&self, iterator: &str, limit: i32) -> Result<RecordsPage, ApiError> {
        let mut s = self.lock();
        s.calls.push("get".to_owned());
        s.get_records_at.push(Instant::now());
        if s.throttle_next > 0 {
            s.throttle_next -= 1;
            return Err(ApiError::Throttled(Error::retryable("throttled")));
        }
        if s.expire_next > 0 {
            s.expire_next -= 1;
            return Err(ApiError::ExpiredIterator);
        }
        if s.fail_next > 0 {
            s.fail_next -= 1;
            return Err(ApiError::Other(Error::retryable("boom")));
        }
        let (shard, index) = parse_iterator(iterator)
            .ok_or_else(|| ApiError::Other(Error::permanent("bad iterator")))?;
        let records = s.records.get(&shard).cloned().unwrap_or_default();
        let end = (index + usize::try_from(limit).unwrap_or(1)).min(records.len());
        let closed = s.shards.iter().any(|i| i.id.as_str() == shard && i.closed);
        let next_iterator = (!(closed && end == records.len())).then(|| format!("{shard}:{end}"));
        Ok(RecordsPage {
            records: records[index.min(end)..end].to_vec(),
            next_iterator,
            millis_behind: Some(if end == records.len() { 0 } else { 1000 }),
            children: vec![],
        })
    }
}
