package redisstore

import (
	"strconv"
	"strings"
	"sync"

	"github.com/delayd/delayd/storage"
)

// This file is the only place Redis keys and channels are built: read it to
// see the whole key space.
//
// Per namespace ns and shard k, every key shares the hash tag {ns#k} (one
// shard: {ns#0}; several: {ns#k} or {ns#k~s}, see shardTag), so each
// script's keys sit in one Redis Cluster slot:
//
//	delayd:{ns#k}:due       ZSET  task id -> due time (Unix ms)
//	delayd:{ns#k}:inflight  ZSET  task id -> lease deadline (Unix ms)
//	delayd:{ns#k}:dead      ZSET  task id -> time it died (Unix ms)
//	delayd:{ns#k}:meta      HASH  task id -> task header (see record.go),
//	                              and ":hwm" -> the shard's high-water mark
//	                              (hwmField)
//	delayd:{ns#k}:body      HASH  task id -> payload, only for payloads over
//	                              256 bytes (smaller ones are inline in the
//	                              header; record.go)
//	delayd:{ns#k}:acked     HASH  task id -> ack marker (durable mode only:
//	                              the version acked until MySQL deleted it)
//	delayd:{ns#k}:indexed   STRING  present once durable mode has indexed ns
//	delayd:{ns#k}:hwm       STRING the high-water mark (hwmField) of a shard
//	                              whose meta HASH has none: written by
//	                              delayd before the field, and by
//	                              DropNamespace; outlives the tasks
//	delayd:{ns#k}:rate      HASH  dispatch-rate token bucket (lua/pop.lua):
//	                              t = tokens, at = when (Redis µs); expires
//	                              once it would be full again
//	delayd:{ns#0}:reqrate   HASH  request-rate token bucket, and
//	delayd:{ns#0}:subs      ZSET  Subscribe streams of every replica
//	                              (storage.SharedLimits; see limits.go)
//	delayd:{ns#k}:task      HASH  the one-value records of delayd before the
//	                              header/payload split; Migrate converts them
//	delayd:{ns#k}:req:<id>  STRING the record of request <id> (issue 38: a
//	                        retried pop or write answers it), expiring
//	delayd:{ns#k}:trace:<id> STRING W3C traceparent of the task's last traced
//	                        upsert (Options.Traces); expires a day after the
//	                        task's due time, so it needs no cleanup
//	delayd:{ns#0}:history:<inc>  STREAM the task events of namespace
//	                        incarnation inc (its create time, Unix ms;
//	                        history.go), XADD MAXLEN ~ keep; on the first
//	                        shard's slot only. Written for an incarnation
//	                        life says ended, it is removed by its writer;
//	                        never read then (historyEnded)
//	delayd:{ns#0}:history:<inc>:ids  ZSET task id -> the entry time (ms)
//	                        of its latest event in that stream: a task with
//	                        none kept is not read at all, a walk stops at
//	                        its last event; trimmed with the stream
//	delayd:{ns#0}:history:<inc>:first  ZSET task id -> the entry time (ms)
//	                        of its first event since it was indexed: a walk
//	                        starts there; trimmed with the stream (a task
//	                        without one is walked from the stream's start)
//	delayd:{ns#0}:history   STREAM the same, from before histories were
//	                        kept per incarnation: no longer read or written,
//	                        removed with the namespace
//	delayd:{ns#k}:wake      shard pub/sub channel (Redis Cluster only;
//	                              SPUBLISH, SSUBSCRIBE): the wake-ups of
//	                              the shard (message = namespace name, or
//	                              "settled:" and tokens on shard 0), so a
//	                              wake-up travels only to the master of the
//	                              shard and its replicas, never over the
//	                              whole cluster bus (wakeups.go)
//	delayd:{ns#k}:sched     HASH  schedule id -> "version,create ms,update ms|"
//	                              + the schedule (storage.MarshalSchedule),
//	                              in the shard of its id (storage.ShardOf),
//	                              where its firings' tasks land too
//	                              (storage.FiringID): one script moves a
//	                              schedule and creates its firings
//	delayd:{ns#k}:schedids  ZSET  schedule id, score 0 (id order, for lists)
//	delayd:{ns#k}:schednext ZSET  schedule id -> when the schedule loop next
//	                              looks at it (Unix ms); absent while paused
//	                              or done
//
// Global:
//
//	delayd:wake             pub/sub channel; message = namespace name (an
//	                        earlier task is at its head), or "policy:" and
//	                        the name (its policy changed; policyWakeMessage),
//	                        or "settled:" and tokens (limits.go). On a Redis
//	                        Cluster only policy changes: the rest travel on
//	                        the shard channels (delayd:{ns#k}:wake)
//	delayd:watch:<ns>       pub/sub channel; message = one delivery copy of
//	                        namespace ns (JSON, watch.go), published only
//	                        while a watcher somewhere is subscribed
//	delayd:lead:<name>      STRING leader lease, value = holder
//	delayd:schedns          SET   namespaces that have schedules (added
//	                        before a namespace's first schedule is written,
//	                        removed when its schedules are dropped): where
//	                        the schedule loop looks for due schedules
//
// The namespace registry (Redis-only and embedded modes; see registry.go)
// shares the hash tag {registry}, which no namespace key can have (theirs
// always contain '#'):
//
//	delayd:{registry}:ns:<name>     HASH  policy (JSON), create_ms, update_ms, version
//	delayd:{registry}:namespaces    ZSET  every namespace name, score 0 (name order)
//	delayd:{registry}:keys          HASH  API key id -> key record (JSON, SHA-256 of the secret)
//	delayd:{registry}:nskeys:<ns>   ZSET  key ids of namespace ns ("*" = global) -> create time (ms)
//	delayd:{registry}:imported      STRING when durable mode copied this registry into MySQL (Unix ms)
//	delayd:{registry}:born          HASH  deleted namespace name -> its create_ms, until re-created
//
// Namespaces are validated with storage.ValidateNamespace before they reach
// these functions ([a-z0-9][a-z0-9_-]*), so no name can open or close a hash
// tag. Task ids are never part of a key, only ZSET members and HASH fields,
// with one exception: the trace keys, which must expire on their own. Task
// ids are validated too (storage.ValidateTaskID: [A-Za-z0-9._-]), so they
// cannot contain a brace either.

