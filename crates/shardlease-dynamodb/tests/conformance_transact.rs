//! The conformance suite's cases for batch writes (and the single writes they fall back to)
//! against the DynamoDB store writing its batches as `TransactWriteItems`
//! (`transact_batches(true)`), on the emulator named by `SHARDLEASE_TEST_DYNAMODB_ENDPOINT`
//! (skipped when unset). `conformance.rs` runs the whole suite on the default batches.

mod common;

async fn transact_factory() -> Option<common::DynamoFactory> {
    common::factory().await.map(common::DynamoFactory::transact_batches)
}

macro_rules! transact_cases {
    ($($case:ident)*) => {
        $( shardlease_testkit::__conformance_test_fn! { (async transact_factory()) $case } )*
    };
}

transact_cases! {
    a_batch_applies_each_compare_and_set_on_its_own
    an_empty_batch_does_nothing
    a_batch_honours_versions_like_update_lease
    a_batch_creates_only_missing_leases
    a_batch_larger_than_any_backend_chunk
    one_worker_takes_every_lease_in_one_pass
    children_wait_for_their_parents
}
