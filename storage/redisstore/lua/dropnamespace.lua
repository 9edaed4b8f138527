-- dropnamespace.lua: delete every task of one namespace shard at once (a
-- forced DeleteNamespace).
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] meta HASH,
-- KEYS[5] index marker (durable mode: a re-created namespace starts unindexed),
-- KEYS[6] body HASH, KEYS[7] acked HASH, KEYS[8] the pre-0.2 task HASH
--
-- Returns the number of tasks deleted. UNLINK frees the memory in the
-- background, so even a huge namespace does not stall Redis.
local n = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
return n
