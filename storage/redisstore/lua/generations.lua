-- generations.lua: the version the index holds per task.
--
-- KEYS[1] meta HASH, KEYS[2] acked HASH (durable mode's ack markers)
-- ARGV[1 ..] task ids (at most 1,000)
--
-- Returns 3 values per id: incarnation, generation (0, 0 when the task is
-- absent or its header malformed), and its ack marker ('inc,gen,dseq,attempt'
-- of the acked delivery, see ack.lua; '' if none).
local out = {}
if #ARGV == 0 then
  return out
end
local hs = redis.call('HMGET', KEYS[1], unpack(ARGV))
local ms = redis.call('HMGET', KEYS[2], unpack(ARGV))
for i = 1, #ARGV do
  local inc, gen
  if hs[i] then
    inc, gen = version(hs[i])
  end
  push(out, inc or 0, gen or 0)
  out[#out + 1] = ms[i] or ''
end
return out
