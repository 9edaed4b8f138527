-- nack.lua: give deliveries back: each task that is still the named delivery
-- in flight goes back to due after its retry delay, or to dead when its
-- attempts are used up; the reason becomes its last error.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] meta HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] retry_after ms ('' = backoff), ARGV[4] max attempts (0 = no limit),
-- ARGV[5] backoff initial ms, ARGV[6] backoff max ms, ARGV[7] multiplier,
-- ARGV[8] jitter fraction, ARGV[9] jitter seed in [0, 1), ARGV[10] reason
-- ARGV[11] '1' when the deliveries were popped but never sent: each gives
--          back the attempt its pop counted, else '0'
-- ARGV[12] n (at most 1,000); then per token i (from 0), at ARGV[13+4i ..]:
--          id, incarnation, generation, delivery sequence (hexadecimal, as
--          headers hold them: 0 is '')
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns {now ms, then 3 values per token: status, state, time}: status 1
local now = now_ms()
local uncount = ARGV[11] == '1'
local n = tonumber(ARGV[12])
local out = {now}
if n == 0 then
  return out
end
local p = retry_policy(3)
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[13 + 4 * i]
end
local recs = redis.call('HMGET', KEYS[4], unpack(ids))
local leased = redis.call('ZMSCORE', KEYS[2], unpack(ids))
local first = head(KEYS[1])
local wake = false
local W = {due = {}, dead = {}, meta = {}}
local back, done = {}, {}
for i = 0, n - 1 do
  local j = 13 + 4 * i
  local id = ids[i + 1]
  local st, state, at = 3, 0, 0
  if not done[id] then
    st = token_check(recs[i + 1], leased[i + 1], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3])
    local r
    if st == 1 then
      r = parse(recs[i + 1])
      if not r then
        st = 3
      end
    end
    if st == 1 then
      done[id] = true
      back[#back + 1] = id
      if uncount and r.attempt > 0 then
        r.attempt = r.attempt - 1
      end
      state, at = settle(W, id, recs[i + 1], r, now, p, i)
      if state == 1 and (first == nil or at < first) then
        first = at
        wake = true
      end
    end
  end
  out[#out + 1] = st
  out[#out + 1] = state
  out[#out + 1] = at
end
flush('ZREM', KEYS[2], back)
apply(W, KEYS[1], KEYS[3], KEYS[4])
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return out
