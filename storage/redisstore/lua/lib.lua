-- lib.lua: helpers shared by every delayd script, the head of the Lua
-- library (library.go): loaded once with the library's functions on Redis
-- >= 7, or put before each entry in its EVALSHA script. Helpers take what
-- they need as arguments and never read KEYS, ARGV or another global but
-- the Redis API and the standard library (Functions forbid globals).
-- Nothing here loops without a bound.
--
-- A task is a header in the meta HASH (see record.go, which must agree),
-- in one of two forms:
--   split:  inc,gen,attempt,dseq,created,updated,due,kindlen|<kind><last error>
--           and the payload, if any, in the body HASH under the same id
--   inline: inc,gen,attempt,dseq,created,updated,due,kindlen,errlen|<kind><last error><payload>
--           and no body entry
-- and, in flight, optionally ';told' before the '|': the deadline the
-- subscriber was told (Unix ms, pop.lua's ARGV[6]), when later than the
-- store lease the pop set. Only repop writes it; every other rewrite of a
-- header drops it (the task leaves flight), and a reader ignores it unless
-- the task is in flight.
-- A payload of 1..INLINE_MAX bytes is written inline (one HASH entry per
-- task: the memory of a small task is close to a bare ZSET + HASH), a
-- larger one apart, so a script that needs only counters never copies a
-- large payload. Both forms are read everywhere; which one a task has is
-- decided anew at each write of its payload (upsert, restore).
-- numbers are hexadecimal integers, empty = 0; created is stored as the
-- difference from the incarnation's millisecond (inc / 1000, rounded down)
-- and updated as the difference from created, so both are usually empty;
-- due is stored only while the task is outside the due ZSET. inc is the
-- incarnation, dseq the delivery sequence (see repop).

-- INLINE_MAX is the largest payload kept in the header (record.go's
-- inlineMax).
local INLINE_MAX = 256

-- now_ms returns the Redis server clock in Unix milliseconds: the one clock
-- that decides due-ness for every replica.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- now_micros returns the Redis server clock in Unix microseconds (exact in
-- a Lua number until the year 2255).
local function now_micros()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- clock returns the Redis server clock in Unix milliseconds and in Unix
-- microseconds (exact in a Lua number until the year 2255).
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- HWM is the meta HASH field that holds the shard's high-water mark of
-- incarnations and delivery sequences (Redis µs): the highest stamp
-- issued, so none repeats or goes back when TIME does. A pop or an upsert
-- reads it in the HMGET of its headers and writes it in their HSET, so it
-- costs no redis.call of its own. No task id can be it (ids never hold a
-- ':'). The shard's hwm STRING (keys.go) holds the mark while the HASH has
-- no field: a shard last written by a delayd before the field, and a
-- dropped namespace (dropnamespace.lua moves the field there).
local HWM = ':hwm'

-- next_stamp returns the stamp for a new incarnation or delivery sequence
-- of a shard: the Redis clock in µs, or one past the high-water mark when
-- the clock is not ahead of it (TIME stepped back), so stamps never repeat
-- or go back. v is the HWM field as the caller read it (nil when the HASH
-- has none: then the hwm STRING legacy is read). The caller writes the
-- highest stamp it issued to the HWM field.
local function next_stamp(v, legacy, now_us)
  if not v then
    v = redis.call('GET', legacy)
  end
  local hwm = tonumber(v or '0') or 0
  if now_us > hwm then
    return now_us
  end
  return hwm + 1
end

-- int formats an integral number for redis.call without exponent notation.
local function int(n)
  return string.format('%d', n)
end

-- enc encodes an integer in hexadecimal (string.format is native code,
-- several times faster than any Lua loop); 0 is the empty string.
local function enc(n)
  if n == 0 then
    return ''
  end
  if n < 0 then
    return '-' .. string.format('%x', -n)
  end
  return string.format('%x', n)
end

-- dec decodes enc's output; nil for anything else.
local function dec(s)
  if s == '' then
    return 0
  end
  if string.sub(s, 1, 1) == '-' then
    local n = tonumber(string.sub(s, 2), 16)
    if n then
      return -n
    end
    return nil
  end
  return tonumber(s, 16)
end

-- A header's fields, in order, as one pattern: inc, gen, attempt, dseq,
-- created, updated (minus created), due, kind length; then ',' and the
-- last error's length in the inline form ('' in the split form); then the
-- told deadline after a ';' ('' when none); then '|' and the position where
-- kind and last error start.
local HDR = '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,;|]*)(,?)([^;|]*);?([^|]*)|()'

-- parse reads a header into a table, or returns nil when it is malformed
-- (a script then leaves the task where it is or moves it to dead; it never
-- raises an error halfway through its writes). b is where kind starts, kl
-- its length; el is the last error's length in the inline form (where the
-- payload follows it), nil in the split form (where the last error runs to
-- the end). told is the told deadline (0 when none).
local function parse(h)
  if not h then
    return nil
  end
  local i, g, a, d, c, u, du, kl, comma, el, told, b = string.match(h, HDR)
  if not b then
    return nil
  end
  told = dec(told)
  if not told then
    return nil
  end
  local r = {
    inc = dec(i), gen = dec(g), attempt = dec(a), dseq = dec(d), created = dec(c),
    updated = dec(u), due = dec(du), kl = dec(kl), b = b, told = told,
  }
  if not (r.inc and r.gen and r.attempt and r.dseq and r.created and r.updated and r.due and r.kl)
    or r.kl < 0 or b + r.kl - 1 > #h then
    return nil
  end
  if comma == ',' then
    r.el = dec(el)
    if not r.el or r.el < 0 or b + r.kl + r.el - 1 > #h then
      return nil
    end
  elseif el ~= '' then
    return nil
  end
  r.created = math.floor(r.inc / 1000) + r.created
  r.updated = r.created + r.updated
  return r
