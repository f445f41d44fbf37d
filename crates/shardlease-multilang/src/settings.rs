//! What a KCL MultiLang properties file means to shardlease: every key an application sets that
//! has a shardlease meaning is mapped ([`Settings`]), shardlease's own `shardlease.*` keys are
//! read, and every other key is kept to be listed once at startup as ignored. A value that
//! cannot be used is an error naming its key and line.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use shardlease::{Balance, Position};

use crate::error::{MultiLangError, Result};
use crate::properties::{self, Entry};

/// The store used when the properties name none: a SQLite file in the working directory.
pub const DEFAULT_STORE_URL: &str = "sqlite://shardlease-multilang.db";
/// The default grace a child gets to checkpoint after `shutdownRequested` (KCL's
/// `shutdownGraceMillis`; the KCL's own default of 0 would cut every child short).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// How long a child may take to exit once its stdin is closed before it is killed.
pub const DEFAULT_CHILD_EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the shards are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retrieval {
    /// `GetRecords` polling.
    Polling,
    /// Enhanced fan-out as the named stream consumer.
    FanOut {
        /// The consumer name (from `consumerName`, `consumerArn`, or the application name).
        consumer_name: String,
    },
}

/// How the daemon drives its children (the part of the settings the processors use).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildSettings {
    /// `executableName`, split on spaces: the program and its arguments.
    pub command: Vec<String>,
    /// `timeoutInSeconds`: the longest wait for any one message from a child (none by default,
    /// as in the KCL: a slow batch is not a fault).
    pub response_timeout: Option<Duration>,
    /// How long a child may take to exit after its stdin is closed.
    pub exit_timeout: Duration,
    /// The first wait before a failed shard's next child starts (doubles per failure).
    pub restart_backoff: Duration,
    /// The longest wait before a failed shard's next child starts.
    pub restart_backoff_max: Duration,
    /// `callProcessRecordsEvenForEmptyRecordList`.
    pub call_for_empty_batches: bool,
}

/// A key the daemon does not use, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredKey {
    /// The key.
    pub key: String,
    /// Its line.
    pub line: usize,
    /// Whether the KCL knows it (else it is unknown to both).
    pub known_to_kcl: bool,
}

/// Everything the properties file says, mapped.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How children are run.
    pub child: ChildSettings,
    /// `streamArn` (preferred) or `streamName`.
    pub stream: String,
    /// `applicationName`: the lease namespace.
    pub namespace: String,
    /// `regionName`.
    pub region: Option<String>,
    /// `kinesisEndpoint`.
    pub kinesis_endpoint: Option<String>,
    /// `dynamoDBEndpoint`: only used by a `dynamodb://` store URL without an endpoint.
    pub dynamodb_endpoint: Option<String>,
    /// `shardlease.store`: the lease store's URL.
    pub store_url: String,
    /// The KCL's lease table (`tableName`, else the application name): never written.
    pub kcl_table: String,
    /// `workerId`.
    pub worker_id: Option<String>,
    /// `initialPositionInStream` / `initialPositionInStreamExtended`.
    pub initial_position: Position,
    /// `failoverTimeMillis`.
    pub failover: Option<Duration>,
    /// `shardlease.heartbeatMillis` (else a tenth of the failover time, the KCL's 10 s by
    /// default).
    pub heartbeat: Option<Duration>,
    /// `shardSyncIntervalMillis`.
    pub shard_sync: Option<Duration>,
    /// `maxLeasesForWorker`.
    pub max_leases: Option<usize>,
    /// `maxRecords`.
    pub max_records: Option<i32>,
    /// `idleTimeBetweenReadsInMillis`.
    pub idle_between_reads: Option<Duration>,
    /// `retrievalMode` (`FANOUT`, the KCL's default, or `POLLING`).
    pub retrieval: Retrieval,
    /// `shutdownGraceMillis`: how long children get to checkpoint when the daemon stops.
    pub grace: Duration,
    /// `shardlease.balance`: `count` (default) or `load`.
    pub balance: Balance,
    /// `shardlease.metricsAddress`: where the daemon serves `GET /metrics` (Prometheus text) and
    /// `GET /health`; `None` (the default) opens no listener ([`crate::listener`]).
    pub metrics_address: Option<SocketAddr>,
    /// The keys not used, in file order.
    pub ignored: Vec<IgnoredKey>,
}

