package redisstore

import (
	"strconv"
	"strings"
)

// This file is the only place Redis keys and channels are built: read it to
// see the whole key space.
//
// Per namespace ns and shard k (one shard, k = 0, for now), every key shares
// the hash tag {ns#k}, so each script's keys sit in one Redis Cluster slot:
//
//	delayd:{ns#k}:due       ZSET  task id -> due time (Unix ms)
//	delayd:{ns#k}:inflight  ZSET  task id -> lease deadline (Unix ms)
//	delayd:{ns#k}:dead      ZSET  task id -> time it died (Unix ms)
//	delayd:{ns#k}:task      HASH  task id -> task record (see record.go)
//	delayd:{ns#k}:indexed   STRING  present once durable mode has indexed ns
//
// Global:
//
//	delayd:wake             pub/sub channel; message = namespace name
//	delayd:lead:<name>      STRING leader lease, value = holder
//
// Namespaces are validated with storage.ValidateNamespace before they reach
// these functions ([a-z0-9][a-z0-9_-]*), so no name can open or close a hash
// tag. Task ids are never part of a key, only ZSET members and HASH fields.

const (
	keyPrefix = "delayd:"
	// nsScanPattern matches every per-namespace key (SCAN MATCH syntax).
	nsScanPattern = keyPrefix + "{*"
	// DefaultWakeChannel is the pub/sub channel of wake-ups unless
	// Options.WakeChannel says otherwise.
	DefaultWakeChannel = keyPrefix + "wake"
)

// nsKeys are the keys of one shard of one namespace.
type nsKeys struct {
	due      string
	inflight string
	dead     string
	task     string
	indexed  string
}

// hashTag returns "{ns#k}", the hash tag every key of shard k of ns shares.
func hashTag(ns string, shard int) string {
	return "{" + ns + "#" + strconv.Itoa(shard) + "}"
}

// keysFor builds the keys of shard k of namespace ns. ns must have passed
// storage.ValidateNamespace; shard must be >= 0.
func keysFor(ns string, shard int) nsKeys {
	p := keyPrefix + hashTag(ns, shard) + ":"
	return nsKeys{
		due:      p + "due",
		inflight: p + "inflight",
		dead:     p + "dead",
		task:     p + "task",
		indexed:  p + "indexed",
	}
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
