// Package buildinfo tells which delayd this is: the version and commit set
// with -ldflags by `make build`, completed from the module and VCS data the
// Go toolchain embeds (runtime/debug.ReadBuildInfo), and the Go version.
// `delayd --version`, the delayd_build_info gauge and the first log line
// all read Get.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set at link time by `make build`:
//
//	go build -ldflags "-X github.com/delayd/delayd/buildinfo.version=v1.2.3 -X github.com/delayd/delayd/buildinfo.commit=abc123"
var (
	version string
	commit  string
)

// Info identifies a build.
type Info struct {
	// Version is the release (from -ldflags, else the main module's version
	// as `go install module@version` records it); "devel" when unknown.
	Version string
	// Commit is the VCS revision (from -ldflags, else vcs.revision, with
	// "-dirty" when the tree had local changes); "unknown" when neither.
	Commit string
	// GoVersion is the Go toolchain that built the binary, e.g. "go1.26.8".
	GoVersion string
}

// Get returns this binary's build information.
func Get() Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			var rev, dirty string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					if s.Value == "true" {
						dirty = "-dirty"
					}
				}
			}
			if rev != "" {
				info.Commit = rev + dirty
			}
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the one line `delayd --version` prints.
func (i Info) String() string {
	return i.Line("delayd")
}

// Line is the one line a program's --version prints: "delayctl v0.3.0
// (commit 1a2b3c…, go1.26.8)".
func (i Info) Line(program string) string {
	return program + " " + i.Version + " (commit " + i.Commit + ", " + i.GoVersion + ")"
}
