//! `ListShards` with pagination: the first page names the stream, every later page carries only
//! the `NextToken` of the one before (the API refuses both together).

use shardlease_core::{Error, Result, ShardInfo};

use crate::api::{Api, ApiError, ListPage};

/// Pages a listing may take before we call the service's tokens a loop (10 000 pages of at least
/// one shard each is far beyond any stream's shard count).
const MAX_PAGES: usize = 10_000;

/// Every shard the stream lists, in the service's order.
pub(crate) async fn list_all(api: &dyn Api, page_size: Option<i32>) -> Result<Vec<ShardInfo>> {
    let mut shards = Vec::new();
    let mut page = ListPage::First { max_results: page_size };
    for _ in 0..MAX_PAGES {
        let reply = api.list_shards(page).await.map_err(ApiError::into_error)?;
        shards.extend(reply.shards);
        match reply.next_token {
            Some(token) if !token.is_empty() => {
                page = ListPage::Next { token, max_results: page_size };
            }
            _ => return Ok(shards),
        }
    }
    Err(Error::retryable(format!("Kinesis ListShards did not finish within {MAX_PAGES} pages")))
}
