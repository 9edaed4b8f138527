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
local zargs, hargs = {}, {}
local d = int(deadline)
for i = 1, #items, 2 do
  local id = items[i]
  local rec = redis.call('HGET', KEYS[3], id)
  if rec then
    local r = parse(rec)
    r.attempt = r.attempt + 1
    r.due = tonumber(items[i + 1])
    r.updated = now
    rec = rewrite(rec, r)
    zargs[#zargs + 1] = d
    zargs[#zargs + 1] = id
    hargs[#hargs + 1] = id
    hargs[#hargs + 1] = rec
    out[#out + 1] = id
    out[#out + 1] = rec
  end
end
if #zargs > 0 then
  redis.call('ZADD', KEYS[2], unpack(zargs))
  redis.call('HSET', KEYS[3], unpack(hargs))
end
return out
