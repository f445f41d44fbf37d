//! STUB
/// STUB
#[derive(Debug, Clone, Default)]
pub struct MemorySource;
