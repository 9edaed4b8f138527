-- restore.lua: re-index tasks from the durable authority.
--
-- KEYS[1] due ZSET, KEYS[2] inflight ZSET, KEYS[3] dead ZSET,
-- KEYS[4] meta HASH, KEYS[5] body HASH, KEYS[6] acked HASH,
-- KEYS[7] life STRING (the namespace incarnation, see keys.go)
-- ARGV[1] wake channel (publish_wake), ARGV[2] namespace
-- ARGV[3] '1' = repair (storage.RestoreParams.Repair): write each task
--         unless the index holds that very version (MySQL is the authority
--         even when the index holds a "newer" one it never committed);
--         '0' = write unless the index holds the same or a newer version
-- ARGV[4] n (at most 1,000); then per task i (from 0), at ARGV[5+7i ..]: id,
--         incarnation, generation, state (1 = due, 3 = dead), score (due ms
--         or death ms), header (one without a create time is given the
--         Redis clock's now), payload
--
-- A task whose ack marker names the given incarnation and generation is
-- never written: that version was acked (its MySQL row is being deleted),
-- and writing it back would deliver it again. A task that is written
-- replaces whatever the index held in any state. Publishes the namespace on
-- the wake channel when a task became earlier than the head of due.
--
-- Nothing is written while life says the namespace was deleted and no
-- later incarnation has written since: those rows are the deleted
-- namespace's, about to be dropped from the authority too.
--
-- Returns the number of tasks written (an id given twice counts once).
local repair = ARGV[3] == '1'
local n = tonumber(ARGV[4])
if n == 0 then
  return 0
end
if life_ended(life_read(KEYS[7])) then
  return 0
end
local ids = {}
for i = 0, n - 1 do
  ids[i + 1] = ARGV[5 + 7 * i]
end
local olds = redis.call('HMGET', KEYS[4], unpack(ids))
local acked = redis.call('HMGET', KEYS[6], unpack(ids))
local first = head(KEYS[1])
local wake = false
local final, order, zrem = {}, {}, {} -- id -> argument index of its write
for i = 0, n - 1 do
  local j = 5 + 7 * i
  local id = ids[i + 1]
  local inc, gen = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local hi, hg
  if final[id] then
    hi, hg = tonumber(ARGV[final[id] + 1]), tonumber(ARGV[final[id] + 2])
  elseif olds[i + 1] then
    hi, hg = version(olds[i + 1])
  end
  local write
  if acked[i + 1] and string.match(acked[i + 1], '^([^,]*,[^,]*),') == ARGV[j + 1] .. ',' .. ARGV[j + 2] then
    write = false
  elseif not hi then
    write = true
  elseif repair then
    write = hi ~= inc or hg ~= gen
  else
    write = newer(inc, gen, hi, hg)
  end
  if write then
    if not final[id] then
      order[#order + 1] = id
      if olds[i + 1] then
        zrem[#zrem + 1] = id
      end
    end
    final[id] = j
  end
end
local zdue, zdead, hset, bset, bdel = {}, {}, {}, {}, {}
local now
for _, id in ipairs(order) do
  local j = final[id]
  local score = tonumber(ARGV[j + 4])
  if ARGV[j + 3] == '3' then
    push(zdead, ARGV[j + 4], id)
  else
    push(zdue, ARGV[j + 4], id)
    if first == nil or score < first then
      first = score
      wake = true
    end
  end
  local h = ARGV[j + 5]
  local r = parse(h)
  if r and r.created == 0 then
    now = now or now_ms()
    r.created = now
    if r.updated == 0 then
      r.updated = now
    end
    h = rewrite(h, r, nil)
  end
  push(hset, id, h)
  if ARGV[j + 6] == '' then
    bdel[#bdel + 1] = id
  else
    push(bset, id, ARGV[j + 6])
  end
end
flush('ZREM', KEYS[1], zrem)
flush('ZREM', KEYS[2], zrem)
flush('ZREM', KEYS[3], zrem)
flush('ZADD', KEYS[1], zdue)
flush('ZADD', KEYS[3], zdead)
flush('HSET', KEYS[4], hset)
flush('HDEL', KEYS[5], bdel)
flush('HSET', KEYS[5], bset)
if wake then
  publish_wake(ARGV[1], ARGV[2])
end
return #order
