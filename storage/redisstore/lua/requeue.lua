-- requeue.lua: move dead tasks back to due after a delay, attempts reset.
--
-- KEYS[1] due ZSET, KEYS[2] dead ZSET, KEYS[3] meta HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] delay ms
-- ARGV[4] '1' = requeue the oldest dead tasks, up to ARGV[5]; '0' = the ids
--         in ARGV[6 ..] (at most 1,000; ids that are not dead are skipped)
-- ARGV[5] limit (with ARGV[4] = '1', at most 1,000)
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- The next delivery of a requeued task gets a delivery sequence above every
-- earlier one (see repop), so a token from before the requeue never
-- matches it. A task whose header is malformed stays dead.
--
-- Returns {now ms, then 4 values per moved task: id, incarnation,
-- generation, due ms}.
local now = now_ms()
local due = now + tonumber(ARGV[3])
local out = {now}
local ids = {}
if ARGV[4] == '1' then
  ids = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[5]) - 1)
elseif #ARGV >= 6 then
  local given, seen = {}, {}
  for i = 6, #ARGV do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      given[#given + 1] = ARGV[i]
    end
  end
  local dead = redis.call('ZMSCORE', KEYS[2], unpack(given))
  for i = 1, #given do
    if dead[i] then
      ids[#ids + 1] = given[i]
    end
  end
end
if #ids == 0 then
  return out
end
local recs = redis.call('HMGET', KEYS[3], unpack(ids))
local first = head(KEYS[1])
local d = int(due)
local zadd, hset, moved = {}, {}, {}
for i = 1, #ids do
  local rec = recs[i]
  local r = parse(rec)
  if r then
    r.attempt, r.due, r.updated = 0, 0, now
    push(hset, ids[i], rewrite(rec, r))
    push(zadd, d, ids[i])
    moved[#moved + 1] = ids[i]
    push(out, ids[i], r.inc)
    push(out, r.gen, due)
  elseif not rec then
    moved[#moved + 1] = ids[i] -- a member without a header: only drop it
  end
end
flush('ZREM', KEYS[2], moved)
flush('ZADD', KEYS[1], zadd)
flush('HSET', KEYS[3], hset)
if #out > 1 and (first == nil or due < first) then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return out
