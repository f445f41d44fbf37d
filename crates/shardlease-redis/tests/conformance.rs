//! The shardlease conformance suite against the Redis store, on the server named by
//! `SHARDLEASE_TEST_REDIS_URL` (skipped when unset, a failure under CI=true). Every case works in
//! fresh namespaces and deletes their keys afterwards.

mod common;

shardlease_testkit::store_conformance_tests!(@async common::factory());
