-- nack.lua: give deliveries back: each task that is still the named delivery
-- in flight goes back to due after its retry delay, or to dead when its
-- attempts are used up; the reason becomes its last error.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET, KEYS[6] meta HASH
-- ARGV[6] wake channel, ARGV[7] namespace
-- ARGV[8] retry_after ms ('' = backoff), ARGV[9] max attempts (0 = no limit),
-- ARGV[10] backoff initial ms, ARGV[11] backoff max ms, ARGV[12] multiplier,
-- ARGV[13] jitter fraction, ARGV[14] jitter seed in [0, 1), ARGV[15] reason
-- ARGV[16] '1' when the deliveries were popped but never sent: each gives
--          back the attempt its pop counted, else '0'
-- ARGV[17] n (at most 1,000); then per token i (from 0), at ARGV[18+5i ..]:
--          id, incarnation, generation, attempt, delivery sequence
--          (hexadecimal, as headers hold them: 0 is '')
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns {now ms, then 3 values per token: status, state, time}: status 1
local kdue, kinflight, kdead, kmeta = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now = now_ms()
local uncount = ARGV[16] == '1'
local n = tonumber(ARGV[17])
local out = {now}
if n == 0 then
  return out
end
local p = retry_policy(ARGV, 8)
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[18 + 5 * i]
end
local recs = redis.call('HMGET', kmeta, unpack(ids))
local leased = redis.call('ZMSCORE', kinflight, unpack(ids))
local first = head(kdue)
local wake = false
local W = {due = {}, dead = {}, meta = {}}
local back, done = {}, {}
for i = 0, n - 1 do
  local j = 18 + 5 * i
  local id = ids[i + 1]
  local st, state, at = 3, 0, 0
  if not done[id] then
    st = token_check(recs[i + 1], leased[i + 1], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4])
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
flush('ZREM', kinflight, back)
apply(W, kdue, kdead, kmeta)
if wake then
  redis.call('PUBLISH', ARGV[6], ARGV[7])
end
return out
