//! From the records the service returns (`GetRecords` replies and `SubscribeToShard` events alike)
//! to the user records a processor sees: KPL de-aggregation, the out-of-range rule, and dropping
//! what a checkpoint or an earlier read already covered. Polling and fan-out share it, so both
//! deliver exactly the same records with the same sub-sequence numbers.

use shardlease_core::{Error, HashRange, LeaseKey, Record, Result, SequenceNumber};
use tracing::{debug, warn};

use crate::api::RawRecord;
use crate::kpl::{self, Deaggregated};
use crate::telemetry;

/// Turns one shard's raw records into user records, in order.
#[derive(Debug)]
pub(crate) struct Unpacker {
    stream: String,
    shard: LeaseKey,
    /// The shard's hash range, for the out-of-range rule (`None`: no record is out of range).
    range: Option<HashRange>,
    deaggregate: bool,
    skip_out_of_range: bool,
    /// User records at or before this (sequence, sub-sequence) are not delivered: the part of a
    /// record a checkpoint covers, or a record an earlier read already delivered.
    skip_through: Option<(SequenceNumber, u64)>,
    /// The sequence number of the last raw record converted.
    last_seq: Option<SequenceNumber>,
}

impl Unpacker {
    pub(crate) fn new(
        stream: String,
        shard: LeaseKey,
        range: Option<HashRange>,
        config: &crate::config::ReadConfig,
        skip_through: Option<(SequenceNumber, u64)>,
    ) -> Self {
        Unpacker {
            stream,
            shard,
            range,
            deaggregate: config.deaggregate,
            skip_out_of_range: config.skip_out_of_range_user_records,
            skip_through,
            last_seq: None,
        }
    }

    /// The sequence number of the last Kinesis record converted, if any: a new iterator or
    /// subscription starts there again, and nothing of it is delivered twice.
    pub(crate) fn last_seq(&self) -> Option<&SequenceNumber> {
        self.last_seq.as_ref()
    }

    /// De-aggregates, applies the out-of-range rule, drops what was covered already, and
    /// remembers the last record (every part of it counts as delivered from now on).
    pub(crate) fn convert(&mut self, raw: Vec<RawRecord>) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(raw.len());
        for r in raw {
            let seq = SequenceNumber::parse(&r.seq).map_err(|_| {
                Error::permanent(format!(
                    "Kinesis returned a malformed sequence number on shard {}",
                    self.shard
                ))
            })?;
            let unpacked = if self.deaggregate {
                kpl::deaggregate(&r.data, self.range.as_ref())
            } else {
                Deaggregated::Plain
            };
            let base = |sub: u64, partition_key: String, data: bytes::Bytes| {
                Record::new(seq.clone(), partition_key, data)
                    .with_sub(sub)
                    .with_arrival_millis(r.arrival_millis)
            };
            let mut users = Vec::new();
            match unpacked {
                Deaggregated::Plain => users.push(base(0, r.partition_key.clone(), r.data.clone())),
                Deaggregated::Records { records, out_of_range } => {
                    self.out_of_range(&seq, &out_of_range);
                    let skip = |i: &u64| self.skip_out_of_range && out_of_range.contains(i);
                    users.extend(
                        records
                            .into_iter()
                            .filter(|(i, _)| !skip(i))
                            .map(|(i, u)| base(i, u.partition_key, u.data)),
                    );
                }
                Deaggregated::Malformed(why) => {
                    metrics::counter!(telemetry::MALFORMED_AGGREGATES).increment(1);
                    warn!(shard = %self.shard, seq = %seq, reason = %why,
                        "malformed KPL aggregate; delivering the raw record");
                    users.push(base(0, r.partition_key.clone(), r.data.clone()));
                }
            }
            for u in users {
                let covered =
                    self.skip_through.as_ref().is_some_and(|(s, sub)| (&u.seq, u.sub) <= (s, *sub));
                if !covered {
                    out.push(u);
                }
            }
            // Never moves back: a service that re-sends older records (an emulator's
            // subscription at a sequence number starts at the shard's first record) must not
            // reopen what a checkpoint covers.
            if self.skip_through.as_ref().is_none_or(|(s, _)| *s < seq) {
                self.skip_through = Some((seq.clone(), u64::MAX));
            }
            self.last_seq = Some(seq);
        }
        Ok(out)
    }

    /// Counts (and, when skipping them, logs) an aggregate's out-of-range user records.
    fn out_of_range(&self, seq: &SequenceNumber, indices: &[u64]) {
        if indices.is_empty() {
            return;
        }
        metrics::counter!(
            telemetry::OUT_OF_RANGE_USER_RECORDS,
            telemetry::STREAM => self.stream.clone(),
            telemetry::SHARD => self.shard.as_str().to_owned()
        )
        .increment(indices.len() as u64);
        if self.skip_out_of_range {
            warn!(shard = %self.shard, seq = %seq, skipped = indices.len(),
                "skipping KPL user records whose hash key lies outside the shard's range \
                 (skip_out_of_range_user_records is set)");
        } else {
            debug!(shard = %self.shard, seq = %seq, count = indices.len(),
                "delivering KPL user records whose hash key lies outside the shard's range");
        }
    }
}
