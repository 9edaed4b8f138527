-- list.lua: one page of the tasks of one state, in score order.
--
-- KEYS[1] the state's ZSET (due, inflight or dead), KEYS[2] meta HASH,
-- KEYS[3] body HASH
-- ARGV[1] page size (at most 1,000)
-- ARGV[2] cursor score ('' = from the start)
-- ARGV[3] cursor id: the page starts after the member (score, id)
-- ARGV[4] byte budget of the page (0 = none)
-- ARGV[5] '1' to return payloads, '' to leave them out (never read)
-- ARGV[6] bytes each task counts beyond its id, header and payload (the
--         Go side's storage.TaskWireOverhead, the namespace and a trace
--         context)
--
-- When the cursor member is still at its score the page starts right after
-- it; otherwise after the last member with a lower score, skipping members
-- at the cursor score that sort before or at the cursor id.
--
-- A page ends after limit members or before the task that would take it
-- past the byte budget, whichever comes first; its first task is always
-- returned, so paging goes on however large one task is. A task counts
-- its id, its header, its payload (only when payloads are returned: the
-- lengths of payloads stored apart come from HSTRLEN, so a large payload
-- left out is never copied; an inline one is part of the header, and is
-- not counted when left out) and ARGV[6]; the Go side cuts again by the
-- exact size.
--
-- Returns {more, last score, last id, then 4 values per task};
-- more is 1 when a full page was read or the budget cut it (there may be
-- more), and last score/id are the cursor of the next page. Per task: id,
-- score, header, payload of the split form ('' when left out or inline).
local limit = tonumber(ARGV[1])
local budget = tonumber(ARGV[4])
local payloads = ARGV[5] == '1'
local fixed = tonumber(ARGV[6])
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
  local keep, used = {}, 0
  for i = 1, #ids do
    if hs[i] then
      local size = fixed + #ids[i] + #hs[i]
      if payloads then
        size = size + redis.call('HSTRLEN', KEYS[3], ids[i])
      else
        -- an inline payload is left out too (by the Go side)
        local r = parse(hs[i])
        if r and r.el then
          size = size - (#hs[i] - (r.b + r.kl + r.el - 1))
        end
      end
      if budget > 0 and #keep > 0 and used + size > budget then
        local last = keep[#keep]
        out[1], out[2], out[3] = 1, scores[last], ids[last]
        break
      end
      used = used + size
      keep[#keep + 1] = i
    end
  end
  local bs = {}
  if payloads and #keep > 0 then
    local kids = {}
    for j = 1, #keep do
      kids[j] = ids[keep[j]]
    end
    bs = redis.call('HMGET', KEYS[3], unpack(kids))
  end
  for j = 1, #keep do
    local i = keep[j]
    push(out, ids[i], scores[i])
    push(out, hs[i], bs[j] or '')
  end
end
return out
