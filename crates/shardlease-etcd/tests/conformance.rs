//! The shardlease conformance suite against the etcd store, on the server named by
//! `SHARDLEASE_TEST_ETCD_URL` (skipped when unset, a failure under CI=true), with change
//! notification on (the lease-loop cases then run with the watch-driven reactions). Every case
//! works in fresh namespaces and deletes their keys afterwards.

mod common;

shardlease_testkit::store_conformance_tests!(@async common::factory());
