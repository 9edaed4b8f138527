package client_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
	cmd := exec.Command("go", append([]string{"build", "-overlay", ovFile}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a Go snippet of the docs does not build (go build %s): %v\n%s", strings.Join(pkgs, " "), err, out)
	}
}
