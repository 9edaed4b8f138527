//go:build shipimage

package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/testkit"
)

// TestImage runs the image make image built (DELAYD_TEST_IMAGE, set by make
// test-image) in durable mode against a private redis-server and a database
// of the host's MariaDB (--network host): it answers /readyz and gRPC
// (an authenticated upsert and get), its HEALTHCHECK (delayctl ready)
// reports healthy, it runs as 65532, and docker stop's SIGTERM ends it
// cleanly with exit 0.
func TestImage(t *testing.T) {
	image := os.Getenv("DELAYD_TEST_IMAGE")
	if image == "" {
		t.Fatal("DELAYD_TEST_IMAGE is not set: run `make test-image`, which builds the image and sets it")
	}
	docker := func(args ...string) (string, error) {
		out, err := exec.Command("docker", args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := docker("version", "--format", "{{.Server.Version}}"); err != nil {
		t.Fatalf("no Docker daemon answers (start dockerd): %v\n%s", err, out)
	}

	rs := testkit.StartRedis(t)
	dsn := testkit.Database(t, "image")
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	opsAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	const adminKey = "image-test-admin-key-0123456789abcdef"
	name := "delayd-image-test-" + testkit.Suffix()

	out, err := docker("run", "-d", "--name", name, "--network", "host",
		"-e", "DELAYD_REDIS_URL="+rs.URL+"/0",
		"-e", "DELAYD_MYSQL_DSN="+dsn,
		"-e", "DELAYD_ADMIN_KEY="+adminKey,
		"-e", "DELAYD_LISTEN="+grpcAddr,
		"-e", "DELAYD_HTTP_LISTEN=",
		"-e", "DELAYD_OPS_LISTEN="+opsAddr,
		// The image's own HEALTHCHECK command (delayctl ready, which finds
		// the ops listener from DELAYD_OPS_LISTEN), checked every second.
		"--health-interval", "1s", "--health-start-period", "1s",
		image)
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := docker("logs", name)
			t.Logf("container log:\n%s", logs)
		}
		_, _ = docker("rm", "-f", name)
	})

	testkit.Eventually(t, 60*time.Second, "/readyz to answer 200", func() bool {
		resp, err := http.Get("http://" + opsAddr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) == "ready"
	})

	c, err := client.New(grpcAddr, client.WithAPIKey(adminKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const ns = "image-test" // private Redis and database: no clean-up needed
	if _, err := c.Admin().CreateNamespace(ctx, ns, client.Policy{}); err != nil {
		t.Fatalf("CreateNamespace over gRPC: %v", err)
	}
	if _, err := c.Upsert(ctx, ns, client.TaskSpec{ID: "t1", Payload: []byte("hi"), When: client.After(time.Hour)}); err != nil {
		t.Fatalf("Upsert over gRPC: %v", err)
	}
	task, err := c.Get(ctx, ns, "t1")
	if err != nil || string(task.Payload) != "hi" {
		t.Fatalf("Get over gRPC: %+v, %v", task, err)
	}

	// The image's HEALTHCHECK command, run by the engine.
	testkit.Eventually(t, 60*time.Second, "docker to report the container healthy", func() bool {
		out, _ := docker("inspect", "--format", "{{.State.Health.Status}}", name)
		return out == "healthy"
	})
	if out, _ := docker("inspect", "--format", "{{.Config.User}}", name); out != "65532:65532" {
		t.Errorf("container user %q, want 65532:65532", out)
	}

	// docker stop sends SIGTERM and waits -t seconds before SIGKILL, which
	// would exit 137.
	if out, err := docker("stop", "-t", "30", name); err != nil {
		t.Fatalf("docker stop: %v\n%s", err, out)
	}
	if out, _ := docker("inspect", "--format", "{{.State.ExitCode}}", name); out != "0" {
		t.Errorf("exit code after SIGTERM %s, want 0", out)
	}
	if logs, _ := docker("logs", name); !strings.Contains(logs, "delayd stopped cleanly") {
		t.Errorf("the log does not say delayd stopped cleanly:\n%s", logs)
	}
}
