//! The stores a fault run can use, and the private servers the harness starts so that it may
//! crash, restart or wipe them (PostgreSQL, MariaDB, Redis, etcd, moto for DynamoDB): the shared
//! services of the machine are never restarted. A store's URL is given per worker slot, through
//! that slot's proxy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardlease::BoxError;
use tokio::process::{Child, Command};

/// A store kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// A SQLite file shared by the processes.
    Sqlite,
    /// A private PostgreSQL cluster.
    Postgres,
    /// A private MariaDB server (InnoDB, a commit flushed to the log).
    Mysql,
    /// A private Redis server (append-only file, fsync always).
    Redis,
    /// A private etcd server.
    Etcd,
    /// A private moto server (DynamoDB in memory: a restart loses every item).
    Dynamodb,
}

impl StoreKind {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
            StoreKind::Mysql => "mysql",
            StoreKind::Redis => "redis",
            StoreKind::Etcd => "etcd",
            StoreKind::Dynamodb => "dynamodb",
        }
    }

    /// Whether workers reach it over TCP (so a proxy can partition them).
    pub fn networked(self) -> bool {
        self != StoreKind::Sqlite
    }

    /// Whether the harness runs a private server it may crash and restart with its data kept.
    pub fn restartable(self) -> bool {
        matches!(self, StoreKind::Postgres | StoreKind::Mysql | StoreKind::Redis | StoreKind::Etcd)
    }

    /// Whether the harness may wipe the store: restart it with every record lost (Redis
    /// without its append-only file, as a Redis without persistence restarts; moto, which keeps
    /// nothing on disk).
    pub fn wipeable(self) -> bool {
        matches!(self, StoreKind::Redis | StoreKind::Dynamodb)
    }

    /// Every kind.
    pub const ALL: [StoreKind; 6] = [
        StoreKind::Sqlite,
        StoreKind::Postgres,
        StoreKind::Mysql,
        StoreKind::Redis,
        StoreKind::Etcd,
        StoreKind::Dynamodb,
    ];
}

/// A free port on 127.0.0.1 (bound and released: good enough for a private server).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The store of one run.
#[derive(Debug)]
pub struct Store {
    kind: StoreKind,
    dir: PathBuf,
    /// Where the store listens (networked stores).
    upstream: Option<SocketAddr>,
    server: Option<Server>,
}

#[derive(Debug)]
enum Server {
    Postgres { data: PathBuf, port: u16 },
    Mysql { child: Child, port: u16 },
    Redis { child: Child, port: u16 },
    Etcd { child: Child, port: u16, peer: u16 },
    Moto { child: Child, port: u16 },
}

async fn wait_port(port: u16, what: &str) -> Result<(), BoxError> {
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{what} did not listen on {port} within 30 s").into())
}

async fn run(cmd: &mut Command, what: &str) -> Result<(), BoxError> {
    let out = cmd.stdin(Stdio::null()).output().await?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}

/// `cmd` run as the `postgres` user when this process is root (PostgreSQL refuses root).
fn as_postgres(program: &str) -> Command {
    let root = std::env::var("USER").as_deref() == Ok("root")
        || std::fs::metadata("/proc/self").map(|m| is_root_owned(&m)).unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    }
}

#[cfg(unix)]
fn is_root_owned(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    m.uid() == 0
}

