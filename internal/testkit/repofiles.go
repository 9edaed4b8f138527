package testkit

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RepoFiles lists the files of the repository whose root is root (a path
// relative to the test's directory, such as ".." or "../.."): what git
// tracks and what it would add (untracked, not ignored), as paths joined
// to root, in git's order. Tests that read every doc or source file list
// them with it instead of walking the tree: go test counts every
// directory a test lists under the module as an input of its cached
// result, with the times of everything in it, so a walk that listed the
// root, bin/, artifacts/ or clients/ts/ (node_modules) saw make test's
// own outputs change and ran again on every make test. Where root is no
// git work tree (an unpacked archive), it walks the tree instead, leaving
// out .git and the directories make and npm write (bin, artifacts, dist,
// node_modules).
func RepoFiles(t testing.TB, root string) []string {
	t.Helper()
	// git -C, not the command's Dir: os/exec stats a Dir, and a stat is
	// an input too (the root's time changes when make test creates bin/).
	names, ok := gitFiles(t, root, "--cached", "--others", "--exclude-standard")
	if !ok {
		return walkRepo(t, root)
	}
	gone, _ := gitFiles(t, root, "--deleted") // tracked, deleted in the work tree
	deleted := map[string]bool{}
	for _, name := range gone {
		deleted[name] = true
	}
	var files []string
	for _, name := range names {
		if !deleted[name] {
			files = append(files, filepath.Join(root, filepath.FromSlash(name)))
		}
	}
	return files
}

// gitFiles is git ls-files with args in root; false when root is no git
// work tree.
func gitFiles(t testing.TB, root string, args ...string) ([]string, bool) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", root, "ls-files", "-z"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(stderr.String(), "not a git repository") {
			return nil, false
		}
		t.Fatalf("git -C %s ls-files %s: %v\n%s", root, strings.Join(args, " "), err, stderr.String())
	}
	var names []string
	for name := range strings.SplitSeq(string(out), "\x00") {
		if name != "" {
			names = append(names, name)
		}
	}
	return names, true
}

// Inputs tells go test's cache that the test reads the repository's
// files under each of dirs (slash-separated, relative to the repository
// root root, as for RepoFiles) through a command it runs (python, javac,
// protoc, kustomize, make), which go test does not see: it stats each, so
// that a change to one runs the test again instead of replaying a cached
// result.
func Inputs(t testing.TB, root string, dirs ...string) {
	t.Helper()
	for _, f := range RepoFiles(t, root) {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		for _, d := range dirs {
			if rel == d || strings.HasPrefix(rel, strings.TrimSuffix(d, "/")+"/") {
				_, _ = os.Stat(f)
				break
			}
		}
	}
}

// walkRepo lists the files under root but for .git and what make and npm
// write.
func walkRepo(t testing.TB, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "bin", "artifacts", "dist":
				return filepath.SkipDir
			}
			return nil
		}
		files = append(files, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
