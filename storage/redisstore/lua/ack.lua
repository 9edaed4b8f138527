-- ack.lua: finish deliveries: delete each task that is still the named
-- delivery in flight.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] inflight ZSET, KEYS[4] meta HASH, KEYS[5] body HASH,
-- KEYS[6] acked HASH (durable mode's ack markers)
-- ARGV[6] '1' = durable mode: leave an ack marker per acked task (id ->
--         'inc,gen,dseq,attempt': the token's version and delivery and the
--         delivery's attempt from the header, decimal) until MySQL has
--         deleted that version, and answer OK again for a token whose
--         'inc,gen,dseq' matches its task's marker (a retried ack); '0' =
--         no markers. The attempt is there for whoever settles the ack in
--         MySQL (the reconciler, if the ack's own write-through never
--         runs): pops are not written to MySQL, so only the index knows it.
-- ARGV[7] n (at most 1,000); then per token i (from 0), at ARGV[8+5i ..]:
--         id, incarnation, generation, attempt, delivery sequence
--         (hexadecimal, as headers hold them: 0 is '')
--
-- Returns one status per token: 1 OK (deleted, or acked before and the
-- marker still says so), 2 STALE (the task has a newer generation or
-- delivery; unchanged), 3 NOT_FOUND (gone, another incarnation, not in
-- flight, or acked by an earlier token of this call; unchanged).
local kinflight, kmeta, kbody, kacked = KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local marks = ARGV[6] == '1'
local n = tonumber(ARGV[7])
local out = {}
if n == 0 then
  return out
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[8 + 5 * i]
end
local hs = redis.call('HMGET', kmeta, unpack(ids))
local leased = redis.call('ZMSCORE', kinflight, unpack(ids))
local prior = {}
if marks then
  prior = redis.call('HMGET', kacked, unpack(ids))
end
-- markOf is a token's delivery key as markers hold it (decimal:
-- durable.go, markOf); built only for a token that needs it, so a stale
-- or unknown token costs no string.
local function markOf(j)
  return int(dec(ARGV[j + 1]) or 0) .. ',' .. int(dec(ARGV[j + 2]) or 0) .. ',' .. int(dec(ARGV[j + 4]) or 0)
end
-- FEW is how many acked tasks are checked for a body entry one by one.
local FEW = 8
local gone, done, mset, pos = {}, {}, {}, {}
for i = 0, n - 1 do
  local j = 8 + 5 * i
  local id = ids[i + 1]
  local st = 3
  if not done[id] then
    st = token_check(hs[i + 1], leased[i + 1], ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4])
    if st == 1 then
      done[id] = true
      gone[#gone + 1] = id
      pos[id] = i + 1
      if marks then
        push(mset, id, markOf(j) .. ',' .. int(dec(string.match(hs[i + 1], '^[^,]*,[^,]*,([^,]*),')) or 0))
      end
    elseif marks and not hs[i + 1] and prior[i + 1] and mark_acked(prior[i + 1], markOf(j), int(dec(ARGV[j + 3]) or 0)) then
      done[id] = true
      st = 1
    end
  end
  out[#out + 1] = st
end
flush('ZREM', kinflight, gone)
flush('HDEL', kmeta, gone)
-- Body entries exist only for payloads too large to be inline, whose
-- headers have the split form. A few acked tasks are looked at one by one
-- (the steady flow acks a task or two a call: all inline, no call at all);
-- for more, one EXISTS tells whether the namespace has a body HASH at all
-- (most have none).
if #gone > 0 and #gone <= FEW then
  for _, id in ipairs(gone) do
    if not is_inline(hs[pos[id]]) then
      flush('HDEL', kbody, gone)
      break
    end
  end
elseif #gone > 0 and redis.call('EXISTS', kbody) == 1 then
  flush('HDEL', kbody, gone)
end
flush('HSET', kacked, mset)
return out
