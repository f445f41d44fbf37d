//! The daemon's own HTTP listener, opened when the properties set `shardlease.metricsAddress`.
//!
//! Why it exists: the Java daemon publishes its metrics to CloudWatch and has no endpoint of its
//! own, and until now this daemon's metrics reached only a recorder installed by a program
//! embedding [`crate::run`]. An operator running the binary as is needs two things from the
//! process itself: `GET /metrics`, the Prometheus text of the process's recorder (shardlease's
//! metric names, `shardlease_*`, and the daemon's, `shardlease_multilang_*`), and `GET /health`,
//! `200 ok` while the worker runs and is not fenced, else `503` and one word (`starting`,
//! `fenced`, `stopped`) for a liveness or readiness probe.
//!
//! The address is bound before the worker starts, so that an address in use stops the daemon at
//! startup ([`MultiLangError::Listen`]) rather than after it has taken leases; the server runs
//! until the daemon returns (it still answers during the graceful stop, `/health` saying
//! `stopped`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use shardlease::WorkerHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{MultiLangError, Result};

/// The content type of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Bucket bounds (seconds) of the histograms whose names end in `_seconds` (store calls, batches):
/// from a fraction of a millisecond to seconds.
pub const SECONDS_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The process's Prometheus recorder, installed at most once.
static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs a Prometheus recorder as the process's global metrics recorder, once per process,
/// and returns its handle (the same handle on every call). `None`, with a warning the first
/// time, when another recorder was installed first: then `/metrics` has nothing to serve unless
/// the caller passes its own handle ([`crate::daemon::RunOptions::prometheus`]).
///
/// Install it before the worker is built: shardlease registers its metrics with the recorder
/// installed at the time.
pub fn install_recorder() -> Option<PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let builder = match PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "histogram buckets refused; histograms are summaries");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    shardlease::telemetry::describe();
                    Some(handle)
                }
                Err(e) => {
                    warn!(
                        error = %e,
                        "another metrics recorder is installed in this process: \
                         /metrics has no Prometheus text to serve"
                    );
                    None
                }
            }
        })
        .clone()
}

/// What `/health` reads: the worker, once it has started.
#[derive(Clone, Debug, Default)]
pub struct Health {
    worker: Arc<OnceLock<Arc<WorkerHandle>>>,
}

impl Health {
    /// A health state with no worker yet (`starting`).
    pub fn new() -> Self {
        Health::default()
    }

    /// The worker has started: `/health` follows it from now on (the first worker set stays).
    pub fn set_worker(&self, worker: Arc<WorkerHandle>) {
        let _ = self.worker.set(worker);
    }

    /// `Ok` while the worker runs and is not fenced, else the one-word reason: `starting` (no
    /// worker yet), `stopped` (shutting down or shut down, or stopped by a failed loop), `fenced`
    /// (fenced itself and not yet recovered).
    pub fn status(&self) -> std::result::Result<(), &'static str> {
        match self.worker.get() {
            None => Err("starting"),
            // A shutdown sets its cause as it begins; the worker runs on until its leases are
            // released, but is no longer one to send traffic to.
            Some(w) if !w.is_running() || w.stop_cause().is_some() => Err("stopped"),
            Some(w) if w.is_fenced() => Err("fenced"),
            Some(_) => Ok(()),
        }
    }
}

/// The listener, bound, not yet serving.
#[derive(Debug)]
pub struct Listener {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
}

impl Listener {
    /// Binds `addr` (port 0 picks a free port: see [`local_addr`](Self::local_addr)).
    pub async fn bind(addr: SocketAddr) -> Result<Listener> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| MultiLangError::Listen { addr, source })?;
        let addr =
            listener.local_addr().map_err(|source| MultiLangError::Listen { addr, source })?;
        Ok(Listener { listener, addr })
    }

    /// The address bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `/metrics` (the text of `metrics`, `404` without one) and `/health` (`health`) on a
    /// task until `stop` is cancelled; the port is closed as soon as it is.
    pub fn serve(
        self,
        metrics: Option<PrometheusHandle>,
        health: Health,
        stop: CancellationToken,
    ) -> JoinHandle<()> {
        let state = Arc::new(Served { metrics, health });
        let app = Router::new()
            .route("/metrics", get(metrics_text))
            .route("/health", get(health_status))
            .with_state(state);
        let addr = self.addr;
        info!(%addr, "serving GET /metrics and GET /health");
        tokio::spawn(async move {
            let served =
                axum::serve(self.listener, app).with_graceful_shutdown(stop.cancelled_owned());
            if let Err(e) = served.await {
                warn!(%addr, error = %e, "the metrics and health listener failed");
            }
        })
    }
}

/// What the routes share.
struct Served {
    metrics: Option<PrometheusHandle>,
    health: Health,
}

async fn metrics_text(State(served): State<Arc<Served>>) -> Response {
    match &served.metrics {
        Some(handle) => {
            // No exporter task runs upkeep (axum serves, not the exporter): each scrape does.
            handle.run_upkeep();
            ([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], handle.render()).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no Prometheus recorder in this process\n").into_response(),
    }
}

async fn health_status(State(served): State<Arc<Served>>) -> Response {
    match served.health.status() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}
