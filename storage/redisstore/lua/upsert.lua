-- upsert.lua: create or replace tasks of one namespace, in request order.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET,
-- KEYS[6] meta HASH (headers, and the high-water mark: lib.lua HWM),
-- KEYS[7] body HASH (large payloads),
-- KEYS[8] life STRING (the namespace incarnation, see keys.go)
-- KEYS[9] hwm STRING (the high-water mark of a shard whose meta HASH has
--         none; lib.lua next_stamp)
-- ARGV[6] wake channel (publish_wake)
-- ARGV[7] namespace (the wake-up message)
-- ARGV[8] n, the number of tasks (at most 1,000); then 10 arguments per
--         task i (from 0), at ARGV[9+10i ..]: id, due ms ('' = now + delay,
--         rounded up to the ms; a delay of 0 is due now), delay µs,
--         incarnation, generation, kind, payload, create only ('1' or
--         '0'), if generation ('0' = unconditional), if incarnation ('0' =
--         any).
--         Create only: when the id exists (any state) the task is refused.
--         If generation: unless the task exists with exactly that
--         generation (and, if given, that incarnation) it is refused. Both
--         only with incarnation and generation '0','0'.
--         Incarnation and generation '0','0': a new task gets a new
--         incarnation (the Redis clock in microseconds, or above the
--         high-water mark when the clock is not; next_stamp) and
--         generation 1;
--         an existing one keeps its incarnation and gets the next
--         generation. Generation given, incarnation '0': that generation
--         of the stored incarnation (a new one if none is stored).
--         Both given (durable mode, decided by MySQL): exactly that
--         version.
-- ARGV[9 + 10n] the namespace incarnation the caller writes for (its create
--         time, ms; '0' = unchecked). When DropNamespace ended that
--         incarnation or a later one (life's ended >= it), nothing is
--         written and the script returns {now, -1}; an unchecked write is
--         refused the same way while no incarnation has written since the
--         last one ended. Otherwise a later incarnation than life's live
--         becomes live. With n = 0 the script only does this check
--         (ClaimIncarnation).
--
-- Each task goes to due at its due time, out of inflight and dead, with
-- attempt 0, last error cleared, create time kept (a new incarnation gets
-- now). A given version older than the stored one changes nothing (stale);
-- the very version stored changes nothing either (a repeated write). A
-- later task with the id of an earlier one in the same call replaces it.
-- When a task becomes earlier than the head of due, the namespace is
-- published on the wake channel (once per call).
--
-- Returns {now ms, then 5 values per task: code, a, b, c, d}:
--   code 0 replaced / 1 created, plus 2 when it became the earliest:
--     a = generation, b = create time ms, c = due ms, d = incarnation
--   code 4 unchanged (stale, or the same version), 5 refused (create only,
--     and the task exists), 6 refused (if generation, and the stored
--     generation differs): a = stored header ('' when there is none),
--     b = its state (1 scheduled, 2 delivered, 3 dead; 0 none), c = its
--     score in that state's ZSET, d = stored payload of the split form
--     (an inline payload is in the header)
local kdue, kinflight, kdead, kmeta, kbody, klife, khwm = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local now, now_us = clock()
local n = tonumber(ARGV[8])
local out = {now}
local nsinc = tonumber(ARGV[9 + 10 * n]) or 0
local live, ended = life_read(klife)
if nsinc == 0 then
  if life_ended(live, ended) then
    return {now, -1}
  end
elseif nsinc <= ended then
  return {now, -1}
elseif nsinc > live then
  redis.call('SET', klife, int(nsinc) .. ',' .. int(ended))
end
if n == 0 then
  return out
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[9 + 10 * i]
end
ids[n + 1] = HWM
local olds = redis.call('HMGET', kmeta, unpack(ids))
ids[n + 1] = nil
local stamp = next_stamp(olds[n + 1], khwm, now_us)
local stamped = false
local first = head(kdue)
local wake = false
-- id -> header, due time and payload written by this call (three tables,
-- not a table per task)
local pend_h, pend_due, pend_p = {}, {}, {}
-- the header of a task this call creates, up to its kind length: a new
-- incarnation (now_us), generation 1, never delivered, created and updated
-- now (both stored as differences: empty)
local fresh = enc(now_us) .. ',1,,,,,,'

local zadd, hset, zrem = {}, {}, {}
-- id -> final body entry ('' = none: no payload, or inline), ids in
-- first-write order, id -> whether the task existed before this call (only
-- then can there be a body entry to delete)
local body, border, stored = {}, {}, {}
for i = 0, n - 1 do
  local j = 9 + 10 * i
  local id = ids[i + 1]
  local due
  if ARGV[j + 1] == '' then
    local delay = tonumber(ARGV[j + 2])
    if delay == 0 then
      due = now -- due at once
    else
      -- never before now + delay: whole µs (< 2^53, exact in a double),
      -- rounded up to the ms
      due = math.ceil((now_us + delay) / 1000)
    end
  else
    due = tonumber(ARGV[j + 1])
  end
  local winc, wgen = tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local kind, payload = ARGV[j + 5], ARGV[j + 6]
  local pend = pend_h[id]
  local old = olds[i + 1]
  if pend then
    old = pend
  end
  local oinc, ogen, ocreated, odseq
  if old then
    local r = parse(old)
    if r then
      oinc, ogen, ocreated, odseq = r.inc, r.gen, r.created, r.dseq
    end
  end
  local inc, gen, created, dseq, code = winc, wgen, now, 0, 1
  local keep, refused = false, nil
  local ifgen, ifinc = tonumber(ARGV[j + 8]), tonumber(ARGV[j + 9])
  if ARGV[j + 7] == '1' and old then
    keep, refused = true, 5
  elseif ifgen ~= 0 and (ogen ~= ifgen or (ifinc ~= 0 and oinc ~= ifinc)) then
    keep, refused = true, 6
  end
  if keep then
    -- refused: the condition decided
  elseif oinc then
    if winc == 0 then
      inc = oinc
      if wgen == 0 then
        gen = ogen + 1
      elseif ogen > wgen then
        keep = true
      end
    elseif not newer(winc, wgen, oinc, ogen) then
      keep = true
    end
    if inc == oinc then
      created, dseq, code = ocreated, odseq, 0
    end
  else
    if inc == 0 then
      inc = stamp
      stamped = true
    end
    if gen == 0 then
      gen = 1
    end
  end
  if keep then
    local st, sc, p
    if pend then
      st, sc, p = 1, pend_due[id], pend_p[id]
    elseif old then
      st, sc = locate(kdue, kinflight, kdead, id)
      p = redis.call('HGET', kbody, id) or ''
    else
      st, sc, p = 0, 0, ''
    end
    push(out, refused or 4, old or '')
    push(out, st, sc)
    out[#out + 1] = p
  else
    if old and not pend then
      zrem[#zrem + 1] = id
    end
    local h
    local inl = inline(payload)
    if inc == now_us and gen == 1 and dseq == 0 and created == now then
      if inl then
        h = fresh .. enc(#kind) .. ',|' .. kind .. payload
      else
        h = fresh .. enc(#kind) .. '|' .. kind
      end
    else
      h = header({inc = inc, gen = gen, attempt = 0, dseq = dseq, created = created,
        updated = now, due = 0}, kind, '', payload)
    end
    push(zadd, int(due), id)
    push(hset, id, h)
    if body[id] == nil then
      border[#border + 1] = id
      if olds[i + 1] then
        stored[id] = true
      end
    end
    if inl then
      body[id] = ''
    else
      body[id] = payload
    end
    pend_h[id], pend_due[id], pend_p[id] = h, due, payload
    if first == nil or due < first then
      first = due
      code = code + 2
      wake = true
    end
    push(out, code, gen)
    push(out, created, due)
    out[#out + 1] = inc
  end
end
flush('ZREM', kinflight, zrem)
flush('ZREM', kdead, zrem)
flush('ZADD', kdue, zadd)
if stamped then
  push(hset, HWM, int(stamp))
end
flush('HSET', kmeta, hset)
local bset, bdel = {}, {}
for _, id in ipairs(border) do
  if body[id] == '' then
    if stored[id] then
      bdel[#bdel + 1] = id
    end
  else
    push(bset, id, body[id])
  end
end
flush('HDEL', kbody, bdel)
flush('HSET', kbody, bset)
if wake then
  publish_wake(ARGV[6], ARGV[7])
end
return out
