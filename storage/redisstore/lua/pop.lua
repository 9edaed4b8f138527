-- pop.lua: lease at most limit due tasks of one namespace.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] task HASH
-- ARGV[1] limit (at most 1,000)
-- ARGV[2] lease ms
--
-- Moves the earliest tasks with due time <= now from due to inflight with
-- score now + lease, counts the attempt and records the due time it was
-- popped at. Deletes nothing.
--
-- Returns {now ms, lease deadline ms, then per task in due order: id,
-- record after the pop}.
local now = now_ms()
local deadline = now + tonumber(ARGV[2])
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'WITHSCORES',
  'LIMIT', 0, tonumber(ARGV[1]))
local out = {now, deadline}
if #items == 0 then
  return out
end
-- the popped tasks are exactly the first #items/2 members of due
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #items / 2 - 1)
local ids = {}
for i = 1, #items, 2 do
  ids[#ids + 1] = items[i]
end
local recs = redis.call('HMGET', KEYS[3], unpack(ids))
local zargs, hargs = {}, {}
local d = int(deadline)
for k = 1, #ids do
  local id, rec = ids[k], recs[k]
  if rec then
    rec = repop(rec, now, tonumber(items[2 * k]))
    push(zargs, d, id)
    push(hargs, id, rec)
    push(out, id, rec)
  end
end
flush('ZADD', KEYS[2], zargs)
flush('HSET', KEYS[3], hargs)
return out
