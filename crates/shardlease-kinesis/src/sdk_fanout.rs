//! The [`FanOutApi`] over the AWS SDK client: finding the stream's ARN, describing, registering
//! and deregistering a stream consumer, and `SubscribeToShard` with its event stream turned into
//! [`ShardEvent`]s. Failures are classified as for polling ([`crate::sdk`]).

use async_trait::async_trait;
use aws_sdk_kinesis::primitives::event_stream::EventReceiver;
use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError;
use aws_sdk_kinesis::types::{
    ConsumerStatus, ShardIteratorType, StartingPosition, SubscribeToShardEventStream,
};
use aws_smithy_types::DateTime;
use bytes::Bytes;
use shardlease_core::Error;

use crate::api::{
    ApiError, ConsumerInfo, ConsumerState, EventStream, FanOutApi, IteratorStart, RawRecord,
    ShardEvent, StreamRef,
};
use crate::sdk::{child_infos, classify, nearest_millis, SdkApi};

fn state(s: &ConsumerStatus) -> ConsumerState {
    match s {
        ConsumerStatus::Active => ConsumerState::Active,
        ConsumerStatus::Deleting => ConsumerState::Deleting,
        // CREATING, and anything newer than this SDK: not usable yet.
        _ => ConsumerState::Creating,
    }
}

fn starting_position(start: &IteratorStart) -> Result<StartingPosition, ApiError> {
    let b = StartingPosition::builder();
    let b = match start {
        IteratorStart::TrimHorizon => b.r#type(ShardIteratorType::TrimHorizon),
        IteratorStart::Latest => b.r#type(ShardIteratorType::Latest),
        IteratorStart::AtTimestamp(millis) => {
            b.r#type(ShardIteratorType::AtTimestamp).timestamp(DateTime::from_millis(*millis))
        }
        IteratorStart::AtSequence(seq) => {
            b.r#type(ShardIteratorType::AtSequenceNumber).sequence_number(seq)
        }
    };
    b.build().map_err(|e| {
        ApiError::Other(Error::permanent(format!("building a SubscribeToShard position: {e}")))
    })
}

#[async_trait]
impl FanOutApi for SdkApi {
    async fn stream_arn(&self) -> Result<String, ApiError> {
        let name = match self.stream() {
            StreamRef::Arn(a) => return Ok(a.clone()),
            StreamRef::Name(n) => n.clone(),
        };
        let req = self.client().describe_stream_summary().stream_name(name);
        let out = self.bounded("DescribeStreamSummary", req.send()).await?;
        out.stream_description_summary.map(|s| s.stream_arn).ok_or_else(|| {
            ApiError::Other(Error::retryable("Kinesis DescribeStreamSummary returned no summary"))
        })
    }

    async fn describe_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<Option<ConsumerInfo>, ApiError> {
        let req =
            self.client().describe_stream_consumer().stream_arn(stream_arn).consumer_name(name);
        let out = self.bounded_found("DescribeStreamConsumer", req.send()).await?;
        Ok(out
            .and_then(|o| o.consumer_description)
            .map(|c| ConsumerInfo { state: state(&c.consumer_status), arn: c.consumer_arn }))
    }

    async fn register_consumer(
        &self,
        stream_arn: &str,
        name: &str,
    ) -> Result<ConsumerInfo, ApiError> {
        let req =
            self.client().register_stream_consumer().stream_arn(stream_arn).consumer_name(name);
        let out = self.bounded("RegisterStreamConsumer", req.send()).await?;
        out.consumer
            .map(|c| ConsumerInfo { state: state(&c.consumer_status), arn: c.consumer_arn })
            .ok_or_else(|| {
                ApiError::Other(Error::retryable("Kinesis RegisterStreamConsumer returned nothing"))
            })
    }

    async fn deregister_consumer(&self, stream_arn: &str, name: &str) -> Result<bool, ApiError> {
        let req =
            self.client().deregister_stream_consumer().stream_arn(stream_arn).consumer_name(name);
        Ok(self.bounded_found("DeregisterStreamConsumer", req.send()).await?.is_some())
    }

    async fn subscribe(
        &self,
        consumer_arn: &str,
        shard: &str,
        start: &IteratorStart,
    ) -> Result<Box<dyn EventStream>, ApiError> {
        let req = self
            .client()
            .subscribe_to_shard()
            .consumer_arn(consumer_arn)
            .shard_id(shard)
            .starting_position(starting_position(start)?);
        // The timeout covers the call up to the reply's headers; the events come afterwards.
        let out = self.bounded("SubscribeToShard", req.send()).await?;
        Ok(Box::new(SdkEvents { inner: out.event_stream }))
    }
}

/// The SDK's event receiver of one subscription.
struct SdkEvents {
    inner: EventReceiver<SubscribeToShardEventStream, SubscribeToShardEventStreamError>,
}

impl std::fmt::Debug for SdkEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SdkEvents")
    }
}

#[async_trait]
impl EventStream for SdkEvents {
    async fn recv(&mut self) -> Result<Option<ShardEvent>, ApiError> {
        loop {
            let event = match self.inner.recv().await {
                Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(e))) => e,
                // A kind of event newer than this SDK: nothing to deliver in it.
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(None),
                Err(e) => return Err(classify("SubscribeToShard event", e)),
            };
            let records = event
                .records
                .into_iter()
                .map(|r| RawRecord {
                    arrival_millis: r
                        .approximate_arrival_timestamp
                        .map_or(0, |t| nearest_millis(&t)),
                    seq: r.sequence_number,
                    partition_key: r.partition_key.unwrap_or_default(),
                    data: Bytes::from(r.data.into_inner()),
                })
                .collect();
            let children = child_infos(event.child_shards);
            let continuation = Some(event.continuation_sequence_number).filter(|c| !c.is_empty());
            return Ok(Some(ShardEvent {
                records,
                continuation,
                millis_behind: Some(event.millis_behind_latest),
                children,
            }));
        }
    }
}
