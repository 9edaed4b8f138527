-- removetasks.lua: delete many tasks of one namespace: the ids given, or
-- one bounded page of a walk over one state's ZSET that deletes the tasks
-- a filter matches.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET,
-- KEYS[6] meta HASH, KEYS[7] body HASH
-- ARGV[6] mode: 'ids' or 'walk'
-- ids:  ARGV[7..] task ids (at most 1,000)
--       Returns {removed, state of ARGV[7], state of ARGV[8], ...}: how
--       many of them existed and were deleted, then per id the state it was
--       in (1 scheduled, 2 delivered, 3 dead), or 0 when there was no such
--       task (or it repeats an id already deleted by this call).
-- walk: ARGV[7] dry: '1' = delete nothing, only report the matches
--       ARGV[8] the state to walk: 1 scheduled, 2 delivered, 3 dead
--       ARGV[9] cursor score ('' = from the start), ARGV[10] cursor id: the
--               page starts after the member (score, id), deleted or not
--       ARGV[11] how many members to examine (at most 1,000)
--       ARGV[12] kind the tasks must have ('' = any)
--       ARGV[13] prefix their ids must have ('' = any)
--       Returns {more, last score, last id, examined, then 3 values per
--       match: id, incarnation, generation}; more is 1 when a full page was
--       examined (there may be more), last score/id are the cursor of the
--       next page, examined is how many members the page examined.
local kmeta, kbody = KEYS[6], KEYS[7]
if ARGV[6] == 'ids' then
  local out = {0}
  for i = 7, #ARGV do
    local id = ARGV[i]
    local st = 0
    if redis.call('ZREM', KEYS[3], id) == 1 then
      st = 1
    elseif redis.call('ZREM', KEYS[4], id) == 1 then
      st = 2
    elseif redis.call('ZREM', KEYS[5], id) == 1 then
      st = 3
    end
    redis.call('HDEL', kbody, id)
    if redis.call('HDEL', kmeta, id) == 1 and st == 0 then
      -- a header outside every set (should not happen): as remove.lua
      st = 1
    end
    if st ~= 0 then
      out[1] = out[1] + 1
    end
    out[i - 5] = st
  end
  return out
end

local dry = ARGV[7] == '1'
local set = KEYS[2 + tonumber(ARGV[8])] -- the state's ZSET: KEYS[3..5]
local cscore, cid = ARGV[9], ARGV[10]
local limit = tonumber(ARGV[11])
local kind, prefix = ARGV[12], ARGV[13]

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

local start = 0
if cscore ~= '' then
  local cur = redis.call('ZSCORE', set, cid)
  if cur and tonumber(cur) == tonumber(cscore) then
    start = redis.call('ZRANK', set, cid) + 1
  else
    -- the cursor member is gone (deleted by the previous page) or moved:
    -- start at the first member at the cursor score whose id sorts after
    -- it (a binary search over ranks: the members of one score sort by id)
    local lo = redis.call('ZCOUNT', set, '-inf', '(' .. cscore)
    local hi = redis.call('ZCOUNT', set, '-inf', cscore)
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local m = redis.call('ZRANGE', set, mid, mid)[1]
      if m and le(m, cid) then
        lo = mid + 1
      else
        hi = mid
      end
    end
    start = lo
  end
end
local items = redis.call('ZRANGE', set, start, start + limit - 1, 'WITHSCORES')
local out = {0, '', '', #items / 2}
if #items / 2 == limit then
  out[1] = 1
  out[2] = items[#items]
  out[3] = items[#items - 1]
end
if #items == 0 then
  return out
end
local ids = {}
for i = 1, #items, 2 do
  ids[#ids + 1] = items[i]
end
local hs = redis.call('HMGET', kmeta, unpack(ids))
local del = {}
for i, id in ipairs(ids) do
  local h = hs[i]
  local ok = prefix == '' or string.sub(id, 1, #prefix) == prefix
  local r = h and parse(h)
  if ok and kind ~= '' then
    ok = r and string.sub(h, r.b, r.b + r.kl - 1) == kind
  end
  if ok then
    if r then
      push(out, id, r.inc)
      out[#out + 1] = r.gen
    else
      push(out, id, 0)
      out[#out + 1] = 0
    end
    del[#del + 1] = id
  end
end
if not dry then
  flush('ZREM', set, del)
  flush('HDEL', kmeta, del)
  flush('HDEL', kbody, del)
end
return out
