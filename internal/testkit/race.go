//go:build race

package testkit

import "os"

// Race reports that this binary was built with -race; Build then builds
// with it too, and tests that run a build of their own follow it.
const Race = true

// A -race binary sleeps a second when it exits (GORACE's atexit_sleep_ms,
// 1000 by default), so that other goroutines may still report a race: a
// test that runs delayctl, grpcurl or delayd (Build: -race builds) a few
// dozen times waited that long for each (TestReadmeTour: 75 s, 45 s
// without). The commands a test starts with this process's environment
// exit at once unless GORACE says otherwise; a race they detect is still
// reported when it happens, and fails the test that reads their output.
// (make test sets GORACE for the test binaries themselves, which read it
// before this runs.)
func init() {
	if _, ok := os.LookupEnv("GORACE"); !ok {
		_ = os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
}
