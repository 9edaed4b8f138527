-- reqrate.lua: take one token of a namespace's request-rate bucket
-- (policy.rate_limit / rate_burst), shared by every replica.
--
-- KEYS[1] request-rate bucket HASH (t = tokens, at = Redis time of t in
--         microseconds)
-- ARGV[1] rate, tokens per second (> 0)
-- ARGV[2] bucket size (burst), at least 1
--
-- The bucket is refilled at ARGV[1] per second up to ARGV[2]; a call takes
-- one whole token when there is one. Every replica's calls go through the
-- same bucket, so the limit holds across replicas. An empty bucket is not
-- written (its refill goes on from the last take). The bucket expires once
-- it would be full again anyway, so an idle namespace leaves nothing behind.
--
-- Returns 1 when a token was taken, 0 when the bucket is empty.
local _, now_us = clock()
local rate = tonumber(ARGV[1])
local burst = math.max(1, tonumber(ARGV[2]))
local tokens = burst
local b = redis.call('HMGET', KEYS[1], 't', 'at')
if b[1] and b[2] then
  local elapsed = math.max(0, now_us - tonumber(b[2]))
  tokens = math.min(burst, tonumber(b[1]) + elapsed * rate / 1000000)
end
if tokens < 1 then
  return 0
end
redis.call('HSET', KEYS[1], 't', tostring(tokens - 1), 'at', int(now_us))
redis.call('PEXPIRE', KEYS[1], int(math.ceil(burst * 1000 / rate) + 1000))
return 1
