package redisstore

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Lua library (docs/ARCHITECTURE.md, "The Lua library"): lua/lib.lua
// and one file per entry point, built once per process into
//   - one Redis Functions library, "delayd_<version>", every entry the
//     function "delayd_<version>_<entry>" (read-only ones flagged
//     no-writes), for FUNCTION LOAD and FCALL/FCALL_RO on Redis >= 7, and
//   - per entry, one script of the same text (lib.lua, then the entry as a
//     function of (KEYS, ARGV)) for EVALSHA on a server without Functions
//     (miniredis, Redis 6.2).
//
// The version is a hash of the sources, so two delayd versions on one
// Redis call their own functions and never replace each other's. loader.go
// decides which build a client runs and loads the library where it is
// missing.

//go:embed lua/*.lua
var luaFS embed.FS

// libFile is the file of the shared helpers; every other file is an entry.
const libFile = "lib.lua"

// entry is one entry point of the library: a script to run.
type entry struct {
	name     string        // the file's name without ".lua": "pop"
	readOnly bool          // flagged no-writes: FCALL_RO
	fn       string        // its function: "delayd_<version>_<name>"
	script   *redis.Script // its EVALSHA build
}

// library is the whole Lua of the store, built from luaFS.
type library struct {
	name    string // "delayd_<version>"
	version string // 12 hex digits of the SHA-256 of the sources
	text    string // the FUNCTION LOAD source
	entries map[string]*entry
}

// lib is the library of this build of delayd.
var lib = mustBuildLibrary(luaFS, readOnlyEntries)

// mustBuildLibrary builds the library from the lua/ directory of fsys; the
// files are embedded, so a mistake is a build mistake and panics at init.
func mustBuildLibrary(fsys fs.FS, readOnly []string) *library {
	l, err := buildLibrary(fsys, readOnly, "")
	if err != nil {
		panic(err)
	}
	return l
}

// buildLibrary builds the library from the lua/ directory of fsys. version
// overrides the hash of the sources when not empty (tests: a second
// delayd version on one Redis).
func buildLibrary(fsys fs.FS, readOnly []string, version string) (*library, error) {
	helpers, err := fs.ReadFile(fsys, "lua/"+libFile)
	if err != nil {
		return nil, err
	}
	files, err := fs.Glob(fsys, "lua/*.lua")
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	type source struct {
		name, body string
		ro         bool
	}
	var srcs []source
	for _, f := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "lua/"), ".lua")
		if name+".lua" == libFile {
			continue
		}
		if !validEntryName(name) {
			return nil, fmt.Errorf("lua/%s.lua: an entry's name is lower-case letters, digits and '_'", name)
		}
		body, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, source{name: name, body: string(body), ro: slices.Contains(readOnly, name)})
	}
	for _, ro := range readOnly {
		if !slices.ContainsFunc(srcs, func(s source) bool { return s.name == ro }) {
			return nil, fmt.Errorf("read-only entry %q has no lua/%s.lua", ro, ro)
		}
	}
	// The text with a placeholder for the version, hashed to make it.
	const placeholder = "@VERSION@"
	var b strings.Builder
	b.WriteString("#!lua name=delayd_" + placeholder + "\n")
	b.Write(helpers)
	for _, s := range srcs {
		fmt.Fprintf(&b, "\nredis.register_function{function_name='delayd_%s_%s', callback=function(KEYS, ARGV)\n%s\nend", placeholder, s.name, s.body)
		if s.ro {
			b.WriteString(", flags={'no-writes'}")
		}
		b.WriteString("}\n")
	}
	if version == "" {
		sum := sha256.Sum256([]byte(b.String()))
		version = hex.EncodeToString(sum[:])[:12]
	}
	l := &library{
		name:    "delayd_" + version,
		version: version,
		text:    strings.ReplaceAll(b.String(), placeholder, version),
		entries: make(map[string]*entry, len(srcs)),
	}
	for _, s := range srcs {
		// The same function of (KEYS, ARGV) as in the library, called
		// with the script's globals.
		src := string(helpers) + "\nlocal function entry(KEYS, ARGV)\n" + s.body + "\nend\nreturn entry(KEYS, ARGV)\n"
		l.entries[s.name] = &entry{name: s.name, readOnly: s.ro, fn: l.name + "_" + s.name, script: redis.NewScript(src)}
	}
	return l, nil
}

// validEntryName: a function name takes letters, digits and '_'.
func validEntryName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// entryOf is the entry called name; a name with no file is a build
// mistake and panics at init.
func entryOf(name string) *entry {
	e, ok := lib.entries[name]
	if !ok {
		panic(fmt.Sprintf("redisstore: no lua/%s.lua", name))
	}
	return e
}

// ScriptNames maps how a client names each entry point of delayd's Lua
// library on the wire to the entry's name ("pop", "ack",
// "registry_ns_create": its file under lua/ without ".lua"): the function
// an FCALL or FCALL_RO names on Redis >= 7 ("delayd_<version>_pop") and the
// lower-case hex SHA1 an EVALSHA sends on a server without Functions.
// Tools that read Redis's SLOWLOG or MONITOR (cmd/delaybench) split script
// calls by it. A delayd built from other sources has another version and
// other SHAs, so its names are not in the map. Each call builds a new map.
func ScriptNames() map[string]string {
	names := make(map[string]string, 2*len(lib.entries))
	for _, e := range lib.entries {
		names[e.fn] = e.name
		names[e.script.Hash()] = e.name
	}
	return names
}

// LibraryName is the name of this build's Lua library on Redis >= 7:
// "delayd_" and a 12-digit hash of its sources.
func LibraryName() string { return lib.name }

// errorIs reports whether err is a Redis error reply containing text.
func errorIs(err error, text string) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), text)
}

// noFunctions reports whether err says the server does not know FCALL or
// FUNCTION (miniredis, Redis < 7), or that this client may not run them (a
// Redis ACL user without them): then the EVALSHA builds run.
func noFunctions(err error) bool {
	return errorIs(err, "unknown command") || errorIs(err, "NOPERM")
}

// functionMissing reports whether err says the function is not loaded (a
// restart without persistence, FUNCTION FLUSH, a node that never had it).
func functionMissing(err error) bool { return errorIs(err, "Function not found") }

// libraryExists reports whether err is FUNCTION LOAD's answer for a
// library that is already loaded.
func libraryExists(err error) bool { return errorIs(err, "already exists") }