impl Store {
    /// Prepares the store of kind `kind` in `dir` (a private server is started here).
    pub async fn start(kind: StoreKind, dir: &Path) -> Result<Store, BoxError> {
        let dir = dir.to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let mut store = Store { kind, dir, upstream: None, server: None };
        match kind {
            StoreKind::Sqlite => {}
            StoreKind::Mysql => {
                run(
                    Command::new("mariadb-install-db").args([
                        "--no-defaults",
                        &format!("--datadir={}", store.dir.join("mysql").to_string_lossy()),
                        &format!("--user={}", current_user()),
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                    ]),
                    "mariadb-install-db",
                )
                .await?;
                let port = free_port()?;
                let child = spawn_mariadb(&store.dir, port)?;
                store.server = Some(Server::Mysql { child, port });
                store.upstream = Some(SocketAddr::from(([127, 0, 0, 1], port)));
                wait_port(port, "mariadb").await?;
                // The server accepts connections a moment after it listens.
                let mut tries = 0;
                while let Err(e) = run(
                    Command::new("mariadb").args([
                        "-h127.0.0.1",
                        &format!("-P{port}"),
                        "-uroot",
                        "-e",
                        "CREATE DATABASE IF NOT EXISTS test",
                    ]),
                    "mariadb CREATE DATABASE",
                )
                .await
                {
                    tries += 1;
                    if tries >= 50 {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            StoreKind::Dynamodb => {
                let port = free_port()?;
                let child = spawn_moto(&store.dir, port)?;
                store.server = Some(Server::Moto { child, port });
                store.upstream = Some(SocketAddr::from(([127, 0, 0, 1], port)));
                wait_port(port, "moto").await?;
            }
            StoreKind::Postgres => {
                let data = store.dir.join("pg");
                std::fs::create_dir_all(&data)?;
                chown_postgres(&store.dir)?;
                run(
                    as_postgres("initdb").args([
                        "-D",
                        &data.to_string_lossy(),
                        "-U",
                        "postgres",
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--no-instructions",
                    ]),
                    "initdb",
                )
                .await?;
                let port = free_port()?;
                store.server = Some(Server::Postgres { data, port });
                store.upstream = Some(SocketAddr::from(([127, 0, 0, 1], port)));
                store.start_server().await?;
            }
            StoreKind::Redis => {
                let port = free_port()?;
                let child = spawn_redis(&store.dir, port)?;
                store.server = Some(Server::Redis { child, port });
                store.upstream = Some(SocketAddr::from(([127, 0, 0, 1], port)));
                wait_port(port, "redis").await?;
            }
            StoreKind::Etcd => {
                let (port, peer) = (free_port()?, free_port()?);
                let child = spawn_etcd(&store.dir, port, peer)?;
                store.server = Some(Server::Etcd { child, port, peer });
                store.upstream = Some(SocketAddr::from(([127, 0, 0, 1], port)));
                wait_port(port, "etcd").await?;
            }
        }
        Ok(store)
    }

    /// The kind.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// Where the store listens (for a proxy), if networked.
    pub fn upstream(&self) -> Option<SocketAddr> {
        self.upstream
    }

    /// The URL a worker uses, through the proxy on `proxy_port` when there is one.
    pub fn url(&self, proxy_port: Option<u16>) -> Result<String, BoxError> {
        let port = match (proxy_port, self.upstream) {
            (Some(p), _) => p,
            (None, Some(a)) => a.port(),
            (None, None) => 0,
        };
        Ok(match self.kind {
            StoreKind::Sqlite => {
                format!("sqlite://{}?mode=rwc", self.dir.join("leases.db").to_string_lossy())
            }
            StoreKind::Postgres => format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            StoreKind::Mysql => format!("mysql://root@127.0.0.1:{port}/test"),
            StoreKind::Redis => format!("redis://127.0.0.1:{port}/"),
            StoreKind::Etcd => format!("etcd://127.0.0.1:{port}"),
            StoreKind::Dynamodb => format!(
                "dynamodb://test:test@shardlease-chaos?region=us-east-1&endpoint=http://127.0.0.1:{port}&create_table=true"
            ),
        })
    }

    async fn start_server(&mut self) -> Result<(), BoxError> {
        let dir = self.dir.clone();
        match &mut self.server {
            None => Ok(()),
            Some(Server::Postgres { data, port }) => {
                let opts = format!(
                    "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
                    dir.to_string_lossy()
                );
                run(
                    as_postgres("pg_ctl").args([
                        "-D",
                        &data.to_string_lossy(),
                        "-o",
                        &opts,
                        "-l",
                        &dir.join("pg.log").to_string_lossy(),
                        "-w",
                        "start",
                    ]),
                    "pg_ctl start",
                )
                .await
            }
            Some(Server::Redis { child, port }) => {
                *child = spawn_redis(&dir, *port)?;
                wait_port(*port, "redis").await
            }
            Some(Server::Etcd { child, port, peer }) => {
                *child = spawn_etcd(&dir, *port, *peer)?;
                wait_port(*port, "etcd").await
            }
            Some(Server::Mysql { child, port }) => {
                *child = spawn_mariadb(&dir, *port)?;
                wait_port(*port, "mariadb").await
            }
            Some(Server::Moto { child, port }) => {
                *child = spawn_moto(&dir, *port)?;
                wait_port(*port, "moto").await
            }
        }
    }

    /// Crashes the private server (an immediate stop: no clean shutdown).
    pub async fn crash(&mut self) -> Result<(), BoxError> {
        match &mut self.server {
            None => Err("this store has no private server".into()),
            Some(Server::Postgres { data, .. }) => {
                run(
                    as_postgres("pg_ctl").args([
                        "-D",
                        &data.to_string_lossy(),
                        "-m",
                        "immediate",
                        "-w",
                        "stop",
                    ]),
                    "pg_ctl stop",
                )
                .await
            }
            Some(
                Server::Redis { child, .. }
                | Server::Etcd { child, .. }
                | Server::Mysql { child, .. }
                | Server::Moto { child, .. },
            ) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                Ok(())
            }
        }
    }

    /// Starts the private server again after [`crash`](Self::crash).
    pub async fn restart(&mut self) -> Result<(), BoxError> {
        self.start_server().await
    }

    /// After [`crash`](Self::crash), throws away what the server kept on disk, so that
    /// [`restart`](Self::restart) brings it back empty: a wipe (Redis's append-only files; moto
    /// keeps nothing anyway).
    pub fn forget(&mut self) -> Result<(), BoxError> {
        match &self.server {
            Some(Server::Redis { .. }) => {
                for name in ["appendonlydir", "appendonly.aof", "dump.rdb"] {
                    let p = self.dir.join(name);
                    if p.is_dir() {
                        std::fs::remove_dir_all(&p)?;
                    } else if p.exists() {
                        std::fs::remove_file(&p)?;
                    }
                }
                Ok(())
            }
            Some(Server::Moto { .. }) => Ok(()),
            _ => Err("this store cannot be wiped".into()),
        }
    }

    /// Stops the private server for good.
    pub async fn stop(&mut self) {
        if let Some(Server::Postgres { data, .. }) = &self.server {
            let _ = run(
                as_postgres("pg_ctl").args([
                    "-D",
                    &data.to_string_lossy(),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                ]),
                "pg_ctl stop",
            )
            .await;
        }
        if let Some(
            Server::Redis { child, .. }
            | Server::Etcd { child, .. }
            | Server::Mysql { child, .. }
            | Server::Moto { child, .. },
        ) = &mut self.server
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

fn chown_postgres(dir: &Path) -> Result<(), BoxError> {
    let root = std::fs::metadata("/proc/self").map(|m| is_root_owned(&m)).unwrap_or(false);
    if root {
        let st = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres", &dir.to_string_lossy()])
            .status()?;
        if !st.success() {
            return Err("chown of the PostgreSQL directory failed".into());
        }
    }
    Ok(())
}

fn spawn_redis(dir: &Path, port: u16) -> Result<Child, BoxError> {
    Ok(Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.to_string_lossy(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--logfile",
            &dir.join("redis.log").to_string_lossy(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

/// The user the private MariaDB runs as (`mariadbd` wants `--user` when started by root).
fn current_user() -> String {
    std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "root".into())
}

fn spawn_mariadb(dir: &Path, port: u16) -> Result<Child, BoxError> {
    let d = dir.to_string_lossy();
    Ok(Command::new("mariadbd")
        .args([
            "--no-defaults".to_owned(),
            format!("--datadir={d}/mysql"),
            format!("--user={}", current_user()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--socket={d}/mysql.sock"),
            format!("--pid-file={d}/mysql.pid"),
            format!("--log-error={d}/mysql.log"),
            "--skip-name-resolve".to_owned(),
            "--innodb-buffer-pool-size=32M".to_owned(),
            "--max-connections=300".to_owned(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

/// moto's server: `SHARDLEASE_CHAOS_MOTO_SERVER`, else the one `scripts/services.sh` installs
/// (`target/services/moto-venv/bin/moto_server`, looked for from the current directory up),
/// else `moto_server` on the `PATH`.
fn moto_server() -> PathBuf {
    if let Some(p) = std::env::var_os("SHARDLEASE_CHAOS_MOTO_SERVER").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let p = dir.join("target/services/moto-venv/bin/moto_server");
            if p.exists() {
                return p;
            }
        }
    }
    PathBuf::from("moto_server")
}

fn spawn_moto(dir: &Path, port: u16) -> Result<Child, BoxError> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("moto.log"))?;
    let exe = moto_server();
    Command::new(&exe)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!("cannot start {} (set SHARDLEASE_CHAOS_MOTO_SERVER): {e}", exe.display()).into()
        })
}

fn spawn_etcd(dir: &Path, port: u16, peer: u16) -> Result<Child, BoxError> {
    let client = format!("http://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{peer}");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("etcd.log"))?;
    Ok(Command::new("etcd")
        .args([
            "--name",
            "chaos",
            "--data-dir",
            &dir.join("etcd").to_string_lossy(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("chaos={peer}"),
            "--logger",
            "zap",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?)
}
