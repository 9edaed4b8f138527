-- remove.lua: delete one task in any state, optionally only at a given
-- generation.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] meta HASH, KEYS[5] body HASH
-- ARGV[1] task id
-- ARGV[2] if generation: '0' = any; else the task is deleted only when its
--         stored generation equals it
-- ARGV[3] if incarnation: '0' = any; else (with ARGV[2]) its stored
--         incarnation must equal it too
--
-- Returns {code}: the state the task was in (1 scheduled, 2 delivered,
-- 3 dead), or 0 when there was no such task; or, when the generation did
-- not match, {4, header, state, score, payload} of the stored task
-- (nothing deleted).
local id = ARGV[1]
local ifgen = tonumber(ARGV[2])
if ifgen ~= 0 then
  local h = redis.call('HGET', KEYS[4], id)
  if not h then
    return {0}
  end
  local i, g = version(h)
  local ifinc = tonumber(ARGV[3])
  if g ~= ifgen or (ifinc ~= 0 and i ~= ifinc) then
    local st, sc = locate(KEYS[1], KEYS[2], KEYS[3], id)
    if st == 0 then
      sc = 0
    end
    return {4, h, st, sc, redis.call('HGET', KEYS[5], id) or ''}
  end
end
local st = 0
if redis.call('ZREM', KEYS[1], id) == 1 then
  st = 1
elseif redis.call('ZREM', KEYS[2], id) == 1 then
  st = 2
elseif redis.call('ZREM', KEYS[3], id) == 1 then
  st = 3
end
redis.call('HDEL', KEYS[5], id)
if redis.call('HDEL', KEYS[4], id) == 1 and st == 0 then
  -- a header outside every set (should not happen): count it as scheduled
  st = 1
end
return {st}