const (
	keyPrefix = "delayd:"
	// nsScanPattern matches every per-namespace key (SCAN MATCH syntax).
	nsScanPattern = keyPrefix + "{*"
	// DefaultWakeChannel is the pub/sub channel of wake-ups unless
	// Options.WakeChannel says otherwise.
	DefaultWakeChannel = keyPrefix + "wake"
)

// hwmField is the meta HASH field that holds the shard's high-water mark:
// the highest incarnation or delivery sequence issued (Redis µs; lib.lua
// HWM, read and written by upsert.lua, pop.lua, schedule_update.lua with
// the headers), so neither repeats or goes back when TIME does. No task id
// can be it (storage.ValidateTaskID allows no ':').
const hwmField = ":hwm"

// policyWakePrefix starts a wake-up message that says a namespace's policy
// changed; no namespace name contains ':', so it never reads as one.
const policyWakePrefix = "policy:"

// policyWakeMessage is the wake-up message "ns's policy changed".
func policyWakeMessage(ns string) string { return policyWakePrefix + ns }

// parseWakeMessage reads a message of the wake-up channel.
func parseWakeMessage(m string) storage.Wakeup {
	if w, ok := parseSettled(m); ok {
		return w
	}
	if ns, ok := strings.CutPrefix(m, policyWakePrefix); ok {
		return storage.Wakeup{Namespace: ns, PolicyChanged: true}
	}
	return storage.Wakeup{Namespace: m}
}

// watchChannel is the pub/sub channel of ns's delivery copies (watch.go).
func watchChannel(ns string) string { return keyPrefix + "watch:" + ns }

