-- clearacked.lua: drop ack markers once MySQL has deleted the acked
-- version (durable mode).
--
-- KEYS[1] acked HASH
-- ARGV[1 ..] pairs of id, marker ('inc,gen,dseq': what an ack marker
--            starts with, see ack.lua); a marker that changed since (a
--            later ack of a re-created task) is kept
--
-- Returns the number of markers dropped.
if #ARGV == 0 then
  return 0
end
local ids = {}
for i = 1, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local ms = redis.call('HMGET', KEYS[1], unpack(ids))
local gone = {}
for k = 1, #ids do
  if mark_is(ms[k], ARGV[2 * k]) then
    gone[#gone + 1] = ids[k]
  end
end
flush('HDEL', KEYS[1], gone)
return #gone
