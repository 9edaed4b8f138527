package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/buildinfo"
	"github.com/delayd/delayd/internal/duration"
	"github.com/delayd/delayd/internal/suggest"
	"github.com/delayd/delayd/push"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage/durable"
	"github.com/delayd/delayd/storage/redisstore"
	"github.com/delayd/delayd/tenancy"
)

// This file is the delayd command: its flags, bound to Config fields with
// the defaults Config itself documents, and Main, which cmd/delayd calls.
// A new setting is a Config field, its default constant, and one line in
// BindFlags.

// EnvPrefix starts the environment variable of every flag: --redis-url is
// also DELAYD_REDIS_URL.
const EnvPrefix = "DELAYD"

// Flags are the command-line settings: a Config, plus the few flags that
// are not Config fields.
type Flags struct {
	Config Config
	// NoAuth is --no-auth: run without authentication against a real Redis
	// (see guard.ResolveAuth).
	NoAuth bool
	// AdminKeyFile is --admin-key-file: read the bootstrap admin key from
	// this file (surrounding whitespace ignored) instead of --admin-key,
	// which ps shows (/debug/pprof/cmdline hides flag values).
	AdminKeyFile string
	// Version is --version: print the version, commit and Go version and
	// exit.
	Version bool
}

// BindFlags defines every delayd flag on fs, bound to f, each with its
// default taken from the constant the code itself uses, so `delayd --help`
// shows the value a zero Config gets.
func BindFlags(fs *flag.FlagSet, f *Flags) {
	c := &f.Config
	pol := defaultPolicy()
	fs.StringVar(&c.Listen, "listen", DefaultListen, "gRPC listen address, host:port; embedded mode: "+loopback(DefaultListen)+" (loopback only) unless set")
	// The one flag whose default is not the zero Config's: in-process users
	// (tests, tools) get no HTTP edge unless they ask for one.
	fs.StringVar(&c.HTTPListen, "http-listen", DefaultHTTPListen, "HTTP edge address, host:port: Connect/JSON, gRPC-Web and gRPC; empty = off; embedded mode: "+loopback(DefaultHTTPListen)+" unless set")
	fs.StringVar(&c.RedisURL, "redis-url", "", "Redis for the task index: redis://host:port/db, rediss://..., or redis-cluster://h1:p1,h2:p2; empty = embedded in-memory store (nothing survives a restart)")
	fs.StringVar(&c.MySQLDSN, "mysql-dsn", "", "MySQL DSN for durable mode, user:pass@tcp(host:3306)/db; empty = Redis-only")
	durationVar(fs, &c.ReconcileInterval, "reconcile-interval", DefaultReconcileInterval, "durable mode: how often the leader re-indexes the tasks changed in MySQL whose Redis copy differs")
	durationVar(fs, &c.FullReconcileInterval, "full-reconcile-interval", DefaultFullReconcileInterval, "durable mode: how often the leader compares every task of MySQL and Redis both ways")
	fs.StringVar(&c.LogLevel, "log-level", DefaultLogLevel, "lowest level logged: debug, info, warn, error; debug logs every gRPC call (info logs failed and slow calls only)")
	durationVar(fs, &c.SlowCall, "log-slow-calls", server.DefaultSlowCall, "log unary calls that take at least this long at WARN; negative = never")
	fs.StringVar(&c.LogFormat, "log-format", DefaultLogFormat, "log format: text or json")
	fs.IntVar(&c.Limits.MaxBatch, "max-batch", server.DefaultMaxBatch, "most items in one batch call (BatchUpsertTasks, AckTasks, ...)")
	fs.IntVar(&c.Limits.MaxMessageBytes, "max-message-bytes", server.DefaultMaxMessageBytes, "largest gRPC message received or sent, in bytes")
	c.Limits.MaxConcurrentStreams = server.DefaultMaxConcurrentStreams
	fs.Var(uint32Flag{&c.Limits.MaxConcurrentStreams}, "max-concurrent-streams", "most concurrent calls per client connection")
	fs.IntVar(&c.Limits.MaxBatchPayloadBytes, "max-batch-payload-bytes", server.DefaultMaxBatchPayload, "most payload bytes of one BatchUpsertTasks, in total")
	fs.IntVar(&c.Limits.MaxListBytes, "max-list-bytes", server.DefaultMaxListBytes, "bytes of one list page (ListTasks, ListDeadLetters, ListKeys, ListNamespaces); a page is cut there and goes on with next_page_token; at most half of --max-message-bytes")
	durationVar(fs, &c.RegistryCacheTTL, "registry-cache-ttl", tenancy.DefaultTTL, "how long a replica caches namespaces, policies and API keys: revocations, deletions and policy changes reach every replica within it")
	fs.IntVar(&c.MaxScriptBytes, "max-script-bytes", redisstore.DefaultMaxScriptBytes, "bytes of ids, kinds and payloads one Redis script call carries; larger batches are split into several calls")
	fs.IntVar(&c.Limits.MaxConnections, "max-connections", server.DefaultMaxConnections, "most client connections open at once; more are closed as soon as accepted")
	durationVar(fs, &c.Limits.MaxConnectionIdle, "max-connection-idle", server.DefaultMaxConnectionIdle, "a connection with no call for this long is sent GOAWAY (clients reconnect)")
	fs.IntVar(&c.Limits.MaxKeylessStreamsPerConn, "max-keyless-streams-per-conn", server.DefaultMaxKeylessStreamsPerConn, "most streams of the methods that need no API key (health Watch, reflection) one connection holds open")
	fs.IntVar(&c.Limits.MaxKeylessStreamsPerPeer, "max-keyless-streams-per-peer", server.DefaultMaxKeylessStreamsPerPeer, "most streams of the methods that need no API key one address (IPv6: one /64) holds open per listener")
	durationVar(fs, &c.Limits.KeylessStreamLifetime, "keyless-stream-lifetime", server.DefaultKeylessStreamLifetime, "how long a stream of a method that needs no API key stays open; then it ends with UNAVAILABLE and the client opens another")
	fs.IntVar(&c.Limits.MaxStreamsPerKey, "max-streams-per-key", server.DefaultMaxStreamsPerKey, "most subscriber streams (Subscribe, StreamDeliveries) one API key holds open per replica, and as many watches (WatchDeliveries) apart, counted from each stream's headers")
	fs.IntVar(&c.Limits.MaxKeys, "max-keys", server.DefaultMaxKeys, "most API keys one namespace holds, and most global keys; CreateKey past it is ResourceExhausted")
	fs.IntVar(&c.Limits.MaxInFlight, "max-in-flight", server.DefaultMaxInFlight, "largest max_in_flight a subscriber may ask for")
	fs.IntVar(&c.MaxPayloadBytes, "max-payload-bytes", pol.MaxPayloadBytes, "largest task payload, in bytes")
	durationVar(fs, &c.MaxDelay, "max-delay", pol.MaxDelay, "horizon: the furthest ahead a task may be due")
	durationVar(fs, &c.StoreTimeout, "store-timeout", 0, fmt.Sprintf("deadline of each store call; 0 = each store's own: %s per Redis call, %s per MySQL transaction (durable mode)",
		redisstore.DefaultTimeout, durable.DefaultOpTimeout))
	durationVar(fs, &c.SafetyPoll, "safety-poll", DefaultSafetyPoll, "dispatcher safety-net poll interval")
	durationVar(fs, &c.WakePrecision, "wake-precision", DefaultWakePrecision, "dispatcher wake precision: wakes and wake signals within it join one store call (tasks never pop early, at most this much later); negative = no joining")
	durationVar(fs, &c.AckLinger, "ack-linger", DefaultAckLinger, "how long an ack waits for others to share its Redis script call when none is in flight and no pop comes (delays ack answers, never deliveries; every verdict of a StreamDeliveries stream waits it out); 0 or negative = no wait")
	durationVar(fs, &c.AckRide, "ack-ride", DefaultAckRide, "acks and nacks of a namespace whose next pop on this replica comes within this wait for it and are settled in its Redis script call (one call per wake of a steady flow; an ack waits at most this plus --wake-precision); negative = always on their own")
	durationVar(fs, &c.ScheduleLookahead, "schedule-lookahead", DefaultScheduleLookahead, "how long before its slot a schedule's firing is created as a task (pause, update and delete remove the ones not due yet)")
	durationVar(fs, &c.SchedulePoll, "schedule-poll", DefaultSchedulePoll, "longest sleep of the schedule loop between two looks at the due schedules")
	durationVar(fs, &c.LateWarn, "log-late-deliveries", DefaultLateWarn, "log deliveries at least this late past their due time at WARN (once per namespace per 10 s, with count and worst); negative = never")
	fs.StringVar(&c.PushAllow, "push-allow", "", "hosts and CIDRs namespaces may push tasks to over HTTP (policy.push), comma-separated, e.g. hooks.example.com,*.example.com,203.0.113.0/24; empty = push disabled")
	fs.StringVar(&c.PushAllowPorts, "push-allow-ports", push.DefaultPorts, "ports push URLs may name (a URL without one names 80 for http, 443 for https), comma-separated ports and ranges, e.g. 443,8443,9000-9099")
	fs.StringVar(&c.PushCAFile, "push-ca", "", "PEM certificate authorities https push targets are verified against, besides the system's; empty = the system's only")
	fs.IntVar(&c.PushConcurrency, "push-concurrency", DefaultPushConcurrency, "most HTTP push requests in flight per namespace on one replica")
	durationVar(fs, &c.ShutdownTimeout, "shutdown-timeout", DefaultShutdownTimeout, "bound on graceful shutdown; then connections are closed")
	fs.BoolVar(&c.Reflection, "reflection", false, "serve gRPC server reflection (for grpcurl; needs no API key, so off unless asked for)")
	fs.StringVar(&c.AdminKey, "admin-key", "", "bootstrap admin key (32-512 printable ASCII, no placeholder: make one with openssl rand -base64 32); turns API-key auth on; pass it in DELAYD_ADMIN_KEY or --admin-key-file: a command line is visible in ps")
	fs.StringVar(&f.AdminKeyFile, "admin-key-file", "", "file holding the bootstrap admin key (e.g. from openssl rand -hex 32; surrounding whitespace ignored); instead of --admin-key")
	fs.BoolVar(&f.NoAuth, "no-auth", false, "run without authentication against a real Redis: every client may do everything")
	fs.BoolVar(&c.AutoCreateNamespaces, "auto-create-namespaces", false, "create an unknown namespace on first use (always on in embedded mode and without auth)")
	fs.StringVar(&c.TLSCertFile, "tls-cert", "", "PEM certificate chain to serve TLS with (with --tls-key)")
	fs.StringVar(&c.TLSKeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&c.TLSClientCAFile, "tls-client-ca", "", "PEM CAs whose client certificates are required (mTLS)")
	fs.StringVar(&c.OpsListen, "ops-listen", DefaultOpsListen, "ops HTTP listener (/metrics, /healthz, /readyz), host:port; empty = off (and no metrics); embedded mode: "+loopback(DefaultOpsListen)+" unless set")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve Go profiling under /debug/pprof/ on the ops listener")
	fs.BoolVar(&f.Version, "version", false, "print the version, commit and Go version, and exit")
}

