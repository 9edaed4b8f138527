-- extend.lua: set the lease of deliveries still in flight to now + by.
--
-- KEYS[1] inflight ZSET, KEYS[2] task HASH
-- ARGV[1] by ms
-- ARGV[2] n; then per token i (from 0), at ARGV[3+3i ..]: id, generation,
--         attempt
--
-- Returns {new lease deadline ms, then one status per token: 1 OK, 2 STALE,
-- 3 NOT_FOUND (unchanged)}.
local now = now_ms()
local deadline = now + tonumber(ARGV[1])
local d = int(deadline)
local n = tonumber(ARGV[2])
local out = {deadline}
for i = 0, n - 1 do
  local j = 3 + 3 * i
  local id = ARGV[j]
  local g, a = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local st = 3
  local rec = redis.call('HGET', KEYS[2], id)
  if rec then
    local r = parse(rec)
    if r.gen == g and r.attempt == a then
      if redis.call('ZSCORE', KEYS[1], id) then
        redis.call('ZADD', KEYS[1], d, id)
        st = 1
      end
    elseif r.gen > g or (r.gen == g and r.attempt > a) then
      st = 2
    end
  end
  out[#out + 1] = st
end
return out
