-- ack.lua: finish deliveries: delete each task that is still the named
-- delivery in flight.
--
-- KEYS[1] inflight ZSET, KEYS[2] task HASH
-- ARGV[1] n (at most 1,000); then per token i (from 0), at ARGV[2+4i ..]:
--         id, generation, attempt, task create time (Unix ms; a token whose
--         create time is not the task's, or is 0, answers NOT_FOUND)
--
-- Returns one status per token: 1 OK (deleted), 2 STALE (the task has a
-- newer generation or attempt; unchanged), 3 NOT_FOUND (gone, or not in
-- flight, or acked by an earlier token of this call; unchanged).
local n = tonumber(ARGV[1])
local out = {}
if n == 0 then
  return out
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[2 + 4 * i]
end
local recs = redis.call('HMGET', KEYS[2], unpack(ids))
local leased = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local gone, done = {}, {}
for i = 0, n - 1 do
  local j = 2 + 4 * i
  local id = ids[i + 1]
  local st = 3
  if not done[id] then
    st = token_check(recs[i + 1], leased[i + 1], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]),
      tonumber(ARGV[j + 3]))
    if st == 1 then
      done[id] = true
      gone[#gone + 1] = id
    end
  end
  out[#out + 1] = st
end
flush('ZREM', KEYS[1], gone)
flush('HDEL', KEYS[2], gone)
return out
