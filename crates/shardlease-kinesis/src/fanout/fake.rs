//! A scripted [`FanOutApi`] for unit tests of the subscription loop: each `SubscribeToShard`
//! call takes the next scripted answer (in use, a failure, or a subscription that yields events,
//! ends, fails or goes quiet). It logs every call's starting position and time.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use shardlease_core::{Error, ShardInfo};
use tokio::time::Instant;

use crate::api::{
    ApiError, ConsumerInfo, ConsumerState, EventStream, FanOutApi, IteratorStart, RawRecord,
    ShardEvent,
};

/// One thing an open subscription does next.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Event(ShardEvent),
    /// The session ends.
    End,
    /// The connection fails.
    Fail,
    /// Nothing, ever.
    Quiet,
}

/// What one `SubscribeToShard` call answers.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    InUse,
    Fail,
    Opens(Vec<Item>),
}

#[derive(Debug, Default)]
pub(crate) struct FakeFanOut {
    pub answers: Mutex<VecDeque<Answer>>,
    pub calls: Mutex<Vec<(IteratorStart, Instant)>>,
}

impl FakeFanOut {
    pub fn new(answers: Vec<Answer>) -> Self {
        FakeFanOut { answers: Mutex::new(answers.into()), calls: Mutex::default() }
    }

    pub fn calls(&self) -> Vec<(IteratorStart, Instant)> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// An event carrying plain records `seqs` (data = the sequence number), continuing at `cont`.
pub(crate) fn event(seqs: &[u32], cont: Option<&str>) -> Item {
    Item::Event(ShardEvent {
        records: seqs
            .iter()
            .map(|s| RawRecord {
                seq: s.to_string(),
                partition_key: "k".into(),
                data: Bytes::from(s.to_string()),
                arrival_millis: 1,
            })
            .collect(),
        continuation: cont.map(str::to_owned),
        millis_behind: Some(0),
        children: Vec::new(),
    })
}

/// The last event of a closed shard, naming `children`.
pub(crate) fn last_event(children: Vec<ShardInfo>) -> Item {
    Item::Event(ShardEvent { children, ..ShardEvent::default() })
}

#[derive(Debug)]
struct FakeEvents {
    items: VecDeque<Item>,
}

#[async_trait]
impl EventStream for FakeEvents {
    async fn recv(&mut self) -> Result<Option<ShardEvent>, ApiError> {
        match self.items.pop_front() {
            Some(Item::Event(e)) => Ok(Some(e)),
            Some(Item::End) | None => Ok(None),
            Some(Item::Fail) => Err(ApiError::Other(Error::retryable("connection reset"))),
            Some(Item::Quiet) => std::future::pending().await,
        }
    }
}

#[async_trait]
impl FanOutApi for FakeFanOut {
    async fn stream_arn(&self) -> Result<String, ApiError> {
        Ok("arn:aws:kinesis:us-east-1:000000000000:stream/s".into())
    }

    async fn describe_consumer(
        &self,
        _stream_arn: &str,
        _name: &str,
    ) -> Result<Option<ConsumerInfo>, ApiError> {
        Ok(Some(ConsumerInfo { arn: "consumer".into(), state: ConsumerState::Active }))
    }

    async fn register_consumer(
        &self,
        _stream_arn: &str,
        _name: &str,
    ) -> Result<ConsumerInfo, ApiError> {
        Err(ApiError::InUse(Error::retryable("exists")))
    }

    async fn deregister_consumer(&self, _stream_arn: &str, _name: &str) -> Result<bool, ApiError> {
        Ok(true)
    }

    async fn subscribe(
        &self,
        _consumer_arn: &str,
        _shard: &str,
        start: &IteratorStart,
    ) -> Result<Box<dyn EventStream>, ApiError> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push((start.clone(), Instant::now()));
        let next = self.answers.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        match next {
            Some(Answer::InUse) => Err(ApiError::InUse(Error::retryable("ResourceInUseException"))),
            Some(Answer::Fail) | None => Err(ApiError::Other(Error::retryable("InternalFailure"))),
            Some(Answer::Opens(items)) => Ok(Box::new(FakeEvents { items: items.into() })),
        }
    }
}
