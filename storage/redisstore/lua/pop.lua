-- pop.lua: lease at most limit due tasks of one namespace.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET,
-- KEYS[6] meta HASH, KEYS[7] body HASH, KEYS[8] rate bucket HASH,
-- KEYS[9] hwm STRING (high-water mark of delivery sequences; next_stamp)
-- ARGV[6] limit (at most 1,000)
-- ARGV[7] lease ms
-- ARGV[8] dispatch rate cap, tasks per second ("0": no cap, KEYS[8] untouched)
-- ARGV[9] bucket size (burst), at least 1
-- ARGV[10] kind scan window: 0 = tasks of any kind; n > 0 = take only tasks
--          whose kind is one of ARGV[12..], looking at the first n due tasks
-- ARGV[11] told ms: the ack timeout the subscriber is told; when longer than
--          the lease, now + it is kept in each header (';told', lib.lua)
-- ARGV[12..] kinds (with a window)
--
-- With a cap, the namespace's token bucket (KEYS[8]: t = tokens, at = Redis
-- time of t in microseconds) is refilled at ARGV[8] per second up to
-- ARGV[9], the pop takes at most its whole tokens, and each task popped
-- spends one; every replica's pop goes through the same bucket, in the
-- same script as the move, so the cap holds across replicas. The bucket
-- expires once it would be full again anyway, so an idle namespace leaves
-- nothing behind.
--
-- Moves the earliest tasks with due time <= now from due to inflight with
-- score now + lease, counts the attempt, gives the delivery a new sequence
-- number and records the due time it was popped at. Deletes nothing: every
-- header is read and checked before anything is written, a member without
-- a header is only taken out of due, and a task whose header is malformed
-- goes to dead (kept for an operator to look at and purge) instead of
-- vanishing.
--
-- Returns {now ms, lease deadline ms, next due ms, next lease deadline ms,
-- then per task in due order: id, header after the pop, payload of the
-- split form ('' when inline: the header holds it)}; then, after a ''
-- marker, the ids moved to dead as malformed. Next due and next lease
-- deadline are the scores at the heads of due and inflight after the pop
-- ('' when empty): when the dispatcher has work next, so a wake needs no
-- second call (NextWake) to plan the following one.
local kdue, kinflight, kdead, kmeta, kbody, krate, khwm = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local now, now_us = clock()
local deadline = now + tonumber(ARGV[7])
local limit = tonumber(ARGV[6])
local rate = tonumber(ARGV[8])
local told = now + tonumber(ARGV[11])
if told <= deadline then
  told = 0
end
local out = {now, deadline, '', ''}
-- heads fills in out[3] and out[4] (called once the writes are done).
local function heads()
  local d = redis.call('ZRANGE', kdue, 0, 0, 'WITHSCORES')
  local l = redis.call('ZRANGE', kinflight, 0, 0, 'WITHSCORES')
  out[3] = d[2] or ''
  out[4] = l[2] or ''
  return out
end
local tokens, burst
if rate > 0 then
  burst = math.max(1, tonumber(ARGV[9]))
  tokens = bucket_read(krate, rate, burst, now_us)
  limit = math.min(limit, math.floor(tokens))
  if limit < 1 then
    return heads()
  end
end
-- Kinds (a window > 0): the wanted tasks among the first window due ones,
-- in due order; the others (and members without a readable header) stay
-- where they are.
local want = {}
for i = 12, #ARGV do
  want[ARGV[i]] = true
end
local window = tonumber(ARGV[10])
local items = due_head(kdue, kmeta, now, limit, window, want)
if #items == 0 then
  return heads()
end
local ids = {}
for i = 1, #items, 2 do
  ids[#ids + 1] = items[i]
end
local hs = redis.call('HMGET', kmeta, unpack(ids))
local stamp = next_stamp(khwm, now_us)
local top = 0 -- the highest sequence issued
-- The reply is built as the tasks are read: no per-task table or string
-- is made that the reply or a write does not use.
local zargs, hargs, bad = {}, {}, {}
local split, at = {}, {} -- split-form tasks (payloads read below), their places in out
local d = int(deadline)
local good = 0
for k = 1, #ids do
  local id, h = ids[k], hs[k]
  if h then
    local nh, seq, inl = repop(h, now, stamp, tonumber(items[2 * k]), told)
    if nh then
      top = math.max(top, seq)
      push(zargs, d, id)
      push(hargs, id, nh)
      good = good + 1
      push(out, id, nh)
      out[#out + 1] = ''
      if not inl then
        split[#split + 1] = id
        at[#at + 1] = #out
      end
    else
      bad[#bad + 1] = id
    end
  end
end
if #split > 0 then
  local got = redis.call('HMGET', kbody, unpack(split))
  for x = 1, #split do
    if got[x] then
      out[at[x]] = got[x]
    end
  end
end
if window > 0 then
  redis.call('ZREM', kdue, unpack(ids))
else
  -- the popped tasks are exactly the first #ids members of due
  redis.call('ZREMRANGEBYRANK', kdue, 0, #ids - 1)
end
flush('ZADD', kinflight, zargs)
flush('HSET', kmeta, hargs)
if top > 0 then
  redis.call('SET', khwm, int(top))
end
if #bad > 0 then
  local dargs = {}
  for _, id in ipairs(bad) do
    push(dargs, int(now), id)
  end
  flush('ZADD', kdead, dargs)
end
if rate > 0 and good > 0 then
  bucket_write(krate, tokens - good, rate, burst, now_us)
end
heads()
if #bad > 0 then
  out[#out + 1] = ''
  for _, id in ipairs(bad) do
    out[#out + 1] = id
  end
end
return out
