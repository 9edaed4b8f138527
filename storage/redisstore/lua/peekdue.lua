-- peekdue.lua: the head of one shard's due tasks, read only (a sharded
-- Pop allocates its limit across shards from these heads; shards.go).
--
-- KEYS[1] due ZSET, KEYS[2] meta HASH
-- ARGV[1] most members to return
-- ARGV[2] kind scan window: 0 = tasks of any kind; n > 0 = only tasks whose
--         kind is one of ARGV[3..], among the first n due (as pop.lua)
-- ARGV[3..] kinds (with a window)
--
-- Returns {now ms, id, due ms, id, due ms, ...}: the first ARGV[1] such
-- members due by the Redis clock, in due order (ties by id).
local now = now_ms()
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local want = {}
for i = 3, #ARGV do
  want[ARGV[i]] = true
end
local out = {now}
for _, v in ipairs(due_head(KEYS[1], KEYS[2], now, limit, window, want)) do
  out[#out + 1] = v
end
return out
