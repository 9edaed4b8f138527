-- extend.lua: move the lease of deliveries still in flight to now + by, never
-- earlier than it already is (ZADD GT): a replica's renewal computed from a
-- deadline the subscriber has since extended must not cut that extension back.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] inflight ZSET, KEYS[4] meta HASH
-- ARGV[6] by ms
-- ARGV[7] n (at most 1,000); then per token i (from 0), at ARGV[8+5i ..]:
--         id, incarnation, generation, attempt, delivery sequence
--         (hexadecimal, as headers hold them: 0 is '')
--
-- Returns {new lease deadline ms, then one status per token: 1 OK, 2 STALE,
-- 3 NOT_FOUND (unchanged)}.
local kinflight, kmeta = KEYS[3], KEYS[4]
local now = now_ms()
local deadline = now + tonumber(ARGV[6])
local n = tonumber(ARGV[7])
local out = {deadline}
if n == 0 then
  return out
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[8 + 5 * i]
end
local recs = redis.call('HMGET', kmeta, unpack(ids))
local leased = redis.call('ZMSCORE', kinflight, unpack(ids))
local d = int(deadline)
local zargs = {}
for i = 0, n - 1 do
  local j = 8 + 5 * i
  local st = token_check(recs[i + 1], leased[i + 1], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4])
  if st == 1 then
    push(zargs, d, ids[i + 1])
  end
  out[#out + 1] = st
end
if #zargs > 0 then
  redis.call('ZADD', kinflight, 'GT', unpack(zargs))
end
return out
