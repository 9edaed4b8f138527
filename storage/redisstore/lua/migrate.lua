-- migrate.lua: convert records of the one-value layout (before the
-- header/payload split) into a header and, for a payload too large to be
-- inline (see lib.lua), a body entry.
--
-- KEYS[1] legacy task HASH, KEYS[2] meta HASH, KEYS[3] body HASH
-- ARGV[1 ..] per record 4 values: id, the legacy value as read, the new
--            header, the body entry ('' = none: no payload, or inline;
--            converted by the caller)
--
-- A record is converted only if its legacy value is still the one the
-- caller read, and never over a header the new layout already holds; either
-- way the legacy value read is deleted.
--
-- Returns the number of records converted.
local moved = 0
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[1], id) == ARGV[i + 1] then
    if redis.call('HSETNX', KEYS[2], id, ARGV[i + 2]) == 1 then
      if ARGV[i + 3] ~= '' then
        redis.call('HSET', KEYS[3], id, ARGV[i + 3])
      end
      moved = moved + 1
    end
    redis.call('HDEL', KEYS[1], id)
  end
end
return moved
