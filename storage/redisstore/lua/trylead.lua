-- trylead.lua: acquire or renew a leader lease.
--
-- KEYS[1] lease key
-- ARGV[1] holder, ARGV[2] lease ms
--
-- The lease is taken when nobody holds it, and renewed when ARGV[1] already
-- holds it. Returns 1 when ARGV[1] holds the lease for ARGV[2] ms from now,
-- 0 when someone else holds it.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