// Main is the delayd command: it parses args (without the program name)
// and the DELAYD_* environment variables, refuses to run a real Redis open
// to everyone unless --no-auth says so, builds the logger, and runs Run
// until ctx is done. It returns the process's exit code: 0 after a clean
// shutdown or --help, 1 when delayd failed, 2 for bad flags. Usage and flag
// errors go to stderr, and so does the log.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var f Flags
	BindFlags(fs, &f)
	// The flag package prints its error and the whole usage on any parse
	// error; a mistake gets one line saying what is wrong instead (below),
	// and only --help (-h) prints the usage.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := ParseFlags(fs, args, os.Environ()); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			usage(fs)
			return 0
		}
		fmt.Fprintf(stderr, "delayd: %v\n", err)
		return 2
	}
	if f.Version {
		fmt.Fprintln(os.Stdout, buildinfo.Get())
		return 0
	}
	// `delayd version` or a stray word would otherwise start a server with
	// every default (an open embedded store) as if nothing had been said.
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "delayd: unexpected argument %q: delayd takes flags only and has no subcommands; `delayd --help` lists them\n", fs.Arg(0))
		return 2
	}
	cfg, onlyLoopback := configFrom(fs, f)
	if cfg.RedisURL != "" {
		if err := checkRedisURL(cfg.RedisURL); err != nil {
			fmt.Fprintf(stderr, "delayd: %v\n", err)
			return 2
		}
	}
	if err := readAdminKeyFile(&cfg, f.AdminKeyFile); err != nil {
		fmt.Fprintf(stderr, "delayd: %v\n", err)
		return 2
	}
	// A shared Redis is never open to everyone by accident: without an
	// admin key, --no-auth must say so (embedded mode is open by default).
	if _, err := guard.ResolveAuth(cfg.AdminKey, f.NoAuth, cfg.RedisURL == ""); err != nil {
		fmt.Fprintf(stderr, "delayd: %v\n", err)
		return 2
	}
	logger, err := NewLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(stderr, "delayd: %v\n", err)
		return 2
	}
	setGCPercent(os.Getenv)
	// go-redis logs reconnect failures through a package-level logger; send
	// them to ours so the log stays one structured stream. Only the command
	// does this: in-process users (tests, tools) keep their own.
	redis.SetLogger(redisLogger{logger.With("component", "go-redis")})
	if onlyLoopback {
		logger.Info("embedded mode listens on loopback only: clients on other machines cannot connect; "+
			"give --listen (DELAYD_LISTEN), e.g. :7070, to accept them", "addr", cfg.Listen)
	}
	if err := Run(ctx, cfg, logger); err != nil {
		logger.Error("delayd failed", "error", err)
		return 1
	}
	return 0
}

