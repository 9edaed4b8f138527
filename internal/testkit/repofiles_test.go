package testkit

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRepoFiles: the repository's files are listed (this one, go.mod, the
// README), and nothing make, npm or git write: no bin/, artifacts/, dist/,
// node_modules or .git path, which would make every test that reads the
// tree miss go test's cache after a make test.
func TestRepoFiles(t *testing.T) {
	t.Parallel()
	files := RepoFiles(t, "../..")
	for _, want := range []string{"internal/testkit/repofiles_test.go", "go.mod", "README.md"} {
		if !slices.Contains(files, filepath.Join("../..", want)) {
			t.Errorf("RepoFiles lacks %s (of %d files)", want, len(files))
		}
	}
	for _, f := range files {
		rel := strings.TrimPrefix(filepath.ToSlash(f), "../../")
		for _, out := range []string{"bin/", "artifacts/", "dist/", ".git/"} {
			if strings.HasPrefix(rel, out) {
				t.Errorf("RepoFiles lists %s, which make or git writes", f)
			}
		}
		if strings.Contains(rel, "node_modules/") {
			t.Errorf("RepoFiles lists %s, which npm writes", f)
		}
	}
	// Without git, the walk lists the same files (here, of this package's
	// directory only: a walk from the root would list bin/ and the rest,
	// and so make this test's cached result depend on them).
	git, walked := RepoFiles(t, "."), walkRepo(t, ".")
	slices.Sort(git)
	slices.Sort(walked)
	if !slices.Equal(git, walked) {
		t.Errorf("in internal/testkit, git lists %v, the walk %v", git, walked)
	}
}
