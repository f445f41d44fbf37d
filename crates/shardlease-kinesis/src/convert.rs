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
    ///
    /// Costs per plain record: no allocation beyond the output's own (the sequence number,
    /// partition key and payload move from the raw record into the user record). The running
    /// "covered through" mark refers to a record already in the output instead of a copy of its
    /// sequence number; it is copied once per page.
    pub(crate) fn convert(&mut self, raw: Vec<RawRecord>) -> Result<Vec<Record>> {
        let mut out: Vec<Record> = Vec::with_capacity(raw.len());
        // The mark as of this record: `Some(i)` is (out[i].seq, everything), newer than
        // `self.skip_through`; `None` is `self.skip_through`.
        let mut mark: Option<usize> = None;
        // The last raw record: `Ok(i)` is out[i].seq, `Err(seq)` one that delivered nothing.
        let mut last: Option<std::result::Result<usize, SequenceNumber>> = None;
        for r in raw {
            let seq = SequenceNumber::try_from(r.seq).map_err(|_| {
                Error::permanent(format!(
                    "Kinesis returned a malformed sequence number on shard {}",
                    self.shard
                ))
            })?;
            let threshold = match mark {
                Some(i) => Some((&out[i].seq, u64::MAX)),
                None => self.skip_through.as_ref().map(|(s, sub)| (s, *sub)),
            };
            // Sub-sequence numbers at or below this are covered (`None`: nothing is).
            let covered_through = match threshold {
                Some((s, _)) if seq < *s => Some(u64::MAX),
                Some((s, sub)) if seq == *s => Some(sub),
                _ => None,
            };
            // Never moves back: a service that re-sends older records (an emulator's
            // subscription at a sequence number starts at the shard's first record) must not
            // reopen what a checkpoint covers.
            let advances = threshold.is_none_or(|(s, _)| *s < seq);
            let first = out.len();
            let keep = |sub: u64| covered_through.is_none_or(|c| sub > c);
            let unpacked = if self.deaggregate {
                kpl::deaggregate_shared(&r.data, self.range.as_ref())
            } else {
                Deaggregated::Plain
            };
            let arrival = r.arrival_millis;
            let user =
                |seq: SequenceNumber, sub: u64, partition_key: String, data: bytes::Bytes| {
                    Record::new(seq, partition_key, data).with_sub(sub).with_arrival_millis(arrival)
                };
            let seq = match unpacked {
                Deaggregated::Plain => {
                    if keep(0) {
                        out.push(user(seq, 0, r.partition_key, r.data));
                        None
                    } else {
                        Some(seq)
                    }
                }
                Deaggregated::Records { records, out_of_range } => {
                    self.out_of_range(&seq, &out_of_range);
                    let skip = |i: u64| self.skip_out_of_range && out_of_range.contains(&i);
                    for (i, u) in records {
                        if keep(i) && !skip(i) {
                            out.push(user(seq.clone(), i, u.partition_key, u.data));
                        }
                    }
                    Some(seq)
                }
                Deaggregated::Malformed(why) => {
                    metrics::counter!(telemetry::MALFORMED_AGGREGATES).increment(1);
                    warn!(shard = %self.shard, seq = %seq, reason = %why,
                        "malformed KPL aggregate; delivering the raw record");
                    if keep(0) {
                        out.push(user(seq, 0, r.partition_key, r.data));
                        None
                    } else {
                        Some(seq)
                    }
                }
            };
            let delivered = out.len() > first;
            match seq {
                // Kept only when nothing of the record is in the output to refer to.
                Some(seq) if !delivered => {
                    if advances {
                        self.skip_through = Some((seq.clone(), u64::MAX));
                        mark = None;
                    }
                    last = Some(Err(seq));
                }
                _ => {
                    if advances {
                        mark = Some(first);
                    }
                    last = Some(Ok(first));
                }
            }
        }
        if let Some(i) = mark {
            self.skip_through = Some((out[i].seq.clone(), u64::MAX));
        }
        match last {
            Some(Ok(i)) => self.last_seq = Some(out[i].seq.clone()),
            Some(Err(seq)) => self.last_seq = Some(seq),
            None => {}
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use shardlease_core::{LeaseKey, Record, SequenceNumber};

    use super::Unpacker;
    use crate::api::RawRecord;
    use crate::config::ReadConfig;
    use crate::kpl::{self, Deaggregated, UserRecord};

    fn raw(seq: u64, data: Bytes) -> RawRecord {
        RawRecord {
            seq: format!("{seq:05}"),
            partition_key: format!("p{seq}"),
            data,
            arrival_millis: 7,
        }
    }

    fn plain(seq: u64) -> RawRecord {
        raw(seq, Bytes::from(format!("d{seq}")))
    }

    fn aggregate(seq: u64, n: usize) -> RawRecord {
        let users: Vec<UserRecord> = (0..n)
            .map(|j| UserRecord {
                partition_key: format!("u{seq}-{j}"),
                explicit_hash_key: None,
                data: Bytes::from(format!("d{seq}-{j}")),
            })
            .collect();
        raw(seq, kpl::aggregate(&users))
    }

    /// The rule, one user record at a time with a copied mark (the straightforward form).
    fn reference(
        skip: &mut Option<(SequenceNumber, u64)>,
        last: &mut Option<SequenceNumber>,
        page: &[RawRecord],
    ) -> Vec<Record> {
        let mut out = Vec::new();
        for r in page {
            let seq = SequenceNumber::parse(&r.seq).unwrap_or_else(|e| panic!("{e}"));
            let users: Vec<(u64, String, Bytes)> = match kpl::deaggregate(&r.data, None) {
                Deaggregated::Records { records, .. } => {
                    records.into_iter().map(|(i, u)| (i, u.partition_key, u.data)).collect()
                }
                _ => vec![(0, r.partition_key.clone(), r.data.clone())],
            };
            for (sub, pk, data) in users {
                let covered = skip.as_ref().is_some_and(|(s, k)| (&seq, sub) <= (s, *k));
                if !covered {
                    out.push(
                        Record::new(seq.clone(), pk, data).with_sub(sub).with_arrival_millis(7),
                    );
                }
            }
            if skip.as_ref().is_none_or(|(s, _)| *s < seq) {
                *skip = Some((seq.clone(), u64::MAX));
            }
            *last = Some(seq);
        }
        out
    }

    fn check(start: Option<(u64, u64)>, pages: &[Vec<RawRecord>]) {
        let start = start.map(|(s, sub)| (SequenceNumber::from(s), sub));
        let mut u = Unpacker::new(
            "s".into(),
            LeaseKey::from("s0"),
            None,
            &ReadConfig::default(),
            start.clone(),
        );
        let (mut skip, mut last) = (start, None);
        for (i, page) in pages.iter().enumerate() {
            let want = reference(&mut skip, &mut last, page);
            let got = u.convert(page.clone()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got, want, "page {i}");
            assert_eq!(u.skip_through, skip, "mark after page {i}");
            assert_eq!(u.last_seq, last, "last after page {i}");
        }
    }

    #[test]
    fn plain_pages_deliver_every_record_once_and_move_the_mark() {
        check(None, &[vec![plain(1), plain(2), plain(3)], vec![], vec![plain(4)]]);
    }

    #[test]
    fn a_checkpoint_inside_an_aggregate_skips_only_what_it_covers() {
        check(Some((10, 1)), &[vec![aggregate(10, 4), plain(11), aggregate(12, 3)]]);
        check(Some((10, 3)), &[vec![aggregate(10, 4)], vec![plain(11)]]);
        check(Some((10, 0)), &[vec![plain(10), plain(11)]]);
    }

    #[test]
    fn records_sent_again_are_not_delivered_again() {
        // An emulator's subscription restarting at the shard's first record, and a page
        // that goes back within itself.
        check(
            None,
            &[
                vec![plain(1), aggregate(2, 2), plain(3)],
                vec![plain(1), aggregate(2, 2), plain(3), plain(4)],
                vec![plain(6), plain(5), plain(6), plain(7), aggregate(7, 2)],
            ],
        );
        check(Some((5, u64::MAX)), &[vec![plain(3), plain(4)], vec![plain(5), plain(6)]]);
    }

    #[test]
    fn a_page_that_delivers_nothing_still_moves_the_mark_and_the_last_record() {
        check(Some((9, u64::MAX)), &[vec![plain(8), aggregate(9, 2)], vec![plain(9), plain(10)]]);
        check(None, &[vec![aggregate(3, 0), aggregate(4, 0)], vec![plain(4), plain(5)]]);
    }

    #[test]
    fn a_malformed_sequence_number_is_an_error() {
        let mut u =
            Unpacker::new("s".into(), LeaseKey::from("s0"), None, &ReadConfig::default(), None);
        let mut bad = plain(1);
        bad.seq = "12x".into();
        assert!(u.convert(vec![bad]).is_err());
        assert_eq!(u.last_seq, None);
    }
}
