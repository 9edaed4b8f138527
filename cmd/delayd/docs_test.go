package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	_ "github.com/delayd/delayd/gen/delayd/v1"       // registers the delayd.v1 services
	_ "google.golang.org/grpc/health/grpc_health_v1" // and grpc.health.v1
)

// TestDocsGrpcurlCommands: every grpcurl call in the README and docs/*.md
// names a method delayd serves, and its -d JSON is a valid request of that
// method (field names, enum names, types), read as grpcurl reads it
// (protojson). A renamed field or method fails here instead of in a
// newcomer's terminal. ($TOKEN and other shell variables stand for a
// string.)
func TestDocsGrpcurlCommands(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	method := regexp.MustCompile(`\s((?:delayd\.v1|grpc\.health\.v1)\.[A-Za-z]+)/([A-Za-z]+)`)
	single := regexp.MustCompile(`\s-d\s+'([^']*)'`)
	double := regexp.MustCompile(`\s-d\s+"((?:[^"\\]|\\.)*)"`)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.ReplaceAll(string(b), "\\\n", " ")
		for _, line := range strings.Split(text, "\n") {
			if !strings.Contains(line, "grpcurl ") {
				continue
			}
			m := method.FindStringSubmatch(line)
			if m == nil {
				continue // list, describe, install lines
			}
			where := filepath.Base(f) + ": " + strings.TrimSpace(line)
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(m[1]))
			if err != nil {
				t.Errorf("%s\n  names service %s, which delayd does not serve", where, m[1])
				continue
			}
			md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(m[2]))
			if md == nil {
				t.Errorf("%s\n  names %s/%s, which does not exist", where, m[1], m[2])
				continue
			}
			body := ""
			if s := single.FindStringSubmatch(line); s != nil {
				body = s[1]
			} else if s := double.FindStringSubmatch(line); s != nil {
				body = strings.ReplaceAll(s[1], `\"`, `"`)
				body = regexp.MustCompile(`\$[A-Z_]+`).ReplaceAllString(body, "x")
			}
			if body != "" {
				req := dynamicpb.NewMessage(md.Input())
				if err := protojson.Unmarshal([]byte(body), req); err != nil {
					t.Errorf("%s\n  -d is not a valid %s: %v", where, md.Input().FullName(), err)
				}
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d grpcurl calls; the docs hold more — has the format changed?", checked)
	}
	t.Logf("checked %d grpcurl calls", checked)
}

// TestDocsNameRealTests: every test the README and docs/*.md name (the
// "Delivery guarantees" section names one per promise) is a test function
// of this repository, so a renamed or deleted test cannot leave a promise
// pointing at nothing.
func TestDocsNameRealTests(t *testing.T) {
	defined := map[string]bool{}
	fn := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == ".git") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range fn.FindAllStringSubmatch(string(b), -1) {
				defined[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
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
