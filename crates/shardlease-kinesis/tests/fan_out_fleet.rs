//! End to end through enhanced fan-out on the in-process ferrokinesis: the fleet scenario of
//! [`common::fleet`] (two workers, a third joining so leases move between workers while their
//! subscriptions are open, a split and a merge), with subscription sessions of 400 ms so
//! they also end and renew throughout. Every record is processed exactly once, children after
//! parents.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fast_reads;
use common::ferro::{fan_out, ferrokinesis};
use common::fleet::reshard_fleet;
use shardlease_core::ShardSource;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reads_everything_once_while_leases_move_between_subscribed_workers() {
    let k = ferrokinesis(Duration::from_millis(400)).await;
    let stream = k.create_stream(2).await;
    let source: Arc<dyn ShardSource> =
        Arc::new(k.fan_out_source(&stream, fan_out("fleet"), fast_reads()).await);
    let outcome = reshard_fleet(&k, &stream, source).await;
    assert!(outcome.handoffs >= 1);
}
