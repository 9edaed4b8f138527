-- nextwake.lua: when a dispatcher has work next in one namespace.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET
--
-- Returns {now ms, due ms of the earliest scheduled task ('' if none), the
-- earliest lease deadline ('' if none)}.
local now = now_ms()
local d = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local l = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {now, d[2] or '', l[2] or ''}
