package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/delayd/delayd/daemon"
	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/internal/testkit"
)

// docCommand is one shell command of a ```sh block in the README or
// docs/*.md: a line, with its backslash continuations and any quote it
// leaves open joined on.
type docCommand struct {
	file, section, text string
	block               int // index of its block in the file
}

// docShellCommands returns every command of every ```sh block of the
// README and docs/*.md, in order.
func docShellCommands(t *testing.T) []docCommand {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	fence := regexp.MustCompile("(?s)\n```sh\n(.*?)```")
	var out []docCommand
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for n, m := range fence.FindAllStringSubmatchIndex(text, -1) {
			section := text[:m[0]]
			if i := strings.LastIndex(section, "\n## "); i >= 0 {
				section = strings.SplitN(section[i+4:], "\n", 2)[0]
			}
			cmd := ""
			for _, line := range strings.Split(text[m[2]:m[3]], "\n") {
				if cmd == "" && strings.HasPrefix(strings.TrimSpace(line), "#") {
					continue // a comment, whose apostrophes quote nothing
				}
				cmd += line
				if strings.HasSuffix(cmd, "\\") {
					cmd = strings.TrimSuffix(cmd, "\\") + " "
					continue
				}
				if strings.Count(cmd, "'")%2 == 1 { // a quote spans lines
					cmd += "\n"
					continue
				}
				if c := strings.TrimSpace(cmd); c != "" {
					out = append(out, docCommand{file: filepath.Base(f), section: section, text: c, block: n})
				}
				cmd = ""
			}
		}
	}
	return out
}

// readmeTourSections are the README sections TestReadmeTour runs block by
// block, in the order a reader does.
var readmeTourSections = []string{"Try it with grpcurl", "Subscribing"}

