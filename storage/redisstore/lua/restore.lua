-- restore.lua: re-index tasks from the durable authority. Each task is
-- written unless the index already holds the same or a newer generation.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] task HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] n (at most 1,000); then per task i (from 0), at ARGV[4+5i ..]: id,
--         generation, state (1 = due, 3 = dead), score (due ms or death
--         ms), record (one without a create time is given the Redis clock's
--         now: the create time names the task's incarnation in delivery
--         tokens, and a token without one matches nothing)
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns the number of tasks written (an id given twice counts once).
local n = tonumber(ARGV[3])
if n == 0 then
  return 0
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[4 + 5 * i]
end
local olds = redis.call('HMGET', KEYS[4], unpack(ids))
local first = head(KEYS[1])
local wake = false
local final, order, zrem = {}, {}, {} -- id -> argument index of its write
for i = 0, n - 1 do
  local j = 4 + 5 * i
  local id = ids[i + 1]
  local gen = tonumber(ARGV[j + 1])
  local have
  if final[id] then
    have = tonumber(ARGV[final[id] + 1])
  elseif olds[i + 1] then
    have = gen_created(olds[i + 1])
  end
  if not have or have < gen then
    if not final[id] then
      order[#order + 1] = id
      if olds[i + 1] then
        zrem[#zrem + 1] = id
      end
    end
    final[id] = j
  end
end
local zdue, zdead, hset = {}, {}, {}
local now
for _, id in ipairs(order) do
  local j = final[id]
  local score = tonumber(ARGV[j + 3])
  if ARGV[j + 2] == '3' then
    push(zdead, ARGV[j + 3], id)
  else
    push(zdue, ARGV[j + 3], id)
    if first == nil or score < first then
      first = score
      wake = true
    end
  end
  local rec = ARGV[j + 4]
  local _, created = gen_created(rec)
  if created == 0 then
    now = now or now_ms()
    local r = parse(rec)
    r.created = now
    if r.updated == 0 then
      r.updated = now
    end
    rec = rewrite(rec, r, nil)
  end
  push(hset, id, rec)
end
flush('ZREM', KEYS[1], zrem)
flush('ZREM', KEYS[2], zrem)
flush('ZREM', KEYS[3], zrem)
flush('ZADD', KEYS[1], zdue)
flush('ZADD', KEYS[3], zdead)
flush('HSET', KEYS[4], hset)
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return #order