end

-- version reads only the incarnation and the generation of a header; nil
-- when it is malformed.
local function version(h)
  local i, g = string.match(h, '^([^,]*),([^,]*),')
  if not g then
    return nil
  end
  i, g = dec(i), dec(g)
  if not (i and g) then
    return nil
  end
  return i, g
end

-- newer reports whether version (i1, g1) is newer than (i2, g2): a later
-- incarnation, or a later generation of the same one.
local function newer(i1, g1, i2, g2)
  return i1 > i2 or (i1 == i2 and g1 > g2)
end

-- repop returns header h popped once more, or nil when h is malformed:
-- attempt + 1, delivery sequence = max(old + 1, now_us) (so a delivery
-- never repeats the sequence of an earlier one of the task, even after a
-- requeue, a rebuild from MySQL or a restored snapshot, which roll the
-- stored sequence back but not the clock), updated = now, due = due. It
-- rewrites only those fields with one match and one concat; kind, last
-- error and an inline payload are copied once. The third value is true
-- when the header is inline (the task has no body entry). told > 0 is the
-- told deadline kept with the delivery (see the header's ';told'); 0 keeps
-- none (a told deadline of an earlier delivery is dropped).
local function repop(h, now, now_us, due, told)
  -- p..e-1: kind length (and ',' error length); e..q-1: ';told' or ''
  local i, g, a, d, c, p, comma, e, q = string.match(h, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),[^,]*,[^,]*,()[^,;|]*(,?)[^;|]*()[^|]*()|')
  if not q then
    return nil
  end
  local ni, na, nd, nc = dec(i), dec(a), dec(d), dec(c)
  if not (ni and na and nd and nc) then
    return nil
  end
  local seq = nd + 1
  if seq < now_us then
    seq = now_us
  end
  local rest
  if told > 0 then
    rest = string.sub(h, p, e - 1) .. ';' .. enc(told) .. string.sub(h, q)
  elseif e == q then
    rest = string.sub(h, p)
  else
    rest = string.sub(h, p, e - 1) .. string.sub(h, q)
  end
  return i .. ',' .. g .. ',' .. enc(na + 1) .. ',' .. enc(seq) .. ',' .. c .. ',' ..
    enc(now - math.floor(ni / 1000) - nc) .. ',' .. enc(due) .. ',' .. rest, seq, comma == ','
end

-- FEW_BODIES is how many acked tasks a call looks at one by one for a body
-- entry (settle_deliveries); for more, one EXISTS of the body HASH.
local FEW_BODIES = 8

-- is_inline reports whether header h has the inline form (its payload in
-- it, no body entry): a ',' and the last error's length after the kind
-- length.
local function is_inline(h)
  return string.find(h, '^[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,]*,[^,;|]*,') ~= nil
end

-- header formats a header from fields (the parse table shape), kind, last
-- error and payload: inline when the payload has 1..INLINE_MAX bytes, else
-- split (the caller stores a non-empty payload in the body HASH; see
-- inline).
local function header(r, kind, err, payload)
  local h = enc(r.inc) .. ',' .. enc(r.gen) .. ',' .. enc(r.attempt) .. ',' .. enc(r.dseq) .. ',' ..
    enc(r.created - math.floor(r.inc / 1000)) .. ',' .. enc(r.updated - r.created) .. ',' .. enc(r.due) .. ',' ..
    enc(#kind)
  if payload and #payload > 0 and #payload <= INLINE_MAX then
    return h .. ',' .. enc(#err) .. '|' .. kind .. err .. payload
  end
  return h .. '|' .. kind .. err
end

-- inline reports whether a payload goes into the header.
local function inline(payload)
  return #payload > 0 and #payload <= INLINE_MAX
end

-- rewrite returns h (parsed as r) with r's fields; when err is not nil it
-- also replaces the last error. Kind and an inline payload are kept, and so
-- is the form.
local function rewrite(h, r, err)
  local e = r.b + r.kl
  local kind = string.sub(h, r.b, e - 1)
  if r.el then
    if err == nil then
      err = string.sub(h, e, e + r.el - 1)
    end
    local h2 = enc(r.inc) .. ',' .. enc(r.gen) .. ',' .. enc(r.attempt) .. ',' .. enc(r.dseq) .. ',' ..
      enc(r.created - math.floor(r.inc / 1000)) .. ',' .. enc(r.updated - r.created) .. ',' .. enc(r.due) .. ',' ..
      enc(r.kl) .. ',' .. enc(#err) .. '|' .. kind .. err
    return h2 .. string.sub(h, e + r.el)
  end
  if err == nil then
    err = string.sub(h, e)
  end
  return header(r, kind, err, nil)
end

-- locate returns the state a task is in (1 scheduled, 2 delivered, 3 dead,
-- 0 none) and its score there.
local function locate(kdue, kinflight, kdead, id)
  local s = redis.call('ZSCORE', kdue, id)
  if s then
    return 1, s
  end
  s = redis.call('ZSCORE', kinflight, id)
  if s then
    return 2, s
  end
  s = redis.call('ZSCORE', kdead, id)
  if s then
    return 3, s
  end
  return 0, ''
end

-- head returns the score of the earliest task in a ZSET, or nil.
local function head(key)
  local h = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if h[2] then
    return tonumber(h[2])
  end
  return nil
end

-- publish_wake publishes a wake-up message on channel: a shard channel
-- (delayd:{ns#k}:wake, in the slot of the shard's keys: a Redis Cluster,
-- keys.go) with SPUBLISH, so it reaches only that shard's master and its
-- replicas; the one channel of every namespace (delayd:wake: one Redis,
-- and the embedded store, which has no sharded pub/sub) with PUBLISH.
local function publish_wake(channel, msg)
  if string.find(channel, '{', 1, true) then
    redis.call('SPUBLISH', channel, msg)
  else
    redis.call('PUBLISH', channel, msg)
  end
end

-- retry_policy reads the retry arguments args[i..i+7]: retry_after ms ('' =
-- backoff), max attempts (0 = no limit), backoff initial ms, max ms,
-- multiplier, jitter fraction, seed in [0, 1), reason.
local function retry_policy(args, i)
  local p = {
    max = tonumber(args[i + 1]),
    initial = tonumber(args[i + 2]),
    cap = tonumber(args[i + 3]),
    mult = tonumber(args[i + 4]),
    jitter = tonumber(args[i + 5]),
    seed = tonumber(args[i + 6]),
    reason = args[i + 7],
  }
  if args[i] ~= '' then
    p.after = tonumber(args[i])
  end
  return p
end

-- delay_for returns the retry delay after the failed attempt n (from 1) for
-- the k-th task of this call: retry_after if given, else
-- min(cap, initial * mult^(n-1)) jittered down by up to jitter of itself.
-- The jitter draw is the golden-ratio sequence from the seed, so tasks of
-- one call get spread, well-distributed draws.
local function delay_for(p, n, k)
  if p.after then
    return p.after
  end
  if n < 1 then
    n = 1
  end
  local d = p.initial * p.mult ^ (n - 1)
  if d > p.cap then
    d = p.cap
  end
  local u = (p.seed + k * 0.6180339887498949) % 1
  return math.floor(d - d * p.jitter * u)
end

-- push appends a and b to the list t.
local function push(t, a, b)
  t[#t + 1] = a
  t[#t + 1] = b
end

-- bucket_read returns the tokens in token bucket HASH key (t = tokens, at =
-- Redis time of t in µs) at now_us: refilled at rate per second up to
-- burst; a bucket never written (or expired) is full.
local function bucket_read(key, rate, burst, now_us)
  local b = redis.call('HMGET', key, 't', 'at')
  if b[1] and b[2] then
    local elapsed = math.max(0, now_us - tonumber(b[2]))
    return math.min(burst, tonumber(b[1]) + elapsed * rate / 1000000)
  end
  return burst
end

-- bucket_write stores tokens in bucket key as of now_us; the key expires
-- once the bucket would be full again (a full bucket needs no key).
local function bucket_write(key, tokens, rate, burst, now_us)
  redis.call('HSET', key, 't', tostring(tokens), 'at', int(now_us))
  redis.call('PEXPIRE', key, int(math.ceil(burst * 1000 / rate) + 1000))
end

-- due_head returns the head of due ZSET zkey by now as a flat list {id,
-- due ms, id, due ms, ...} in due order: the first limit members or, when
-- window > 0, the members whose kind (read from the meta HASH mkey) is in
-- the set want among the first window due ones, at most limit of them;
-- members without a readable header are left where they are. pop.lua and
-- peekdue.lua must agree on it.
local function due_head(zkey, mkey, now, limit, window, want)
  if window == 0 then
    return redis.call('ZRANGEBYSCORE', zkey, '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, limit)
  end
  local items = {}
  local scan = redis.call('ZRANGEBYSCORE', zkey, '-inf', int(now), 'WITHSCORES', 'LIMIT', 0, window)
  if #scan == 0 then
    return items
  end
  local sids = {}
  for i = 1, #scan, 2 do
    sids[#sids + 1] = scan[i]
  end
  local shs = redis.call('HMGET', mkey, unpack(sids))
  for k = 1, #sids do
    local r = parse(shs[k])
    if r and want[string.sub(shs[k], r.b, r.b + r.kl - 1)] then
      push(items, sids[k], scan[2 * k])
      if #items >= 2 * limit then
        break
      end
    end
  end
  return items
end

-- flush runs cmd on key with the collected arguments, if any. Scripts
-- collect their writes and run each command once per call rather than once
-- per task: a redis.call costs far more than the Lua around it. Batches are
-- at most 1,000 tasks, so args stays under Lua's unpack limit (8,000).
local function flush(cmd, key, args)
  if #args > 0 then
    redis.call(cmd, key, unpack(args))
  end
end

-- settle decides where an in-flight task goes (it must already be, or be
-- about to be, taken out of the inflight ZSET): to due after its retry
-- delay, or to dead when its attempts are used up. The writes are
-- collected in W = {due = ZADD args, dead = ZADD args, meta = HSET args}.
-- Returns the new state (1 or 3) and its score.
local function settle(W, id, h, r, now, p, k)
  r.updated = now
  if p.max > 0 and r.attempt >= p.max then
    push(W.dead, int(now), id)
    push(W.meta, id, rewrite(h, r, p.reason))
    return 3, now
  end
  local due = now + delay_for(p, r.attempt, k)
  r.due = 0
  push(W.due, int(due), id)
  push(W.meta, id, rewrite(h, r, p.reason))
  return 1, due
end

-- apply runs the writes settle collected.
local function apply(W, kdue, kdead, kmeta)
  flush('ZADD', kdue, W.due)
  flush('ZADD', kdead, W.dead)
  flush('HSET', kmeta, W.meta)
end

-- token_check compares a delivery token (incarnation i, generation g,
-- attempt a, delivery sequence d: hexadecimal strings as a header holds
-- them, see enc, so 0 is '') with the stored header h and whether the task
-- is in flight: 1 OK (h is that delivery, in flight, at that attempt), 2
-- STALE (the same incarnation has a newer generation or delivery since),
-- 3 NOT_FOUND (no task, another incarnation, not in flight, or a token
-- naming the delivery with another attempt than its own: never issued). A
-- token with delivery 0 never matches: pops never issue it. The common case
-- (the token names the header's delivery) is decided by comparing the
-- strings, without decoding a number (that decoding was a third of
-- ack.lua's CPU per token).
local function token_check(h, inflight, i, g, a, d)
  if not h or d == '' then
    return 3
  end
  local hi, hg, ha, hd = string.match(h, '^([^,]*),([^,]*),([^,]*),([^,]*),')
  if not hd then
    return 3
  end
  if hi == i and hg == g and ha == a and hd == d then
    if inflight then
      return 1
    end
    return 3
  end
  local ri, rg, ra, rd = dec(hi), dec(hg), dec(ha), dec(hd)
  local ti, tg, ta, td = dec(i), dec(g), dec(a), dec(d)
  if not (ri and rg and ra and rd and ti and tg and ta and td) or td == 0 or ri ~= ti then
    return 3
  end
  if rg == tg and rd == td then
    if inflight and ra == ta then
      return 1
    end
    return 3
  end
  if rg > tg or (rg == tg and rd > td) then
    return 2
  end
  return 3
end

-- mark_is says whether ack marker m ('inc,gen,dseq,attempt', or the
-- 'inc,gen,dseq' of markers written before the attempt was added) names
-- the delivery key ('inc,gen,dseq').
local function mark_is(m, key)
  return m == key or (m ~= nil and m ~= false and string.sub(m, 1, #key + 1) == key .. ',')
end

-- mark_acked says whether ack marker m records the ack of delivery key
-- ('inc,gen,dseq') at attempt a (decimal): a retried ack of that very
-- token. A marker written before the attempt was added names no attempt.
local function mark_acked(m, key, a)
  return m == key or m == key .. ',' .. a
end

-- mark_of is the delivery key, as ack markers hold it (decimal: durable.go,
-- markOf), of the token at args[j+1 ..] (a settle section's layout); built
-- only for a token that needs it, so a stale or unknown token costs no
-- string.
local function mark_of(args, j)
  return int(dec(args[j + 1]) or 0) .. ',' .. int(dec(args[j + 2]) or 0) .. ',' .. int(dec(args[j + 4]) or 0)
end

-- The settle section: the acks and nacks one call settles, laid out from
-- args[i] as
--   ga, the number of ack groups; per group: marks ('1': durable mode, leave
--       an ack marker per acked task, see settle.lua), m, then m tokens
--   gn, the number of nack groups; per group: the 8 retry arguments
--       (retry_policy), unsent ('1': the deliveries were popped but never
--       sent, each gives back the attempt its pop counted), m, then m tokens
-- where a token is 5 values: id, incarnation, generation, attempt and
-- delivery sequence (hexadecimal, as headers hold them: 0 is ''). settle.lua
-- is the section alone; pop.lua settles one before it pops (issue 37 item
-- 3: the acks of a wake ride its pop).
--
-- settle_deliveries settles the section of args from i against the shard
-- whose keys are keys[3..8] (due, inflight, dead, meta, body, acked: the
-- layout settle.lua and pop.lua share) and appends its answers to out: per
-- ack token its status (1 OK, 2 STALE, 3 NOT_FOUND; token_check), per nack
-- token its status, the state its task went to and when (1 scheduled at
-- its due ms, 3 dead at its death ms; 0, 0 when not applied). A token is
-- settled once per call: a later token of a delivery this call already
-- settled answers NOT_FOUND, as a second call would. now is the Redis
-- clock in ms, or nil: read when a nack needs it. Returns whether a nacked
-- task became the earliest due task (the caller publishes the wake-up) and
-- the index after the section. The ack groups go first, then the nack
-- groups, each in order.
local function settle_deliveries(keys, args, i, now, out)
  local kdue, kinflight, kdead, kmeta, kbody, kacked = keys[3], keys[4], keys[5], keys[6], keys[7], keys[8]
  -- The groups' shapes, and every token's id for one read of each key.
  local groups, ids, marks = {}, {}, false
  local ga = tonumber(args[i])
  i = i + 1
  for _ = 1, ga do
    local m = tonumber(args[i + 1])
    groups[#groups + 1] = {marks = args[i] == '1', at = i + 2, m = m}
    marks = marks or args[i] == '1'
    for t = 0, m - 1 do
      ids[#ids + 1] = args[i + 2 + 5 * t]
    end
    i = i + 2 + 5 * m
  end
  local gn = tonumber(args[i])
  i = i + 1
  for _ = 1, gn do
    local m = tonumber(args[i + 9])
    groups[#groups + 1] = {nack = true, p = retry_policy(args, i), unsent = args[i + 8] == '1', at = i + 10, m = m}
    for t = 0, m - 1 do
      ids[#ids + 1] = args[i + 10 + 5 * t]
    end
    i = i + 10 + 5 * m
  end
  if #ids == 0 then
    return false, i
  end
  local hs = redis.call('HMGET', kmeta, unpack(ids))
  local leased = redis.call('ZMSCORE', kinflight, unpack(ids))
  local prior = {}
  if marks then
    prior = redis.call('HMGET', kacked, unpack(ids))
  end
  local gone, back, done, mset = {}, {}, {}, {}
  local W, first, firstRead, wake
  local x = 0
  for _, g in ipairs(groups) do
    for t = 0, g.m - 1 do
      x = x + 1
      local j = g.at + 5 * t
      local id, h = ids[x], hs[x]
      local st, state, at = 3, 0, 0
      if not done[id] then
        st = token_check(h, leased[x], args[j + 1], args[j + 2], args[j + 3], args[j + 4])
        if not g.nack then
          if st == 1 then
            done[id] = true
            gone[#gone + 1] = x
            if g.marks then
              push(mset, id, mark_of(args, j) .. ',' .. int(dec(string.match(h, '^[^,]*,[^,]*,([^,]*),')) or 0))
            end
          elseif g.marks and not h and prior[x] and mark_acked(prior[x], mark_of(args, j), int(dec(args[j + 3]) or 0)) then
            done[id] = true
            st = 1
          end
        else
          local r
          if st == 1 then
            r = parse(h)
            if not r then
              st = 3
            end
          end
          if st == 1 then
            done[id] = true
            back[#back + 1] = id
            if g.unsent and r.attempt > 0 then
              r.attempt = r.attempt - 1
            end
            now = now or now_ms()
            W = W or {due = {}, dead = {}, meta = {}}
            state, at = settle(W, id, h, r, now, g.p, x)
            if state == 1 then
              if not firstRead then
                first, firstRead = head(kdue), true
              end
              if first == nil or at < first then
                first, wake = at, true
              end
            end
          end
        end
      end
      out[#out + 1] = st
      if g.nack then
        out[#out + 1] = state
        out[#out + 1] = at
      end
    end
  end
  -- Writes: the settled deliveries leave flight in one ZREM; acked tasks
  -- lose their headers (and body entries: only the split form has one,
  -- looked at for a few tasks, one EXISTS for more: most namespaces have
  -- no body HASH at all); nacked ones are rewritten where they go.
  if #gone + #back > 0 then
    local out_ids, body = {}, false
    for _, k in ipairs(gone) do
      out_ids[#out_ids + 1] = ids[k]
      body = body or (#gone <= FEW_BODIES and not is_inline(hs[k]))
    end
    for _, id in ipairs(back) do
      out_ids[#out_ids + 1] = id
    end
    redis.call('ZREM', kinflight, unpack(out_ids))
    if #gone > 0 then
      local gids = {}
      for n, k in ipairs(gone) do
        gids[n] = ids[k]
      end
      redis.call('HDEL', kmeta, unpack(gids))
      if body or (#gone > FEW_BODIES and redis.call('EXISTS', kbody) == 1) then
        redis.call('HDEL', kbody, unpack(gids))
      end
    end
  end
  flush('HSET', kacked, mset)
  if W then
    apply(W, kdue, kdead, kmeta)
  end
  return wake, i
end

-- life_read reads a namespace shard's life key (keys.go): the latest
-- incarnation that wrote and the latest one DropNamespace ended (Unix ms
-- create times; 0 = none).
local function life_read(key)
  local v = redis.call('GET', key)
  if not v then
    return 0, 0
  end
  local l, e = string.match(v, '^(%d+),(%d+)$')
  return tonumber(l) or 0, tonumber(e) or 0
end

-- life_ended reports whether the namespace's last incarnation was ended
-- and none has written since: then no write, checked or not, belongs in it.
local function life_ended(live, ended)
  return ended > 0 and ended >= live
end

-- The call head: every entry that changes a task opens its KEYS and ARGV
-- with the same slots (docs/ARCHITECTURE.md, "The Lua library"; the Go
-- side builds them in one place, shard.go headKeys/headArgs):
--   KEYS[1] the record of this request (keys.go requestKey), a STRING
--           with a PX expiry; KEYS[2] the shard's history stream
--   ARGV[1] request id ('' = none), ARGV[2] how long the record is kept
--   (ms), ARGV[3] history keep, ARGV[4] key id, ARGV[5] replica
--
-- A request's record is its answer, kept so that the request asked again
-- with the same id gets the same answer and changes nothing (a caller
-- whose answer was lost cannot tell whether the request ran): record_pack
-- makes it of value first and values t[from..#t]; record_unpack returns
-- first and appends the others to out. Each value is its length in
-- decimal, ':' and its bytes, so any bytes (payloads) come back unchanged
-- and no encoder module is needed.
local function record_pack(first, t, from)
  local parts = {}
  for i = from - 1, #t do
    local v = first
    if i >= from then
      v = t[i]
    end
    if type(v) == 'number' then
      v = int(v)
    end
    parts[#parts + 1] = #v .. ':' .. v
  end
  return table.concat(parts)
end

-- record_unpack is record_pack undone: it returns the first value and
-- appends the others to out (a malformed record ends where it stops making
-- sense; only record_pack writes one).
local function record_unpack(s, out)
  local pos, n, first = 1, #s, nil
  while pos <= n do
    local colon = string.find(s, ':', pos, true)
    local len = colon and tonumber(string.sub(s, pos, colon - 1))
    if not len then
      break
    end
    local v = string.sub(s, colon + 1, colon + len)
    if first == nil then
      first = v
    else
      out[#out + 1] = v
    end
    pos = colon + len + 1
  end
  return first
end
