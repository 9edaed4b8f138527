-- forecast.lua: count one shard's scheduled tasks falling due per minute
-- over the next hour and per hour over the next day.
--
-- KEYS[1] due ZSET
-- ARGV[1] minute buckets (60), ARGV[2] hour buckets (24)
--
-- Returns {now ms, the minute counts..., the hour counts...}: minute
-- bucket i counts due times in (now + i min, now + (i+1) min], hour bucket
-- i in (now + i h, now + (i+1) h] (a task due at now or before is due now,
-- not forecast). One ZCOUNT per bucket (O(log N) each),
-- so the cost does not grow with the tasks counted; the loops are bounded
-- by the arguments, which the store caps.
local now = now_ms()
local out = {now}
local function buckets(n, width)
  for i = 0, n - 1 do
    local lo = now + i * width
    out[#out + 1] = redis.call('ZCOUNT', KEYS[1], '(' .. int(lo), int(lo + width))
  end
end
buckets(math.min(tonumber(ARGV[1]), 60), 60000)
buckets(math.min(tonumber(ARGV[2]), 24), 3600000)
return out
