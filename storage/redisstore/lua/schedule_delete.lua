-- schedule_delete.lua: delete a schedule (its firings' tasks stay).
--
-- KEYS[1] sched HASH, KEYS[2] schedids ZSET, KEYS[3] schednext ZSET
-- ARGV[1] schedule id
-- ARGV[2] the version the stored one must have ('0' = any)
--
-- Returns {1} deleted, {0} no such schedule, {2, version} another version
-- is stored (nothing deleted).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  return {0}
end
local ver = tonumber(string.match(cur, '^(%d+),'))
if ARGV[2] ~= '0' and ver ~= tonumber(ARGV[2]) then
  return {2, ver}
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return {1}
