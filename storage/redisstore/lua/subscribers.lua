-- subscribers.lua: the Subscribe streams of one namespace on every replica
-- (policy.max_subscribers), each a member of one ZSET with a lease that
-- its replica renews; a replica that dies leaves its members to expire.
--
-- KEYS[1] subscribers ZSET: stream id -> lease end (Redis ms)
-- ARGV[1] op: 'acquire', 'renew' or 'release'
-- ARGV[2] lease ms (acquire, renew)
-- ARGV[3] most streams (acquire; 0 = no limit, only counted)
-- ARGV[4..] stream ids (acquire: exactly one)
--
-- Expired members are dropped first. acquire adds the stream when fewer
-- than ARGV[3] are held; renew re-adds every named stream with a new
-- lease (also one whose lease lapsed: it is still open); release removes
-- the named streams.
--
-- Returns {taken (1/0; renew and release: 1), streams held after}.
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
local op = ARGV[1]
local lease = tonumber(ARGV[2])
if op == 'release' then
  for i = 4, #ARGV do
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
  return {1, redis.call('ZCARD', KEYS[1])}
end
local held = redis.call('ZCARD', KEYS[1])
if op == 'acquire' then
  local most = tonumber(ARGV[3])
  if most > 0 and held >= most and not redis.call('ZSCORE', KEYS[1], ARGV[4]) then
    return {0, held}
  end
end
for i = 4, #ARGV do
  redis.call('ZADD', KEYS[1], int(now + lease), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], int(lease + 1000))
return {1, redis.call('ZCARD', KEYS[1])}
