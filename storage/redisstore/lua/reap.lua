-- reap.lua: take expired leases back: at most limit tasks whose lease
-- deadline <= now go back to due after their backoff, or to dead when their
-- attempts are used up. Atomic, so any number of replicas may reap at once.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] task HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] retry_after ms ('' = backoff), ARGV[4] max attempts (0 = no limit),
-- ARGV[5] backoff initial ms, ARGV[6] backoff max ms, ARGV[7] multiplier,
-- ARGV[8] jitter fraction, ARGV[9] jitter seed in [0, 1), ARGV[10] reason
-- ARGV[11] limit (at most 1,000)
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns {now ms, then 5 values per moved task: id, generation, attempt,
-- state (1 scheduled, 3 dead), time (due ms or death ms)}.
local now = now_ms()
local p = retry_policy(3)
local K = {due = KEYS[1], dead = KEYS[3], task = KEYS[4]}
local items = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now), 'LIMIT', 0,
  tonumber(ARGV[11]))
local out = {now}
if #items == 0 then
  return out
end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, #items - 1)
local first = head(KEYS[1])
local wake = false
for i = 1, #items do
  local id = items[i]
  local rec = redis.call('HGET', KEYS[4], id)
  if rec then
    local r = parse(rec)
    local state, at = settle(K, id, rec, r, now, p, i)
    if state == 1 and (first == nil or at < first) then
      first = at
      wake = true
    end
    out[#out + 1] = id
    out[#out + 1] = r.gen
    out[#out + 1] = r.attempt
    out[#out + 1] = state
    out[#out + 1] = at
  end
end
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return out
