//! Lease loads: what a worker measures of each lease it runs, and the bounded form it publishes
//! in its heartbeat record for the load-aware balancer (docs/algorithm.md, "Balancing by load").
//!
//! A lease's load is its share of its worker's cores while its processor handles batches (busy
//! seconds per second, so 1.0 is a lease that keeps one core busy; see `runtime/core_share.rs`):
//! that is what a hot shard costs, on whatever machine runs it, without the time it waited for a
//! core its co-located leases were using. A worker publishes only its [`MAX_PUBLISHED_LEASE_LOADS`] heaviest
//! leases and its total, so a record stays small and a listing of the worker records stays
//! O(workers) to read however many leases there are; the balancer estimates every other lease of
//! that worker as the average of the rest.
//!
//! Stores keep the published loads as one text field ([`encode_lease_loads`],
//! [`decode_lease_loads`]), so a store needs no schema of its own for them.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::ids::LeaseKey;

/// The most lease loads a worker publishes in its heartbeat record (its heaviest leases).
///
/// With keys of Kinesis length (about 20 bytes) the published list is under 600 bytes.
pub const MAX_PUBLISHED_LEASE_LOADS: usize = 16;

/// One lease's measured load, as published in a worker record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseLoad {
    /// The lease.
    pub key: LeaseKey,
    /// Busy seconds per second of its processor (exponentially weighted); finite, at least 0.
    pub load: f64,
}

impl LeaseLoad {
    /// The load of `key`.
    pub fn new(key: impl Into<LeaseKey>, load: f64) -> Self {
        LeaseLoad { key: key.into(), load }
    }
}

/// The text form a store keeps: one line per lease, the load then a space then the key. Keys
/// cannot hold control characters (they are validated names), so a newline always ends one.
/// Loads that are not finite or are negative are written as 0.
pub fn encode_lease_loads(loads: &[LeaseLoad]) -> String {
    let mut out = String::new();
    for (i, l) in loads.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let load = if l.load.is_finite() && l.load > 0.0 { l.load } else { 0.0 };
        // Six significant digits are plenty for a balancing decision and keep records small.
        let _ = write!(out, "{load:.6e} {}", l.key);
    }
    out
}

/// Reads [`encode_lease_loads`]'s form back; a store reports an error as a corrupt record.
/// The empty text is no loads.
pub fn decode_lease_loads(text: &str) -> Result<Vec<LeaseLoad>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (n, line) in text.split('\n').enumerate() {
        let Some((load, key)) = line.split_once(' ') else {
            return Err(format!("lease load {n}: expected `<load> <key>`"));
        };
        let load: f64 =
            load.parse().map_err(|_| format!("lease load {n}: `{load}` is not a number"))?;
        if !load.is_finite() || load < 0.0 {
            return Err(format!("lease load {n}: {load} is not a finite load"));
        }
        if key.is_empty() {
            return Err(format!("lease load {n}: empty lease key"));
        }
        out.push(LeaseLoad::new(key, load));
    }
    if out.len() > MAX_PUBLISHED_LEASE_LOADS * 4 {
        return Err(format!("{} lease loads, more than any worker publishes", out.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn loads_round_trip_through_text() {
        let loads = vec![
            LeaseLoad::new("shardId-000000000001", 0.25),
            LeaseLoad::new("stream a/shard with spaces", 1.5e-7),
            LeaseLoad::new("z", 0.0),
        ];
        let text = encode_lease_loads(&loads);
        let back = decode_lease_loads(&text).unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in loads.iter().zip(&back) {
            assert_eq!(a.key, b.key);
            assert!((a.load - b.load).abs() <= a.load * 1e-5, "{} vs {}", a.load, b.load);
        }
        assert_eq!(decode_lease_loads("").unwrap(), Vec::new());
        assert_eq!(encode_lease_loads(&[]), "");
    }

    #[test]
    fn bad_loads_are_written_as_zero_and_bad_text_is_an_error() {
        let text = encode_lease_loads(&[
            LeaseLoad::new("a", f64::NAN),
            LeaseLoad::new("b", -1.0),
            LeaseLoad::new("c", f64::INFINITY),
        ]);
        assert!(decode_lease_loads(&text).unwrap().iter().all(|l| l.load == 0.0));
        for bad in ["0.5", "x a", "NaN a", "-1 a", "0.5 ", "inf a"] {
            assert!(decode_lease_loads(bad).is_err(), "{bad:?} accepted");
        }
    }
}
