//! The server-side Lua scripts that make each write atomic per record.
//!
//! A compare-and-set on Redis needs "read the version, compare, write" to happen with nothing in
//! between. `WATCH`/`MULTI` would do it, but costs a round trip per step and retries under
//! contention; a Lua script runs atomically on the server in one round trip and can return the
//! current record when the comparison fails. [`redis::Script`] sends `EVALSHA` and falls back to
//! loading the script when the server does not know it (after a restart, for instance).
//!
//! Every script declares all the keys it touches (record, index) in `KEYS`, and they all share
//! the namespace's hash tag, so the scripts run unchanged on Redis Cluster.
//!
//! The version a create or update writes is an argument: a fresh random 63-bit number drawn by
//! the client (`Version::random`, never the version being replaced). So a version never repeats
//! for a key, not after a delete and re-create (no ABA), and not after the server lost writes (a
//! restart without persistence, a failover to a replica that had not seen the last writes): a
//! counter kept in Redis would be rolled back with the data and hand the same numbers out again,
//! letting a worker holding a version from before the loss overwrite a record written since.
//! The scripts are deterministic (no `TIME`, no counter), so they replicate as they are.
//!
//! Every script that changes ownership or membership takes the namespace's change channel as an
//! argument (empty when notification is off, or for a quiet update, a checkpoint) and, after it
//! wrote, `PUBLISH`es to it what changed: `L<lease key>`, `J<worker id>` (a worker record
//! appeared) or `X<worker id>` (one was removed); see `crate::notify`. A heartbeat that updates
//! an existing record publishes nothing.
//!
//! The batch scripts (`LeaseStore::create_leases`, `LeaseStore::update_leases`) take the lease
//! hashes of up to [`MAX_BATCH_ITEMS`] items as their keys, all under the namespace's hash tag and
//! so in one slot, also on a cluster, and run the single create or update of every item in turn
//! (the same Lua function), replying with an array of the single replies, one per item in order.
//! One script call is one round trip and one atomic step on the server for the whole chunk.
//!
//! Replies are arrays whose first item is a tag: `created`/`exists`, `updated`/`deleted`,
//! `absent`, `conflict` (with the current hash as a flat field/value array) and `wrongtype`
//! (with the Redis type of the key that should have been a hash).

use redis::Script;

