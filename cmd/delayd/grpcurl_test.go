package main

import (
	"path/filepath"
	"testing"

	"github.com/delayd/delayd/internal/testkit"
)

// grpcurlTool is grpcurl as go.mod pins it (a tool dependency: `go get
// -tool github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3`). The README
// tells a newcomer to install that same version, and the docs tests run
// their grpcurl lines with it, so a line the real tool refuses fails here.
const grpcurlTool = "github.com/fullstorydev/grpcurl/cmd/grpcurl"

// grpcurlDir builds the pinned grpcurl once per test process and returns
// the directory holding it, for the front of a shell's PATH. It is built
// as testkit.Build builds delayd, with -race under go test -race: gRPC,
// protobuf and the standard library are then the packages the tests have
// compiled already, where a plain build compiled them all a second time
// without -race on a cold cache (grpcurl needs 545 packages: the 212 of
// the standard library and 130 of the 333 others are ones the tests use).
func grpcurlDir(t *testing.T) string {
	t.Helper()
	return filepath.Dir(testkit.Build(t, grpcurlTool))
}
