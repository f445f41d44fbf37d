//! The lease keys of a multi-stream source: `stream/shard`, one format for the source, the
//! runtime's metrics and the tools, so a key says which stream it belongs to.
//!
//! The stream part is the name the application gives the stream (for Kinesis, the stream's name,
//! also when it is addressed by ARN); it may not contain the separator, so the first `/` of a key
//! splits it. The shard part is the shard's own id, untouched (it may contain `/`).

use crate::error::{Error, Result};
use crate::lease::LeaseKey;
use crate::source::ShardInfo;

/// What separates the stream from the shard in a multi-stream lease key (`orders/shardId-0`).
pub const STREAM_SEPARATOR: char = '/';

/// The longest stream name a multi-stream source accepts, in bytes.
pub const MAX_STREAM_NAME_BYTES: usize = 128;

/// The lease key of `shard` of `stream`: `stream/shard`.
pub fn qualify(stream: &str, shard: &LeaseKey) -> LeaseKey {
    LeaseKey::new(format!("{stream}{STREAM_SEPARATOR}{shard}"))
}

/// The stream and shard of a multi-stream lease key, split at the first separator; `None` when
/// the key has none (a single-stream key) or either part is empty.
pub fn split_key(key: &LeaseKey) -> Option<(&str, LeaseKey)> {
    let (stream, shard) = key.as_str().split_once(STREAM_SEPARATOR)?;
    (!stream.is_empty() && !shard.is_empty()).then(|| (stream, LeaseKey::from(shard)))
}

/// Checks a stream name: 1 to [`MAX_STREAM_NAME_BYTES`] bytes, no separator, no whitespace or
/// control characters (`Error::Config` otherwise).
pub fn validate_stream_name(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        Some("is empty")
    } else if name.len() > MAX_STREAM_NAME_BYTES {
        Some("is longer than 128 bytes")
    } else if name.contains(STREAM_SEPARATOR) {
        Some("contains '/', which separates the stream from the shard in lease keys")
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("contains whitespace or control characters")
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::Config(format!("stream name {name:?} {why}"))),
        None => Ok(()),
    }
}

/// `shard` as the multi-stream source lists it: its id and its parents qualified by `stream`, so
/// splits and merges are followed within the stream.
pub(crate) fn qualify_info(stream: &str, shard: ShardInfo) -> ShardInfo {
    let parents: Vec<LeaseKey> = shard.parents.iter().map(|p| qualify(stream, p)).collect();
    ShardInfo { id: qualify(stream, &shard.id), parents, ..shard }
}
