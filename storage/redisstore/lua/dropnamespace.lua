-- dropnamespace.lua: delete every task of one namespace shard at once (a
-- forced DeleteNamespace).
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] meta HASH,
-- KEYS[5] index marker (durable mode: a re-created namespace starts unindexed),
-- KEYS[6] body HASH, KEYS[7] acked HASH, KEYS[8] the pre-0.2 task HASH,
-- KEYS[9] life STRING (the namespace incarnation, see keys.go),
-- KEYS[10] hwm STRING (lib.lua HWM)
-- ARGV[1] the incarnation (create time, ms) being deleted; '0' = none (a
--         rebuild, not a delete)
--
-- With an incarnation, life records it as ended ("live,ended", see
-- keys.go): from then on upserts for it (or an earlier one) are refused,
-- and unchecked writes too until a later incarnation writes, so nothing
-- written through a stale view survives into a namespace re-created under
-- the same name.
--
-- The shard's high-water mark outlives its tasks: it moves from the meta
-- HASH (lib.lua HWM) to the hwm STRING, so a namespace re-created under the
-- name never repeats an incarnation.
--
-- Returns the number of tasks deleted. UNLINK frees the memory in the
-- background, so even a huge namespace does not stall Redis.
local inc = tonumber(ARGV[1]) or 0
if inc > 0 then
  local live, ended = 0, 0
  local v = redis.call('GET', KEYS[9])
  if v then
    local l, e = string.match(v, '^(%d+),(%d+)$')
    live, ended = tonumber(l) or 0, tonumber(e) or 0
  end
  if inc > ended then
    redis.call('SET', KEYS[9], string.format('%d,%d', live, inc))
  end
end
local hwm = redis.call('HGET', KEYS[4], HWM)
if hwm and (tonumber(hwm) or 0) > (tonumber(redis.call('GET', KEYS[10]) or '0') or 0) then
  redis.call('SET', KEYS[10], hwm)
end
local n = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
return n
