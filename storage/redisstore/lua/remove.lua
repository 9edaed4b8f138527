-- remove.lua: delete one task in any state, optionally only at a given
-- generation.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET,
-- KEYS[6] meta HASH, KEYS[7] body HASH
-- ARGV[6] task id
-- ARGV[7] if generation: '0' = any; else the task is deleted only when its
--         stored generation equals it
-- ARGV[8] if incarnation: '0' = any; else (with ARGV[7]) its stored
--         incarnation must equal it too
--
-- Returns {code}: the state the task was in (1 scheduled, 2 delivered,
-- 3 dead), or 0 when there was no such task; or, when the generation did
-- not match, {4, header, state, score, payload} of the stored task
-- (nothing deleted).
local kdue, kinflight, kdead, kmeta, kbody = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id = ARGV[6]
local ifgen = tonumber(ARGV[7])
if ifgen ~= 0 then
  local h = redis.call('HGET', kmeta, id)
  if not h then
    return {0}
  end
  local i, g = version(h)
  local ifinc = tonumber(ARGV[8])
  if g ~= ifgen or (ifinc ~= 0 and i ~= ifinc) then
    local st, sc = locate(kdue, kinflight, kdead, id)
    if st == 0 then
      sc = 0
    end
    return {4, h, st, sc, redis.call('HGET', kbody, id) or ''}
  end
end
local st = 0
if redis.call('ZREM', kdue, id) == 1 then
  st = 1
elseif redis.call('ZREM', kinflight, id) == 1 then
  st = 2
elseif redis.call('ZREM', kdead, id) == 1 then
  st = 3
end
redis.call('HDEL', kbody, id)
if redis.call('HDEL', kmeta, id) == 1 and st == 0 then
  -- a header outside every set (should not happen): count it as scheduled
  st = 1
end
return {st}