/// KCL keys with no shardlease meaning (credentials come from the AWS SDK's default chain,
/// metrics from the `metrics` facade, lease-table tuning has no counterpart).
const KCL_KEYS_WITHOUT_MEANING: &[&str] = &[
    "AwsCredentialsProvider",
    "AwsCredentialsProviderDynamoDB",
    "AwsCredentialsProviderCloudWatch",
    "processingLanguage",
    "parentShardPollIntervalMillis",
    "cleanupLeasesUponShardCompletion",
    "taskBackoffTimeMillis",
    "metricsBufferTimeMillis",
    "metricsMaxQueueSize",
    "metricsLevel",
    "metricsEnabledDimensions",
    "validateSequenceNumberBeforeCheckpointing",
    "maxActiveThreads",
    "cloudWatchEndpoint",
    "userAgent",
    "maxLeasesToStealAtOneTime",
    "maxLeaseRenewalThreads",
    "initialLeaseTableReadCapacity",
    "initialLeaseTableWriteCapacity",
    "skipShardSyncAtStartupIfLeasesExist",
    "listShardsBackoffTimeInMillis",
    "maxListShardsRetryAttempts",
    "logWarningForTaskAfterMillis",
    "billingMode",
    "clientVersionConfig",
    "coordinatorStateTableName",
    "coordinatorStateBillingMode",
    "coordinatorStateReadCapacity",
    "coordinatorStateWriteCapacity",
    "coordinatorStatePointInTimeRecoveryEnabled",
    "coordinatorStateDeletionProtectionEnabled",
    "coordinatorStateTags",
    "gracefulLeaseHandoffTimeoutMillis",
    "isGracefulLeaseHandoffEnabled",
    "workerMetricsTableName",
    "workerMetricsBillingMode",
    "workerMetricsReadCapacity",
    "workerMetricsWriteCapacity",
    "workerMetricsPointInTimeRecoveryEnabled",
    "workerMetricsDeletionProtectionEnabled",
    "workerMetricsTags",
    "inMemoryWorkerMetricsCaptureFrequencyMillis",
    "workerMetricsReporterFreqInMillis",
    "noOfPersistedMetricsPerWorkerMetrics",
    "disableWorkerMetrics",
    "maxThroughputPerHostKBps",
    "dampeningPercentage",
    "reBalanceThresholdPercentage",
    "allowThroughputOvershoot",
    "varianceBalancingFrequency",
    "workerMetricsEMAAlpha",
    "leaseAssignmentIntervalMillis",
    "staleWorkerMetricsEntryCleanupDuration",
];

/// The keys this module maps (the KCL's and shardlease's own).
const MAPPED: &[&str] = &[
    "executableName",
    "streamName",
    "streamArn",
    "applicationName",
    "regionName",
    "kinesisEndpoint",
    "dynamoDBEndpoint",
    "tableName",
    "workerId",
    "initialPositionInStream",
    "initialPositionInStreamExtended",
    "failoverTimeMillis",
    "shardSyncIntervalMillis",
    "maxLeasesForWorker",
    "maxRecords",
    "idleTimeBetweenReadsInMillis",
    "retrievalMode",
    "consumerName",
    "consumerArn",
    "callProcessRecordsEvenForEmptyRecordList",
    "shutdownGraceMillis",
    "timeoutInSeconds",
    "shardlease.store",
    "shardlease.balance",
    "shardlease.heartbeatMillis",
    "shardlease.childExitTimeoutMillis",
    "shardlease.childRestartBackoffMillis",
    "shardlease.childRestartBackoffMaxMillis",
    "shardlease.metricsAddress",
];

