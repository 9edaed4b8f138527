package daemon

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delayd/delayd/internal/testkit"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage/redisstore"
	"github.com/delayd/delayd/tenancy"
)

// TestFlagDefaults: the flags' defaults are the defaults a zero Config
// gets, so `delayd` with no flags runs exactly what Start(Config{}) runs and
// --help shows the values in force.
func TestFlagDefaults(t *testing.T) {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	got := f.Config
	// Fields other parts default (checked below) are left out here.
	// HTTPListen and OpsListen are the deliberate differences: the command
	// serves the HTTP edge on :7071 and the ops listener on :9070, a zero
	// Config (tests, the bench, tools in-process) neither, so that many of
	// them on one host never contend for one port.
	otherParts := cmpopts.IgnoreFields(Config{}, "Limits", "MaxPayloadBytes", "MaxDelay", "SlowCall", "HTTPListen", "OpsListen", "MaxScriptBytes", "RegistryCacheTTL")
	if got.HTTPListen != DefaultHTTPListen || (Config{}).withDefaults().HTTPListen != "" {
		t.Errorf("--http-listen defaults to %q, a zero Config to %q; want %q and none", got.HTTPListen, Config{}.withDefaults().HTTPListen, DefaultHTTPListen)
	}
	if got.OpsListen != DefaultOpsListen || (Config{}).withDefaults().OpsListen != "" {
		t.Errorf("--ops-listen defaults to %q, a zero Config to %q; want %q and none", got.OpsListen, Config{}.withDefaults().OpsListen, DefaultOpsListen)
	}
	if diff := cmp.Diff(Config{}.withDefaults(), got, otherParts); diff != "" {
		t.Errorf("flag defaults differ from a zero Config's defaults (-zero Config +flags):\n%s", diff)
	}
	pol := Config{}.policy()
	if got.MaxPayloadBytes != pol.MaxPayloadBytes || got.MaxDelay != pol.MaxDelay {
		t.Errorf("--max-payload-bytes %d, --max-delay %s; a zero Config's policy has %d, %s",
			got.MaxPayloadBytes, got.MaxDelay, pol.MaxPayloadBytes, pol.MaxDelay)
	}
	want := server.Limits{MaxBatch: server.DefaultMaxBatch, MaxMessageBytes: server.DefaultMaxMessageBytes,
		MaxConcurrentStreams: server.DefaultMaxConcurrentStreams, MaxBatchPayloadBytes: server.DefaultMaxBatchPayload,
		MaxListBytes: server.DefaultMaxListBytes, MaxConnections: server.DefaultMaxConnections,
		MaxConnectionIdle: server.DefaultMaxConnectionIdle, MaxStreamsPerKey: server.DefaultMaxStreamsPerKey,
		MaxInFlight: server.DefaultMaxInFlight, MaxKeys: server.DefaultMaxKeys,
		MaxKeylessStreamsPerConn: server.DefaultMaxKeylessStreamsPerConn, MaxKeylessStreamsPerPeer: server.DefaultMaxKeylessStreamsPerPeer,
		KeylessStreamLifetime: server.DefaultKeylessStreamLifetime}
	if got.Limits != want {
		t.Errorf("limit flags default to %+v, want the server's defaults %+v", got.Limits, want)
	}
	if got.RegistryCacheTTL != tenancy.DefaultTTL {
		t.Errorf("--registry-cache-ttl defaults to %s, the registry's default is %s", got.RegistryCacheTTL, tenancy.DefaultTTL)
	}
	if got.MaxScriptBytes != redisstore.DefaultMaxScriptBytes {
		t.Errorf("--max-script-bytes defaults to %d, the store's default is %d", got.MaxScriptBytes, redisstore.DefaultMaxScriptBytes)
	}
	if got.SlowCall != server.DefaultSlowCall || got.Reflection || f.NoAuth {
		t.Errorf("--log-slow-calls %s, reflection on %v, --no-auth %v", got.SlowCall, got.Reflection, f.NoAuth)
	}
}

