//! One child process per lease: started from `executableName` (no shell; the daemon's
//! environment and working directory), fed lines on stdin, read line by line from stdout, its
//! stderr forwarded into the daemon's log with the shard id. Every way a child can misbehave is
//! a [`Fault`], which costs that child's lease only.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::protocol::{decode_line, DecodeError, FromChild, ToChild};

/// What a child did wrong (or what happened to it).
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// The program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Its stdout ended (it exited or closed it) while an answer was awaited.
    #[error(
        "the child closed its stdout (exited?) while the daemon awaited its answer to {awaiting}"
    )]
    Exited {
        /// The action awaited.
        awaiting: &'static str,
    },
    /// Writing to its stdin failed (it exited).
    #[error("cannot write to the child: {0}")]
    Write(#[source] std::io::Error),
    /// A line that is not a message.
    #[error("bad line from the child: {0}")]
    Decode(#[from] DecodeError),
    /// A `status` for another action than the one sent.
    #[error("the child answered {got:?} to {expected}")]
    WrongResponse {
        /// The action sent.
        expected: &'static str,
        /// The action its status named.
        got: String,
    },
    /// No message within `timeoutInSeconds`.
    #[error("no answer to {awaiting} within {after:?}")]
    Timeout {
        /// The action awaited.
        awaiting: &'static str,
        /// The timeout.
        after: Duration,
    },
}

impl Fault {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Spawn { .. } => "spawn",
            Fault::Exited { .. } => "exited",
            Fault::Write(_) => "write",
            Fault::Decode(DecodeError::NotJson(_)) => "not_json",
            Fault::Decode(DecodeError::Malformed(_)) => "malformed",
            Fault::Decode(DecodeError::UnknownAction(_)) => "unknown_action",
            Fault::WrongResponse { .. } => "wrong_response",
            Fault::Timeout { .. } => "timeout",
        }
    }
}

/// A running child.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: mpsc::Receiver<String>,
    shard: String,
}

impl ChildProcess {
    /// Starts `command` for `shard`. Its stderr is forwarded to the log at once.
    pub fn spawn(command: &[String], shard: &str) -> Result<ChildProcess, Fault> {
        let program = command.first().cloned().unwrap_or_default();
        let mut child = Command::new(&program)
            .args(command.iter().skip(1))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Fault::Spawn { program: program.clone(), source })?;
        let pid = child.id().unwrap_or_default();
        let (tx, stdout) = mpsc::channel(16);
        if let Some(out) = child.stdout.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if tx.send(line).await.is_err() {
                        break;
                    }
                }
            });
        }
        if let Some(err) = child.stderr.take() {
            let shard = shard.to_owned();
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    info!(target: "shardlease_multilang::child", shard = %shard, pid, "{line}");
                }
            });
        }
        info!(shard, pid, program, "child started");
        Ok(ChildProcess { stdin: child.stdin.take(), child, stdout, shard: shard.to_owned() })
    }

    /// The child's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Writes one message.
    pub async fn send(&mut self, msg: &ToChild) -> Result<(), Fault> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(Fault::Write(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "stdin already closed",
            )));
        };
        let mut line = msg.to_line();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.map_err(Fault::Write)?;
        stdin.flush().await.map_err(Fault::Write)
    }

    /// The next message, skipping blank lines; within `timeout` when there is one.
    pub async fn next_message(
        &mut self,
        awaiting: &'static str,
        timeout: Option<Duration>,
    ) -> Result<FromChild, Fault> {
        let read = async {
            loop {
                match self.stdout.recv().await {
                    None => return Err(Fault::Exited { awaiting }),
                    Some(line) => {
                        if let Some(msg) = decode_line(&line)? {
                            return Ok(msg);
                        }
                    }
                }
            }
        };
        match timeout {
            None => read.await,
            Some(after) => tokio::time::timeout(after, read)
                .await
                .unwrap_or(Err(Fault::Timeout { awaiting, after })),
        }
    }

    /// Closes stdin (the child sees EOF) and waits up to `bound` for it to exit; kills it
    /// otherwise. Returns whether it had to be killed.
    pub async fn finish(mut self, bound: Duration) -> bool {
        drop(self.stdin.take());
        match tokio::time::timeout(bound, self.child.wait()).await {
            Ok(Ok(status)) => {
                info!(shard = %self.shard, %status, "child exited");
                false
            }
            Ok(Err(e)) => {
                warn!(shard = %self.shard, error = %e, "cannot wait for the child; killing it");
                self.kill().await;
                true
            }
            Err(_) => {
                warn!(shard = %self.shard, ?bound, "child did not exit after its stdin closed; killing it");
                self.kill().await;
                true
            }
        }
    }

    /// Kills the child and reaps it.
    pub async fn kill(&mut self) {
        if let Err(e) = self.child.kill().await {
            warn!(shard = %self.shard, error = %e, "cannot kill the child");
        }
    }
}
