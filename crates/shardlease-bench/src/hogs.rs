//! `--cpu-hogs K`: CPU burnt beside the fleet, for as long as the runs last.
//!
//! A busy machine is where a worker is tempted to fence itself: its heartbeat waits behind lease
//! tasks and other processes for a core. The hogs make the bench's machine that busy on purpose,
//! so a run can show how many self-fences (`self_fences` in every report) that costs: K threads
//! that spin (other processes), and K tasks on the bench's own runtime that compute for
//! `slice` at a time without yielding (processors doing heavy work between awaits).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Running hog threads; they stop when this is dropped.
pub struct CpuHogs {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl CpuHogs {
    /// Starts `n` spinning threads and `n` runtime tasks busy for `slice` between yields, until
    /// the returned value is dropped (0 starts none). Must be called within a tokio runtime.
    pub fn start(n: usize, slice: std::time::Duration) -> CpuHogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .filter_map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("cpu-hog-{i}"))
                    .spawn(move || {
                        let mut x: u64 = 1;
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..100_000 {
                                x = std::hint::black_box(
                                    x.wrapping_mul(6364136223846793005).wrapping_add(1),
                                );
                            }
                        }
                    })
                    .ok()
            })
            .collect();
        let tasks = (0..n)
            .map(|_| {
                let stop = stop.clone();
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let until = std::time::Instant::now() + slice;
                        while std::time::Instant::now() < until {
                            std::hint::spin_loop();
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        CpuHogs { stop, threads, tasks }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
