//! The smallest complete consumer: one worker, an in-memory stream of 4 shards, a processor that
//! prints what it reads. Swap the URL for `sqlite://app.db`, `postgres://…` or `redis://…` and
//! nothing else changes. Run: `cargo run --example minimal`.

use std::sync::Arc;
use std::time::Duration;

use shardlease::{processor_fn, Config, MemorySource, Position, Worker};

#[tokio::main]
async fn main() -> shardlease::Result<()> {
    let store = shardlease::connect("memory://").await?;
    let stream = Arc::new(MemorySource::new(4));
    for i in 0..20 {
        stream.put(&format!("user-{i}"), format!("event {i}"));
    }
    let processor = processor_fn(|ctx, batch| async move {
        for record in batch.records.iter() {
            println!("{} #{}: {:?}", ctx.key(), record.seq, record.data);
        }
        Ok(()) // checkpointed after the batch, fenced by the lease's epoch
    });
    let config = Config::new("default")?
        .with_initial_position(Position::TrimHorizon)
        .with_heartbeat(Duration::from_millis(200));
    let worker = Worker::builder(config, store, stream, processor).build()?.start();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = worker.shutdown().await;
    println!(
        "released {} leases, processed {} records",
        report.released.len(),
        worker.stats().records
    );
    Ok(())
}
