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
local out = {now}
if window == 0 then
  local r = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #r do
    out[#out + 1] = r[i]
  end
  return out
end
local want = {}
for i = 3, #ARGV do
  want[ARGV[i]] = true
end
local scan = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, window)
if #scan == 0 then
  return out
end
local sids = {}
for i = 1, #scan, 2 do
  sids[#sids + 1] = scan[i]
end
local shs = redis.call('HMGET', KEYS[2], unpack(sids))
for k = 1, #sids do
  local r = parse(shs[k])
  if r and want[string.sub(shs[k], r.b, r.b + r.kl - 1)] then
    out[#out + 1] = sids[k]
    out[#out + 1] = scan[2 * k]
    if (#out - 1) / 2 >= limit then
      break
    end
  end
end
return out
