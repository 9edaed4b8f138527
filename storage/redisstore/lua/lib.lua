-- lib.lua: helpers shared by every delayd script. The Go side prepends this
-- file to each script, so every script still runs as one self-contained
-- chunk (and is cached by its own SHA). Nothing here loops without a bound.
--
-- Task record layout (see record.go, which must agree):
--   gen,attempt,created,updated,due,kindlen,errlen|<kind><last error><payload>
-- header numbers are hexadecimal integers, empty = 0; updated is stored as the
-- difference from created; due is stored only while the task is outside the
-- due ZSET.

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

-- dec decodes enc's output.
local function dec(s)
  if s == '' then
    return 0
  end
  if string.sub(s, 1, 1) == '-' then
    return -tonumber(string.sub(s, 2), 16)
  end
  return tonumber(s, 16)
end

-- parse reads a record's header into a table; b is where the body starts.
local function parse(rec)
  local p = string.find(rec, '|', 1, true)
  local g, a, c, u, d, kl, el = string.match(string.sub(rec, 1, p - 1),
    '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$')
  local created = dec(c)
  return {
    gen = dec(g), attempt = dec(a), created = created,
    updated = created + dec(u), due = dec(d),
    kl = dec(kl), el = dec(el), b = p + 1,
  }
end

-- gen_created reads only the generation and the create time of a record
-- (cheaper than parse when that is all a script needs).
local function gen_created(rec)
  local g, c = string.match(rec, '^([^,]*),[^,]*,([^,]*),')
  return dec(g), dec(c)
end

-- gen_attempt_created reads only the generation, the attempt and the create
-- time of a record: all a delivery token is checked against (much cheaper
-- than parse).
local function gen_attempt_created(rec)
  local g, a, c = string.match(rec, '^([^,]*),([^,]*),([^,]*),')
  return dec(g), dec(a), dec(c)
end

-- repop returns rec popped once more: attempt + 1, updated = now, due =
-- due. It rewrites only those header fields with one match and one concat
-- (no parse table, no full header re-encode); the rest of the record is
-- copied once.
local function repop(rec, now, due)
  local g, a, c, e = string.match(rec, '^([^,]*),([^,]*),([^,]*),[^,]*,[^,]*,()')
  return g .. ',' .. enc(dec(a) + 1) .. ',' .. c .. ',' .. enc(now - dec(c)) .. ',' ..
    enc(due) .. ',' .. string.sub(rec, e)
end

-- header formats a record header from fields (the parse table shape).
local function header(r)
  return enc(r.gen) .. ',' .. enc(r.attempt) .. ',' .. enc(r.created) .. ',' ..
    enc(r.updated - r.created) .. ',' .. enc(r.due) .. ',' .. enc(r.kl) .. ',' ..
    enc(r.el) .. '|'
end

-- rewrite returns rec with r's header fields; when err is not nil it also
-- replaces the last error (r.el is updated).
local function rewrite(rec, r, err)
  if err == nil then
    return header(r) .. string.sub(rec, r.b)
  end
  local kind = string.sub(rec, r.b, r.b + r.kl - 1)
  local payload = string.sub(rec, r.b + r.kl + r.el)
  r.el = #err
  return header(r) .. kind .. err .. payload
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

-- retry_policy reads the retry arguments ARGV[i..i+6]: retry_after ms ('' =
-- backoff), max attempts (0 = no limit), backoff initial ms, max ms,
-- multiplier, jitter fraction, seed in [0, 1), reason.
local function retry_policy(i)
  local p = {
    max = tonumber(ARGV[i + 1]),
    initial = tonumber(ARGV[i + 2]),
    cap = tonumber(ARGV[i + 3]),
    mult = tonumber(ARGV[i + 4]),
    jitter = tonumber(ARGV[i + 5]),
    seed = tonumber(ARGV[i + 6]),
    reason = ARGV[i + 7],
  }
  if ARGV[i] ~= '' then
    p.after = tonumber(ARGV[i])
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
-- collected in W = {due = ZADD args, dead = ZADD args, task = HSET args}.
-- Returns the new state (1 or 3) and its score.
local function settle(W, id, rec, r, now, p, k)
  r.updated = now
  if p.max > 0 and r.attempt >= p.max then
    push(W.dead, int(now), id)
    push(W.task, id, rewrite(rec, r, p.reason))
    return 3, now
  end
  local due = now + delay_for(p, r.attempt, k)
  r.due = 0
  push(W.due, int(due), id)
  push(W.task, id, rewrite(rec, r, p.reason))
  return 1, due
end

-- apply runs the writes settle collected.
local function apply(W, kdue, kdead, ktask)
  flush('ZADD', kdue, W.due)
  flush('ZADD', kdead, W.dead)
  flush('HSET', ktask, W.task)
end

-- token_check is token_status for a caller that needs only the status: it
-- reads just the generation, attempt and create time of rec.
local function token_check(rec, inflight, g, a, c)
  if not rec then
    return 3
  end
  local rg, ra, rc = gen_attempt_created(rec)
  -- Another create time: the task the token named was removed and this is
  -- a re-created one. A token without one (c == 0) matches nothing.
  if c == 0 or rc ~= c then
    return 3
  end
  if rg == g and ra == a then
    if inflight then
      return 1
    end
    return 3
  end
  if rg > g or (rg == g and ra > a) then
    return 2
  end
  return 3
end

-- token_status compares a delivery token (generation g, attempt a, task
-- create time c) with the stored record rec and whether the task is in
-- flight: 1 OK, 2 STALE (the task has a newer generation or attempt), 3
-- NOT_FOUND (no task, not in flight, or another incarnation: its create
-- time is not c; a token with c == 0 never matches). Returns the status
-- and the parsed record.
local function token_status(rec, inflight, g, a, c)
  if not rec then
    return 3, nil
  end
  local r = parse(rec)
  if c == 0 or r.created ~= c then
    return 3, r
  end
  if r.gen == g and r.attempt == a then
    if inflight then
      return 1, r
    end
    return 3, r
  end
  if r.gen > g or (r.gen == g and r.attempt > a) then
    return 2, r
  end
  return 3, r
end