// readAdminKeyFile sets cfg.AdminKey from --admin-key-file, when given.
func readAdminKeyFile(cfg *Config, file string) error {
	if file == "" {
		return nil
	}
	if cfg.AdminKey != "" {
		return errors.New("--admin-key (DELAYD_ADMIN_KEY) and --admin-key-file (DELAYD_ADMIN_KEY_FILE) go alone: give one")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("--admin-key-file: %w", err)
	}
	if cfg.AdminKey = strings.TrimSpace(string(b)); cfg.AdminKey == "" {
		return fmt.Errorf("--admin-key-file %s is empty; it must hold the admin key", file)
	}
	return nil
}

// EnvVar is the environment variable of the flag name: --redis-url is
// DELAYD_REDIS_URL.
func EnvVar(name string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// notFromEnv are the flags no variable sets: --version is an action, not a
// setting, so a DELAYD_VERSION a deploy sets as a label (DELAYD_VERSION=1.4.2)
// neither prints the version and exits nor stops delayd from starting.
var notFromEnv = map[string]bool{"version": true, "help": true}

// CtlEnv are the variables delayctl reads (ctl/ctl.go): delayd does not, but
// one environment often serves both, so they are no typo.
var CtlEnv = []string{"DELAYD_ADDR", "DELAYD_API_KEY", "DELAYD_API_KEY_FILE", "DELAYD_TLS", "DELAYD_TLS_CA", "DELAYD_TLS_CERT", "DELAYD_TLS_KEY", "DELAYD_TLS_SERVER_NAME"}

// harnessEnv are the variables of this repository's build, tests and
// deployment files (Makefile, internal/testkit, the web console's and
// TypeScript and Python clients' tests, deploy/compose's image choice, make
// test-image), which may sit in the environment delayd starts in: no typo
// either.
var harnessEnv = []string{"DELAYD_BIN", "DELAYD_CHROMIUM", "DELAYD_IMAGE", "DELAYD_TEST_ARTIFACTS", "DELAYD_TEST_IMAGE", "DELAYD_TEST_LOG", "DELAYD_TEST_NAMESPACE"}

// ParseFlags parses args into fs, then sets every flag the command line
// left unset from its DELAYD_* variable in environ ("KEY=value" pairs, as
// os.Environ returns them; an empty value sets nothing, and --version has
// no variable). A bad value is an error naming the variable and what it
// must be. So is a DELAYD_* variable that neither delayd nor delayctl
// reads, with the closest one it may have meant: a misspelt
// DELAYD_REDIS_ULR would otherwise start an open embedded store as if
// nothing had been said. A flag it does not define is an error naming the
// closest one when there is one near (--redis-ulr: did you mean
// --redis-url?).
func ParseFlags(fs *flag.FlagSet, args []string, environ []string) error {
	if err := fs.Parse(args); err != nil {
		return unknownFlag(fs, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	known := map[string]string{} // variable → flag name ("" for delayctl's and the harness's)
	fs.VisitAll(func(f *flag.Flag) {
		if !notFromEnv[f.Name] {
			known[EnvVar(f.Name)] = f.Name
		}
	})
	for _, v := range append(append([]string{EnvVar("version")}, CtlEnv...), harnessEnv...) {
		known[v] = ""
	}
	var unknown []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, EnvPrefix+"_") {
			continue
		}
		name, ok := known[k]
		switch {
		case !ok:
			unknown = append(unknown, k)
		case name == "" || v == "" || given[name]:
		default:
			if err := fs.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q (--%s): %v", k, v, name, err)
			}
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		k := unknown[0]
		meant, _ := suggest.Closest(k, slices.Collect(maps.Keys(known))) // a DELAYD_ name is ours: always suggest
		return fmt.Errorf("%s is set, but neither delayd nor delayctl reads it; did you mean %s? (`delayd --help` lists every variable; unset it to start)",
			k, meant)
	}
	return nil
}

// unknownFlag turns the flag package's "flag provided but not defined: -x"
// into a line that names the flag as it is written (--x) and the one it
// probably meant; any other parse error is returned as it is.
func unknownFlag(fs *flag.FlagSet, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if meant, near := suggest.Closest(name, names); near {
		return fmt.Errorf("unknown flag --%s; did you mean --%s? (`delayd --help` lists every flag)", name, meant)
	}
	return fmt.Errorf("unknown flag --%s (`delayd --help` lists every flag)", name)
}

// durationVar defines a duration flag with default def: Go's units plus d
// for days (--max-delay 400d), printed the same way (366d).
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(duration.Value{P: p}, name, usage)
}

