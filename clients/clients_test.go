// Package clients_test checks the language clients under clients/ that the
// Go toolchain does not build: their generated stubs are what proto/
// generates today (protoc from Debian's protobuf-compiler, with
// grpc_python_plugin and grpc_java_plugin), and each client's own test runs
// against a real delayd built from this tree. scripts/ensure-clients.sh
// (make test runs it) installs the Debian packages they need. The
// TypeScript client has its own runner (make test-ts).
package clients_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/internal/testkit/delaydtest"
)

// TestMain removes the delayd binary the tests built. (No testkit.Main:
// its exit leaves no room for that; each test deletes its own namespace.)
func TestMain(m *testing.M) {
	code := m.Run()
	testkit.RemoveBuilt()
	os.Exit(code)
}

// delaydBinary is the delayd the client tests run, built once (a -race
// build when the tests are: go test -race has compiled its packages
// already, so the build is a link).
func delaydBinary(t *testing.T) string {
	return testkit.Build(t, "github.com/delayd/delayd/cmd/delayd")
}

// need fails t unless every command is installed, naming the Debian
// packages that bring them.
func need(t *testing.T, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("%s is not installed: run scripts/ensure-clients.sh (make test does), or apt-get install -y %s", c, ensurePackages)
		}
	}
}

const ensurePackages = "protobuf-compiler libprotobuf-dev protobuf-compiler-grpc python3-grpcio python3-protobuf " +
	"protobuf-compiler-grpc-java-plugin libgrpc-java libprotobuf-java libnetty-java libperfmark-java " +
	"libgeronimo-annotation-1.3-spec-java default-jdk-headless"

// protoc runs protoc on every file of proto/ with the given output flags,
// from the repository root.
func protoc(t *testing.T, outFlags ...string) {
	t.Helper()
	files, err := filepath.Glob("../proto/delayd/v1/*.proto")
	if err != nil || len(files) == 0 {
		t.Fatalf("proto files: %v %v", files, err)
	}
	for i, f := range files {
		files[i] = strings.TrimPrefix(f, "../")
	}
	args := append([]string{"-I", "proto", "-I", "/usr/include"}, outFlags...)
	cmd := exec.Command("protoc", append(args, files...)...)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}

// sameTree fails t for every file that differs between the generated tree
// got and the committed tree want (only files with one of the suffixes).
func sameTree(t *testing.T, want, got string, suffixes ...string) {
	t.Helper()
	list := func(root string) map[string][]byte {
		files := map[string][]byte{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			for _, s := range suffixes {
				if strings.HasSuffix(p, s) {
					b, err := os.ReadFile(p)
					rel, _ := filepath.Rel(root, p)
					files[rel] = b
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	w, g := list(want), list(got)
	if len(g) == 0 {
		t.Fatalf("protoc generated nothing under %s", got)
	}
	for name, b := range g {
		if wb, ok := w[name]; !ok {
			t.Errorf("%s is generated but not committed: run make generate-clients", filepath.Join(want, name))
		} else if !bytes.Equal(wb, b) {
			t.Errorf("%s is stale: run make generate-clients and commit the result", filepath.Join(want, name))
		}
	}
	for name := range w {
		if _, ok := g[name]; !ok {
			t.Errorf("%s is committed but proto/ no longer generates it: run make generate-clients", filepath.Join(want, name))
		}
	}
}

// TestPythonStubsCurrent: clients/python/delayd/v1 is what protoc and
// grpc_python_plugin generate from proto/ now.
func TestPythonStubsCurrent(t *testing.T) {
	t.Parallel()
	need(t, "protoc", "grpc_python_plugin")
	out := t.TempDir()
	protoc(t, "--python_out="+out, "--pyi_out="+out, "--grpc_python_out="+out,
		"--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin")
	sameTree(t, "python/delayd/v1", filepath.Join(out, "delayd/v1"), "_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
}

// pythonWithGRPC is Debian's python3, which python3-grpcio installs into
// (a python3 earlier on PATH, e.g. pyenv's, does not see it); PYTHON
// overrides it.
func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	py := os.Getenv("PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc and protobuf (%v: %s): run scripts/ensure-clients.sh, or apt-get install -y python3-grpcio python3-protobuf, or set PYTHON to a python3 that has grpcio and protobuf", py, err, bytes.TrimSpace(out))
	}
	return py
}

// TestPythonClient runs clients/python's tests (python3 -m unittest): the
// Consumer against a delayd on the test Redis with auth on, through acks,
// a Retry nack, a handler's exception, a handler slower than its lease
// (extended, so delivered once), a delayd restart (reconnected) and a stop
// while a handler runs (drained: its ack answered before the stream closes).
func TestPythonClient(t *testing.T) {
	t.Parallel()
	py := pythonWithGRPC(t)
	bin := delaydBinary(t)
	url := testkit.RedisURL()
	ns := "py-client-" + testkit.Suffix()
	t.Cleanup(func() { testkit.DeleteNamespaceKeys(t, url, ns) })
	testkit.Inputs(t, "..", "clients/python") // python's
	cmd := exec.CommandContext(t.Context(), py, "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Dir = "python"
	cmd.Env = append(os.Environ(), "DELAYD_BIN="+bin, "TEST_REDIS_URL="+url, "DELAYD_TEST_NAMESPACE="+ns, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nOK")) {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	t.Logf("%s", out)
}

// TestJavaClient runs clients/java/README.md's block that generates the
// Java stubs from proto/ (protoc and grpc_java_plugin, as the pom's
// protobuf plugin does elsewhere), compiles them with src/main/java
// against Debian's grpc-java and protobuf-java jars and runs
// StreamDeliveriesExample — as written, in a scratch copy of the directory
// (src/ and ../../proto linked in), against a delayd on the test Redis with
// auth on: it upserts 10 tasks, receives them on one StreamDeliveries
// stream, acks them on it (every ack answered OK) and finds them gone.
func TestJavaClient(t *testing.T) {
	t.Parallel()
	need(t, "protoc", "grpc_java_plugin", "javac", "java")
	block := javaReadmeBlock(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "clients", "java")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		filepath.Join(dir, "src"):   filepath.Join(root, "clients", "java", "src"),
		filepath.Join(tmp, "proto"): filepath.Join(root, "proto"),
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}

	const key = "java-client-test-admin-key-0123456789"
	url := testkit.RedisURL()
	ns := "java-client-" + testkit.Suffix()
	t.Cleanup(func() { testkit.DeleteNamespaceKeys(t, url, ns) })
	d := delaydtest.Start(t, daemon.Config{AdminKey: key, AutoCreateNamespaces: true})
	script := strings.NewReplacer("localhost:7070", d.Addr(), "java-example", ns).Replace(block)
	testkit.Inputs(t, "..", "clients/java", "proto") // javac's and protoc's
	cmd := exec.CommandContext(t.Context(), "bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DELAYD_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("acked 10 of 10")) {
		t.Fatalf("clients/java/README.md's block: %v\n%s\n--- output:\n%s", err, script, out)
	}
}

// javaReadmeBlock is the sh block of clients/java/README.md that builds and
// runs the example (the one that runs javac).
func javaReadmeBlock(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("java/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		if strings.Contains(m[1], "javac ") {
			return m[1]
		}
	}
	t.Fatal("clients/java/README.md has no sh block that runs javac")
	return ""
}
