-- pop.lua: settle the acks and nacks handed to the pop, then lease at most
-- limit due tasks of one namespace shard.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET,
-- KEYS[6] meta HASH (headers, and the high-water mark: lib.lua HWM),
-- KEYS[7] body HASH, KEYS[8] acked HASH (durable mode's ack markers),
-- KEYS[9] rate bucket HASH,
-- KEYS[10] hwm STRING (the high-water mark of a shard whose meta HASH has
--          none; lib.lua next_stamp)
-- ARGV[6] limit (at most 1,000)
-- ARGV[7] lease ms
-- ARGV[8] dispatch rate cap, tasks per second ("0": no cap, KEYS[9] untouched)
-- ARGV[9] bucket size (burst), at least 1
-- ARGV[10] kind scan window: 0 = tasks of any kind; n > 0 = take only tasks
--          whose kind is one of the kinds, looking at the first n due tasks
-- ARGV[11] told ms: the ack timeout the subscriber is told; when longer than
--          the lease, now + it is kept in each header (';told', lib.lua)
-- ARGV[12] wake channel (publish_wake), ARGV[13] namespace (the wake-up message)
-- ARGV[14] k, the number of kinds (with a window); ARGV[15..14+k] the kinds
-- ARGV[15+k..] the settle section (lib.lua settle_deliveries): the acks and
--          nacks of the namespace shard that arrived for this pop (issue 37
--          item 3), settled first, as settle.lua would
--
-- A pop that can be asked again (issue 38): with a request id (ARGV[1]),
-- a pop whose record (KEYS[1]) exists answers the recorded pop — the same
-- lease deadline, tasks, headers and so tokens — and moves nothing; one
-- without a record pops and writes what it leased as the record, kept
-- ARGV[2] ms (SET PX). So a pop whose answer was lost is asked again with
-- the same id and gets the same deliveries; asked with limit 0 before the
-- first one ran, it records that it leased nothing, and the first one, run
-- late, answers that and leases nothing (a pop of limit > 0 that leases
-- nothing writes no record). The settle section is settled in
-- every call (it is the acks of this call, not of the recorded one), and
-- next due and next lease deadline are read anew.
--
-- With a cap, the namespace's token bucket (KEYS[9]: t = tokens, at = Redis
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
-- vanishing. A nack of the section that makes a task due at once lets this
-- very pop deliver it again.
--
-- Returns {now ms, lease deadline ms, next due ms, next lease deadline ms,
-- s, then the settle section's s answers (lib.lua settle_deliveries), then
-- per task in due order: id, header after the pop, payload of the split
-- form ('' when inline: the header holds it)}; then, after a '' marker,
-- the ids moved to dead as malformed. Next due and next lease deadline are
-- the scores at the heads of due and inflight after the pop ('' when
-- empty): when the dispatcher has work next, so a wake needs no second call
-- (NextWake) to plan the following one.
--
-- Cost (the steady flow pops a task or two per call): a pop of up to PEEK
-- tasks reads due once, by rank, and that one read also tells the next due
-- time; the high-water mark rides the headers' HMGET and HSET. A pop of a
-- task makes 7 redis.calls (TIME, ZRANGE due, HMGET, ZREMRANGEBYRANK,
-- ZADD, HSET, ZRANGE inflight), an empty one 3; an ack it carries adds 4
-- (HMGET, ZMSCORE, ZREM, HDEL): a script call and its TIME fewer than the
-- ack alone. A request id adds GET (and SET when the pop leased a task).
local kdue, kinflight, kdead, kmeta, kbody, krate, khwm = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[9], KEYS[10]
-- PEEK is how many due tasks the first read of due takes at most: it reads
-- PEEK + 1 members by rank, so the member after the last one taken (the
-- next due time) comes with it. A larger pop reads the rest by score.
local PEEK = 2
local now, now_us = clock()
local limit = tonumber(ARGV[6])
local deadline = now + tonumber(ARGV[7])
local rate = tonumber(ARGV[8])
local window = tonumber(ARGV[10])
local told = now + tonumber(ARGV[11])
if told <= deadline then
  told = 0
end
local nkinds = tonumber(ARGV[14])
local out = {now, deadline, '', '', 0}
if settle_deliveries(KEYS, ARGV, 15 + nkinds, now, out) then
  publish_wake(ARGV[12], ARGV[13])
end
out[5] = #out - 5
-- rows: where the popped tasks start in out; rec: this request's record
local rows, rec = #out + 1, nil
if ARGV[1] ~= '' then
  rec = redis.call('GET', KEYS[1])
  if rec then
    limit = 0 -- asked again: answer the record below, move nothing
  end
end
local tokens, burst
if rate > 0 then
  burst = math.max(1, tonumber(ARGV[9]))
  tokens = bucket_read(krate, rate, burst, now_us)
  limit = math.min(limit, math.floor(tokens))
end
-- ids and dues: the due members taken, in due order; nextdue: the head of
-- due after they are gone, when a read told it (nil: read it at the end).
local ids, dues, nextdue = {}, {}, nil
if limit >= 1 and window == 0 then
  local m = math.min(limit, PEEK)
  local r = redis.call('ZRANGE', kdue, 0, m, 'WITHSCORES')
  local k = 0
  while k < limit and r[2 * k + 2] and tonumber(r[2 * k + 2]) <= now do
    ids[k + 1], dues[k + 1] = r[2 * k + 1], r[2 * k + 2]
    k = k + 1
  end
  if r[2 * k + 2] then
    nextdue = r[2 * k + 2] -- the first member not taken
  elseif #r < 2 * (m + 1) then
    nextdue = '' -- the set held no more
  elseif k < limit then
    -- every member read was due: read the rest that is, up to limit
    local more = redis.call('ZRANGEBYSCORE', kdue, '-inf', int(now), 'WITHSCORES', 'LIMIT', k, limit - k)
    for i = 1, #more, 2 do
      ids[#ids + 1], dues[#dues + 1] = more[i], more[i + 1]
    end
  end
elseif limit >= 1 then
  -- Kinds: the wanted tasks among the first window due ones, in due
  -- order; the others (and members without a readable header) stay where
  -- they are.
  local want = {}
  for i = 15, 14 + nkinds do
    want[ARGV[i]] = true
  end
  local items = due_head(kdue, kmeta, now, limit, window, want)
  for i = 1, #items, 2 do
    ids[#ids + 1], dues[#dues + 1] = items[i], items[i + 1]
  end
end
if #ids > 0 then
  local n = #ids
  ids[n + 1] = HWM
  local hs = redis.call('HMGET', kmeta, unpack(ids))
  ids[n + 1] = nil
  local stamp = next_stamp(hs[n + 1], khwm, now_us)
  local top = 0 -- the highest sequence issued
  -- The reply is built as the tasks are read: no per-task table or string
  -- is made that the reply or a write does not use; the tables of the
  -- rare cases (split payloads, malformed headers) only when needed.
  local zargs, hargs = {}, {}
  local split, at, bad
  local d = int(deadline)
  local good = 0
  for k = 1, n do
    local id, h = ids[k], hs[k]
    if h then
      local nh, seq, inl = repop(h, now, stamp, tonumber(dues[k]), told)
      if nh then
        if seq > top then
          top = seq
        end
        good = good + 1
        zargs[2 * good - 1], zargs[2 * good] = d, id
        hargs[2 * good - 1], hargs[2 * good] = id, nh
        local o = #out
        out[o + 1], out[o + 2], out[o + 3] = id, nh, ''
        if not inl then
          split, at = split or {}, at or {}
          split[#split + 1] = id
          at[#at + 1] = o + 3
        end
      else
        bad = bad or {}
        bad[#bad + 1] = id
      end
    end
  end
  if split then
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
    -- the popped tasks are exactly the first n members of due
    redis.call('ZREMRANGEBYRANK', kdue, 0, n - 1)
  end
  flush('ZADD', kinflight, zargs)
  if top > 0 then
    push(hargs, HWM, int(top))
  end
  flush('HSET', kmeta, hargs)
  if bad then
    local dargs = {}
    for _, id in ipairs(bad) do
      push(dargs, int(now), id)
    end
    flush('ZADD', kdead, dargs)
    out[#out + 1] = ''
    for _, id in ipairs(bad) do
      out[#out + 1] = id
    end
  end
  if rate > 0 and good > 0 then
    bucket_write(krate, tokens - good, rate, burst, now_us)
  end
end
if rec then
  -- the record: the lease deadline, then the rows (and malformed ids)
  out[2] = tonumber(record_unpack(rec, out)) or deadline
elseif ARGV[1] ~= '' and (#out >= rows or tonumber(ARGV[6]) <= 0) then
  -- A pop that leased nothing needs no record (asked again, it finds none
  -- and records that nothing); a pop asked again with limit 0 always
  -- writes one: it is what cancels the first one.
  redis.call('SET', KEYS[1], record_pack(deadline, out, rows), 'PX', ARGV[2])
end
if nextdue == nil then
  nextdue = redis.call('ZRANGE', kdue, 0, 0, 'WITHSCORES')[2] or ''
end
out[3] = nextdue
out[4] = redis.call('ZRANGE', kinflight, 0, 0, 'WITHSCORES')[2] or ''
return out
