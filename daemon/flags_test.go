package daemon

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/delayd/delayd/server"
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
	otherParts := cmpopts.IgnoreFields(Config{}, "Limits", "MaxPayloadBytes", "MaxDelay", "SlowCall", "HTTPListen", "OpsListen")
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
		MaxConcurrentStreams: server.DefaultMaxConcurrentStreams}
	if got.Limits != want {
		t.Errorf("limit flags default to %+v, want the server's defaults %+v", got.Limits, want)
	}
	if got.SlowCall != server.DefaultSlowCall || got.DisableReflection || f.NoAuth {
		t.Errorf("--log-slow-calls %s, reflection off %v, --no-auth %v", got.SlowCall, got.DisableReflection, f.NoAuth)
	}
}

// TestFlagsParse: flags and DELAYD_* variables set the Config fields they
// name, the negated and uint32 flags included; bad values exit 2 naming
// the flag; --help exits 0 and lists every flag with its variable.
func TestFlagsParse(t *testing.T) {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	if err := fs.Parse([]string{"--reflection=false", "--max-concurrent-streams=7", "--no-auth", "--max-batch=9", "--listen=:1"}); err != nil {
		t.Fatal(err)
	}
	if !f.Config.DisableReflection || f.Config.Limits.MaxConcurrentStreams != 7 || !f.NoAuth ||
		f.Config.Limits.MaxBatch != 9 || f.Config.Listen != ":1" {
		t.Errorf("parsed %+v", f)
	}

	var out bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &out); code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	fs.VisitAll(func(fl *flag.Flag) {
		env := "DELAYD_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if !strings.Contains(out.String(), "--"+fl.Name+"  ("+env+")") {
			t.Errorf("--help does not list --%s (%s)", fl.Name, env)
		}
	})
	if !strings.Contains(out.String(), "--reflection  (DELAYD_REFLECTION)\n        serve gRPC server reflection (for grpcurl) (default true)") {
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
