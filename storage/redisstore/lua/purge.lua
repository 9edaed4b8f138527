-- purge.lua: delete dead tasks.
--
-- KEYS[1] dead ZSET, KEYS[2] task HASH
-- ARGV[1] '1' = purge the oldest dead tasks, up to ARGV[2]; '0' = the ids in
--         ARGV[3 ..] (at most 1,000; ids that are not dead are skipped)
-- ARGV[2] limit (with ARGV[1] = '1', at most 1,000)
--
-- Returns the ids deleted.
local ids
if ARGV[1] == '1' then
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
else
  ids = {}
  for i = 3, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
end
local out = {}
for i = 1, #ids do
  if redis.call('ZREM', KEYS[1], ids[i]) == 1 then
    redis.call('HDEL', KEYS[2], ids[i])
    out[#out + 1] = ids[i]
  end
end
return out
