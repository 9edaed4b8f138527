package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// builds are the commands Build made in this process, by import path.
var builds struct {
	sync.Mutex
	dir string               // holds every binary; removed by RemoveBuilt
	m   map[string]*building // import path → its build
}

type building struct {
	once     sync.Once
	bin, err string
}

// Build builds the command at import path pkg (e.g.
// "github.com/delayd/delayd/cmd/delayd") once per test process and returns
// the binary's path. When the test binary runs with -race, so does the
// command: its packages are then the ones go test -race already
// compiled, so the build is a link, and a data race
// in the process fails whoever reads its output. The binary and its
// directory (0755) may be run by any user, e.g. a test that drops to a
// deployment's uid. testkit.Main removes them at the end; a TestMain of
// its own calls RemoveBuilt. Safe for concurrent use.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	builds.Lock()
	if builds.m == nil {
		builds.m = map[string]*building{}
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "delayd-bin-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			builds.Unlock()
			t.Fatalf("testkit.Build: %v", err)
		}
		builds.dir = dir
	}
	b := builds.m[pkg]
	if b == nil {
		b = &building{}
		builds.m[pkg] = b
	}
	dir := builds.dir
	builds.Unlock()

	b.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			b.err = fmt.Sprintf("go tool not in PATH: %v", err)
			return
		}
		// A directory per package, so the binary keeps its own name
		// (delayd, delayctl) whatever else is built beside it.
		sub := filepath.Join(dir, strings.ReplaceAll(pkg, "/", "_"))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.err = err.Error()
			return
		}
		out := filepath.Join(sub, path.Base(pkg))
		args := []string{"build", "-o", out}
		if Race {
			args = append(args, "-race")
		}
		if msg, err := exec.Command(goBin, append(args, pkg)...).CombinedOutput(); err != nil {
			b.err = fmt.Sprintf("go build %s: %v\n%s", pkg, err, msg)
			return
		}
		if err := statSources(goBin, pkg); err != nil {
			b.err = err.Error()
			return
		}
		b.bin = out
	})
	if b.err != "" {
		t.Fatal(b.err)
	}
	return b.bin
}

// statSources stats every file of this module that pkg is built from (Go
// and embedded files of pkg and of the module's packages it imports). go
// test caches a test's result by its binary and the files the test
// opened or statted; a command built by a go build of its own is in
// neither, so without this a change to, say, cmd/delayctl's main.go left
// a cached result of a test that runs delayctl in place.
func statSources(goBin, pkg string) error {
	const tmpl = `{{if and .Module .Module.Main}}{{$d := .Dir}}` +
		`{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}`
	out, err := exec.Command(goBin, "list", "-deps", "-f", tmpl, pkg).Output()
	if err != nil {
		return fmt.Errorf("go list -deps %s: %v", pkg, err)
	}
	for f := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		_, _ = os.Stat(f)
	}
	return nil
}

// RemoveBuilt deletes what Build made. testkit.Main calls it; a package
// with a TestMain of its own calls it after m.Run.
func RemoveBuilt() {
	builds.Lock()
	defer builds.Unlock()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
		builds.dir, builds.m = "", nil
	}
}
