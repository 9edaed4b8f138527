package schedule

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"sync"

	// The tz database is embedded in the binary, so zones resolve in the
	// scratch image too (no /usr/share/zoneinfo there).
	_ "time/tzdata"
)

// EmbeddedTZData is the release of the tz database embedded in the binary
// (time/tzdata of the Go toolchain in go.mod; a test checks it against the
// toolchain's lib/time/update.bash).
const EmbeddedTZData = "2025c"

// zoneDirs are where Go's time package looks for zone files before it
// falls back to the embedded copy (time/zoneinfo_unix.go).
var zoneDirs = []string{"/usr/share/zoneinfo/", "/usr/share/lib/zoneinfo/", "/usr/lib/locale/TZ/", "/etc/zoneinfo/"}

var tzVersion = sync.OnceValue(func() string {
	if z := os.Getenv("ZONEINFO"); z != "" {
		return "ZONEINFO=" + z
	}
	for _, dir := range zoneDirs {
		if _, err := os.Stat(filepath.Join(dir, "UTC")); err != nil {
			continue
		}
		if v := tzdataZiVersion(filepath.Join(dir, "tzdata.zi")); v != "" {
			return v + " (system, " + dir + ")"
		}
		return "unknown (system, " + dir + ")"
	}
	return EmbeddedTZData + " (embedded)"
})

// TZDataVersion says which tz database release resolves time zones in this
// process, as Go's time package picks it: the zones of $ZONEINFO, else the
// host's zoneinfo directory (its tzdata.zi names the release), else the
// copy embedded in the binary (EmbeddedTZData), e.g. "2025c (embedded)".
func TZDataVersion() string { return tzVersion() }

// tzdataZiVersion reads "# version 2025b" from the first line of a
// tzdata.zi file; "" when there is none.
func tzdataZiVersion(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# version "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
