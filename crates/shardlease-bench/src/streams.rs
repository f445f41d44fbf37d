//! The in-memory stream(s) a run reads: `--shards` shards in one [`MemorySource`], or, with
//! `--streams K` above 1, spread over K in-memory streams combined by a [`MultiSource`] (lease keys
//! `s0/shardId-…`), so the multi-stream source's coordination figures can be compared with a
//! single stream of the same total shard count.
//!
//! Every part of the bench that writes records or reads the stream back goes through
//! [`BenchStreams`], which addresses shards by the lease key the workers see (qualified when there
//! are several streams).

use std::sync::Arc;

use rand::Rng;
use shardlease::{qualify, split_key, LeaseKey, MemorySource, MultiSource, Record, ShardSource};

use crate::error::BenchError;

/// The stream(s) of one run.
#[derive(Clone, Debug)]
pub struct BenchStreams {
    /// Each stream's name and source, in order (`s0`, `s1`, …); one unnamed stream when single.
    streams: Vec<(String, MemorySource)>,
    /// Shards in each stream, as created (the bench never splits or merges), so the producer
    /// picks a stream without listing shards per record.
    sizes: Vec<usize>,
}

impl BenchStreams {
    /// `shards` shards spread over `streams` streams: `shards / streams` each, the remainder one
    /// more to each of the first streams. `streams` is clamped to 1..=`shards` (the flags are
    /// validated before).
    pub fn new(shards: usize, streams: usize, batch_limit: usize) -> Self {
        let k = streams.clamp(1, shards.max(1));
        let (each, extra) = (shards / k, shards % k);
        let sizes: Vec<usize> = (0..k).map(|i| each + usize::from(i < extra)).collect();
        let streams = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("s{i}"), MemorySource::new(n).with_batch_limit(batch_limit)))
            .collect();
        BenchStreams { streams, sizes }
    }

    /// Whether the streams are read through a [`MultiSource`] (`--streams` above 1).
    fn multi(&self) -> bool {
        self.streams.len() > 1
    }

    /// The source the workers read: the single stream itself, or every stream behind one
    /// [`MultiSource`].
    pub fn source(&self) -> Result<Arc<dyn ShardSource>, BenchError> {
        match (self.multi(), self.streams.first()) {
            (false, Some((_, single))) => Ok(Arc::new(single.clone())),
            _ => {
                let mut builder = MultiSource::builder();
                for (name, s) in &self.streams {
                    builder = builder.stream(name.clone(), Arc::new(s.clone()));
                }
                Ok(Arc::new(builder.build()?))
            }
        }
    }

    /// Every shard's lease key, as the workers see it.
    pub fn keys(&self) -> Vec<LeaseKey> {
        self.streams
            .iter()
            .flat_map(|(name, s)| s.shards().into_iter().map(|sh| self.key(name, &sh.id)))
            .collect()
    }

    fn key(&self, stream: &str, shard: &LeaseKey) -> LeaseKey {
        if self.multi() {
            qualify(stream, shard)
        } else {
            shard.clone()
        }
    }

    /// The stream of a lease key and the shard's own id in it.
    fn locate(&self, key: &LeaseKey) -> Result<(&MemorySource, LeaseKey), BenchError> {
        let found = if self.multi() {
            split_key(key).and_then(|(stream, id)| {
                self.streams.iter().find(|(n, _)| n == stream).map(|(_, s)| (s, id))
            })
        } else {
            self.streams.first().map(|(_, s)| (s, key.clone()))
        };
        found.ok_or_else(|| BenchError::Setup(format!("no bench stream has shard {key}")))
    }

    /// Writes a record to the shard with lease key `key`.
    pub fn put_to_shard(&self, key: &LeaseKey, data: Vec<u8>) -> Result<(), BenchError> {
        let (source, id) = self.locate(key)?;
        source.put_to_shard(&id, data)?;
        Ok(())
    }

    /// Writes a record with a random partition key to a stream chosen with odds proportional to
    /// its shards (so every shard of every stream gets the same rate on average); with one stream
    /// the draw is the single stream's partition key alone, as before `--streams`.
    pub fn put_random(&self, rng: &mut impl Rng, data: Vec<u8>) {
        let stream = if self.multi() {
            let total: usize = self.sizes.iter().sum();
            let mut pick = rng.random_range(0..total.max(1));
            self.streams.iter().zip(&self.sizes).find_map(|(s, &n)| {
                if pick < n {
                    Some(s)
                } else {
                    pick -= n;
                    None
                }
            })
        } else {
            self.streams.first()
        };
        if let Some((_, s)) = stream {
            let key = format!("pk-{:016x}", rng.random::<u64>());
            s.put(&key, data);
        }
    }

    /// Records written so far, over every stream.
    pub fn produced(&self) -> u64 {
        self.streams.iter().map(|(_, s)| s.produced()).sum()
    }

    /// The records of the shard with lease key `key` (none for an unknown key).
    pub fn records(&self, key: &LeaseKey) -> Vec<Record> {
        self.locate(key).map(|(s, id)| s.records(&id)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn shards_are_spread_with_the_remainder_first() {
        let s = BenchStreams::new(10, 3, 100);
        assert_eq!(s.streams.len(), 3);
        assert_eq!(s.sizes, [4, 3, 3]);
        let listed: Vec<usize> = s.streams.iter().map(|(_, m)| m.shards().len()).collect();
        assert_eq!(listed, [4, 3, 3]);
        let keys = s.keys();
        assert_eq!(keys.len(), 10);
        assert!(keys.iter().all(|k| split_key(k).is_some()), "{keys:?}");
        assert_eq!(
            BenchStreams::new(5, 1, 100).keys(),
            MemorySource::new(5).shards().iter().map(|s| s.id.clone()).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn the_source_lists_every_stream_and_records_reach_every_stream() {
        let s = BenchStreams::new(7, 3, 100);
        let listed: Vec<LeaseKey> =
            s.source().unwrap().list_shards().await.unwrap().into_iter().map(|i| i.id).collect();
        let mut keys = s.keys();
        keys.sort();
        let mut listed_sorted = listed.clone();
        listed_sorted.sort();
        assert_eq!(listed_sorted, keys);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for i in 0..700 {
            s.put_random(&mut rng, format!("r{i}").into_bytes());
        }
        assert_eq!(s.produced(), 700);
        let per_shard: Vec<usize> = keys.iter().map(|k| s.records(k).len()).collect();
        assert_eq!(per_shard.iter().sum::<usize>(), 700);
        assert!(per_shard.iter().all(|&n| n > 0), "{per_shard:?}");
        s.put_to_shard(&keys[6], b"x".to_vec()).unwrap();
        assert_eq!(s.records(&keys[6]).len(), per_shard[6] + 1);
        assert!(s.put_to_shard(&LeaseKey::from("nope/shardId-0"), vec![]).is_err());
    }
}
