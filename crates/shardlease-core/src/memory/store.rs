//! STUB
/// STUB
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend;
/// STUB
#[derive(Debug, Clone, Default)]
pub struct MemoryStore;
