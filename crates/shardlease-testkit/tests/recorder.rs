//! The recorder's failure report: when a test finds records processed twice, it must say which
//! processor instances read them and whether a checkpoint had failed (a retry of the same batch)
//! or a second owner read them, so a red run on a loaded CI machine can be diagnosed from its
//! output alone.

use std::sync::Arc;

use shardlease_core::store::{Lease, LeaseStore, MemoryBackend, StoreCheckpointer};
use shardlease_core::{
    Batch, CheckpointHandle, Epoch, LeaseContext, LeaseToken, Namespace, Position, Record,
    SequenceNumber, WorkerId,
};
use shardlease_testkit::recorder::Recorder;

fn batch(seqs: &[u128]) -> Batch {
    Batch::new(
        seqs.iter().map(|s| Record::new(SequenceNumber::from(*s), "k", format!("r{s}"))).collect(),
    )
}

fn context(token: &LeaseToken) -> LeaseContext {
    LeaseContext { token: token.clone(), start: Position::TrimHorizon, parents: Vec::new() }
}

#[tokio::test]
async fn the_report_names_each_reader_and_counts_failed_checkpoints() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryBackend::new().store(Namespace::default()));
    let owner = WorkerId::new("w1");
    let mut lease = Lease::new("shard-0", Position::TrimHorizon);
    lease.owner = Some(owner.clone());
    lease.epoch = Epoch(7);
    store.create_lease(&lease).await.expect("create");
    let current = LeaseToken { key: lease.key.clone(), owner: owner.clone(), epoch: Epoch(7) };
    let stale = LeaseToken { epoch: Epoch(6), ..current.clone() };
    let cp: Arc<dyn shardlease_core::Checkpointer> = Arc::new(StoreCheckpointer::new(store));

    let rec = Recorder::new();
    assert!(rec.duplicate_report().is_empty(), "nothing delivered yet");
    let factory = rec.factory();
    let mut first = factory.create(&context(&stale));
    let mut second = factory.create(&context(&current));
    // The first instance's checkpoint is refused (its token is stale), so it fails the batch.
    let refused =
        first.process_records(&batch(&[1, 2, 3]), &CheckpointHandle::new(cp.clone(), stale)).await;
    assert!(refused.is_err(), "a stale token's checkpoint fails the batch");
    second
        .process_records(&batch(&[2, 3, 4]), &CheckpointHandle::new(cp, current))
        .await
        .expect("the owner's batch");

    assert_eq!(rec.duplicates(), 2);
    assert_eq!(rec.checkpoint_failures(), 1);
    let report = rec.duplicate_report();
    assert_eq!(report.len(), 1, "one line per shard: {report:?}");
    assert!(report[0].starts_with("shard-0: 2 records again"), "{report:?}");
    assert!(report[0].contains("instance 1 at epoch 6"), "{report:?}");
    assert!(report[0].contains("instance 2 at epoch 7"), "{report:?}");
}
