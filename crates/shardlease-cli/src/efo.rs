//! `shardlease efo ...`: enhanced fan-out housekeeping that needs no lease store. Its one command
//! deregisters a Kinesis stream consumer, the only way shardlease ever removes one (workers never
//! do, not even the last one to stop). Built with the `kinesis` feature; AWS credentials come
//! from the SDK's default chain (environment, profile, instance role).

use std::process::ExitCode;

use clap::Subcommand;

use crate::error::CliError;

/// Enhanced fan-out commands.
#[derive(Subcommand, Debug)]
pub enum EfoCommand {
    /// Deregister a stream consumer: every application subscribed as it loses its
    /// subscriptions. For retiring an application; exits 6 when no such consumer exists.
    Deregister {
        /// The stream's name or ARN.
        #[arg(long)]
        stream: String,
        /// The consumer's name (the application's `enhanced_fan_out` name).
        #[arg(long)]
        consumer: String,
        /// The AWS region (else AWS_REGION or the profile's).
        #[arg(long)]
        region: Option<String>,
        /// The Kinesis endpoint, for emulators (else AWS_ENDPOINT_URL_KINESIS or AWS).
        #[arg(long)]
        endpoint_url: Option<String>,
    },
}

/// Runs an `efo` command.
pub async fn run(cmd: &EfoCommand, json: bool) -> Result<ExitCode, CliError> {
    let EfoCommand::Deregister { stream, consumer, region, endpoint_url } = cmd;
    let mut builder = shardlease::KinesisSource::builder(stream).enhanced_fan_out(consumer);
    if let Some(r) = region {
        builder = builder.region(r);
    }
    if let Some(u) = endpoint_url {
        builder = builder.endpoint_url(u);
    }
    if !builder.deregister_consumer().await.map_err(CliError::Store)? {
        return Err(CliError::NotFound(format!(
            "no consumer {consumer} is registered on stream {stream}"
        )));
    }
    if json {
        println!("{}", serde_json::json!({ "deregistered": consumer, "stream": stream }));
    } else {
        println!("deregistered consumer {consumer} of stream {stream}");
    }
    Ok(ExitCode::SUCCESS)
}