// nsKeys are the keys of one shard of one namespace.
type nsKeys struct {
	due      string
	inflight string
	dead     string
	meta     string
	body     string
	acked    string
	indexed  string
	legacy   string
	// life holds "live,ended": the latest namespace incarnation (create
	// time, ms) that wrote, and the latest one DropNamespace ended
	// (upsert.lua, dropnamespace.lua, restore.lua; 0 = none). It outlives
	// the tasks, so a write through a stale view of a deleted namespace is
	// refused; it is not a sign that the namespace has tasks.
	life string
	// hwm is the high-water mark of incarnations and delivery sequences
	// (lib.lua next_stamp).
	hwm  string
	rate string
	// wake is the shard's wake-up channel on a Redis Cluster (sharded
	// pub/sub: in the slot of the shard's keys; wakeups.go).
	wake string
	// trace prefixes the trace-context keys (traceKey).
	trace string
	// request prefixes the request records (requestKey).
	request string
	// history is the stream of task events of delayd before histories
	// were kept per incarnation, and the prefix of historyOf's keys; only
	// used on shard 0's keys.
	history string
	// sched, schedIDs and schedNext are the schedules whose ids fall in
	// this shard (schedules.go).
	sched, schedIDs, schedNext string
}

// requestKey is the record of the request with id req in this shard (the
// call head's first key; docs/ARCHITECTURE.md, "The Lua library"). With no
// id it is a key never written.
func (k nsKeys) requestKey(req string) string { return k.request + req }

// holdsTasks reports whether key is one of a namespace shard's keys that
// hold its tasks (due, inflight, dead, meta, body, acked, the legacy task
// HASH) or durable mode's indexed marker: the keys by which Namespaces
// knows a namespace is there. Every other per-namespace key either
// outlives the tasks (life, hwm, history, schedules, subscriber sets) or
// expires on its own (request records, trace keys, rate buckets).
func holdsTasks(key string) bool {
	_, kind, ok := strings.Cut(key, "}:")
	if !ok {
		return false
	}
	switch kind {
	case "due", "inflight", "dead", "meta", "body", "acked", "task", "indexed":
		return true
	}
	return false
}

// traceOf is the trace-context key of task id (in this shard).
func (k nsKeys) traceOf(id string) string { return k.trace + id }

// historyOf is the task event stream of namespace incarnation inc (XADD
// with MAXLEN ~), only used on shard 0's keys: one stream per incarnation
// of a namespace, on its first shard's slot, beside the life key that says
// whether the incarnation has ended.
func (k nsKeys) historyOf(inc int64) string {
	return k.history + ":" + strconv.FormatInt(inc, 10)
}

// historyIDsOf is the index of historyOf(inc): each task id with events in
// the stream, scored by the entry time (ms) of its latest one.
func (k nsKeys) historyIDsOf(inc int64) string { return k.historyOf(inc) + ":ids" }

// historyFirstOf is the other index of historyOf(inc): each task id
// indexed, scored by the entry time (ms) of its first event since.
func (k nsKeys) historyFirstOf(inc int64) string { return k.historyOf(inc) + ":first" }

// hashTag returns "{ns#k}", the hash tag every key of shard k of a
// one-shard namespace ns shares (see shardTag for several shards).
func hashTag(ns string, shard int) string {
	return "{" + ns + "#" + strconv.Itoa(shard) + "}"
}

// keysFor builds the keys of shard k of a namespace ns of one shard (the
// layout of every namespace before sharding; tests). ns must have passed
// storage.ValidateNamespace; shard must be >= 0.
func keysFor(ns string, shard int) nsKeys { return keysForN(ns, shard, 1) }

// keysForN builds the keys of shard k of namespace ns of n shards.
func keysForN(ns string, shard, n int) nsKeys {
	p := keyPrefix + "{" + shardTag(ns, shard, n) + "}:"
	return nsKeys{
		due:      p + "due",
		inflight: p + "inflight",
		dead:     p + "dead",
		meta:     p + "meta",
		body:     p + "body",
		acked:    p + "acked",
		indexed:  p + "indexed",
		life:     p + "life",
		hwm:      p + "hwm",
		legacy:   p + "task",
		rate:     p + "rate",
		wake:     p + "wake",
		trace:    p + "trace:",
		request:  p + "req:",
		history:  p + "history",

		sched:     p + "sched",
		schedIDs:  p + "schedids",
		schedNext: p + "schednext",
	}
}

