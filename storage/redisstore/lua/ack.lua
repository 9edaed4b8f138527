-- ack.lua: finish deliveries: delete each task that is still the named
-- delivery in flight.
--
-- KEYS[1] inflight ZSET, KEYS[2] task HASH
-- ARGV[1] n; then per token i (from 0), at ARGV[2+3i ..]: id, generation,
--         attempt
--
-- Returns one status per token: 1 OK (deleted), 2 STALE (the task has a
-- newer generation or attempt; unchanged), 3 NOT_FOUND (gone, or not in
-- flight; unchanged).
local n = tonumber(ARGV[1])
local out = {}
local gone = {}
for i = 0, n - 1 do
  local j = 2 + 3 * i
  local id = ARGV[j]
  local g, a = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local st = 3
  local rec = redis.call('HGET', KEYS[2], id)
  if rec then
    local r = parse(rec)
    if r.gen == g and r.attempt == a then
      if redis.call('ZREM', KEYS[1], id) == 1 then
        st = 1
        gone[#gone + 1] = id
      end
    elseif r.gen > g or (r.gen == g and r.attempt > a) then
      st = 2
    end
  end
  out[#out + 1] = st
end
if #gone > 0 then
  redis.call('HDEL', KEYS[2], unpack(gone))
end
return out
