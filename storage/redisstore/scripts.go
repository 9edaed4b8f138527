package redisstore

// The entry points of the Lua library (library.go builds it from lua/),
// named once for the calls that run them. Every file under lua/ but
// lib.lua is an entry; those that change nothing are listed in
// readOnlyEntries, so they are flagged no-writes and run with FCALL_RO.

// readOnlyEntries are the entries that only read.
var readOnlyEntries = []string{"get", "list", "stats", "nextwake", "peekdue", "duekinds", "forecast", "generations", "schedule_due"}

// scripts are the task index's entries.
var scripts = struct {
	upsert, get, remove, list       *entry
	removeTasks                     *entry
	pop, settle, extend, reap       *entry
	requeue, purge, stats, nextWake *entry
	dueKinds                        *entry
	restore, generations, tryLead   *entry
	forget, clearAcked, migrate     *entry
	peekDue, rateTake               *entry
	forecast, subscribers           *entry
}{
	upsert:      entryOf("upsert"),
	get:         entryOf("get"),
	remove:      entryOf("remove"),
	removeTasks: entryOf("removetasks"),
	list:        entryOf("list"),
	pop:         entryOf("pop"),
	settle:      entryOf("settle"),
	extend:      entryOf("extend"),
	reap:        entryOf("reap"),
	requeue:     entryOf("requeue"),
	purge:       entryOf("purge"),
	stats:       entryOf("stats"),
	dueKinds:    entryOf("duekinds"),
	nextWake:    entryOf("nextwake"),
	restore:     entryOf("restore"),
	generations: entryOf("generations"),
	tryLead:     entryOf("trylead"),
	forget:      entryOf("forget"),
	clearAcked:  entryOf("clearacked"),
	migrate:     entryOf("migrate"),
	peekDue:     entryOf("peekdue"),
	rateTake:    entryOf("ratetake"),
	forecast:    entryOf("forecast"),
	subscribers: entryOf("subscribers"),
}

// registryScripts are the registry's entries (registry.go).
var registryScripts = struct {
	nsCreate, nsUpdate, nsDelete *entry
	keyCreate, keyRevoke         *entry
	dropNamespace                *entry
}{
	nsCreate:      entryOf("registry_ns_create"),
	nsUpdate:      entryOf("registry_ns_update"),
	nsDelete:      entryOf("registry_ns_delete"),
	keyCreate:     entryOf("registry_key_create"),
	keyRevoke:     entryOf("registry_key_revoke"),
	dropNamespace: entryOf("dropnamespace"),
}