// TestFlagsParse: flags and DELAYD_* variables set the Config fields they
// name, the uint32 flag included; bad values exit 2 naming
// the flag; --help exits 0 and lists every flag with its variable.
func TestFlagsParse(t *testing.T) {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	if err := fs.Parse([]string{"--reflection", "--max-concurrent-streams=7", "--no-auth", "--max-batch=9", "--listen=:1"}); err != nil {
		t.Fatal(err)
	}
	if !f.Config.Reflection || f.Config.Limits.MaxConcurrentStreams != 7 || !f.NoAuth ||
		f.Config.Limits.MaxBatch != 9 || f.Config.Listen != ":1" {
		t.Errorf("parsed %+v", f)
	}

	var out bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &out); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	fs.VisitAll(func(fl *flag.Flag) {
		env := "DELAYD_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if fl.Name == "version" {
			if !strings.Contains(out.String(), "--version\n") {
				t.Errorf("--help lists --version with a variable; it has none:\n%s", out.String())
			}
			return
		}
		if !strings.Contains(out.String(), "--"+fl.Name+"  ("+env+")") {
			t.Errorf("--help does not list --%s (%s)", fl.Name, env)
		}
	})
	if !strings.Contains(out.String(), "--reflection  (DELAYD_REFLECTION)\n        serve gRPC server reflection (for grpcurl; needs no API key, so off unless asked for) (default false)") {
		t.Errorf("--help shows reflection's default wrongly:\n%s", out.String())
	}

	out.Reset()
	if code := Main(context.Background(), []string{"--max-concurrent-streams=-1"}, &out); code != 2 || !strings.Contains(out.String(), "max-concurrent-streams") {
		t.Errorf("bad --max-concurrent-streams: exit %d, %q", code, out.String())
	}
	out.Reset()
	t.Setenv("DELAYD_REDIS_URL", "redis://127.0.0.1:1")
	if code := Main(context.Background(), nil, &out); code != 2 || !strings.Contains(out.String(), "--no-auth") {
		t.Errorf("real Redis without auth: exit %d, %q; want 2 and the refusal", code, out.String())
	}
}

// TestEnvironment (issue 31): every DELAYD_* variable sets its flag (a
// duration in days too: DELAYD_MAX_DELAY=400d); a bad value names the
// variable and the format; a DELAYD_* variable neither delayd nor
// delayctl reads stops delayd, naming the one it probably meant; and
// DELAYD_VERSION, a label deploys set, is no --version.
func TestEnvironment(t *testing.T) {
	parse := func(environ ...string) (Flags, error) {
		fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f Flags
		BindFlags(fs, &f)
		err := ParseFlags(fs, nil, environ)
		return f, err
	}
	f, err := parse("DELAYD_MAX_DELAY=400d", "DELAYD_VERSION=1.4.2", "DELAYD_ADDR=localhost:7070", "DELAYD_LOG_LATE_DELIVERIES=2s", "PATH=/bin")
	if err != nil || f.Config.MaxDelay != 400*24*time.Hour || f.Version || f.Config.LateWarn != 2*time.Second {
		t.Errorf("DELAYD_MAX_DELAY=400d DELAYD_VERSION=1.4.2: max delay %s, version %v, late %s, %v; want 9600h, false, 2s, nil",
			f.Config.MaxDelay, f.Version, f.Config.LateWarn, err)
	}
	// The push port list (issue 32 item 5) is a known variable.
	if f, err := parse("DELAYD_PUSH_ALLOW_PORTS=443,8443"); err != nil || f.Config.PushAllowPorts != "443,8443" {
		t.Errorf("DELAYD_PUSH_ALLOW_PORTS=443,8443: %q, %v", f.Config.PushAllowPorts, err)
	}
	for _, tc := range []struct{ env, want string }{
		{"DELAYD_PUSH_ALLOW_PROTS=443", "did you mean DELAYD_PUSH_ALLOW_PORTS?"},
		{"DELAYD_MAX_DELAY=400x", `DELAYD_MAX_DELAY="400x" (--max-delay): "400x" is not a duration; want a number with a unit`},
		{"DELAYD_REDIS_ULR=redis://db:6379/0", "DELAYD_REDIS_ULR is set, but neither delayd nor delayctl reads it; did you mean DELAYD_REDIS_URL?"},
		{"DELAYD_APIKEY=x", "did you mean DELAYD_API_KEY?"},
		{"DELAYD_MAX_BATCH=many", `DELAYD_MAX_BATCH="many" (--max-batch)`},
	} {
		if _, err := parse(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.env, err, tc.want)
		}
	}
	// Through Main: exit 2 before anything starts.
	t.Setenv("DELAYD_REDIS_ULR", "redis://127.0.0.1:1")
	var out bytes.Buffer
	if code := Main(context.Background(), nil, &out); code != 2 || !strings.Contains(out.String(), "did you mean DELAYD_REDIS_URL?") {
		t.Errorf("Main with DELAYD_REDIS_ULR: exit %d, %q; want 2 and the variable it meant", code, out.String())
	}
}

