-- dropnamespace.lua: delete every task of one namespace shard at once (a
-- forced DeleteNamespace).
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] task HASH,
-- KEYS[5] index marker (durable mode: a re-created namespace starts unindexed)
--
-- Returns the number of tasks deleted. UNLINK frees the memory in the
-- background, so even a huge namespace does not stall Redis.
local n = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return n
