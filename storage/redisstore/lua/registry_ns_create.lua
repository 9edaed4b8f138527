-- registry_ns_create.lua: create a namespace record.
--
-- KEYS[1] namespace record HASH (delayd:{registry}:ns:<name>)
-- KEYS[2] namespace index ZSET (delayd:{registry}:namespaces), every score 0
-- KEYS[3] born HASH (delayd:{registry}:born): name -> create_ms of a
--         deleted namespace of that name
-- ARGV[1] namespace name
-- ARGV[2] policy JSON (storage.MarshalPolicy)
--
-- The create time is the namespace's incarnation (streams and cached
-- policies are tied to it): it is later than a deleted namespace's of the
-- same name, even one deleted within the same millisecond.
--
-- Returns {create_ms, update_ms, version} of the new record (times by the
-- Redis clock), or 0 when the namespace exists.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local born = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if ms <= born then
  ms = born + 1
end
local now = string.format('%d', ms)
redis.call('HSET', KEYS[1], 'policy', ARGV[2], 'create_ms', now, 'update_ms', now, 'version', '1')
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return {now, now, '1'}
