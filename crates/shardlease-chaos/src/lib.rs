//! A fault campaign for shardlease with real processes: a fleet of consumer processes built on
//! the public API only, a producer, and a harness whose nemesis kills (`kill -9`), pauses
//! (`SIGSTOP` past the failover timeout), stops and restarts them, partitions one of them from
//! the store through a TCP proxy, restarts a private store server, and splits and merges the
//! stream's shards; then a checker judges what the fleet wrote. See `docs/reliability.md`.

pub mod checker;
pub mod consumer;
pub mod events;
pub mod harness;
pub mod kinesis;
pub mod producer;
pub mod proxy;
pub mod schedule;
pub mod sink;
pub mod stores;