/// The last entry of each key, looked up by name.
struct Keys<'a> {
    by_key: HashMap<&'a str, &'a Entry>,
}

impl<'a> Keys<'a> {
    fn new(entries: &'a [Entry]) -> Self {
        Keys { by_key: entries.iter().map(|e| (e.key.as_str(), e)).collect() }
    }

    /// The trimmed value of `key`, `None` when absent or empty (the KCL treats an empty value as
    /// unset too: `workerId =` in its sample).
    fn get(&self, key: &str) -> Option<(&'a str, usize)> {
        let e = self.by_key.get(key)?;
        let v = e.value.trim();
        (!v.is_empty()).then_some((v, e.line))
    }

    fn bad(&self, key: &str, line: usize, message: impl Into<String>) -> MultiLangError {
        MultiLangError::BadValue { key: key.to_owned(), line, message: message.into() }
    }

    fn millis(&self, key: &str) -> Result<Option<Duration>> {
        let Some((v, line)) = self.get(key) else { return Ok(None) };
        let n: u64 = v.parse().map_err(|_| {
            self.bad(key, line, format!("expected a whole number of milliseconds, got {v:?}"))
        })?;
        Ok(Some(Duration::from_millis(n)))
    }

    fn positive_millis(&self, key: &str) -> Result<Option<Duration>> {
        match self.millis(key)? {
            Some(d) if d.is_zero() => {
                let line = self.get(key).map_or(0, |(_, l)| l);
                Err(self.bad(key, line, "must be greater than 0"))
            }
            other => Ok(other),
        }
    }

    fn number<T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display>(
        &self,
        key: &str,
        min: T,
        max: T,
    ) -> Result<Option<T>> {
        let Some((v, line)) = self.get(key) else { return Ok(None) };
        match v.parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(Some(n)),
            _ => Err(self.bad(
                key,
                line,
                format!("expected a whole number from {min} to {max}, got {v:?}"),
            )),
        }
    }

    fn socket_address(&self, key: &str) -> Result<Option<SocketAddr>> {
        let Some((v, line)) = self.get(key) else { return Ok(None) };
        v.parse().map(Some).map_err(|_| {
            self.bad(
                key,
                line,
                format!("expected an IP address and port such as 127.0.0.1:9464, got {v:?}"),
            )
        })
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>> {
        let Some((v, line)) = self.get(key) else { return Ok(None) };
        match v.to_ascii_lowercase().as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(self.bad(key, line, format!("expected true or false, got {v:?}"))),
        }
    }
}

