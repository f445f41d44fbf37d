//! `shardlease-multilang --properties app.properties`: the KCL MultiLang daemon's command line.
//! SIGTERM or SIGINT stops it gracefully (each child may checkpoint within
//! `shutdownGraceMillis`, then the leases are released).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use shardlease_multilang::daemon;
use shardlease_multilang::Settings;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Runs a KCL MultiLang application (amazon-kclpy, aws-kcl) on shardlease, without a JVM.
#[derive(Parser, Debug)]
#[command(name = "shardlease-multilang", version)]
struct Args {
    /// The KCL properties file (executableName, streamName, applicationName, ...).
    #[arg(long, short = 'p')]
    properties: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let settings = match Settings::from_file(&args.properties) {
        Ok(s) => s,
        Err(e) => {
            error!("{e}");
            eprintln!("shardlease-multilang: {e}");
            return ExitCode::from(2);
        }
    };
    daemon::log_startup(&settings);
    if let Some(addr) = settings.metrics_address {
        // The process's recorder, before the worker registers its metrics; the daemon serves
        // its text on `addr` (`/metrics`, beside `/health`).
        if shardlease_multilang::listener::install_recorder().is_some() {
            info!(%addr, "Prometheus metrics recorder installed");
        }
    }
    let stop = CancellationToken::new();
    tokio::spawn(signal_stop(stop.clone()));
    match daemon::run(&settings, stop).await {
        Ok(report) => {
            info!(
                children_started = report.children.started(),
                child_faults = report.children.faults(),
                "stopped"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{e}");
            eprintln!("shardlease-multilang: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Cancels `stop` on SIGTERM or SIGINT.
async fn signal_stop(stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM"),
                _ = int.recv() => info!("SIGINT"),
            }
        }
        _ => {
            error!("cannot install the signal handlers; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    stop.cancel();
}
