-- generations.lua: the generation the index holds per task.
--
-- KEYS[1] task HASH
-- ARGV[1 ..] task ids (at most 1,000)
--
-- Returns one generation per id, 0 when the task is absent.
local out = {}
for i = 1, #ARGV do
  local rec = redis.call('HGET', KEYS[1], ARGV[i])
  if rec then
    out[i] = dec(string.match(rec, '^([^,]*),'))
  else
    out[i] = 0
  end
end
return out
