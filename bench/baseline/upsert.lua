-- upsert: the source design's "add or renew" script (seed 001): one ZADD of
-- the due time and one HSET of the task record, atomically.
--
-- KEYS[1]  the queue's ZSET (task id -> due time, Unix ms)
-- KEYS[2]  the queue's HASH (task id -> task record)
-- ARGV[1]  task id
-- ARGV[2]  due time, Unix ms
-- ARGV[3]  task record (the payload)
--
-- Returns 1.
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
