//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/delayd/delayd/internal/testkit"
)

// TestMakeRunCtrlC: `make run` in a terminal, stopped with Ctrl-C as a
// person stops it, ends cleanly: delayd shuts down, make exits 0 and prints
// no "make: *** ... Error" (it used to, since `go run` exits 1 on SIGINT and
// make itself got the SIGINT too). It serves reflection, which delayd does
// only when asked (--reflection). The terminal is a pseudo-terminal whose
// Ctrl-C byte the kernel turns into SIGINT for the foreground process group.
func TestMakeRunCtrlC(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is not installed: %v", err)
	}
	// The other tests' build of delayd first, and make run's with the same
	// flags (-race under go test -race): it then finds every package
	// compiled in the cache and only links, instead of compiling them all a
	// second time beside the other tests. Its binary goes to a directory of
	// the test's own (BIN), not over the developer's bin/delayd.
	buildBinary(t)
	goflags := os.Getenv("GOFLAGS")
	if testkit.Race {
		goflags = strings.TrimSpace(goflags + " -race")
	}
	testkit.Inputs(t, "../..", "Makefile", "scripts/run-foreground.sh") // make's
	master, slave := openPTY(t)
	cmd := exec.Command("make", "--no-print-directory", "run", "BIN="+t.TempDir(),
		"RUN_FLAGS=--listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --ops-listen 127.0.0.1:0")
	cmd.Dir = "../.."
	for _, kv := range os.Environ() { // not the caller's DELAYD_* nor the make test's jobserver
		if !strings.HasPrefix(kv, "DELAYD_") && !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") && !strings.HasPrefix(kv, "GOFLAGS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "GOFLAGS="+goflags)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	var out ptyOutput
	go out.read(master)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	deadline := time.Now().Add(5 * time.Minute) // make run builds delayd first
	for !strings.Contains(out.String(), `msg="delayd serving"`) {
		select {
		case err := <-done:
			t.Fatalf("make run ended before serving (%v):\n%s", err, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("make run did not serve within 5 minutes:\n%s", out.String())
		}
	}
	if _, err := master.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("make run still running 2 minutes after Ctrl-C:\n%s", out.String())
	}
	time.Sleep(100 * time.Millisecond) // the last output
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	log := out.String()
	if err != nil || strings.Contains(log, "make: ***") || !strings.Contains(log, "delayd stopped cleanly") {
		t.Fatalf("Ctrl-C on make run: %v; want exit 0, a clean stop and no make error:\n%s", err, log)
	}
	// Reflection is off by default (it needs no key); make run, for local
	// use, turns it on so grpcurl works as the README shows.
	if !strings.Contains(log, "reflection=true") {
		t.Errorf("make run served without reflection; want --reflection on:\n%s", log)
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatalf("unlockpt: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatalf("ptsname: %v", e)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}

// ptyOutput collects what a pseudo-terminal's programs write.
type ptyOutput struct {
	mu sync.Mutex
	b  strings.Builder
}

func (o *ptyOutput) read(f *os.File) {
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		o.mu.Lock()
		o.b.Write(buf[:n])
		o.mu.Unlock()
		if err != nil {
			return // EIO once every program has closed the terminal
		}
	}
}

func (o *ptyOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