// configFrom is the Config that parsed flags ask for: f.Config with the
// listeners an empty DELAYD_* variable turns off, and embedded mode's
// listeners on loopback (see loopbackIfEmbedded, whose answer it returns).
func configFrom(fs *flag.FlagSet, f Flags) (Config, bool) {
	cfg := f.Config
	// DELAYD_HTTP_LISTEN or DELAYD_OPS_LISTEN set but empty turns that
	// listener off (ff ignores empty variables), unless its flag is given.
	if v, ok := os.LookupEnv(EnvPrefix + "_HTTP_LISTEN"); ok && v == "" && !flagGiven(fs, "http-listen") {
		cfg.HTTPListen = ""
	}
	if v, ok := os.LookupEnv(EnvPrefix + "_OPS_LISTEN"); ok && v == "" && !flagGiven(fs, "ops-listen") {
		cfg.OpsListen = ""
	}
	return cfg, loopbackIfEmbedded(fs, &cfg)
}

// loopbackIfEmbedded binds embedded mode's listeners to loopback unless an
// address was given: embedded mode runs without authentication (unless an
// admin key is set) and is for trying delayd on one machine, so listening on
// every interface would open it to the network by surprise. A listener whose
// flag or DELAYD_* variable is set keeps what was asked for (--listen :7070
// opens it on purpose).
// It reports whether the gRPC listener was moved to loopback.
func loopbackIfEmbedded(fs *flag.FlagSet, cfg *Config) bool {
	if cfg.RedisURL != "" {
		return false
	}
	moved := false
	for name, addr := range map[string]*string{"listen": &cfg.Listen, "http-listen": &cfg.HTTPListen, "ops-listen": &cfg.OpsListen} {
		if !flagGiven(fs, name) && loopback(*addr) != *addr {
			*addr = loopback(*addr)
			moved = moved || name == "listen"
		}
	}
	return moved
}

