//! `rediss://` end to end (only with the `tls` feature): a private `redis-server` serving TLS
//! with a certificate from a throw-away CA made with the `openssl` command, trusted through
//! `tls_root_certificates_pem`. Skipped (a failure under CI=true) without `redis-server` or
//! `openssl`.

#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlease_core::store::{CreateOutcome, Lease, LeaseStore, VersionedLease};
use shardlease_core::Position;
use shardlease_redis::RedisStore;
use shardlease_testkit::suite::skip;

const NAME: &str = "rediss_round_trip_with_a_private_ca";

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "openssl {args:?} failed");
}

/// Makes `ca.crt`, `server.crt` and `server.key` (for localhost and 127.0.0.1) in `dir`.
fn make_certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=test-ca"]);
    run(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
    run(dir, &csr);
    std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    run(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "ext",
        ],
    );
}

fn installed(cmd: &str) -> bool {
    Command::new(cmd)
        .arg(if cmd == "openssl" { "version" } else { "--version" })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_round_trip_with_a_private_ca() {
    for cmd in ["redis-server", "openssl"] {
        if !installed(cmd) {
            skip(NAME, &format!("{cmd} is not installed"));
            return;
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_certificates(dir);
    let port = common::free_port();
    let file = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let child = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--tls-cert-file", &file("server.crt"), "--tls-key-file", &file("server.key")])
        .args(["--tls-ca-cert-file", &file("ca.crt"), "--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no", "--dir", &dir.to_string_lossy()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the TLS server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let url = format!("rediss://localhost:{port}/");

    let store = RedisStore::builder()
        .url(&url)
        .namespace("tls")
        .tls_root_certificates_pem(ca)
        .connect()
        .await
        .unwrap();
    let lease = Lease::new("shard-1", Position::TrimHorizon);
    let v = match store.create_lease(&lease).await.unwrap() {
        CreateOutcome::Created(v) => v,
        CreateOutcome::AlreadyExists => panic!("fresh server"),
    };
    assert_eq!(store.get_lease(&lease.key).await.unwrap(), Some(VersionedLease::new(lease, v)));

    // Without the CA the server's certificate is not trusted: an error, never a panic.
    let untrusted = RedisStore::builder()
        .url(&url)
        .namespace("tls")
        .connection_timeout(Duration::from_millis(500))
        .connect()
        .await;
    assert!(untrusted.is_err(), "a certificate from an unknown CA must be refused");
}
