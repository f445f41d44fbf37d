//! The shardlease conformance suite against the etcd store with change notification off
//! (`watch=false`): the worker must run on etcd exactly as on a store that cannot notify.

mod common;

shardlease_testkit::store_conformance_tests!(@async common::factory_without_watch());
