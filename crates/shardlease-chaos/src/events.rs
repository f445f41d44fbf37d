//! The lines the processes of a fault run append to their files, and the clock they stamp them
//! with: the consumers' record, acquisition and checkpoint events and the producer's acknowledged
//! writes. The checker reads nothing else, so these lines are the contract between the fleet and
//! the checker. Every process runs on one machine, so its monotonic clock orders them (not the
//! wall clock, which the `clock` fault skews).

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Microseconds on the machine's monotonic clock (since boot): the shared clock of every
/// process in a run.
pub fn now_micros() -> u64 {
    // CLOCK_MONOTONIC is one clock for every process of the machine, and rustix reads it through
    // the vDSO, past libfaketime: the `clock` fault skews a consumer's wall clock, never this.
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let micros = i128::from(t.tv_sec) * 1_000_000 + i128::from(t.tv_nsec) / 1_000;
    u64::try_from(micros).unwrap_or_default()
}

/// One line of a consumer's output file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum ConsumerEvent {
    /// A processor started on a lease: the store granted `epoch` to `owner` before `t`.
    Init {
        /// When the processor was created (after the store granted the lease).
        t: u64,
        /// The shard.
        shard: String,
        /// The worker holding the lease.
        owner: String,
        /// The lease's fencing epoch.
        epoch: u64,
        /// Where reading starts, as the lease said.
        start: String,
    },
    /// One record processed (written and fsynced before the checkpoint that covers it).
    Rec {
        /// The shard.
        shard: String,
        /// The record's sequence number.
        seq: String,
        /// The record's unique id (its payload).
        id: String,
        /// The worker.
        owner: String,
        /// The epoch it was processed under.
        epoch: u64,
    },
    /// A checkpoint write and its outcome.
    Ckpt {
        /// Just before the write was sent.
        t0: u64,
        /// Just after the store answered.
        t1: u64,
        /// The shard.
        shard: String,
        /// The position written: a sequence number, or `END`.
        pos: String,
        /// The writer.
        owner: String,
        /// The epoch written under.
        epoch: u64,
        /// Whether the store accepted it.
        ok: bool,
        /// The error, when refused or failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        err: Option<String>,
    },
}

/// One record the producer wrote, acknowledged by the stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Produced {
    /// The record's unique id (its payload).
    pub id: String,
    /// The shard the stream put it in.
    pub shard: String,
    /// Its sequence number.
    pub seq: String,
}

/// An append-only line file, fsynced on demand.
#[derive(Debug)]
pub struct LineFile {
    file: std::fs::File,
    buf: Vec<u8>,
}

impl LineFile {
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LineFile { file, buf: Vec::new() })
    }

    /// Buffers one line.
    pub fn push<T: Serialize>(&mut self, value: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.buf, value)?;
        self.buf.push(b'\n');
        Ok(())
    }

    /// Writes the buffered lines and fsyncs the file.
    pub fn sync(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all(&self.buf)?;
            self.buf.clear();
        }
        self.file.sync_data()
    }
}

/// Reads every complete JSON line of `path` (a torn last line, left by a kill -9, is skipped).
pub fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Vec<T>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// A position as the consumers log it: the sequence number, or `END` for the end of a shard.
pub fn position_label(p: &shardlease::Position) -> String {
    match p {
        shardlease::Position::Sequence { seq, .. } => seq.to_string(),
        shardlease::Position::ShardEnd => "END".to_owned(),
        other => other.to_string(),
    }
}
