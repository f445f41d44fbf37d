//! The shardlease conformance suite against the Redis store, on the server named by
//! `SHARDLEASE_TEST_REDIS_URL` (skipped when unset, a failure under CI=true). Every case works in
//! fresh namespaces and deletes their keys afterwards.

mod common;

shardlease_testkit::store_conformance_tests!(@async common::factory());

/// The batch scripts are loaded again when the server has forgotten them (`SCRIPT FLUSH`, as
/// after a restart): the batch that meets `NOSCRIPT` is applied, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::unwrap_used)]
async fn batch_scripts_are_loaded_again_after_a_flush() {
    use shardlease_core::store::{CreateOutcome, Lease, LeaseStore, LeaseUpdate};
    use shardlease_core::Position;
    use shardlease_testkit::suite::with_scope;
    let Some(f) = common::factory().await else { return };
    let f = &f;
    with_scope(f, "redis_batch_noscript", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        let store = f.open(&ns).await.unwrap();
        let mut conn = store.connection();
        let flush = || redis::cmd("SCRIPT").arg("FLUSH").to_owned();
        let _: () = flush().query_async(&mut conn).await.unwrap();
        let leases =
            [Lease::new("a", Position::TrimHorizon), Lease::new("b", Position::TrimHorizon)];
        let created = store.create_leases(&leases).await.unwrap();
        let CreateOutcome::Created(v) = created[1] else { panic!("{created:?}") };
        let _: () = flush().query_async(&mut conn).await.unwrap();
        let updated = store.update_leases(&[LeaseUpdate::new(leases[1].clone(), v)]).await.unwrap();
        assert!(updated[0].is_ok(), "{updated:?}");
    })
    .await;
}
