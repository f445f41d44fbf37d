//! In-memory store and source (being written).
mod source;
mod store;
pub use source::MemorySource;
pub use store::{MemoryBackend, MemoryStore};