// TestEveryDelaydVariableIsKnown: every DELAYD_* name the repository
// mentions — in the docs, the Makefile, scripts, the TypeScript client's
// tests, the Go code — is a variable delayd or delayctl reads, or one of
// the test harness's, so no doc hands a reader a variable that would stop
// delayd (and delayctl's list here is the one ctl/ctl.go reads).
func TestEveryDelaydVariableIsKnown(t *testing.T) {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	known := map[string]bool{EnvVar("version"): true}
	fs.VisitAll(func(fl *flag.Flag) { known[EnvVar(fl.Name)] = true })
	for _, v := range append(append([]string{}, CtlEnv...), harnessEnv...) {
		known[v] = true
	}
	// Names the tests use on purpose as unknown or as a placeholder.
	deliberate := map[string]bool{"DELAYD_REDIS_ULR": true, "DELAYD_APIKEY": true, "DELAYD_X": true, "DELAYD_PUSH_ALLOW_PROTS": true}
	name := regexp.MustCompile(`DELAYD_[A-Z0-9_]*[A-Z0-9]`)
	seen := 0
	for _, path := range testkit.RepoFiles(t, "..") {
		if slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "gen") { // generated code
			continue
		}
		if !slices.Contains([]string{".go", ".md", ".sh", ".js", ".yml", ".yaml", ".json"}, filepath.Ext(path)) && filepath.Base(path) != "Makefile" {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range name.FindAllString(string(b), -1) {
			seen++
			if !known[m] && !deliberate[m] {
				t.Errorf("%s names %s, which neither delayd nor delayctl reads (delayd would refuse to start with it set)", path, m)
			}
		}
	}
	ctl, err := os.ReadFile("../ctl/ctl.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?:env|def)\("(DELAYD_[A-Z_]+)"`).FindAllStringSubmatch(string(ctl), -1) {
		if !slices.Contains(CtlEnv, m[1]) {
			t.Errorf("delayctl reads %s, which CtlEnv does not list: delayd would refuse to start with it set", m[1])
		}
	}
	if seen < 50 {
		t.Fatalf("found %d DELAYD_* names in the repository; has the walk gone wrong?", seen)
	}
}

// A positional argument (`delayd version`, a stray word) is refused with
// exit 2 naming it, instead of starting a server with every default.
func TestMainRefusesPositionalArguments(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--log-level", "info", "serve"}} {
		var stderr bytes.Buffer
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // were it to start a server, it would stop at once
		code := Main(ctx, args, &stderr)
		last := args[len(args)-1]
		if code != 2 || !strings.Contains(stderr.String(), "unexpected argument \""+last+"\"") {
			t.Errorf("Main(%q) = %d, stderr %q; want exit 2 naming %q", args, code, stderr.String(), last)
		}
	}
}

