//! The TCP proxy between one worker and the store: how the harness partitions a single worker
//! from the store while the rest of the fleet still reaches it. Each worker slot connects to the
//! store through its own proxy; the nemesis switches a proxy to drop (reset every connection and
//! refuse new ones), blackhole (hold the bytes, as a network that loses every packet until it
//! heals: the kernel buffers fill and the peer stalls) or delay, in both directions or one.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a partition does to the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionKind {
    /// Reset every connection and refuse new ones (always both directions).
    Drop,
    /// Hold the bytes until the partition heals.
    Blackhole,
    /// Forward each chunk this many milliseconds late.
    Delay {
        /// The added latency.
        ms: u64,
    },
}

/// Which way a partition cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Both ways.
    Both,
    /// Worker to store only.
    ToStore,
    /// Store to worker only.
    FromStore,
}

/// The proxy's state: passing traffic, or a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Mode {
    /// The partition in force, if any.
    pub cut: Option<(PartitionKind, Direction)>,
}

impl Mode {
    fn dropping(&self) -> bool {
        matches!(self.cut, Some((PartitionKind::Drop, _)))
    }

    fn applies(&self, to_store: bool) -> Option<PartitionKind> {
        let (kind, dir) = self.cut?;
        let hit = match dir {
            Direction::Both => true,
            Direction::ToStore => to_store,
            Direction::FromStore => !to_store,
        };
        hit.then_some(kind)
    }
}

/// A running proxy: listens on 127.0.0.1 and forwards to the store.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (tx, rx) = watch::channel(Mode::default());
        let task = tokio::spawn(accept_loop(listener, upstream, rx));
        Ok(Proxy { port, mode: tx, task })
    }

    /// The port workers connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Switches the proxy's mode.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        if mode.borrow().dropping() {
            drop(client);
            continue;
        }
        let mode = mode.clone();
        conns.spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            // When either way ends (or a drop resets the connection), both sockets close.
            tokio::select! {
                _ = pump(cr, sw, true, mode.clone()) => {}
                _ = pump(sr, cw, false, mode) => {}
            }
        });
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
    }
}

async fn pump(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    to_store: bool,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Hold while blackholed this way: the bytes stay in the kernel's buffers.
        loop {
            let m = *mode.borrow_and_update();
            if m.dropping() {
                return;
            }
            if m.applies(to_store) == Some(PartitionKind::Blackhole) {
                if mode.changed().await.is_err() {
                    return;
                }
                continue;
            }
            break;
        }
        let n = tokio::select! {
            r = r.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let m = *mode.borrow();
        match m.applies(to_store) {
            Some(PartitionKind::Drop) => return,
            Some(PartitionKind::Delay { ms }) => {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            Some(PartitionKind::Blackhole) => {
                // Cut after these bytes were read: hold them until it heals.
                let mut m = mode.clone();
                while m.borrow_and_update().applies(to_store) == Some(PartitionKind::Blackhole) {
                    if m.changed().await.is_err() {
                        return;
                    }
                }
                if m.borrow().dropping() {
                    return;
                }
            }
            None => {}
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
