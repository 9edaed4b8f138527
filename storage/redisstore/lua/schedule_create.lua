-- schedule_create.lua: store a new schedule.
--
-- KEYS[1] sched HASH, KEYS[2] schedids ZSET, KEYS[3] schednext ZSET
-- ARGV[1] schedule id
-- ARGV[2] the schedule (storage.MarshalSchedule)
-- ARGV[3] when the schedule loop first looks at it (Unix ms; '' = never:
--         created paused or done)
--
-- Returns {now ms, 1} when stored (version 1, created and updated now), or
-- {now ms, 0} when a schedule with the id exists (nothing changed).
local now = now_ms()
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {now, 0}
end
redis.call('HSET', KEYS[1], ARGV[1], '1,' .. int(now) .. ',' .. int(now) .. '|' .. ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
end
return {now, 1}