// TestEmbeddedModeListensOnLoopback: with no Redis URL (embedded mode,
// authentication off) every listener whose address was not given binds
// 127.0.0.1, so `make run` is not open to the network; an address given by
// flag or DELAYD_* variable is kept, and a real Redis keeps the defaults.
func TestEmbeddedModeListensOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		args                 []string
		env                  map[string]string
		listen, http, opsAdr string
		moved                bool
	}{
		{name: "embedded, nothing given", listen: "127.0.0.1:7070", http: "127.0.0.1:7071", opsAdr: "127.0.0.1:9070", moved: true},
		{name: "embedded, --listen given", args: []string{"--listen", ":7070"}, listen: ":7070", http: "127.0.0.1:7071", opsAdr: "127.0.0.1:9070"},
		{name: "embedded, DELAYD_LISTEN and an empty DELAYD_OPS_LISTEN", env: map[string]string{"DELAYD_LISTEN": "0.0.0.0:7070", "DELAYD_OPS_LISTEN": ""},
			listen: "0.0.0.0:7070", http: "127.0.0.1:7071", opsAdr: ""},
		{name: "embedded, host given", args: []string{"--http-listen", "10.1.2.3:80"}, listen: "127.0.0.1:7070", http: "10.1.2.3:80", opsAdr: "127.0.0.1:9070", moved: true},
		{name: "real Redis", args: []string{"--redis-url", "redis://127.0.0.1:6379/0"}, listen: ":7070", http: ":7071", opsAdr: ":9070"},
		// An empty HTTP address turns the HTTP edge (and the console) off.
		{name: "embedded, an empty DELAYD_HTTP_LISTEN", env: map[string]string{"DELAYD_HTTP_LISTEN": ""},
			listen: "127.0.0.1:7070", http: "", opsAdr: "127.0.0.1:9070", moved: true},
		{name: "real Redis, --http-listen empty", args: []string{"--redis-url", "redis://127.0.0.1:6379/0", "--http-listen", ""}, listen: ":7070", http: "", opsAdr: ":9070"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
			var f Flags
			BindFlags(fs, &f)
			if err := ParseFlags(fs, tc.args, os.Environ()); err != nil {
				t.Fatal(err)
			}
			cfg, moved := configFrom(fs, f)
			if cfg.Listen != tc.listen || cfg.HTTPListen != tc.http || cfg.OpsListen != tc.opsAdr || moved != tc.moved {
				t.Errorf("listen %q, http %q, ops %q, moved %v; want %q, %q, %q, %v",
					cfg.Listen, cfg.HTTPListen, cfg.OpsListen, moved, tc.listen, tc.http, tc.opsAdr, tc.moved)
			}
		})
	}
}

// TestFlagDefaultsMatchDocs: the README's configuration table lists every
// flag, with the default --help shows (read as the flag would parse it:
// "30 s" is 30s, "64 KiB" is 65536), and the defaults docs/operating.md
// states (its limits table, and "--flag (DELAYD_X, default V)") agree with
// --help too.
func TestFlagDefaultsMatchDocs(t *testing.T) {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `--([a-z-]+)`(?:, `--([a-z-]+)`)? \\|[^|]*\\|([^|]*)\\|")
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		for _, name := range m[1:3] {
			if name == "" {
				continue
			}
			listed[name] = true
			checkDocDefault(t, fs, "README", name, m[3])
		}
	}
	fs.VisitAll(func(fl *flag.Flag) {
		if !listed[fl.Name] {
			t.Errorf("README's configuration table does not list --%s", fl.Name)
		}
	})
	if len(listed) < 20 {
		t.Fatalf("read %d flags from the README's table; has its format changed?", len(listed))
	}
	ops, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	// Its limits table has the README's columns; it need not list every flag.
	for _, m := range row.FindAllStringSubmatch(string(ops), -1) {
		checkDocDefault(t, fs, "docs/operating.md", m[1], m[3])
	}
	stated := regexp.MustCompile("`--([a-z-]+)`\\s+\\(`DELAYD_[A-Z_]+`,\\s+default\\s+([^)]+)\\)")
	ms := stated.FindAllStringSubmatch(string(ops), -1)
	if len(ms) == 0 {
		t.Fatal("docs/operating.md states no flag default in the form checked; has its wording changed?")
	}
	for _, m := range ms {
		checkDocDefault(t, fs, "docs/operating.md", m[1], m[2])
	}
}