/// Shared Lua prelude: the full replacement of a lease hash from field/value arguments, the type
/// of a key, the announcement of a change, and the create and update of one lease (the single
/// scripts run one, the batch scripts one per item, so an item of a batch is judged and written
/// exactly as its single write would be).
const PRELUDE: &str = r#"
local function replace(key, version, first, last)
  local args = {}
  for i = first, last do args[#args + 1] = ARGV[i] end
  args[#args + 1] = 'version'
  args[#args + 1] = version
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(args))
end
local function kind(key)
  return redis.call('TYPE', key)['ok']
end
local function announce(channel, what)
  if channel ~= '' then redis.call('PUBLISH', channel, what) end
end
local function create_one(key, index, lease, version, channel, first, last)
  local t = kind(key)
  if t ~= 'none' then return {'exists', t} end
  replace(key, version, first, last)
  redis.call('ZADD', index, 0, lease)
  announce(channel, 'L' .. lease)
  return {'created', version}
end
local function update_one(key, index, lease, expected, version, channel, first, last)
  local t = kind(key)
  if t == 'none' then return {'absent'} end
  if t ~= 'hash' then return {'wrongtype', t} end
  if redis.call('HGET', key, 'version') ~= expected then
    return {'conflict', redis.call('HGETALL', key)}
  end
  replace(key, version, first, last)
  redis.call('ZADD', index, 0, lease)
  announce(channel, 'L' .. lease)
  return {'updated', version}
end
"#;

/// KEYS: lease hash, lease index. ARGV: lease key, new version, change channel, then field/value
/// pairs.
const CREATE: &str = r#"
return create_one(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], 4, #ARGV)
"#;

/// KEYS: lease hash, lease index. ARGV: lease key, expected version, new version, change channel
/// (empty for a quiet update), then field/value pairs.
const UPDATE: &str = r#"
return update_one(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 5, #ARGV)
"#;

/// The most items one batch script call carries ([`CREATE_BATCH`], [`UPDATE_BATCH`]). A script
/// holds the server (every other client waits) while it runs: 128 small writes are well under a
/// millisecond, and the runtime sends no more than 128 takes at once anyway. A longer batch is
/// split into calls of this many, sent one after another.
pub(crate) const MAX_BATCH_ITEMS: usize = 128;

/// KEYS: lease index, then the lease hash of every item. ARGV: change channel, then per item its
/// lease key, new version, the count `n` of field/value arguments, and those `n` arguments.
/// Creates the leases in order, each exactly as [`CREATE`] would; replies one `CREATE` reply per
/// item, in order.
const CREATE_BATCH: &str = r#"
local replies = {}
local a = 2
for i = 2, #KEYS do
  local n = tonumber(ARGV[a + 2])
  replies[#replies + 1] = create_one(KEYS[i], KEYS[1], ARGV[a], ARGV[a + 1], ARGV[1], a + 3, a + 2 + n)
  a = a + 3 + n
end
return replies
"#;

/// KEYS: lease index, then the lease hash of every item. ARGV: change channel, then per item its
/// lease key, expected version, new version, the count `n` of field/value arguments, and those
/// `n` arguments. Each item is its own compare-and-set, exactly as [`UPDATE`] would judge and
/// write it (one item's conflict does not stop the next); replies one `UPDATE` reply per item,
/// in order.
const UPDATE_BATCH: &str = r#"
local replies = {}
local a = 2
for i = 2, #KEYS do
  local n = tonumber(ARGV[a + 3])
  replies[#replies + 1] =
    update_one(KEYS[i], KEYS[1], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[1], a + 4, a + 3 + n)
  a = a + 4 + n
end
return replies
"#;

/// KEYS: lease hash, lease index. ARGV: lease key, expected version, change channel.
const DELETE: &str = r#"
local t = kind(KEYS[1])
if t == 'none' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return {'absent'}
end
if t ~= 'hash' then return {'wrongtype', t} end
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then
  return {'conflict', redis.call('HGETALL', KEYS[1])}
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
announce(ARGV[3], 'L' .. ARGV[1])
return {'deleted'}
"#;

/// KEYS: worker hash, worker index. ARGV: worker id, the new beat, the last beat of its process
/// (`WorkerRecord::last_beat_of_process`), change channel, then field/value pairs. Replaces the record unless
/// it holds a beat of the same process (between the new beat and that last one, both included):
/// then it replies `kept` and writes nothing (see `LeaseStore::heartbeat`). Beats go up to 2^56,
/// beyond the integers Lua's doubles hold exactly, so they are compared as decimal strings
/// (longer is greater, then byte by byte); a stored beat that is not a plain decimal number is
/// replaced. A record that did not exist is announced (a join).
const HEARTBEAT: &str = r#"
local function ge(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return true
end
local existed = redis.call('TYPE', KEYS[1])['ok'] == 'hash'
if existed then
  local stored = redis.call('HGET', KEYS[1], 'beat')
  if stored and (stored == '0' or string.match(stored, '^[1-9]%d*$'))
      and ge(stored, ARGV[2]) and ge(ARGV[3], stored) then
    return {'kept'}
  end
end
local args = {}
for i = 5, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(args))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if not existed and ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], 'J' .. ARGV[1]) end
return {'ok'}
"#;

/// KEYS: worker hash, worker index. ARGV: worker id, beat, change channel. Removes the record and its index entry
/// only while its `beat` field is exactly that beat; replies 1 when it removed, 0 otherwise (a
/// newer beat, a missing record, or a key that is not a hash, which is left for an operator).
const REMOVE_WORKER_IF: &str = r#"
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'hash' then return 0 end
if redis.call('HGET', KEYS[1], 'beat') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], 'X' .. ARGV[1]) end
return 1
"#;

/// The compiled scripts (each knows its SHA1 for `EVALSHA`).
#[derive(Debug)]
pub(crate) struct Scripts {
    /// Create-if-absent.
    pub create: Script,
    /// Compare-and-set update.
    pub update: Script,
    /// Create-if-absent of up to [`MAX_BATCH_ITEMS`] leases, in order.
    pub create_batch: Script,
    /// Compare-and-set update of up to [`MAX_BATCH_ITEMS`] leases, each on its own.
    pub update_batch: Script,
    /// Compare-and-delete.
    pub delete: Script,
    /// Worker record upsert with its index entry, never over a later beat of the same process.
    pub heartbeat: Script,
    /// Removal of a worker record while its beat is unchanged.
    pub remove_worker_if: Script,
}

impl Scripts {
    /// Builds the scripts.
    pub(crate) fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Scripts {
            create: with_prelude(CREATE),
            update: with_prelude(UPDATE),
            create_batch: with_prelude(CREATE_BATCH),
            update_batch: with_prelude(UPDATE_BATCH),
            delete: with_prelude(DELETE),
            heartbeat: Script::new(HEARTBEAT),
            remove_worker_if: Script::new(REMOVE_WORKER_IF),
        }
    }
}
