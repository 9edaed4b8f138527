package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// grpcurlTool is grpcurl as go.mod pins it (a tool dependency: `go get
// -tool github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3`). The README
// tells a newcomer to install that same version, and the docs tests run
// their grpcurl lines with it, so a line the real tool refuses fails here.
const grpcurlTool = "github.com/fullstorydev/grpcurl/cmd/grpcurl"

// grpcurlBuilt is the grpcurl binary the tests share, built once
// (grpcurlDir) into a directory TestMain removes.
var grpcurlBuilt struct {
	once sync.Once
	dir  string
	err  error
}

// grpcurlDir builds the pinned grpcurl once per test process and returns
// the directory holding it, for the front of a shell's PATH. The go build
// cache keeps it: after the first build it is a link. Not -race: it is a
// tool the docs run, not delayd's code.
func grpcurlDir(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not in PATH: %v", err)
	}
	grpcurlBuilt.once.Do(func() {
		if grpcurlBuilt.dir, grpcurlBuilt.err = os.MkdirTemp("", "delayd-grpcurl-"); grpcurlBuilt.err != nil {
			return
		}
		out, err := exec.Command(goBin, "build", "-o", filepath.Join(grpcurlBuilt.dir, "grpcurl"), grpcurlTool).CombinedOutput()
		if err != nil {
			grpcurlBuilt.err = fmt.Errorf("go build %s (the version go.mod pins): %v\n%s", grpcurlTool, err, out)
		}
	})
	if grpcurlBuilt.err != nil {
		t.Fatal(grpcurlBuilt.err)
	}
	return grpcurlBuilt.dir
}
