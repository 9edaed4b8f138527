-- generations.lua: the generation the index holds per task.
--
-- KEYS[1] task HASH
-- ARGV[1 ..] task ids (at most 1,000)
--
-- Returns one generation per id, 0 when the task is absent.
local out = {}
if #ARGV == 0 then
  return out
end
local recs = redis.call('HMGET', KEYS[1], unpack(ARGV))
for i = 1, #ARGV do
  if recs[i] then
    out[i] = gen_created(recs[i])
  else
    out[i] = 0
  end
end
return out