// loopback turns an address on every interface (":7070") into the same
// port on 127.0.0.1; any other address is returned as it is.
func loopback(addr string) string {
	if strings.HasPrefix(addr, ":") {
		return "127.0.0.1" + addr
	}
	return addr
}

// flagGiven reports whether name was set on the command line or by its
// DELAYD_* variable (ff sets flags from the environment).
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// redisLogger adapts slog to go-redis's internal logger, at WARN.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...))
}

// usage prints every flag with its environment variable and default.
func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, "delayd: the delay-task gRPC server.\n\nUsage: delayd [flags]\n\nEvery flag can also be set by the environment variable shown; a flag given on\nthe command line wins. A DELAYD_* variable neither delayd nor delayctl reads\nstops delayd from starting (a misspelt name is not silently ignored);\nDELAYD_VERSION is left alone. Durations take %s.\n\n", duration.Formats)
	fs.VisitAll(func(f *flag.Flag) {
		if notFromEnv[f.Name] {
			fmt.Fprintf(w, "  --%s\n        %s\n", f.Name, f.Usage)
			return
		}
		fmt.Fprintf(w, "  --%s  (%s)\n        %s", f.Name, EnvVar(f.Name), f.Usage)
		if f.DefValue != "" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// uint32Flag is a flag bound to a uint32 field; its default is the field's
// value when the flag is defined.
type uint32Flag struct{ p *uint32 }

func (f uint32Flag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*f.p), 10)
}

func (f uint32Flag) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return errors.New("not a whole number from 0 to 4294967295")
	}
	*f.p = uint32(n)
	return nil
}

// DefaultGCPercent is the garbage collector's target (GOGC) of the delayd
// command when the environment sets no GOGC: a hot path allocates per
// call and per delivery, and at Go's default of 100 collecting cost about
// a fifth of delayd's CPU per unary UpsertTask (delayd CPU for 100,000
// unary upserts: 8.1 and 8.4 s at GOGC=100, 6.1 and 6.6 s at 400, same
// build, alternating runs; docs/BENCHMARKS.md, "Cost per task"). The price
// is a larger heap: up to five times the live one instead of twice.
// GOGC in the environment (any value, off too) wins.
const DefaultGCPercent = 400

// setGCPercent applies DefaultGCPercent unless getenv("GOGC") is set (the
// Go runtime has applied that already). It returns the percent it set, or
// -1 when it left the runtime's alone.
func setGCPercent(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		return -1
	}
	debug.SetGCPercent(DefaultGCPercent)
	return DefaultGCPercent
}