impl Settings {
    /// Reads and maps the properties file at `path`.
    pub fn from_file(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| MultiLangError::Read { path: path.to_owned(), source })?;
        Settings::from_text(&text)
    }

    /// Maps the text of a properties file.
    pub fn from_text(text: &str) -> Result<Settings> {
        let entries = properties::parse(text);
        let keys = Keys::new(&entries);

        let command: Vec<String> = match keys.get("executableName") {
            Some((v, _)) => v.split(' ').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
            None => Vec::new(),
        };
        if command.is_empty() {
            return Err(MultiLangError::Missing(
                "executableName is required: the program each shard's child runs".into(),
            ));
        }
        let stream = match (keys.get("streamArn"), keys.get("streamName")) {
            (Some((arn, line)), _) => {
                if !arn.starts_with("arn:") || !arn.contains(":stream/") {
                    return Err(keys.bad(
                        "streamArn",
                        line,
                        format!("expected arn:aws:kinesis:REGION:ACCOUNT:stream/NAME, got {arn:?}"),
                    ));
                }
                arn.to_owned()
            }
            (None, Some((name, _))) => name.to_owned(),
            (None, None) => {
                return Err(MultiLangError::Missing("streamName or streamArn is required".into()))
            }
        };
        let Some((namespace, ns_line)) = keys.get("applicationName") else {
            return Err(MultiLangError::Missing(
                "applicationName is required: it names the lease namespace".into(),
            ));
        };
        shardlease::Namespace::new(namespace)
            .map_err(|e| keys.bad("applicationName", ns_line, e.to_string()))?;

        let initial_position = initial_position(&keys)?;
        let retrieval = retrieval(&keys, namespace)?;

        let balance = match keys.get("shardlease.balance") {
            None => Balance::default(),
            Some((v, line)) => match v.to_ascii_lowercase().as_str() {
                "count" => Balance::ByCount,
                "load" => Balance::by_load(),
                _ => {
                    return Err(keys.bad(
                        "shardlease.balance",
                        line,
                        format!("expected count or load, got {v:?}"),
                    ))
                }
            },
        };
        let store_url = keys.get("shardlease.store").map_or(DEFAULT_STORE_URL, |(v, _)| v);
        let kcl_table = keys.get("tableName").map_or(namespace, |(v, _)| v).to_owned();

        let timeout = keys.number::<u64>("timeoutInSeconds", 1, 86_400 * 30)?;
        let child = ChildSettings {
            command,
            response_timeout: timeout.map(Duration::from_secs),
            exit_timeout: keys
                .millis("shardlease.childExitTimeoutMillis")?
                .unwrap_or(DEFAULT_CHILD_EXIT_TIMEOUT),
            restart_backoff: keys
                .positive_millis("shardlease.childRestartBackoffMillis")?
                .unwrap_or(Duration::from_secs(1)),
            restart_backoff_max: keys
                .positive_millis("shardlease.childRestartBackoffMaxMillis")?
                .unwrap_or(Duration::from_secs(30)),
            call_for_empty_batches: keys
                .boolean("callProcessRecordsEvenForEmptyRecordList")?
                .unwrap_or(false),
        };

        let ignored = entries
            .iter()
            .filter(|e| !MAPPED.contains(&e.key.as_str()))
            .map(|e| IgnoredKey {
                key: e.key.clone(),
                line: e.line,
                known_to_kcl: KCL_KEYS_WITHOUT_MEANING.contains(&e.key.as_str()),
            })
            .collect();

        Ok(Settings {
            child,
            stream,
            namespace: namespace.to_owned(),
            region: keys.get("regionName").map(|(v, _)| v.to_owned()),
            kinesis_endpoint: keys.get("kinesisEndpoint").map(|(v, _)| v.to_owned()),
            dynamodb_endpoint: keys.get("dynamoDBEndpoint").map(|(v, _)| v.to_owned()),
            store_url: store_url.to_owned(),
            kcl_table,
            worker_id: keys.get("workerId").map(|(v, _)| v.to_owned()),
            initial_position,
            failover: keys.positive_millis("failoverTimeMillis")?,
            heartbeat: keys.positive_millis("shardlease.heartbeatMillis")?,
            shard_sync: keys.positive_millis("shardSyncIntervalMillis")?,
            max_leases: keys.number::<usize>("maxLeasesForWorker", 1, usize::MAX)?,
            max_records: keys.number::<i32>("maxRecords", 1, 10_000)?,
            idle_between_reads: keys.millis("idleTimeBetweenReadsInMillis")?,
            retrieval,
            grace: keys
                .millis("shutdownGraceMillis")?
                .filter(|d| !d.is_zero())
                .unwrap_or(DEFAULT_GRACE),
            balance,
            metrics_address: keys.socket_address("shardlease.metricsAddress")?,
            ignored,
        })
    }

    /// The store URL with what the KCL keys say about DynamoDB added to a `dynamodb://` URL that
    /// lacks it (`regionName`, `dynamoDBEndpoint`).
    pub fn effective_store_url(&self) -> String {
        let url = &self.store_url;
        if !url.starts_with("dynamodb://") {
            return url.clone();
        }
        let mut extra = Vec::new();
        if !url.contains("region=") {
            if let Some(r) = &self.region {
                extra.push(format!("region={r}"));
            }
        }
        if !url.contains("endpoint=") {
            if let Some(e) = &self.dynamodb_endpoint {
                extra.push(format!("endpoint={e}"));
            }
        }
        if extra.is_empty() {
            return url.clone();
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{}", extra.join("&"))
    }

    /// The DynamoDB table a `dynamodb://` store URL names, if it is one.
    pub fn store_dynamodb_table(&self) -> Option<&str> {
        let rest = self.store_url.strip_prefix("dynamodb://")?;
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        Some(rest.split(['?', '/']).next().unwrap_or(rest))
    }
}

