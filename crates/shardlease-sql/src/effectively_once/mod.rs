//! Effectively-once output: a batch's output and the position after it commit in one SQL
//! transaction, fenced by the lease's epoch, so the effect of every record appears in the sink's
//! database exactly once, across crashes, failovers, handoffs and zombies.
//!
//! - [`TxCheckpointer`]: a [`Checkpointer`](shardlease_core::Checkpointer) whose positions live in
//!   the sink's database: a `<prefix>checkpoints` table (any lease store:
//!   [`TxCheckpointer::in_checkpoints_table`]) or the lease rows themselves when the lease store is
//!   a [`SqlStore`](crate::SqlStore) in the same database ([`TxCheckpointer::in_lease_rows`]).
//!   Give it to the worker too (`WorkerBuilder::checkpointer`), so a new owner resumes from it.
//! - [`transactional_fn`]: the closure form; [`TxCheckpointer::write_batch`] for a hand-written
//!   processor; [`TxCheckpointer::begin`] / [`FencedTx`] for full control.
//!
//! How it holds, in one paragraph: every transaction first locks the lease's position row and
//! refuses to go on when a newer epoch has written it (`Error::LeaseLost`: the whole transaction,
//! output included, rolls back). Records at or before the committed position are never handed to
//! user code again, so neither a retry after an unknown commit outcome nor a new owner that read
//! the position before a zombie's last commit can write anything twice. `docs/effectively-once.md`
//! in the repository states the guarantee and its limits precisely.

mod backend;
mod batch;
mod checkpointer;
mod processor;
mod statements;

#[doc(hidden)]
pub use backend::__private;
pub use backend::TxDatabase;
pub use batch::{BatchOutcome, TxFuture};
pub use checkpointer::{FencedTx, RetryPolicy, TxCheckpointer};
pub use processor::transactional_fn;
