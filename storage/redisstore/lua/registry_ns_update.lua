-- registry_ns_update.lua: replace a namespace's policy if nobody changed it
-- since it was read (compare-and-set on the record's version).
--
-- KEYS[1] namespace record HASH
-- ARGV[1] the version the caller read
-- ARGV[2] new policy JSON
--
-- Returns {create_ms, update_ms, version} of the updated record, -1 when
-- the namespace does not exist, or 0 when its version is no longer ARGV[1]
-- (read again and retry).
local rec = redis.call('HMGET', KEYS[1], 'version', 'create_ms')
if not rec[1] then
  return -1
end
if rec[1] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local v = string.format('%d', tonumber(rec[1]) + 1)
redis.call('HSET', KEYS[1], 'policy', ARGV[2], 'update_ms', now, 'version', v)
return {rec[2], now, v}
