-- registry_ns_delete.lua: delete a namespace record and every API key of
-- that namespace.
--
-- KEYS[1] namespace record HASH
-- KEYS[2] namespace index ZSET
-- KEYS[3] API key HASH (delayd:{registry}:keys), id -> key record
-- KEYS[4] the namespace's key index ZSET (delayd:{registry}:nskeys:<name>)
-- KEYS[5] born HASH (delayd:{registry}:born): the deleted namespace's
--         create_ms is kept there, so a re-created one is born later
-- ARGV[1] namespace name
--
-- Returns the number of keys deleted with it, or -1 when the namespace does
-- not exist. Loops once per key of the namespace (bounded by how many keys
-- an operator created for it).
local born = redis.call('HGET', KEYS[1], 'create_ms')
if redis.call('DEL', KEYS[1]) == 0 then
  return -1
end
if born then
  redis.call('HSET', KEYS[5], ARGV[1], born)
end
redis.call('ZREM', KEYS[2], ARGV[1])
local ids = redis.call('ZRANGE', KEYS[4], 0, -1)
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[3], id)
end
redis.call('DEL', KEYS[4])
return #ids
