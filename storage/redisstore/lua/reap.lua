-- reap.lua: take expired leases back: at most limit tasks whose lease
-- deadline <= now go back to due after their backoff, or to dead when their
-- attempts are used up. Atomic, so any number of replicas may reap at once.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET, KEYS[6] meta HASH
-- ARGV[6] wake channel (publish_wake), ARGV[7] namespace
-- ARGV[8] retry_after ms ('' = backoff), ARGV[9] max attempts (0 = no limit),
-- ARGV[10] backoff initial ms, ARGV[11] backoff max ms, ARGV[12] multiplier,
-- ARGV[13] jitter fraction, ARGV[14] jitter seed in [0, 1), ARGV[15] reason
-- ARGV[16] limit (at most 1,000)
-- ARGV[17] expired-by ms ('' = now): take only leases whose deadline is at
--          or before the earlier of it and now (storage.NackOptions.
--          ExpiredBy: a reap that waited out a stall in the socket takes
--          back only what had expired when it was sent)
--
-- Every header is read and checked before anything is written: a member
-- without a header is only taken out of inflight, and a task whose header is
-- malformed goes to dead (kept) instead of vanishing. Publishes the
-- namespace on the wake channel when a task became earlier than the head of
-- due.
--
-- Returns {now ms, then 6 values per moved task: id, incarnation,
-- generation, attempt, state (1 scheduled, 3 dead), time (due ms or death
-- ms)}; then, after a '' marker, the ids moved to dead as malformed.
local kdue, kinflight, kdead, kmeta = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = now_ms()
local p = retry_policy(ARGV, 8)
local upto = now
if ARGV[17] and ARGV[17] ~= '' then
  upto = math.min(now, tonumber(ARGV[17]))
end
local ids = redis.call('ZRANGEBYSCORE', kinflight, '-inf', int(upto), 'LIMIT', 0,
  tonumber(ARGV[16]))
local out = {now}
if #ids == 0 then
  return out
end
local hs = redis.call('HMGET', kmeta, unpack(ids))
local first = head(kdue)
local wake = false
local W = {due = {}, dead = {}, meta = {}}
local bad = {}
for i = 1, #ids do
  local id, h = ids[i], hs[i]
  if h then
    local r = parse(h)
    if r then
      local state, at = settle(W, id, h, r, now, p, i)
      if state == 1 and (first == nil or at < first) then
        first = at
        wake = true
      end
      push(out, id, r.inc)
      push(out, r.gen, r.attempt)
      push(out, state, at)
    else
      bad[#bad + 1] = id
      push(W.dead, int(now), id)
    end
  end
end
redis.call('ZREMRANGEBYRANK', kinflight, 0, #ids - 1)
apply(W, kdue, kdead, kmeta)
if wake then
  publish_wake(ARGV[6], ARGV[7])
end
if #bad > 0 then
  out[#out + 1] = ''
  for _, id in ipairs(bad) do
    out[#out + 1] = id
  end
end
return out
