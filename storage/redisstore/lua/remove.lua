-- remove.lua: delete one task in any state.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] meta HASH, KEYS[5] body HASH
-- ARGV[1] task id
--
-- Returns the state the task was in: 1 scheduled, 2 delivered, 3 dead, or 0
-- when there was no such task.
local id = ARGV[1]
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
return st
