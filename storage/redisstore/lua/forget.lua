-- forget.lua: remove tasks from the index only if it still holds the
-- version named (durable mode's reverse reconcile: the index holds a task
-- MySQL does not have, e.g. after a snapshot was restored or an index remove
-- failed).
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] meta HASH, KEYS[5] body HASH
-- ARGV[1] n (at most 1,000); then per task i (from 0), at ARGV[2+3i ..]: id,
--         incarnation, generation
--
-- Returns the number of tasks removed.
local n = tonumber(ARGV[1])
if n == 0 then
  return 0
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[2 + 3 * i]
end
local hs = redis.call('HMGET', KEYS[4], unpack(ids))
local gone, seen = {}, {}
for i = 0, n - 1 do
  local id = ids[i + 1]
  if hs[i + 1] and not seen[id] then
    local inc, gen = version(hs[i + 1])
    if inc == tonumber(ARGV[3 + 3 * i]) and gen == tonumber(ARGV[4 + 3 * i]) then
      seen[id] = true
      gone[#gone + 1] = id
    end
  end
end
flush('ZREM', KEYS[1], gone)
flush('ZREM', KEYS[2], gone)
flush('ZREM', KEYS[3], gone)
flush('HDEL', KEYS[4], gone)
flush('HDEL', KEYS[5], gone)
return #gone
