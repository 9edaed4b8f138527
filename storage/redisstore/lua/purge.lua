-- purge.lua: delete dead tasks.
--
-- KEYS[1] dead ZSET, KEYS[2] task HASH
-- ARGV[1] '1' = purge the oldest dead tasks, up to ARGV[2]; '0' = the ids in
--         ARGV[3 ..] (at most 1,000; ids that are not dead are skipped)
-- ARGV[2] limit (with ARGV[1] = '1', at most 1,000)
--
-- Returns the ids deleted.
local ids = {}
if ARGV[1] == '1' then
  ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
elseif #ARGV >= 3 then
  local given, seen = {}, {}
  for i = 3, #ARGV do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      given[#given + 1] = ARGV[i]
    end
  end
  local dead = redis.call('ZMSCORE', KEYS[1], unpack(given))
  for i = 1, #given do
    if dead[i] then
      ids[#ids + 1] = given[i]
    end
  end
end
flush('ZREM', KEYS[1], ids)
flush('HDEL', KEYS[2], ids)
return ids
