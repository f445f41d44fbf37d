//! STUB
/// STUB
pub struct Worker;
/// STUB
pub struct WorkerHandle;
