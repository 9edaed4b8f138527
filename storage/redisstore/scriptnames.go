package redisstore

import (
	"io/fs"
	"strings"
)

// ScriptNames returns the name of every Lua script this package runs (its
// file name under lua/ without ".lua": "pop", "ack", "registry_ns_create")
// keyed by how a client names the script on the wire: the lower-case hex
// SHA1 an EVALSHA sends. Tools that read Redis's SLOWLOG or MONITOR
// (cmd/delaybench) use it to split script calls by name. The SHAs are those
// of the scripts as this build loads them, so a delayd built from other
// sources sends SHAs that are not in the map. Each call builds a new map.
func ScriptNames() map[string]string {
	names := map[string]string{}
	add := func(fsys fs.FS, loadOne func(string) interface{ Hash() string }) {
		files, _ := fs.Glob(fsys, "lua/*.lua")
		for _, f := range files {
			name := strings.TrimSuffix(strings.TrimPrefix(f, "lua/"), ".lua")
			if name == "lib" {
				continue
			}
			names[loadOne(name).Hash()] = name
		}
	}
	add(luaFS, func(n string) interface{ Hash() string } { return load(n) })
	add(registryLuaFS, func(n string) interface{ Hash() string } { return loadRegistryScript(n) })
	return names
}
