-- requeue.lua: move dead tasks back to due after a delay, attempts reset.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] dead ZSET, KEYS[5] meta HASH
-- ARGV[6] wake channel (publish_wake), ARGV[7] namespace
-- ARGV[8] delay ms
-- ARGV[9] '1' = requeue the oldest dead tasks, up to ARGV[10]; '0' = the
--         ids in ARGV[11 ..] (at most 1,000; ids that are not dead are
--         skipped)
-- ARGV[10] limit (with ARGV[9] = '1', at most 1,000)
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
local kdue, kdead, kmeta = KEYS[3], KEYS[4], KEYS[5]
local now = now_ms()
local due = now + tonumber(ARGV[8])
local out = {now}
local ids = {}
if ARGV[9] == '1' then
  ids = redis.call('ZRANGE', kdead, 0, tonumber(ARGV[10]) - 1)
elseif #ARGV >= 11 then
  local given, seen = {}, {}
  for i = 11, #ARGV do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      given[#given + 1] = ARGV[i]
    end
  end
  local dead = redis.call('ZMSCORE', kdead, unpack(given))
  for i = 1, #given do
    if dead[i] then
      ids[#ids + 1] = given[i]
    end
  end
end
if #ids == 0 then
  return out
end
local recs = redis.call('HMGET', kmeta, unpack(ids))
local first = head(kdue)
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
flush('ZREM', kdead, moved)
flush('ZADD', kdue, zadd)
flush('HSET', kmeta, hset)
if #out > 1 and (first == nil or due < first) then
  publish_wake(ARGV[6], ARGV[7])
end
return out
