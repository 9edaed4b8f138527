-- ratetake.lua: take tokens from, or give tokens back to, a namespace's
-- dispatch-rate bucket outside a pop. A sharded namespace has one bucket,
-- in shard 0 (shards.go): a Pop takes its tokens here first, pops that
-- many across the shards, and gives back what it did not use. The
-- request-rate bucket of policy.rate_limit (limits.go) takes one token a
-- call through it too.
--
-- KEYS[1] rate HASH (t = tokens, at = Redis time of t in µs; pop.lua's
--         layout)
-- ARGV[1] rate, tokens per second (> 0)
-- ARGV[2] bucket size (burst), at least 1
-- ARGV[3] tokens wanted (whole; 0 to only give back)
-- ARGV[4] tokens given back (added before taking, up to the bucket size)
--
-- Returns the whole tokens taken.
local _, now_us = clock()
local rate = tonumber(ARGV[1])
local burst = math.max(1, tonumber(ARGV[2]))
local tokens = math.min(burst, bucket_read(KEYS[1], rate, burst, now_us) + tonumber(ARGV[4]))
local take = math.max(0, math.min(tonumber(ARGV[3]), math.floor(tokens)))
bucket_write(KEYS[1], tokens - take, rate, burst, now_us)
return take
