-- stats.lua: count one namespace's tasks.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET
--
-- Returns {now ms, scheduled, delivered, dead, due now (scheduled with due
-- time <= now), due ms of the earliest scheduled task ('' if none)}.
local now = now_ms()
local h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {now, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]), redis.call('ZCOUNT', KEYS[1], '-inf', int(now)),
  h[2] or ''}
