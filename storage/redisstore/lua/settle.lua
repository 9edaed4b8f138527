-- settle.lua: settle deliveries on their own: the acks and nacks of a
-- settle section (lib.lua settle_deliveries) when no pop carries them.
-- Acked tasks that are still the named delivery in flight are deleted;
-- nacked ones go back to due after their retry delay, or to dead when
-- their attempts are used up, the reason becoming their last error.
--
-- KEYS[1], KEYS[2], ARGV[1..5]: the call head (lib.lua)
-- KEYS[3] due ZSET, KEYS[4] inflight ZSET, KEYS[5] dead ZSET,
-- KEYS[6] meta HASH, KEYS[7] body HASH, KEYS[8] acked HASH (durable mode's
-- ack markers)
-- ARGV[6] wake channel (publish_wake), ARGV[7] namespace (the wake-up message)
-- ARGV[8..] the settle section (lib.lua)
--
-- Durable mode's acks (an ack group with marks '1') leave an ack marker
-- per acked task (id -> 'inc,gen,dseq,attempt': the token's version and
-- delivery and the delivery's attempt from the header, decimal) until MySQL
-- has deleted that version, and answer OK again for a token that matches
-- its task's marker (a retried ack). The attempt is there for whoever
-- settles the ack in MySQL (the reconciler, if the ack's own write-through
-- never runs): pops are not written to MySQL, so only the index knows it.
--
-- Publishes the namespace on the wake channel when a nacked task became
-- earlier than the head of due.
--
-- Returns the section's answers (lib.lua settle_deliveries): per ack token
-- its status, per nack token its status, state and time.
local out = {}
if settle_deliveries(KEYS, ARGV, 8, nil, out) then
  publish_wake(ARGV[6], ARGV[7])
end
return out
