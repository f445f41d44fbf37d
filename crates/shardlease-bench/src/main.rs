//! `shardlease-bench`: runs the benchmark scenarios and prints one JSON object per line per run.
//!
//! Exit status: 0 when every run finished, 1 when one failed (its line has an `"error"` key), 2 for
//! bad flags (message on stderr). Logs go to stderr; set `RUST_LOG` for more than warnings.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    // `--help` prints and exits 0; a flag mistake prints and exits 2.
    let args = match shardlease_bench::args::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        if let Err(m) = shardlease_bench::preflight(&args).await {
            eprintln!("error: {m}");
            return ExitCode::from(2);
        }
        let ok = shardlease_bench::run(&args, |report| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", report.to_line());
            let _ = out.flush();
        })
        .await;
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}
