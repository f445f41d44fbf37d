//! The macros that turn the conformance suite into tests.
//!
//! [`__conformance_cases!`](crate::__conformance_cases) holds the one list of case names; the
//! test generator, [`STORE_CASES`](crate::suite::STORE_CASES) and
//! [`run_all`](crate::suite::run_all) are all expanded from it, so adding a case to the suite is
//! one `pub async fn(&dyn StoreFactory)` re-exported from `suite` plus one line in that list.

/// The list of every conformance case: calls `callback! { args case_1 case_2 ... }`.
///
/// Each name is a `pub async fn name(factory: &dyn StoreFactory)` in
/// [`shardlease_testkit::suite`](crate::suite). Add a new case here (one line).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ([$($callback:tt)*] $args:tt) => {
        $($callback)*! {
            $args
            create_and_get_round_trip
            create_race_is_idempotent
            update_is_compare_and_set
            delete_is_compare_and_set
            concurrent_increments
            a_batch_applies_each_compare_and_set_on_its_own
            an_empty_batch_does_nothing
            a_batch_honours_versions_like_update_lease
            a_batch_creates_only_missing_leases
            a_batch_larger_than_any_backend_chunk
            a_rolled_back_record_never_accepts_a_stale_version
            list_many_leases
            namespaces_are_isolated
            worker_records
            worker_records_keep_lease_loads
            remove_worker_if_checks_the_beat
            a_heartbeat_never_moves_the_beat_back
            the_fleet_signal_round_trips
            get_workers_reads_the_named_records
            notices_announce_ownership_changes_only
            a_dropped_subscription_ends_its_stream
            one_worker_takes_every_lease_in_one_pass
            workers_share_leases_evenly
            a_joining_worker_gets_its_share_without_duplicates
            a_crashed_workers_leases_are_taken_over
            a_graceful_leave_releases_leases_and_keeps_checkpoints
            a_zombie_cannot_checkpoint
            children_wait_for_their_parents
        }
    };
}

/// Expands to one test fn per case (see
/// [`store_conformance_tests!`](crate::store_conformance_tests)).
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test_fns {
    ($how:tt $($case:ident)*) => {
        $( $crate::__conformance_test_fn! { $how $case } )*
    };
}

/// Expands to the test fn of one case.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test_fn {
    ((sync $factory:expr) $case:ident) => {
        #[test]
        fn $case() {
            $crate::suite::__run_test(async {
                let factory = $factory;
                $crate::suite::$case(&factory).await;
            });
        }
    };
    ((async $factory:expr) $case:ident) => {
        #[test]
        fn $case() {
            $crate::suite::__run_test(async {
                let factory = match $crate::suite::MaybeFactory::into_factory(($factory).await) {
                    ::core::result::Result::Ok(factory) => factory,
                    ::core::result::Result::Err(reason) => {
                        $crate::suite::skip(::core::stringify!($case), &reason);
                        return;
                    }
                };
                $crate::suite::$case(&factory).await;
            });
        }
    };
}

/// Generates the conformance suite as tests: one `#[test] fn <case>()` per case of
/// [`STORE_CASES`](crate::suite::STORE_CASES), each running on a multi-threaded tokio runtime with
/// 2 worker threads (like `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`; the
/// calling crate needs no tokio features of its own).
///
/// The factory expression is evaluated afresh inside each test, in async context (so it may
/// contain `.await`):
///
/// ```text
/// // The factory is always available:
/// shardlease_testkit::store_conformance_tests!(MemoryFactory::new());
///
/// // The factory needs a server: an async expression giving an `Option<F>` (or a
/// // `Result<F, String>`); `None` / `Err(reason)` skips the test with a printed line (and fails
/// // it when `CI=true`).
/// async fn postgres() -> Option<PgFactory> {
///     let url = shardlease_testkit::suite::env_or_skip("SHARDLEASE_TEST_POSTGRES_URL")?;
///     Some(PgFactory::connect(&url).await.expect("connect to PostgreSQL"))
/// }
/// shardlease_testkit::store_conformance_tests!(@async postgres());
/// ```
///
/// The test fns are named after the cases, so invoke the macro once per module (wrap it in a
/// `mod` to run the suite against several factories in one file).
#[macro_export]
macro_rules! store_conformance_tests {
    (@async $factory:expr $(,)?) => {
        $crate::__conformance_cases!([$crate::__conformance_test_fns] (async $factory));
    };
    ($factory:expr $(,)?) => {
        $crate::__conformance_cases!([$crate::__conformance_test_fns] (sync $factory));
    };
}

/// Expands to the `#[test]` of one extension case (see [`corrupt_record_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __extension_test {
    ($factory:expr, $module:ident :: $case:ident) => {
        #[test]
        fn $case() {
            $crate::suite::__run_test(async {
                let ::core::option::Option::Some(hooks) = $factory.await else { return };
                $crate::extensions::$module::$case(&hooks).await;
            });
        }
    };
}

/// Generates the corrupt-record cases of [`extensions::corrupt`](crate::extensions::corrupt) as
/// tests, on the same runtime as
/// [`store_conformance_tests!`](crate::store_conformance_tests). `$factory` is an async expression
/// giving an `Option` of a [`CorruptRecords`](crate::extensions::CorruptRecords) implementation
/// (`None`: the store's server is not configured; the factory said so, as a skip).
///
/// ```text
/// shardlease_testkit::corrupt_record_tests!(corrupting_factory());
/// ```
#[macro_export]
macro_rules! corrupt_record_tests {
    ($factory:expr) => {
        $crate::__extension_test!($factory, corrupt::corrupt_leases_are_reported_per_record);
        $crate::__extension_test!($factory, corrupt::corrupt_workers_are_reported_per_record);
        $crate::__extension_test!(
            $factory,
            corrupt::a_worker_processes_the_leases_around_a_corrupt_one
        );
    };
}

/// Generates the redaction case of [`extensions::redaction`](crate::extensions::redaction) as a
/// test. `$hooks` is an async expression giving an `Option` of a
/// [`SecretUrl`](crate::extensions::SecretUrl) implementation.
#[macro_export]
macro_rules! redaction_tests {
    ($hooks:expr) => {
        $crate::__extension_test!($hooks, redaction::an_unreachable_server_hides_the_password);
    };
}

/// Expands to the `#[test]` of one TLS case (see [`store_tls_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __tls_test {
    ($hooks:expr, $case:ident) => {
        #[test]
        fn $case() {
            $crate::extensions::tls::__run_tls_test(|logs| async move {
                let ::core::option::Option::Some(hooks) = $hooks.await else { return };
                $crate::extensions::tls::$case(&hooks, logs).await;
            });
        }
    };
}

/// Generates the TLS cases of [`extensions::tls`](crate::extensions::tls) as tests, each on a
/// current-thread runtime with every log line captured. `$hooks` is an async expression giving
/// an `Option` of a [`TlsUrls`](crate::extensions::TlsUrls) implementation (`None`: the TLS
/// server is not configured; [`TlsEnv::from_env`](crate::extensions::TlsEnv::from_env) said so,
/// as a skip).
///
/// ```text
/// shardlease_testkit::store_tls_tests!(async { TlsEnv::from_env("SHARDLEASE_TEST_TLS_REDIS_ADDR").map(RedisTls) });
/// ```
#[macro_export]
macro_rules! store_tls_tests {
    ($hooks:expr) => {
        $crate::__tls_test!($hooks, a_trusted_certificate_connects);
        $crate::__tls_test!($hooks, an_unknown_ca_is_refused);
        $crate::__tls_test!($hooks, a_wrong_host_name_is_refused);
    };
}
