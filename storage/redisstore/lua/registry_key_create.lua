-- registry_key_create.lua: store a new API key (its hash, never its secret).
--
-- KEYS[1] API key HASH, id -> key record
-- KEYS[2] the key's namespace's key index ZSET, id -> create time (ms)
-- KEYS[3] the namespace record HASH (ignored for a global key)
-- ARGV[1] key id
-- ARGV[2] key record (JSON, opaque here)
-- ARGV[3] create time, Unix ms
-- ARGV[4] "1" for a global key (no namespace record to check), else "0"
--
-- Returns 1 when stored, 0 when the id is taken, -1 when the namespace does
-- not exist (so a key can never outlive, or predate, its namespace).
if ARGV[4] ~= '1' and redis.call('EXISTS', KEYS[3]) == 0 then
  return -1
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
