package daemon

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestParseClusterURL(t *testing.T) {
	t.Parallel()
	opts, err := parseClusterURL("redis-cluster://app:s3cret@10.0.0.1:7000,10.0.0.2:7001,10.0.0.3:7002?dial_timeout=3s&max_redirects=5")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"}; !slices.Equal(opts.Addrs, want) {
		t.Fatalf("Addrs = %v, want %v", opts.Addrs, want)
	}
	if opts.Username != "app" || opts.Password != "s3cret" || opts.DialTimeout.String() != "3s" || opts.MaxRedirects != 5 || opts.TLSConfig != nil {
		t.Fatalf("options = %+v", opts)
	}

	tlsOpts, err := parseClusterURL("rediss-cluster://h1:6379,h2:6379/")
	if err != nil || tlsOpts.TLSConfig == nil || len(tlsOpts.Addrs) != 2 {
		t.Fatalf("rediss-cluster = %+v, %v; want TLS and two nodes", tlsOpts, err)
	}

	for _, bad := range []string{
		"redis-cluster://h1:1,h2:2/3",        // a database number
		"redis-cluster://h1:1,,h2:2",         // an empty node
		"redis-cluster://",                   // no node
		"redis-cluster://h1:1?no_such_opt=1", // unknown option
	} {
		if _, err := parseClusterURL(bad); err == nil {
			t.Errorf("parseClusterURL(%q) accepted", bad)
		}
	}
}

func TestOpenRedisModesAndRedaction(t *testing.T) {
	t.Parallel()
	conn, err := openRedis("redis://user:hunter2@127.0.0.1:6390/2")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.close()
	if conn.mode != "redis" || conn.embedded != nil || strings.Contains(conn.where, "hunter2") || !strings.Contains(conn.where, "127.0.0.1:6390/2") {
		t.Fatalf("redis conn = mode %q where %q", conn.mode, conn.where)
	}

	cl, err := openRedis("redis-cluster://:hunter2@127.0.0.1:7000,127.0.0.1:7001")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	if cl.mode != "redis-cluster" || strings.Contains(cl.where, "hunter2") {
		t.Fatalf("cluster conn = mode %q where %q", cl.mode, cl.where)
	}

	if _, err := openRedis("redis://user:hunter2@host:notaport"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad URL error = %v; want an error without the password", err)
	}
	if _, err := openRedis("http://host:1"); err == nil || !strings.Contains(err.Error(), `scheme "http" is not one delayd speaks`) {
		t.Fatalf("http:// as a Redis URL: %v; want a refusal naming the scheme", err)
	}
}

// TestRedisURLWithoutScheme (issue 41): DELAYD_REDIS_URL=127.0.0.1:6379,
// the form redis-cli and most configs write, is refused at start (exit 2)
// with the URL to write instead, not a URL parser's "first path segment in
// URL cannot contain colon"; a password in it is never repeated.
func TestRedisURLWithoutScheme(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:6379", `--redis-url (DELAYD_REDIS_URL) "127.0.0.1:6379" has no scheme: write redis://127.0.0.1:6379/0`},
		{"user:hunter2@db.internal:6379", `"db.internal:6379" has no scheme: write redis://db.internal:6379/0`},
		{"localhost", "write redis://localhost/0"},
	} {
		t.Setenv("DELAYD_REDIS_URL", tc.url)
		var out bytes.Buffer
		code := Main(t.Context(), []string{"--no-auth", "--listen", "127.0.0.1:0"}, &out)
		if code != 2 || !strings.Contains(out.String(), tc.want) || !strings.Contains(out.String(), "rediss://") ||
			strings.Contains(out.String(), "hunter2") || strings.Contains(out.String(), "first path segment") {
			t.Errorf("DELAYD_REDIS_URL=%s: exit %d\n%s\nwant exit 2 saying %q, no password", tc.url, code, out.String(), tc.want)
		}
	}
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ level, format string }{{"", ""}, {"debug", "json"}, {"WARN", "text"}, {"error", "JSON"}} {
		if _, err := NewLogger(nil, c.level, c.format); err != nil {
			t.Errorf("NewLogger(%q, %q): %v", c.level, c.format, err)
		}
	}
	if _, err := NewLogger(nil, "loud", "text"); err == nil || !strings.Contains(err.Error(), "allowed: debug, info, warn, error") {
		t.Errorf("bad level: %v", err)
	}
	if _, err := NewLogger(nil, "info", "xml"); err == nil || !strings.Contains(err.Error(), "allowed: text, json") {
		t.Errorf("bad format: %v", err)
	}
}
