-- purge.lua: delete dead tasks.
--
-- KEYS[1] dead ZSET, KEYS[2] meta HASH, KEYS[3] body HASH
-- ARGV[1] '1' = purge the oldest dead tasks, up to ARGV[2]; '0' = the ids in
--         ARGV[3 ..] (at most 1,000; ids that are not dead are skipped)
-- ARGV[2] limit (with ARGV[1] = '1', at most 1,000)
--
-- Returns 3 values per task deleted: id, incarnation, generation (0, 0 for
-- a header that is missing or malformed).
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
local out = {}
if #ids == 0 then
  return out
end
local hs = redis.call('HMGET', KEYS[2], unpack(ids))
for i = 1, #ids do
  local inc, gen
  if hs[i] then
    inc, gen = version(hs[i])
  end
  push(out, ids[i], inc or 0)
  out[#out + 1] = gen or 0
end
flush('ZREM', KEYS[1], ids)
flush('HDEL', KEYS[2], ids)
flush('HDEL', KEYS[3], ids)
return out
