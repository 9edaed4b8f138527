package redisstore

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one file each under lua/. Every script opens with a
// header documenting its KEYS, ARGV and return value. lua/lib.lua holds the
// helpers they share (the record layout, the clock, backoff) and is
// prepended to each, so every script is still one self-contained chunk run
// with Script.Run (EVALSHA, falling back to EVAL after a Redis restart).
//
//go:embed lua/*.lua
var luaFS embed.FS

// scripts are the compiled scripts; built once per process, shared by every
// Store (a redis.Script is immutable and safe for concurrent use).
var scripts = struct {
	upsert, get, remove, list       *redis.Script
	removeTasks                     *redis.Script
	pop, ack, nack, extend, reap    *redis.Script
	requeue, purge, stats, nextWake *redis.Script
	dueKinds                        *redis.Script
	restore, generations, tryLead   *redis.Script
	forget, clearAcked, migrate     *redis.Script
	peekDue, rateTake               *redis.Script
	forecast                        *redis.Script
}{
	upsert:      load("upsert"),
	get:         load("get"),
	remove:      load("remove"),
	removeTasks: load("removetasks"),
	list:        load("list"),
	pop:         load("pop"),
	ack:         load("ack"),
	nack:        load("nack"),
	extend:      load("extend"),
	reap:        load("reap"),
	requeue:     load("requeue"),
	purge:       load("purge"),
	stats:       load("stats"),
	dueKinds:    load("duekinds"),
	nextWake:    load("nextwake"),
	restore:     load("restore"),
	generations: load("generations"),
	tryLead:     load("trylead"),
	forget:      load("forget"),
	clearAcked:  load("clearacked"),
	migrate:     load("migrate"),
	peekDue:     load("peekdue"),
	rateTake:    load("ratetake"),
	forecast:    load("forecast"),
}

// load returns lib.lua + name.lua as one script. The files are embedded, so
// a missing one is a build mistake and panics at init.
func load(name string) *redis.Script {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err)
	}
	src, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(lib) + "\n" + string(src))
}
