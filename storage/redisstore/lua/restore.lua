-- restore.lua: re-index tasks from the durable authority. Each task is
-- written unless the index already holds the same or a newer generation.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET, KEYS[4] task HASH
-- ARGV[1] wake channel, ARGV[2] namespace
-- ARGV[3] n; then per task i (from 0), at ARGV[4+5i ..]: id, generation,
--         state (1 = due, 3 = dead), score (due ms or death ms), record
--
-- Publishes the namespace on the wake channel when a task became earlier
-- than the head of due.
--
-- Returns the number of tasks written.
local n = tonumber(ARGV[3])
local first = head(KEYS[1])
local wake = false
local written = 0
for i = 0, n - 1 do
  local j = 4 + 5 * i
  local id = ARGV[j]
  local gen = tonumber(ARGV[j + 1])
  local old = redis.call('HGET', KEYS[4], id)
  if not old or parse(old).gen < gen then
    if old then
      redis.call('ZREM', KEYS[1], id)
      redis.call('ZREM', KEYS[2], id)
      redis.call('ZREM', KEYS[3], id)
    end
    local score = tonumber(ARGV[j + 3])
    if ARGV[j + 2] == '3' then
      redis.call('ZADD', KEYS[3], ARGV[j + 3], id)
    else
      redis.call('ZADD', KEYS[1], ARGV[j + 3], id)
      if first == nil or score < first then
        first = score
        wake = true
      end
    end
    redis.call('HSET', KEYS[4], id, ARGV[j + 4])
    written = written + 1
  end
end
if wake then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return written
