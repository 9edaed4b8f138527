package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit"
)

// TestReadmeQuickTour runs the README's "Quick tour" as written against a
// delayd in embedded mode with its HTTP edge, as a newcomer runs it after
// `make run`: every delayctl line (but tail, which runs until
// interrupted; ctl's tests watch it), then the curl block — upsert, get,
// remove, the error the comment shows, and the streamed Subscribe, which
// must print a delivery. Only the addresses (localhost:7070 and :7071) are
// the test server's, and delayctl is built from this tree (with -race
// when the test is).
func TestReadmeQuickTour(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("curl is not installed; the README's HTTP/JSON examples use it (Debian: apt-get install curl): %v", err)
	}
	dir := t.TempDir()
	shim := filepath.Dir(testkit.Build(t, "github.com/delayd/delayd/cmd/delayctl"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Config{Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", Reflection: true}, testkit.Logger(t)) // embedded, reflection on, as make run
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})

	ctlBlock, curlBlock := quickTourBlocks(t)
	addrs := strings.NewReplacer("localhost:7070", d.Addr(), "localhost:7071", d.HTTPAddr())
	// delayctl's lines name no address: DELAYD_ADDR stands for its
	// default, localhost:7070.
	env := []string{"PATH=" + shim + ":" + os.Getenv("PATH"), "HOME=" + dir, "DELAYD_ADDR=" + d.Addr()}
	sh := func(script string) (string, error) {
		cmd := exec.CommandContext(ctx, "bash", "-c", addrs.Replace(script))
		cmd.Env, cmd.Dir = env, dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	for _, line := range quickTourCtlLines(t, ctlBlock) {
		out, err := sh(line)
		if err != nil {
			t.Errorf("%s\n%s(%v)", line, out, err)
		}
	}

	// The curl block: unary calls first, then the streamed Subscribe.
	unary, stream, ok := strings.Cut(curlBlock, "\n# A streamed Subscribe")
	if !ok {
		t.Fatal("the curl block has no streamed Subscribe")
	}
	stream = "# A streamed Subscribe" + stream
	out, err := sh(unary)
	if err != nil {
		t.Fatalf("curl upsert, get, remove: %v\n%s", err, out)
	}
	// protojson varies its spaces from build to build: compare without.
	for _, want := range []string{`"id":"order-42"`, `"created":true`, `"payload":"eyJvcmRlciI6NDJ9"`, `{"removed":true,"previousState":"TASK_STATE_SCHEDULED"}`} {
		if !strings.Contains(strings.ReplaceAll(out, " ", ""), want) {
			t.Errorf("curl upsert, get, remove printed no %s:\n%s", want, out)
		}
	}
	// The error the README shows, after the remove: its status and body.
	m := regexp.MustCompile(`(?m)^# (\d{3}) (\{.*\})$`).FindStringSubmatch(unary)
	if m == nil {
		t.Fatal("the curl block shows no error answer")
	}
	get := regexp.MustCompile(`(?s)curl -s [^\n]*GetTask.*?\n[^\n]*\n`).FindString(unary)
	out, err = sh(strings.Replace(strings.TrimSpace(get), "curl -s ", "curl -s -w ' %{http_code}' ", 1))
	if err != nil || out != m[2]+" "+m[1] {
		t.Errorf("GetTask after the remove: %q (%v), the README says %s %s", out, err, m[1], m[2])
	}

	cmd := exec.Command("bash", "-c", addrs.Replace(stream))
	cmd.Env, cmd.Dir = env, dir
	var subOut testkit.SyncBuffer
	cmd.Stdout, cmd.Stderr = &subOut, &subOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the streamed Subscribe printed:\n%q", subOut.String())
		}
	})
	// Due now: it waits for the subscriber if curl has not subscribed yet.
	if out, err := sh(`delayctl task upsert orders order-44 --delay 0s --kind order.close --payload '{"order":44}'`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	testkit.Eventually(t, time.Minute, "the streamed Subscribe to print the delivery", func() bool {
		return strings.Contains(strings.ReplaceAll(subOut.String(), " ", ""), `{"delivery":{"task":{"namespace":"orders","id":"order-44"`)
	})
	if !strings.Contains(subOut.String(), `"token":"`) {
		t.Errorf("the delivery has no token to ack with:\n%s", subOut.String())
	}
}

// quickTourBlocks are the README Quick tour's delayctl and curl blocks.
func quickTourBlocks(t *testing.T) (ctlBlock, curlBlock string) {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	i := strings.Index(text, "\n## Quick tour")
	if i < 0 {
		t.Fatal("README has no Quick tour section")
	}
	text = text[i+1:]
	text = text[:strings.Index(text, "\n## ")]
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
		switch {
		case strings.Contains(m[1], "delayctl task upsert"):
			ctlBlock = m[1]
		case strings.Contains(m[1], "curl "):
			curlBlock = m[1]
		}
	}
	if ctlBlock == "" || curlBlock == "" {
		t.Fatalf("the Quick tour lacks its delayctl or curl block; has its layout changed?")
	}
	return ctlBlock, curlBlock
}

// quickTourCtlLines are the delayctl lines of the Quick tour's block, in
// order, but tail, which runs until interrupted (ctl's tests watch it).
func quickTourCtlLines(t *testing.T, ctlBlock string) []string {
	t.Helper()
	var lines []string
	for _, line := range strings.Split(ctlBlock, "\n") {
		if strings.HasPrefix(line, "delayctl ") && !strings.HasPrefix(line, "delayctl tail ") {
			lines = append(lines, line)
		}
	}
	if len(lines) < 8 {
		t.Fatalf("found %d delayctl lines in the Quick tour; has its layout changed?", len(lines))
	}
	return lines
}
