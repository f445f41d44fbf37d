//! The server-side Lua scripts that make each write atomic per record.
//!
//! A compare-and-set on Redis needs "read the version, compare, write" to happen with nothing in
//! between. `WATCH`/`MULTI` would do it, but costs a round trip per step and retries under
//! contention; a Lua script runs atomically on the server in one round trip and can return the
//! current record when the comparison fails. [`redis::Script`] sends `EVALSHA` and falls back to
//! loading the script when the server does not know it (after a restart, for instance).
//!
//! Every script declares all the keys it touches (record, index, counter) in `KEYS`, and they all
//! share the namespace's hash tag, so the scripts run unchanged on Redis Cluster.
//!
//! Versions come from one counter per namespace, incremented by every create and update, so a
//! version is never reused, not even after a delete and a re-create (no ABA). When the counter
//! does not exist (a new namespace, or a server that lost its data) it is seeded from the
//! server's clock in microseconds, so versions handed out after a data loss are larger than any
//! handed out before it and a worker holding a pre-loss version can never match a new record.
//!
//! Replies are arrays whose first item is a tag: `created`/`exists`, `updated`/`deleted`,
//! `absent`, `conflict` (with the current hash as a flat field/value array) and `wrongtype`
//! (with the Redis type of the key that should have been a hash).

use redis::Script;

/// Shared Lua prelude: effects replication (needed before Redis 5 for `TIME`), the version
/// counter, and the full replacement of a lease hash from field/value arguments.
const PRELUDE: &str = r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local function next_version(counter)
  local v = redis.call('INCR', counter)
  if v == 1 then
    local t = redis.call('TIME')
    local us = tostring(t[2])
    redis.call('SET', counter, tostring(t[1]) .. string.rep('0', 6 - #us) .. us)
    v = redis.call('INCR', counter)
  end
  return string.format('%d', v)
end
local function replace(key, version, first)
  local args = {}
  for i = first, #ARGV do args[#args + 1] = ARGV[i] end
  args[#args + 1] = 'version'
  args[#args + 1] = version
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(args))
end
local function kind(key)
  return redis.call('TYPE', key)['ok']
end
"#;

/// KEYS: lease hash, lease index, version counter. ARGV: lease key, then field/value pairs.
const CREATE: &str = r#"
local t = kind(KEYS[1])
if t ~= 'none' then return {'exists', t} end
local v = next_version(KEYS[3])
replace(KEYS[1], v, 2)
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return {'created', v}
"#;

/// KEYS: lease hash, lease index, version counter. ARGV: lease key, expected version, then
/// field/value pairs.
const UPDATE: &str = r#"
local t = kind(KEYS[1])
if t == 'none' then return {'absent'} end
if t ~= 'hash' then return {'wrongtype', t} end
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then
  return {'conflict', redis.call('HGETALL', KEYS[1])}
end
local v = next_version(KEYS[3])
replace(KEYS[1], v, 3)
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return {'updated', v}
"#;

/// KEYS: lease hash, lease index. ARGV: lease key, expected version.
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
return {'deleted'}
"#;

/// KEYS: worker hash, worker index. ARGV: worker id, then field/value pairs.
const HEARTBEAT: &str = r#"
local args = {}
for i = 2, #ARGV do args[#args + 1] = ARGV[i] end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(args))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return {'ok'}
"#;

/// The compiled scripts (each knows its SHA1 for `EVALSHA`).
#[derive(Debug)]
pub(crate) struct Scripts {
    /// Create-if-absent.
    pub create: Script,
    /// Compare-and-set update.
    pub update: Script,
    /// Compare-and-delete.
    pub delete: Script,
    /// Worker record upsert with its index entry.
    pub heartbeat: Script,
}

impl Scripts {
    /// Builds the scripts.
    pub(crate) fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Scripts {
            create: with_prelude(CREATE),
            update: with_prelude(UPDATE),
            delete: with_prelude(DELETE),
            heartbeat: Script::new(HEARTBEAT),
        }
    }
}
