-- upsert.lua: create or replace tasks of one namespace, in request order.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] task HASH
-- ARGV[1] wake channel
-- ARGV[2] namespace (the wake-up message)
-- ARGV[3] n, the number of tasks (at most 1,000); then 6 arguments per task
--         i (from 0), at ARGV[4+6i ..]: id, due ms ('' = now + delay,
--         rounded up to the ms; a delay of 0 is due now), delay µs, generation ('0' = bump the stored one, 1 if new), kind,
--         payload
--
-- Each task goes to due at its due time, out of inflight and dead, with
-- attempt 0, last error cleared, create time kept. A given generation older
-- than the stored one changes nothing (stale). A later task with the id of
-- an earlier one in the same call replaces it. When a task becomes earlier
-- than the head of due, the namespace is published on the wake channel
-- (once per call).
--
-- Returns {now ms, then 4 values per task: code, a, b, c}:
--   code 0 replaced / 1 created, plus 2 when it became the earliest:
--     a = generation, b = create time ms, c = due ms
--   code 4 stale: a = stored record, b = its state (1 scheduled,
--     2 delivered, 3 dead), c = its score in that state's ZSET
local now_us = now_micros()
local now = math.floor(now_us / 1000)
local n = tonumber(ARGV[3])
local out = {now}
if n == 0 then
  return out
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[4 + 6 * i]
end
local olds = redis.call('HMGET', KEYS[4], unpack(ids))
local first = head(KEYS[1])
local wake = false
local pending = {} -- id -> {rec, due} written by this call
local zadd, hset, zrem = {}, {}, {}
for i = 0, n - 1 do
  local j = 4 + 6 * i
  local id = ids[i + 1]
  local due
  if ARGV[j + 1] == '' then
    local delay = tonumber(ARGV[j + 2])
    if delay == 0 then
      due = now -- due at once (the task did not exist before this call)
    else
      -- never before now + delay: whole µs (< 2^53, exact in a double),
      -- rounded up to the ms
      due = math.ceil((now_us + delay) / 1000)
    end
  else
    due = tonumber(ARGV[j + 1])
  end
  local want = tonumber(ARGV[j + 3])
  local kind = ARGV[j + 4]
  local pend = pending[id]
  local old = olds[i + 1]
  if pend then
    old = pend.rec
  end
  local gen, created, code = 1, now, 1
  local stale = false
  if old then
    local ogen
    ogen, created = gen_created(old)
    code = 0
    if want == 0 then
      gen = ogen + 1
    elseif ogen > want then
      stale = true
    else
      gen = want
    end
    if not stale and not pend then
      zrem[#zrem + 1] = id
    end
  elseif want > 0 then
    gen = want
  end
  if stale then
    local st, sc
    if pend then
      st, sc = 1, pend.due
    else
      st, sc = locate(KEYS[1], KEYS[2], KEYS[3], id)
    end
    out[#out + 1] = 4
    out[#out + 1] = old
    out[#out + 1] = st
    out[#out + 1] = sc
  else
    local r = {gen = gen, attempt = 0, created = created, updated = now, due = 0,
      kl = #kind, el = 0}
    local rec = header(r) .. kind .. ARGV[j + 5]
    push(zadd, int(due), id)
    push(hset, id, rec)
    pending[id] = {rec = rec, due = due}
    if first == nil or due < first then
      first = due
      code = code + 2
      wake = true
    end
    out[#out + 1] = code
    out[#out + 1] = gen
    out[#out + 1] = created
    out[#out + 1] = due
  end
end
flush('ZREM', KEYS[2], zrem)
flush('ZREM', KEYS[3], zrem)
flush('ZADD', KEYS[1], zadd)
flush('HSET', KEYS[4], hset)
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return out
