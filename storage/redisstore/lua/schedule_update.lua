-- schedule_update.lua: replace a schedule at the version it was read at,
-- and create its firings' tasks in the same step: the slots a step decides
-- become tasks exactly when the schedule's cursor moves past them, so a
-- slot is fired once however many replicas race the step.
--
-- KEYS[1] sched HASH, KEYS[2] schednext ZSET, KEYS[3] due ZSET,
-- KEYS[4] meta HASH (and the high-water mark: lib.lua HWM), KEYS[5] body
-- HASH, KEYS[6] life STRING, KEYS[7] hwm STRING (lib.lua next_stamp) (the
-- task keys of the schedule's shard: its firings' ids land there,
-- storage.FiringID)
-- ARGV[1] wake channel (publish_wake), ARGV[2] namespace (the wake-up message)
-- ARGV[3] schedule id, ARGV[4] the version the stored one must have
-- ARGV[5] the schedule (storage.MarshalSchedule)
-- ARGV[6] when the schedule loop next looks at it (Unix ms; '' = never)
-- ARGV[7] the namespace incarnation the firings are for ('0' = unchecked;
--         as upsert.lua's last argument)
-- ARGV[8] n, the number of firings (at most 1,000); then 4 arguments per
--         firing i (from 0), at ARGV[9+4i ..]: id, due ms, kind, payload.
--
-- Each firing is created as upsert.lua creates a task (a new incarnation,
-- generation 1, due at its due time) unless a task with its id exists, in
-- any state: then it is left as it is (refused). When a firing becomes the
-- earliest due task the namespace is published on the wake channel.
--
-- Returns {now ms, code, version, then per firing: 1 created, 3 created and
-- the earliest, 5 refused}; code 1 applied (version is the new one), 0 no
-- such schedule, 2 another version is stored (version is it), -1 the
-- namespace incarnation ended (nothing written).
local now, now_us = clock()
local cur = redis.call('HGET', KEYS[1], ARGV[3])
if not cur then
  return {now, 0, 0}
end
local ver, created = string.match(cur, '^(%d+),(%d+),')
ver = tonumber(ver)
if ver ~= tonumber(ARGV[4]) then
  return {now, 2, ver}
end
local n = tonumber(ARGV[8])
local out = {now, 1, ver + 1}
if n > 0 then
  local nsinc = tonumber(ARGV[7]) or 0
  local live, ended = life_read(KEYS[6])
  if (nsinc == 0 and life_ended(live, ended)) or (nsinc ~= 0 and nsinc <= ended) then
    return {now, -1, ver}
  end
  if nsinc > live then
    redis.call('SET', KEYS[6], int(nsinc) .. ',' .. int(ended))
  end
  local ids = {}
  for i = 0, n - 1 do
    ids[i + 1] = ARGV[9 + 4 * i]
  end
  ids[n + 1] = HWM
  local olds = redis.call('HMGET', KEYS[4], unpack(ids))
  ids[n + 1] = nil
  local stamp = next_stamp(olds[n + 1], KEYS[7], now_us)
  local first = head(KEYS[3])
  local wake, made = false, {}
  local zadd, hset, bset = {}, {}, {}
  for i = 0, n - 1 do
    local j = 9 + 4 * i
    local id, due, kind, payload = ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2], ARGV[j + 3]
    if olds[i + 1] or made[id] then
      out[#out + 1] = 5
    else
      made[id] = true
      push(zadd, int(due), id)
      push(hset, id, header({inc = stamp, gen = 1, attempt = 0, dseq = 0, created = now, updated = now, due = 0}, kind, '', payload))
      if #payload > 0 and not inline(payload) then
        push(bset, id, payload)
      end
      local code = 1
      if first == nil or due < first then
        first, code, wake = due, 3, true
      end
      out[#out + 1] = code
    end
  end
  flush('ZADD', KEYS[3], zadd)
  if #zadd > 0 then
    push(hset, HWM, int(stamp))
  end
  flush('HSET', KEYS[4], hset)
  flush('HSET', KEYS[5], bset)
  if wake then
    publish_wake(ARGV[1], ARGV[2])
  end
end
redis.call('HSET', KEYS[1], ARGV[3], int(ver + 1) .. ',' .. created .. ',' .. int(now) .. '|' .. ARGV[5])
if ARGV[6] == '' then
  redis.call('ZREM', KEYS[2], ARGV[3])
else
  redis.call('ZADD', KEYS[2], ARGV[6], ARGV[3])
end
return out