// checkDocDefault compares a default as a document writes it with the
// flag's own: the document's text is turned into the flag's syntax, parsed
// by the flag, and printed back.
func checkDocDefault(t *testing.T, fs *flag.FlagSet, doc, name, text string) {
	t.Helper()
	fl := fs.Lookup(name)
	if fl == nil {
		t.Errorf("%s names --%s, which delayd does not have", doc, name)
		return
	}
	if name == "version" {
		return // an action, not a setting
	}
	v := strings.TrimSpace(text)
	if i := strings.Index(v, "`"); i == 0 {
		v = v[1:]
		v = v[:strings.Index(v, "`")]
	} else if strings.HasPrefix(v, "empty") {
		v = ""
	} else if m := regexp.MustCompile(`^([0-9]+) (s|days|KiB|MiB)\b`).FindStringSubmatch(v); m != nil {
		n, _ := strconv.Atoi(m[1])
		v = map[string]string{"s": m[1] + "s", "days": strconv.Itoa(n*24) + "h",
			"KiB": strconv.Itoa(n << 10), "MiB": strconv.Itoa(n << 20)}[m[2]]
	}
	probe := flag.NewFlagSet("probe", flag.ContinueOnError)
	var pf Flags
	BindFlags(probe, &pf)
	if err := probe.Set(name, v); err != nil {
		t.Errorf("%s: --%s default %q does not parse as the flag's value: %v", doc, name, text, err)
		return
	}
	if got := probe.Lookup(name).Value.String(); got != fl.DefValue {
		t.Errorf("%s: --%s default %q, but --help says %q", doc, name, strings.TrimSpace(text), fl.DefValue)
	}
}

// TestSetGCPercent: the delayd command collects garbage at GOGC=400 unless
// the environment says otherwise; a GOGC in the environment is left to the
// Go runtime.
func TestSetGCPercent(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	if got := setGCPercent(func(string) string { return "" }); got != DefaultGCPercent {
		t.Fatalf("setGCPercent without GOGC = %d, want %d", got, DefaultGCPercent)
	}
	if now := debug.SetGCPercent(100); now != DefaultGCPercent {
		t.Errorf("GC percent after setGCPercent = %d, want %d", now, DefaultGCPercent)
	}
	env := map[string]string{"GOGC": "50"}
	if got := setGCPercent(func(k string) string { return env[k] }); got != -1 {
		t.Errorf("setGCPercent with GOGC=50 = %d, want -1 (untouched)", got)
	}
	if now := debug.SetGCPercent(100); now != 100 {
		t.Errorf("GC percent with GOGC set = %d, want the runtime's 100 untouched", now)
	}
}

