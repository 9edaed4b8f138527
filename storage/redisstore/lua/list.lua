-- list.lua: one page of the tasks of one state, in score order.
--
-- KEYS[1] the state's ZSET (due, inflight or dead), KEYS[2] meta HASH,
-- KEYS[3] body HASH
-- ARGV[1] page size (at most 1,000)
-- ARGV[2] cursor score ('' = from the start)
-- ARGV[3] cursor id: the page starts after the member (score, id)
--
-- When the cursor member is still at its score the page starts right after
-- it; otherwise after the last member with a lower score, skipping members
-- at the cursor score that sort before or at the cursor id.
--
-- Returns {more, last score, last id, then 4 values per task};
-- more is 1 when a full page was read (there may be more), and last
-- score/id are the cursor of the next page. Per task: id, score, header,
-- payload.
local limit = tonumber(ARGV[1])
local start = 0
local cs, cid = nil, ARGV[3]
if ARGV[2] ~= '' then
  cs = tonumber(ARGV[2])
  local cur = redis.call('ZSCORE', KEYS[1], cid)
  if cur and tonumber(cur) == cs then
    start = redis.call('ZRANK', KEYS[1], cid) + 1
    cs = nil
  else
    start = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[2])
  end
end
local items = redis.call('ZRANGE', KEYS[1], start, start + limit - 1, 'WITHSCORES')
local got = #items / 2
-- byte order, as ZSET members sort (Lua's < follows the server's locale)
local function le(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a <= #b
end
local out = {0, '', ''}
if got == limit then
  out[1] = 1
  out[2] = items[#items]
  out[3] = items[#items - 1]
end
local ids, scores = {}, {}
for i = 1, #items, 2 do
  local id, score = items[i], items[i + 1]
  if not (cs and tonumber(score) == cs and le(id, cid)) then
    ids[#ids + 1] = id
    scores[#scores + 1] = score
  end
end
if #ids > 0 then
  local hs = redis.call('HMGET', KEYS[2], unpack(ids))
  local bs = redis.call('HMGET', KEYS[3], unpack(ids))
  for i = 1, #ids do
    if hs[i] then
      push(out, ids[i], scores[i])
      push(out, hs[i], bs[i] or '')
    end
  end
end
return out
