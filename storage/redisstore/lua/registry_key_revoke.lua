-- registry_key_revoke.lua: delete an API key.
--
-- KEYS[1] API key HASH, id -> key record
-- KEYS[2] the key's namespace's key index ZSET
-- ARGV[1] key id
--
-- Returns 1 when deleted, 0 when there was no such key.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
