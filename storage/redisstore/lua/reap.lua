-- reap.lua: take expired leases back: at most limit tasks whose lease
-- deadline <= now go back to due after their backoff, or to dead when their
-- attempts are used up. Atomic, so any number of replicas may reap at once.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] meta HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] retry_after ms ('' = backoff), ARGV[4] max attempts (0 = no limit),
-- ARGV[5] backoff initial ms, ARGV[6] backoff max ms, ARGV[7] multiplier,
-- ARGV[8] jitter fraction, ARGV[9] jitter seed in [0, 1), ARGV[10] reason
-- ARGV[11] limit (at most 1,000)
-- ARGV[12] expired-by ms ('' = now): take only leases whose deadline is at
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
local now = now_ms()
local p = retry_policy(3)
local upto = now
if ARGV[12] and ARGV[12] ~= '' then
  upto = math.min(now, tonumber(ARGV[12]))
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(upto), 'LIMIT', 0,
  tonumber(ARGV[11]))
local out = {now}
if #ids == 0 then
  return out
end
local hs = redis.call('HMGET', KEYS[4], unpack(ids))
local first = head(KEYS[1])
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
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, #ids - 1)
apply(W, KEYS[1], KEYS[3], KEYS[4])
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
if #bad > 0 then
  out[#out + 1] = ''
  for _, id in ipairs(bad) do
    out[#out + 1] = id
  end
end
return out