fn initial_position(keys: &Keys<'_>) -> Result<Position> {
    let extended = match keys.get("initialPositionInStreamExtended") {
        None => None,
        Some((v, line)) => {
            let secs: i64 = v.parse().map_err(|_| {
                keys.bad(
                    "initialPositionInStreamExtended",
                    line,
                    format!("expected a timestamp in seconds since the Unix epoch, got {v:?}"),
                )
            })?;
            Some(secs.checked_mul(1000).ok_or_else(|| {
                keys.bad("initialPositionInStreamExtended", line, "timestamp out of range")
            })?)
        }
    };
    let named = keys.get("initialPositionInStream");
    match (named, extended) {
        (None | Some(("AT_TIMESTAMP", _)), Some(millis)) => Ok(Position::AtTimestamp { millis }),
        (Some(("AT_TIMESTAMP", line)), None) => Err(keys.bad(
            "initialPositionInStream",
            line,
            "AT_TIMESTAMP needs initialPositionInStreamExtended (seconds since the Unix epoch)",
        )),
        (Some((v, line)), Some(_)) => Err(keys.bad(
            "initialPositionInStreamExtended",
            line,
            format!("a timestamp contradicts initialPositionInStream = {v}"),
        )),
        // The KCL's default.
        (None, None) | (Some(("LATEST", _)), None) => Ok(Position::Latest),
        (Some(("TRIM_HORIZON", _)), None) => Ok(Position::TrimHorizon),
        (Some((v, line)), None) => Err(keys.bad(
            "initialPositionInStream",
            line,
            format!("expected TRIM_HORIZON, LATEST or AT_TIMESTAMP, got {v:?}"),
        )),
    }
}

fn retrieval(keys: &Keys<'_>, application: &str) -> Result<Retrieval> {
    let mode = keys.get("retrievalMode");
    match mode.map(|(v, l)| (v.to_ascii_uppercase(), l)) {
        Some((m, _)) if m == "POLLING" => Ok(Retrieval::Polling),
        None => fan_out(keys, application),
        Some((m, _)) if m == "FANOUT" || m == "DEFAULT" => fan_out(keys, application),
        Some((m, line)) => {
            Err(keys.bad("retrievalMode", line, format!("expected FANOUT or POLLING, got {m:?}")))
        }
    }
}

/// Fan-out's consumer: `consumerName`, else the name inside `consumerArn`
/// (`arn:…:stream/S/consumer/NAME:CREATION`), else the application name (the KCL's default).
fn fan_out(keys: &Keys<'_>, application: &str) -> Result<Retrieval> {
    if let Some((name, _)) = keys.get("consumerName") {
        return Ok(Retrieval::FanOut { consumer_name: name.to_owned() });
    }
    if let Some((arn, line)) = keys.get("consumerArn") {
        let name = arn
            .split_once("/consumer/")
            .map(|(_, rest)| rest.split(':').next().unwrap_or(rest))
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                keys.bad(
                    "consumerArn",
                    line,
                    format!("expected arn:aws:kinesis:…:stream/S/consumer/NAME:TIME, got {arn:?}"),
                )
            })?;
        return Ok(Retrieval::FanOut { consumer_name: name.to_owned() });
    }
    Ok(Retrieval::FanOut { consumer_name: application.to_owned() })
}
