//! Values that do not decode (not JSON, another format number, a document naming another record)
//! are reported as `Error::Corrupt` / `Listing::corrupt` for that record only: nothing panics,
//! and every other lease and worker keeps working, also across listing pages. Runs on the server
//! named by `SHARDLEASE_TEST_ETCD_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use shardlease_core::{
    CreateOutcome, Error, Lease, LeaseKey, LeaseStore, Position, Version, WorkerId, WorkerRecord,
};
use shardlease_etcd::EtcdStore;
use shardlease_testkit::suite::with_scope;

fn corrupt_reason<T: std::fmt::Debug>(r: shardlease_core::Result<T>, key: &str) -> String {
    match r {
        Err(Error::Corrupt { key: k, reason }) => {
            assert_eq!(k, key);
            reason
        }
        other => panic!("expected Error::Corrupt for {key}, got {other:?}"),
    }
}

async fn put(store: &EtcdStore, key: String, value: &[u8]) {
    store.client().kv_client().put(key, value.to_vec(), None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_records_are_reported_per_record() {
    let Some(factory) = common::factory().await else { return };
    let opener = common::EtcdFactory::new(factory.url().to_owned(), false);
    with_scope(&factory, "corrupt_records", |scope| async move {
        let (ns, _) = scope.fresh_store().await;
        // Small pages, so corrupt entries fall on several pages.
        let store = opener.open(&ns).await.unwrap().with_page_size(2);
        for k in ["good-1", "good-2", "good-3", "garbled", "format-9", "elsewhere"] {
            let created = store.create_lease(&Lease::new(k, Position::TrimHorizon)).await.unwrap();
            assert!(matches!(created, CreateOutcome::Created(_)));
        }
        let key = |k: &str| store.lease_etcd_key(&LeaseKey::from(k));
        put(&store, key("garbled"), b"{not json \xff").await;
        let other_format = String::from_utf8(shardlease_etcd::codec::encode_lease(
            &Lease::new("format-9", Position::Latest),
            Version(5),
        ))
        .unwrap()
        .replace("\"format\":1", "\"format\":9");
        put(&store, key("format-9"), other_format.as_bytes()).await;
        let misplaced = shardlease_etcd::codec::encode_lease(
            &Lease::new("good-1", Position::Latest),
            Version(5),
        );
        put(&store, key("elsewhere"), &misplaced).await;

        assert!(corrupt_reason(store.get_lease(&"garbled".into()).await, "garbled")
            .contains("not a lease"));
        assert!(corrupt_reason(store.get_lease(&"format-9".into()).await, "format-9")
            .contains("format 9"));
        corrupt_reason(store.get_lease(&"elsewhere".into()).await, "elsewhere");
        let listing = store.list_leases().await.unwrap();
        let mut good: Vec<_> =
            listing.items.iter().map(|v| v.lease.key.as_str().to_owned()).collect();
        good.sort();
        assert_eq!(good, ["good-1", "good-2", "good-3"]);
        let mut bad: Vec<_> = listing.corrupt.iter().map(|c| c.key.clone()).collect();
        bad.sort();
        assert_eq!(bad, ["elsewhere", "format-9", "garbled"], "named by the lease key exactly");

        // A compare-and-set on a corrupt record reports it, and changes nothing.
        let r = store.update_lease(&Lease::new("garbled", Position::Latest), Version(1)).await;
        corrupt_reason(r, "garbled");
        let r = store.delete_lease(&"garbled".into(), Version(1)).await;
        corrupt_reason(r, "garbled");

        // Worker records too.
        store.heartbeat(&WorkerRecord::new(WorkerId::new("w-good"), 1)).await.unwrap();
        put(&store, store.worker_etcd_key(&WorkerId::new("w-bad")), b"[]").await;
        let workers = store.list_workers().await.unwrap();
        assert_eq!(workers.items.len(), 1);
        assert_eq!(workers.corrupt.len(), 1);
        assert_eq!(workers.corrupt[0].key, "w-bad");
        assert!(!store.remove_worker_if(&WorkerId::new("w-bad"), 1).await.unwrap());
    })
    .await;
}