// TestDocsGrpcurlCommands runs every grpcurl command of the README and
// docs/*.md that TestReadmeTour does not (the README's push example,
// docs/operating.md's debugging block with its API keys and TLS, the push
// target in docs/push.md) with the real grpcurl go.mod pins, and checks
// that each succeeds. Each runs with bash, after the shell variables its
// block sets before it, against a delayd in embedded mode set up as the
// doc's text says: without authentication for the README's, with an admin
// key (~/.delayd-admin-key), a namespace "orders" and its keys
// ($CONSUMER_KEY, $ORDERS_ADMIN_KEY) for docs/, push allowed to
// hooks.example.com, and for the TLS line a delayd with the certificates
// docs/operating.md's openssl block makes. A Subscribe must print a
// delivery. The README's install line must name the version go.mod pins.
func TestDocsGrpcurlCommands(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("openssl is not installed; the docs make secrets and certificates with it (Debian: apt-get install openssl): %v", err)
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	tools := grpcurlDir(t)
	cmds := docShellCommands(t)

	// The install line names go.mod's version.
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	pinned := regexp.MustCompile(`(?m)^\s*github\.com/fullstorydev/grpcurl (v\S+)`).FindSubmatch(mod)
	if pinned == nil {
		t.Fatal("go.mod pins no grpcurl")
	}
	installs := 0
	for _, c := range cmds {
		if strings.Contains(c.text, "go install "+grpcurlTool+"@") {
			installs++
			if !strings.HasSuffix(c.text, "@"+string(pinned[1])) {
				t.Errorf("%s: %s\n  installs another grpcurl than go.mod's %s, which the tests run", c.file, c.text, pinned[1])
			}
		}
	}
	if installs == 0 {
		t.Error("the docs no longer say how to install grpcurl")
	}

	// docs/operating.md's TLS block, as written, in $HOME.
	var tlsBlock []string
	for _, c := range cmds {
		if c.file == "operating.md" && strings.Contains(c.text, "mkdir -p ~/delayd-tls") {
			tlsBlock = append(tlsBlock, c.text)
			for _, d := range cmds {
				if d.file == c.file && d.block == c.block && d.text != c.text {
					tlsBlock = append(tlsBlock, d.text)
				}
			}
		}
	}
	if len(tlsBlock) < 5 {
		t.Fatal("docs/operating.md has no block making ~/delayd-tls; has its layout changed?")
	}
	env := []string{"PATH=" + tools + ":" + os.Getenv("PATH"), "HOME=" + home}
	bash := func(ctx context.Context, script string, extra ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "bash", "-c", script)
		cmd.Env, cmd.Dir = append(append([]string{}, env...), extra...), home
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := bash(ctx, "set -e\n"+strings.Join(tlsBlock, "\n")).CombinedOutput(); err != nil {
		t.Fatalf("docs/operating.md's certificate block: %v\n%s", err, out)
	}

	const adminKey = "docs-test-admin-key-0123456789abcdef"
	if err := os.WriteFile(filepath.Join(home, ".delayd-admin-key"), []byte(adminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(cfg daemon.Config) *daemon.Daemon {
		cfg.Listen = "127.0.0.1:0"
		d, err := daemon.Start(ctx, cfg, testkit.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_ = d.Stop(ctx)
		})
		return d
	}
	// With reflection on, as make run and the docs' servers start
	// (--reflection) for grpcurl.
	open := start(daemon.Config{PushAllow: "hooks.example.com", Reflection: true}) // the README's: make run
	authed := start(daemon.Config{PushAllow: "hooks.example.com", AdminKey: adminKey, Reflection: true})
	tlsd := start(daemon.Config{AdminKey: adminKey, Reflection: true,
		TLSCertFile: filepath.Join(home, "delayd-tls/server.pem"), TLSKeyFile: filepath.Join(home, "delayd-tls/server.key"),
		TLSClientCAFile: filepath.Join(home, "delayd-tls/ca.pem")})

	// "orders" exists on both plaintext servers (the README's tour made
	// it), with a task due now for docs/'s subscriber and the keys docs/
	// hands its reader.
	call := func(d *daemon.Daemon, key string, f func(context.Context, delaydv1.NamespaceServiceClient, delaydv1.TaskServiceClient) error) {
		conn, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx := ctx
		if key != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
		}
		if err := f(cctx, delaydv1.NewNamespaceServiceClient(conn), delaydv1.NewTaskServiceClient(conn)); err != nil {
			t.Fatal(err)
		}
	}
	keys := map[string]string{}
	for _, d := range []*daemon.Daemon{open, authed} {
		key := ""
		if d == authed {
			key = adminKey
		}
		call(d, key, func(ctx context.Context, ns delaydv1.NamespaceServiceClient, tasks delaydv1.TaskServiceClient) error {
			if _, err := ns.CreateNamespace(ctx, &delaydv1.CreateNamespaceRequest{Namespace: &delaydv1.Namespace{Name: "orders"}}); err != nil {
				return err
			}
			if _, err := tasks.UpsertTask(ctx, &delaydv1.UpsertTaskRequest{Namespace: "orders", Id: "order-1", When: &delaydv1.UpsertTaskRequest_Delay{Delay: durationpb.New(0)}}); err != nil {
				return err
			}
			if d != authed {
				return nil
			}
			for name, scope := range map[string]delaydv1.KeyScope{"CONSUMER_KEY": delaydv1.KeyScope_KEY_SCOPE_CONSUME, "ORDERS_ADMIN_KEY": delaydv1.KeyScope_KEY_SCOPE_ADMIN} {
				k, err := ns.CreateKey(ctx, &delaydv1.CreateKeyRequest{Namespace: "orders", Scopes: []delaydv1.KeyScope{scope}})
				if err != nil {
					return err
				}
				keys[name] = k.GetSecret()
			}
			return nil
		})
	}
	extra := []string{"CONSUMER_KEY=" + keys["CONSUMER_KEY"], "ORDERS_ADMIN_KEY=" + keys["ORDERS_ADMIN_KEY"]}
	tlsPort := tlsd.Addr()[strings.LastIndex(tlsd.Addr(), ":")+1:]

	ran, toured := 0, 0
	vars := regexp.MustCompile(`^[A-Z_]+=\S`)
	var setup []string // the variables the block has set so far
	lastBlock := ""
	for _, c := range cmds {
		if where := c.file + "#" + strconv.Itoa(c.block); where != lastBlock {
			setup, lastBlock = nil, where
		}
		if vars.MatchString(c.text) && !strings.Contains(c.text, " make ") {
			setup = append(setup, c.text)
			continue
		}
		if !strings.HasPrefix(c.text, "grpcurl ") {
			continue
		}
		if c.file == "README.md" && slices.Contains(readmeTourSections, c.section) {
			toured++ // TestReadmeTour runs it, in its place in the tour
			continue
		}
		addr := authed.Addr()
		switch {
		case c.file == "README.md":
			addr = open.Addr()
		case strings.Contains(c.text, "-cacert"):
			addr = "localhost:" + tlsPort // the name its certificate is for
		}
		script := strings.Join(append(append([]string{}, setup...), strings.ReplaceAll(c.text, "localhost:7070", addr)), "\n")
		where := fmt.Sprintf("%s (%s): %s", c.file, c.section, c.text)
		ran++
		if strings.Contains(c.text, "/Subscribe") {
			var out testkit.SyncBuffer
			cmd := bash(ctx, script, extra...)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, time.Minute, where+" to print a delivery", func() bool {
				return strings.Contains(out.String(), `"token": "`) || strings.Contains(out.String(), "ERROR")
			})
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			if strings.Contains(out.String(), "ERROR") {
				t.Errorf("%s\n%s", where, out.String())
			}
			continue
		}
		out, err := bash(ctx, script, extra...).CombinedOutput()
		if err != nil {
			t.Errorf("%s\n%s(%v)", where, out, err)
		}
	}
	if toured < 25 || ran < 5 {
		t.Fatalf("found %d grpcurl commands in the README's tour and ran %d others; has the docs' format changed?", toured, ran)
	}
	t.Logf("ran %d grpcurl commands (and TestReadmeTour runs the tour's %d)", ran, toured)
}

// TestDocsNameRealTests: every test the README and docs/*.md name (the
// "Delivery guarantees" section names one per promise) is a test function
// of this repository, so a renamed or deleted test cannot leave a promise
// pointing at nothing.
func TestDocsNameRealTests(t *testing.T) {
	defined := map[string]bool{}
	fn := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	for _, path := range testkit.RepoFiles(t, "../..") {
		if !strings.HasSuffix(path, "_test.go") {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fn.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
	}
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	named := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)`")
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range named.FindAllStringSubmatch(string(b), -1) {
			checked++
			if !defined[m[1]] {
				t.Errorf("%s names %s, which is no test of this repository", filepath.Base(f), m[1])
			}
		}
	}
	if checked < 10 {
		t.Fatalf("found only %d test names in the docs; has their format changed?", checked)
	}
}
