package client_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/testkit"
)

// goFence matches a ```go block of a Markdown file.
var goFence = regexp.MustCompile("(?ms)^[ \t]*```go\n(.*?)^[ \t]*```")

// TestDocSnippetsBuild extracts every ```go block of the client guide and
// the README and builds each as a Go file of its own package inside this
// module (an overlay: nothing is written to the tree), so a snippet a team
// copies compiles as written. A block is a whole file without its package
// clause (imports and declarations); pseudo-code goes in ```text blocks.
func TestDocSnippetsBuild(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for _, doc := range []string{"docs/client-guide.md", "README.md"} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range goFence.FindAllSubmatch(b, -1) {
			name := fmt.Sprintf("%s_%d", strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(doc), i)
			src := filepath.Join(dir, name+".go")
			code := "// Snippet " + fmt.Sprint(i) + " of " + doc + ".\npackage " + name + "\n\n" + string(m[1])
			if err := os.WriteFile(src, []byte(code), 0o600); err != nil {
				t.Fatal(err)
			}
			pkg := filepath.Join(root, "internal", "docsnippets", name)
			overlay[filepath.Join(pkg, "snippet.go")] = src
			pkgs = append(pkgs, "./internal/docsnippets/"+name)
		}
	}
	if len(pkgs) < 2 {
		t.Fatalf("found %d Go snippets in the client guide and README; the guide's producer and consumer alone are 2", len(pkgs))
	}
	ov, _ := json.Marshal(map[string]any{"Replace": overlay})
	ovFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o600); err != nil {
		t.Fatal(err)
	}
	// With -race under go test -race: the snippets' dependencies (this
	// module, gRPC, the standard library) are then the packages the tests
	// compiled, where a plain build compiled them all again without -race
	// on a cold cache.
	args := []string{"build", "-overlay", ovFile}
	if testkit.Race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a Go snippet of the docs does not build (go build %s): %v\n%s", strings.Join(pkgs, " "), err, out)
	}
}

// TestClientGuideFieldReference: the client guide's "Task and Delivery
// fields" table names every exported field of client.Task, and the text
// under it every field Delivery adds, so a field added to the SDK is not
// left out of the one page a team reads.
func TestClientGuideFieldReference(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "docs", "client-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "### Task and Delivery fields\n")
	if !ok {
		t.Fatal(`docs/client-guide.md has no "### Task and Delivery fields" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	named := map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		if first, _, ok := strings.Cut(strings.TrimPrefix(line, "| "), " |"); ok && strings.HasPrefix(line, "| `") {
			for _, m := range regexp.MustCompile("`([A-Za-z]+)`").FindAllStringSubmatch(first, -1) {
				named[m[1]] = true
			}
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[client.Task]()) {
		if f.IsExported() && !named[f.Name] {
			t.Errorf("client.Task.%s is not in the client guide's field table", f.Name)
		}
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[client.Delivery]()) {
		if f.IsExported() && !f.Anonymous && f.Index[0] != 0 && !strings.Contains(sec, "`"+f.Name+"`") {
			t.Errorf("client.Delivery.%s is not described under the client guide's field table", f.Name)
		}
	}
}

// TestDocsGoGetNamesARealVersion: a `go get …@vX.Y.Z` line in the docs
// names a tag that exists (the guide once said @v0.1.0, which was never
// tagged); until delayd is tagged, the docs pin a commit.
func TestDocsGoGetNamesARealVersion(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("git", "-C", "..", "tag", "--list").Output()
	if err != nil {
		t.Fatalf("git tag --list: %v", err)
	}
	tags := map[string]bool{}
	for _, tag := range strings.Fields(string(out)) {
		tags[tag] = true
	}
	re := regexp.MustCompile(`go get \S*delayd\S*@(v[0-9][^\s` + "`" + `]*)`)
	for _, doc := range []string{"README.md", "docs/client-guide.md", "clients/ts/README.md"} {
		b, err := os.ReadFile(filepath.Join("..", doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			if !tags[m[1]] {
				t.Errorf("%s: %q names %s, which is not a tag of this repository (pin a commit until there is one)", doc, m[0], m[1])
			}
		}
	}
}
