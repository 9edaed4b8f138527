-- requeue.lua: move dead tasks back to due after a delay, attempts reset.
--
-- KEYS[1] due ZSET, KEYS[2] dead ZSET, KEYS[3] task HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] delay ms
-- ARGV[4] '1' = requeue the oldest dead tasks, up to ARGV[5]; '0' = the ids
--         in ARGV[6 ..] (at most 1,000; ids that are not dead are skipped)
-- ARGV[5] limit (with ARGV[4] = '1', at most 1,000)
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns {now ms, then 3 values per moved task: id, generation, due ms}.
local now = now_ms()
local due = now + tonumber(ARGV[3])
local ids
if ARGV[4] == '1' then
  ids = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[5]) - 1)
else
  ids = {}
  for i = 6, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
end
local first = head(KEYS[1])
local out = {now}
for i = 1, #ids do
  local id = ids[i]
  if redis.call('ZREM', KEYS[2], id) == 1 then
    local rec = redis.call('HGET', KEYS[3], id)
    if rec then
      local r = parse(rec)
      r.attempt, r.due, r.updated = 0, 0, now
      redis.call('HSET', KEYS[3], id, rewrite(rec, r))
      redis.call('ZADD', KEYS[1], int(due), id)
      out[#out + 1] = id
      out[#out + 1] = r.gen
      out[#out + 1] = due
    end
  end
end
if #out > 1 and (first == nil or due < first) then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return out
