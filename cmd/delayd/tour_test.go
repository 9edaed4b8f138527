package main

import (
	"bytes"
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

// TestReadmeTour runs the README's grpcurl tour ("Try it with grpcurl" and
// "Subscribing") as written, block by block, with bash, against a delayd
// in embedded mode — as a newcomer runs it after `make run`, with the real
// grpcurl at the version go.mod pins (grpcurlDir). Only two things differ:
// localhost:7070 is the test server's address, and /tmp/ is the test's own
// directory. Terminal 1's subscriber runs in the background. The test checks that no call fails and that each
// step answers what the README says it answers. The README is read top to
// bottom: the Quick tour's delayctl lines run first, on the same delayd,
// as a reader who did them has run them (its create-only order-43 once made
// the grpcurl section's create-only upsert answer ALREADY_EXISTS).
func TestReadmeTour(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tools := grpcurlDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := daemon.Start(ctx, daemon.Config{Listen: "127.0.0.1:0", Reflection: true}, testkit.Logger(t)) // embedded, reflection on, as make run
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, sec := range []struct{ from, to string }{
		{"\n## Try it with grpcurl\n", "\n## "},
		{"\n## Subscribing\n", "The rules a subscriber can count on"},
	} {
		text := string(readme)
		i := strings.Index(text, sec.from)
		if i < 0 {
			t.Fatalf("README has no %q section", strings.TrimSpace(sec.from))
		}
		text = text[i+len(sec.from):]
		if j := strings.Index(text, sec.to); j >= 0 {
			text = text[:j]
		}
		for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
			if !strings.Contains(m[1], "go install") {
				blocks = append(blocks, m[1])
			}
		}
	}
	if len(blocks) < 6 {
		t.Fatalf("found %d tour blocks in the README; has its layout changed?", len(blocks))
	}

	// The Quick tour before it, on the same delayd (its curl lines leave
	// nothing behind: they remove what they upsert).
	ctlBlock, _ := quickTourBlocks(t)
	ctlDir := filepath.Dir(testkit.Build(t, "github.com/delayd/delayd/cmd/delayctl"))
	for _, line := range quickTourCtlLines(t, ctlBlock) {
		cmd := exec.Command("bash", "-c", line)
		cmd.Env = []string{"PATH=" + ctlDir + ":" + os.Getenv("PATH"), "HOME=" + dir, "DELAYD_ADDR=" + d.Addr()}
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the Quick tour's %s, before the grpcurl tour: %v\n%s", line, err, out)
		}
	}

	tmp := filepath.Join(dir, "tmp") + "/"
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+tools+":"+os.Getenv("PATH"))
	verbatim := func(block string) string {
		return strings.NewReplacer("localhost:7070", d.Addr(), "/tmp/", tmp).Replace(block)
	}
	deliveries := filepath.Join(tmp, "deliveries.json")
	upserted := regexp.MustCompile(`"namespace": "demo", "id": "([^"]+)"[^\n]*\n\s*[^\n]*UpsertTask`)
	var all strings.Builder
	for n, block := range blocks {
		if strings.Contains(block, "DeliveryService/Subscribe | tee") { // terminal 1
			cmd := exec.Command("bash", "-c", verbatim(block))
			cmd.Env, cmd.Dir = env, dir
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
			testkit.Eventually(t, time.Minute, "terminal 1's subscriber to start", func() bool {
				_, err := os.Stat(deliveries)
				return err == nil
			})
			time.Sleep(time.Second) // subscribed before the first upsert
			continue
		}
		cmd := exec.Command("bash", "-c", verbatim(block))
		cmd.Env, cmd.Dir = env, dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("tour block %d still running after 2 minutes:\n%s\n--- output:\n%s", n, block, out.String())
		}
		// grpcurl's failures: an error answer ("ERROR:\n  Code: ..."), a
		// request it cannot read ("Error invoking method ..."), or no
		// server ("Failed to dial target host ...").
		if failed := regexp.MustCompile(`ERROR:|Error:|Error invoking|Failed to`); failed.MatchString(out.String()) {
			t.Fatalf("tour block %d failed:\n%s\n--- output:\n%s", n, block, out.String())
		}
		all.WriteString(out.String())
		// The README's next step reads the delivery from terminal 1's file:
		// wait for it as the reader does ("Five seconds later ...").
		for _, m := range upserted.FindAllStringSubmatch(block, -1) {
			testkit.Eventually(t, time.Minute, "terminal 1 to print the delivery of "+m[1], func() bool {
				b, _ := os.ReadFile(deliveries)
				return bytes.Contains(b, []byte(`"id": "`+m[1]+`"`))
			})
		}
	}
	for _, want := range []string{
		`"removed": true`, `"previousState": "TASK_STATE_SCHEDULED"`, `"status": "SERVING"`, // grpcurl basics
		`"status": "TOKEN_STATUS_OK"`,                                  // the ack
		`"lastError": "payment service down"`,                          // the nack, read back by GetTask
		`"state": "TASK_STATE_DEAD"`, `"lastError": "order not found"`, // the dead letter
		`"dead": "1"`, // its count
	} {
		if !strings.Contains(all.String(), want) {
			t.Errorf("the tour's output lacks %s:\n%s", want, all.String())
		}
	}
}
