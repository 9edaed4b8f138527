-- schedule_due.lua: the schedules of one shard the schedule loop should
-- look at now.
--
-- KEYS[1] schednext ZSET, KEYS[2] sched HASH, KEYS[3] schedids ZSET
-- ARGV[1] limit (at most 1,000)
--
-- Returns {now ms, next ms ('' = none), the shard's schedule count, then
-- id, stored schedule per due schedule}: the schedules whose time in
-- schednext is at or before now, earliest first, at most limit; next is
-- the time of the first one not returned (at or before now when the limit
-- cut the list).
local now = now_ms()
local limit = tonumber(ARGV[1])
local head = redis.call('ZRANGE', KEYS[1], 0, limit, 'WITHSCORES')
local out = {now, '', redis.call('ZCARD', KEYS[3])}
local ids = {}
for i = 1, #head, 2 do
  local at = tonumber(head[i + 1])
  if at > now or #ids == limit then
    out[2] = int(at)
    break
  end
  ids[#ids + 1] = head[i]
end
if #ids > 0 then
  local recs = redis.call('HMGET', KEYS[2], unpack(ids))
  for i, id in ipairs(ids) do
    if recs[i] then
      push(out, id, recs[i])
    end
  end
end
return out
