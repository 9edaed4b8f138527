-- purge.lua: delete dead tasks.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] dead ZSET, KEYS[4] meta HASH, KEYS[5] body HASH
-- ARGV[6] '1' = purge the oldest dead tasks, up to ARGV[7]; '0' = the ids in
--         ARGV[8 ..] (at most 1,000; ids that are not dead are skipped)
-- ARGV[7] limit (with ARGV[6] = '1', at most 1,000)
--
-- Returns 3 values per task deleted: id, incarnation, generation (0, 0 for
-- a header that is missing or malformed).
local kdead, kmeta, kbody = KEYS[3], KEYS[4], KEYS[5]
local ids = {}
if ARGV[6] == '1' then
  ids = redis.call('ZRANGE', kdead, 0, tonumber(ARGV[7]) - 1)
elseif #ARGV >= 8 then
  local given, seen = {}, {}
  for i = 8, #ARGV do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      given[#given + 1] = ARGV[i]
    end
  end
  local dead = redis.call('ZMSCORE', kdead, unpack(given))
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
local hs = redis.call('HMGET', kmeta, unpack(ids))
for i = 1, #ids do
  local inc, gen
  if hs[i] then
    inc, gen = version(hs[i])
  end
  push(out, ids[i], inc or 0)
  out[#out + 1] = gen or 0
end
flush('ZREM', kdead, ids)
flush('HDEL', kmeta, ids)
flush('HDEL', kbody, ids)
return out
