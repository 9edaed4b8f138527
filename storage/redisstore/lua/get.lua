-- get.lua: look up one task.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] meta HASH, KEYS[5] body HASH
-- ARGV[1] task id
--
-- Returns {header, state, score, payload}: state 1 scheduled, 2 delivered,
-- 3 dead and the task's score in that state's ZSET; an empty array when
-- there is no such task.
local h = redis.call('HGET', KEYS[4], ARGV[1])
if not h then
  return {}
end
local st, sc = locate(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
return {h, st, sc, redis.call('HGET', KEYS[5], ARGV[1]) or ''}
