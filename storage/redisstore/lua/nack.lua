-- nack.lua: give deliveries back: each task that is still the named delivery
-- in flight goes back to due after its retry delay, or to dead when its
-- attempts are used up; the reason becomes its last error.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] task HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] retry_after ms ('' = backoff), ARGV[4] max attempts (0 = no limit),
-- ARGV[5] backoff initial ms, ARGV[6] backoff max ms, ARGV[7] multiplier,
-- ARGV[8] jitter fraction, ARGV[9] jitter seed in [0, 1), ARGV[10] reason
-- ARGV[11] n; then per token i (from 0), at ARGV[12+3i ..]: id, generation,
--          attempt
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns {now ms, then 3 values per token: status, state, time}: status 1
-- OK, 2 STALE, 3 NOT_FOUND (unchanged); when OK, state 1 (scheduled, time =
-- due ms) or 3 (dead, time = death ms), else 0 and 0.
local now = now_ms()
local p = retry_policy(3)
local K = {due = KEYS[1], dead = KEYS[3], task = KEYS[4]}
local first = head(KEYS[1])
local wake = false
local n = tonumber(ARGV[11])
local out = {now}
for i = 0, n - 1 do
  local j = 12 + 3 * i
  local id = ARGV[j]
  local g, a = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local st, state, at = 3, 0, 0
  local rec = redis.call('HGET', KEYS[4], id)
  if rec then
    local r = parse(rec)
    if r.gen == g and r.attempt == a then
      if redis.call('ZREM', KEYS[2], id) == 1 then
        st = 1
        state, at = settle(K, id, rec, r, now, p, i)
        if state == 1 and (first == nil or at < first) then
          first = at
          wake = true
        end
      end
    elseif r.gen > g or (r.gen == g and r.attempt > a) then
      st = 2
    end
  end
  out[#out + 1] = st
  out[#out + 1] = state
  out[#out + 1] = at
end
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return out
