//! The shardlease conformance suite, unchanged, against the Redis store on a Redis Cluster: the
//! cluster named by `SHARDLEASE_TEST_REDIS_CLUSTER_URL` (`redis+cluster://h:7000,h:7001,…`;
//! scripts/services.sh starts one on loopback; skipped when unset, a failure under CI=true).
//! Every case works in fresh namespaces and deletes their keys afterwards.

mod common;

shardlease_testkit::store_conformance_tests!(@async common::cluster_factory());
