-- pop: the source design's poller step (seeds 000 and 004): take at most
-- ARGV[2] ids whose due time is <= ARGV[1] with ZRANGEBYSCORE LIMIT, ZREM
-- them (the ZREM is the claim), and, as seed 001's poller does with HGET and
-- HDEL per task, read and delete their records. Doing the record reads in the
-- same script saves the source design's per-task round trips, so the
-- baseline measured here is a generous version of it.
--
-- KEYS[1]  the queue's ZSET (task id -> due time, Unix ms)
-- KEYS[2]  the queue's HASH (task id -> task record)
-- ARGV[1]  now, Unix ms, by the poller's clock (the source design's
--          System.currentTimeMillis())
-- ARGV[2]  limit: most ids popped by this call (at most 7,000, so unpack
--          stays within Lua's stack)
--
-- Returns a flat array {id1, score1, record1, id2, score2, record2, ...} in
-- due order; empty when nothing is due. A missing record is returned as false
-- (nil in Go).
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local n = #due / 2
if n == 0 then
  return {}
end
local ids = {}
for i = 1, n do
  ids[i] = due[2 * i - 1]
end
redis.call('ZREM', KEYS[1], unpack(ids))
local records = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
local out = {}
for i = 1, n do
  out[3 * i - 2] = ids[i]
  out[3 * i - 1] = due[2 * i]
  out[3 * i] = records[i]
end
return out