// TestAdminKeyNeverInHelpAndFromFile (issue 32 item 4): `delayd --help`
// with DELAYD_ADMIN_KEY set does not print the key, and --admin-key-file
// reads it from a file (whitespace trimmed), alone.
func TestAdminKeyNeverInHelpAndFromFile(t *testing.T) {
	const secret = "admin-SECRETSECRETSECRET-0123456789"
	t.Setenv("DELAYD_ADMIN_KEY", secret)
	var help bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &help); code != 0 || !strings.Contains(help.String(), "--admin-key-file") {
		t.Fatalf("delayd --help: exit %d\n%s", code, help.String())
	}
	if strings.Contains(help.String(), "SECRETSECRET") {
		t.Errorf("delayd --help prints DELAYD_ADMIN_KEY:\n%s", help.String())
	}
	file := filepath.Join(t.TempDir(), "admin-key")
	if err := os.WriteFile(file, []byte("  "+secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if err := readAdminKeyFile(&cfg, file); err != nil || cfg.AdminKey != secret {
		t.Errorf("readAdminKeyFile = %v, key %q; want %q", err, cfg.AdminKey, secret)
	}
	if err := readAdminKeyFile(&cfg, file); err == nil || !strings.Contains(err.Error(), "go alone") {
		t.Errorf("--admin-key and --admin-key-file together: %v; want an error", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := readAdminKeyFile(&Config{}, empty); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("an empty --admin-key-file: %v; want an error", err)
	}
}

// TestAckLingerIsOffByDefault: an ack waits for no others by default. A
// StreamDeliveries stream's receiver applies its verdict requests one after
// another, so a linger delays every one of them: at the old 2 ms default one
// stream acked about 4,000 tasks/s, its credit ran out, and 100k tasks due
// over 5 s on four streams arrived up to 0.6 s late (p99 5 ms without it;
// docs/BENCHMARKS.md, "The ack linger"). A default that brings it back
// fails here.
func TestAckLingerIsOffByDefault(t *testing.T) {
	if got := (Config{}).withDefaults().AckLinger; got > 0 {
		t.Errorf("Config{}.withDefaults().AckLinger = %s, want no wait", got)
	}
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	if d := fs.Lookup("ack-linger").DefValue; d != "0s" {
		t.Errorf("--ack-linger default = %s, want 0s", d)
	}
}

// TestMisspeltFlag (issue 41): a flag delayd does not define stops it
// (exit 2) with one line naming the flag as written and the one it
// probably meant, as a misspelt DELAYD_* variable does, not the whole
// usage followed by "flag provided but not defined: -redis-ulr"; a word
// like no flag gets no guess. --help still prints the usage.
func TestMisspeltFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-ulr", "redis://127.0.0.1:1"}, "delayd: unknown flag --redis-ulr; did you mean --redis-url? (`delayd --help` lists every flag)\n"},
		{[]string{"--admin-keyfile=/etc/delayd/key"}, "did you mean --admin-key-file?"},
		{[]string{"-lisen", ":7070"}, "did you mean --listen?"},
		{[]string{"--verbose"}, "delayd: unknown flag --verbose (`delayd --help` lists every flag)\n"},
	} {
		var out bytes.Buffer
		code := Main(t.Context(), tc.args, &out)
		if code != 2 || !strings.Contains(out.String(), tc.want) || strings.Contains(out.String(), "Usage:") || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("delayd %s: exit %d\n%s\nwant exit 2 and one line saying %q", strings.Join(tc.args, " "), code, out.String(), tc.want)
		}
	}
	var out bytes.Buffer
	if code := Main(t.Context(), []string{"--help"}, &out); code != 0 || !strings.Contains(out.String(), "Usage: delayd [flags]") {
		t.Errorf("delayd --help: exit %d\n%s", code, out.String())
	}
}

// TestPlaceholderAdminKeyRefused (issue 41): delayd refuses to start with
// deploy/systemd/delayd.env.example's admin key, or any key under 32
// characters, and says how to make one.
func TestPlaceholderAdminKeyRefused(t *testing.T) {
	raw, err := os.ReadFile("../deploy/systemd/delayd.env.example")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^DELAYD_ADMIN_KEY=(.+)$`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("delayd.env.example sets no DELAYD_ADMIN_KEY")
	}
	t.Setenv("DELAYD_REDIS_URL", "redis://127.0.0.1:1/0") // never reached
	for key, say := range map[string]string{
		string(m[1]):                      "the admin key is a placeholder",
		"0123456789abcdef0123456789abcde": "the admin key is 31 characters long; it must have 32-512",
	} {
		t.Setenv("DELAYD_ADMIN_KEY", key)
		var out bytes.Buffer
		code := Main(t.Context(), []string{"--listen", "127.0.0.1:0"}, &out)
		if code != 2 || !strings.Contains(out.String(), say) || !strings.Contains(out.String(), "openssl rand -base64 32") {
			t.Errorf("DELAYD_ADMIN_KEY=%s: exit %d\n%s\nwant exit 2 saying %q and how to make a key", key, code, out.String(), say)
		}
	}
}