// scheduleNamespacesKey is the SET of namespaces that have schedules.
const scheduleNamespacesKey = keyPrefix + "schedns"

// traceKey is the trace-context key of task id in shard k of ns.
func traceKey(ns string, shard int, id string) string {
	return keyPrefix + hashTag(ns, shard) + ":trace:" + id
}

// leaderKey is the key of the leader lease called name.
func leaderKey(name string) string {
	return keyPrefix + "lead:" + name
}

// namespaceOfKey returns the namespace a per-namespace key belongs to, and
// false for any other key.
func namespaceOfKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, keyPrefix+"{")
	if !ok {
		return "", false
	}
	end := strings.IndexByte(rest, '}')
	if end < 0 {
		return "", false
	}
	tag := rest[:end]
	hash := strings.LastIndexByte(tag, '#')
	if hash <= 0 {
		return "", false
	}
	return tag[:hash], true
}

// registryTag is the hash tag every registry key shares (one Cluster slot).
const registryTag = "{registry}"

// registryNamespaceKey is the HASH of one namespace. name must be a valid
// namespace name.
func registryNamespaceKey(name string) string { return keyPrefix + registryTag + ":ns:" + name }

// registryNamespaceIndexKey is the ZSET of every namespace name, score 0.
func registryNamespaceIndexKey() string { return keyPrefix + registryTag + ":namespaces" }

// registryBornKey is the HASH of deleted namespaces' create times (ms): a
// namespace re-created under the same name is born later (its incarnation).
func registryBornKey() string { return keyPrefix + registryTag + ":born" }

// registryImportedKey marks a registry durable mode has copied into MySQL.
func registryImportedKey() string { return keyPrefix + registryTag + ":imported" }

// registryKeysKey is the HASH of every API key: id -> key record.
func registryKeysKey() string { return keyPrefix + registryTag + ":keys" }

// registryNamespaceKeysKey is the ZSET of the key ids of namespace ns (a
// valid name, or "*" for the global keys), scored by creation time (ms).
func registryNamespaceKeysKey(ns string) string { return keyPrefix + registryTag + ":nskeys:" + ns }

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// slotOf is the Redis Cluster slot of a hash tag's content: CRC16 (XMODEM,
// as Redis's cluster.c) modulo 16384.
func slotOf(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// tagCache holds shardTag's answers: (ns, k, n) -> tag content.
var tagCache sync.Map

type tagKey struct {
	ns   string
	k, n int
}

// shardTag is the hash tag content of shard k of a namespace of n shards.
// One shard: "ns#0", the layout of every namespace before sharding. Several:
// "ns#k" if its slot falls in the k-th of n equal slices of the slot space,
// else "ns#k~s" with the smallest s >= 1 that does. So the shards of a
// namespace spread evenly over the slot space, and a cluster whose masters
// own equal slot ranges (as `redis-cli --cluster create` makes them) gets
// an even share of every namespace's shards: 6 shards on 3 masters are 2
// on each, where plain CRC16 of "ns#k" would leave a master without any
// about one time in four.
func shardTag(ns string, k, n int) string {
	if n <= 1 {
		return ns + "#" + strconv.Itoa(k)
	}
	key := tagKey{ns, k, n}
	if v, ok := tagCache.Load(key); ok {
		return v.(string)
	}
	lo, hi := k*clusterSlots/n, (k+1)*clusterSlots/n
	base := ns + "#" + strconv.Itoa(k)
	tag := base
	for s := 1; ; s++ {
		if slot := slotOf(tag); slot >= lo && slot < hi {
			break
		}
		tag = base + "~" + strconv.Itoa(s)
	}
	tagCache.Store(key, tag)
	return tag
}
