//! The shardlease conformance suite against the DynamoDB store, on the emulator named by
//! `SHARDLEASE_TEST_DYNAMODB_ENDPOINT` (skipped when unset, a failure under CI=true). Every case
//! works in fresh namespaces of one shared table and deletes their items afterwards.

mod common;

shardlease_testkit::store_conformance_tests!(@async common::factory());
