-- duekinds.lua: count the due tasks of one namespace per kind, over a
-- bounded window of the due head.
--
-- KEYS[1] due ZSET, KEYS[2] meta HASH
-- ARGV[1] window: how many due tasks (in due order) to look at, at most 1,000
--
-- Returns {1 if more tasks were due than the window held else 0, then per
-- kind: kind, count}. Members without a readable header are not counted.
local now = now_ms()
local window = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(now), 'LIMIT', 0, window + 1)
local more = 0
if #ids > window then
  more = 1
  ids[#ids] = nil
end
local out = {more}
if #ids == 0 then
  return out
end
local hs = redis.call('HMGET', KEYS[2], unpack(ids))
local counts, order = {}, {}
for k = 1, #ids do
  local r = parse(hs[k])
  if r then
    local kind = string.sub(hs[k], r.b, r.b + r.kl - 1)
    if not counts[kind] then
      counts[kind] = 0
      order[#order + 1] = kind
    end
    counts[kind] = counts[kind] + 1
  end
end
for _, kind in ipairs(order) do
  push(out, kind, counts[kind])
end
return out
