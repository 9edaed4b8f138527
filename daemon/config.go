package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/push"
	"github.com/delayd/delayd/schedule"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/durable"
)

// Config is everything a delayd process is started from. The zero value is
// a working configuration: embedded mode on :7070.
type Config struct {
	// Listen is the TCP address the gRPC server listens on, host:port.
	// Port 0 picks a free port (see Daemon.Addr). If empty, ":7070".
	Listen string

	// HTTPListen is the TCP address of the HTTP edge, host:port: the same
	// services over Connect (JSON or binary), gRPC-Web and gRPC, with the
	// same auth and limits, and the web console at /ui/ (package web). TLS
	// and mTLS as on the gRPC listener. Port 0 picks a free port (see
	// Daemon.HTTPAddr). If empty, there is no HTTP edge; the delayd binary's
	// --http-listen defaults to ":7071".
	HTTPListen string

	// RedisURL is the Redis holding the task index:
	//   - "" (default): embedded mode, an in-process Redis-compatible store
	//     (miniredis) in memory; nothing survives a restart, and delayd logs
	//     one WARN saying so. For trying delayd, demos and local development.
	//   - redis://[user:password@]host:port[/db][?dial_timeout=3s&...] or
	//     rediss://... (TLS), unix:///path/redis.sock: one Redis server,
	//     parsed by go-redis's redis.ParseURL (query options as documented
	//     there).
	//   - redis-cluster://[user:password@]host1:port1,host2:port2[?options]
	//     or rediss-cluster://... (TLS): a Redis Cluster, seeded from the
	//     listed nodes; options as documented for go-redis's
	//     redis.ParseClusterURL. No database number (Cluster has only db 0).
	RedisURL string

	// MySQLDSN turns on durable mode (see storage/durable): MySQL becomes
	// the authority for every task and Redis the fast index. go-sql-driver
	// form, e.g. "user:pass@tcp(host:3306)/delayd". If empty (default),
	// delayd runs Redis-only and says so at start. The schema is migrated
	// at start; health stays NOT_SERVING until the Redis index is complete
	// (rebuilt from MySQL where Redis lost it).
	MySQLDSN string
	// ReconcileInterval is how often, in durable mode, the leader replica's
	// incremental pass re-indexes the tasks changed in MySQL since its last
	// pass whose Redis copy differs. If zero, DefaultReconcileInterval
	// (30 seconds).
	ReconcileInterval time.Duration
	// FullReconcileInterval is how often, in durable mode, the leader
	// compares every task of MySQL with Redis and every Redis entry with
	// MySQL (forgetting entries MySQL does not have); it also runs once
	// when a replica becomes leader. If zero, DefaultFullReconcileInterval
	// (1 hour).
	FullReconcileInterval time.Duration

	// LogLevel is the lowest level logged: debug, info, warn or error.
	// Used only when Run or Start is given a nil logger. If empty, "info".
	LogLevel string
	// SlowCall is the duration from which a unary call is logged at WARN
	// ("slow call"). Calls that succeed faster are logged only at DEBUG,
	// so the default INFO level is quiet under load (server.CallLog). If
	// zero, 1 second; negative: never.
	SlowCall time.Duration
	// LogFormat is "text" (logfmt-like) or "json". Used only when Run or
	// Start is given a nil logger. If empty, "text".
	LogFormat string

	// Limits bound requests (batch size, message size, streams per
	// connection, in-flight credit). Zero fields take the defaults
	// documented on server.Limits.
	Limits server.Limits

	// MaxPayloadBytes is the largest task payload accepted, in bytes, for
	// every namespace. If zero, 64 KiB (storage.DefaultPolicy).
	MaxPayloadBytes int
	// MaxDelay is the horizon: the furthest ahead a task may be due. If
	// zero, 366 days (storage.DefaultPolicy).
	MaxDelay time.Duration

	// StoreTimeout is the deadline of each store call. If zero, each store's
	// own default: 5 seconds per Redis call (redisstore.DefaultTimeout), 10
	// seconds per MySQL transaction in durable mode
	// (durable.DefaultOpTimeout).
	StoreTimeout time.Duration
	// RegistryCacheTTL is how long a replica serves a namespace, policy or
	// API key from its cache: a revoked key, a deleted namespace or a policy
	// change reaches every replica within it. If zero, 1 second
	// (tenancy.DefaultTTL).
	RegistryCacheTTL time.Duration
	// MaxScriptBytes bounds the arguments of one Redis script call that
	// writes tasks or settles deliveries; longer batches are split into
	// several calls. If zero, 1 MiB (redisstore.DefaultMaxScriptBytes).
	MaxScriptBytes int
	// SafetyPoll is the dispatcher's slow poll that catches a missed
	// wake-up. If zero, 1 second (dispatcher.Config.SafetyPoll).
	SafetyPoll time.Duration
	// WakePrecision is how finely the dispatcher times its wakes: wakes
	// and wake signals within it join one store call (tasks are never
	// popped early, at most this much later). If zero, 1 ms
	// (dispatcher.DefaultWakePrecision); negative: no joining.
	WakePrecision time.Duration
	// AckLinger is how long an ack that finds no script call of its
	// namespace shard in flight and no pop coming waits for others to share
	// its Redis script call (redisstore.Options.AckLinger). It delays ack
	// answers, never deliveries. Zero or negative: no wait
	// (DefaultAckLinger); acks still share a script call in flight's next
	// one, or ride a pop coming (AckRide).
	AckLinger time.Duration
	// AckRide is how close the dispatcher's next pop of a namespace must
	// be for the namespace's acks and nacks to wait for it and be settled
	// in its script call (dispatcher.Config.AckRide): one Redis script
	// call per wake of a steady flow instead of one for the pop and one per
	// ack. An ack waits at most that long (plus WakePrecision); with no pop
	// that close it is settled at once. If zero, 3 ms (DefaultAckRide);
	// negative: acks are always settled on their own.
	AckRide time.Duration
	// ScheduleLookahead is how long before its slot a schedule's firing is
	// created as a task (overlap ALLOW), so it waits in the index and is
	// delivered on time; pausing, updating or deleting a schedule removes
	// the firings created within it that are not due yet. If zero, 10
	// seconds (schedule.DefaultLookahead).
	ScheduleLookahead time.Duration
	// SchedulePoll is the longest the schedule loop sleeps between two
	// looks at the due schedules (it wakes earlier for the next one it
	// knows of). If zero, 1 second (schedule.DefaultPoll).
	SchedulePoll time.Duration
	// LateWarn is the lateness past a task's due time from which its
	// delivery is logged at WARN (at most once per namespace every 10 s,
	// with the count and the worst), so a stall is never silent. If zero,
	// 1 second (dispatcher.DefaultLateWarn); negative: never.
	LateWarn time.Duration
	// PushAllow lists the hosts and CIDR prefixes namespaces may push to
	// (NamespacePolicy.push), comma-separated: "hooks.example.com",
	// "*.example.com", "203.0.113.0/24" (see push.Allow for exactly what
	// each admits; every connection is checked on the address dialed). If
	// empty, push is disabled: a policy that sets push is refused.
	PushAllow string
	// PushAllowPorts lists the ports push URLs may name, comma-separated
	// ports and ranges ("443", "8000-8999"); a URL without a port names 80
	// (http) or 443 (https). If empty, "80,443" (push.DefaultPorts).
	// Checked when a URL is set and on every connection, like PushAllow.
	PushAllowPorts string
	// PushCAFile, if set, is a PEM file of certificate authorities https
	// push targets are verified against, besides the system's (endpoints
	// with certificates of a private CA). If empty, the system's only.
	PushCAFile string
	// PushConcurrency is the most push requests one namespace has in
	// flight on one replica. If zero, 16 (dispatcher.DefaultPushConcurrency).
	PushConcurrency int
	// ShutdownTimeout bounds shutdown: the dispatcher handing deliveries
	// back and running calls draining together get this long, then every
	// connection is closed. If zero, 10 seconds.
	ShutdownTimeout time.Duration

	// Reflection serves gRPC server reflection, so grpcurl works with no
	// .proto files at hand. Default off: reflection needs no API key and
	// tells anyone who connects every service, method and message of the
	// API, and each reflection stream is one more call a client without a
	// key may hold open. `make run` turns it on (--reflection) for local
	// use.
	Reflection bool

	// AdminKey is the bootstrap admin key: a global key with every scope,
	// sent as gRPC metadata "authorization: Bearer <key>", for operators to
	// create namespaces and their API keys with. Setting it turns API-key
	// authentication on (32-512 printable ASCII characters, no placeholder:
	// guard.ResolveAuth refuses anything else, here and in the binary). If
	// empty, authentication is off and every client may do everything: the delayd
	// binary refuses that against a real Redis unless --no-auth is given
	// (guard.ResolveAuth); Start allows it for tests and tools that run
	// delayd in-process on loopback.
	AdminKey string
	// AutoCreateNamespaces creates an unknown namespace with the default
	// policy on its first use. Default off when authentication is on
	// (namespaces are created with NamespaceService.CreateNamespace);
	// always on in embedded mode and while authentication is off.
	AutoCreateNamespaces bool

	// TLSCertFile and TLSKeyFile are the PEM certificate chain and private
	// key the listener serves TLS with; both or neither. If neither,
	// plaintext. A changed file is picked up without a restart.
	TLSCertFile string
	TLSKeyFile  string
	// TLSClientCAFile, if set, requires every client to present a
	// certificate signed by one of these PEM CAs (mTLS).
	TLSClientCAFile string

	// OpsListen is the address of the ops listener (package ops): plain
	// HTTP with /metrics, /healthz, /readyz and, with Pprof, /debug/pprof/.
	// If empty, there is no ops listener and nothing is measured (no
	// metrics cost on the hot path). The delayd binary's default is ":9070"
	// (DefaultOpsListen); port 0 picks a free port (see Daemon.OpsAddr).
	OpsListen string
	// Pprof serves Go profiling under /debug/pprof/ on the ops listener.
	// Default off.
	Pprof bool

	// TracerProvider, if set, traces every gRPC call (OpenTelemetry, W3C
	// trace context) and keeps each traced upsert's trace context with its
	// task, so the delivery links back to the producer. If nil, Start builds
	// one from the standard OTEL_* environment (package tracing), and
	// tracing is off when those are unset.
	TracerProvider trace.TracerProvider
}

// Defaults of Config, each stated once: withDefaults fills zero fields with
// them and BindFlags shows them as the flags' defaults. Defaults owned by
// the part that uses them are re-exported here under the Config field's
// name.
const (
	DefaultListen            = ":7070"
	DefaultHTTPListen        = ":7071"
	DefaultOpsListen         = ":9070"
	DefaultShutdownTimeout   = 10 * time.Second
	DefaultLogLevel          = "info"
	DefaultLogFormat         = "text"
	DefaultReconcileInterval = durable.DefaultReconcileInterval
	// DefaultFullReconcileInterval is FullReconcileInterval's default.
	DefaultFullReconcileInterval = durable.DefaultFullReconcileInterval
	DefaultSafetyPoll            = dispatcher.DefaultSafetyPoll
	DefaultWakePrecision         = dispatcher.DefaultWakePrecision
	// DefaultAckLinger is AckLinger's default: no wait. A linger made every
	// verdict request of a StreamDeliveries stream, which its receiver
	// applies one after another, wait it out: at 2 ms one stream acked
	// about 4,000 tasks/s, and 100k tasks due over 5 s on four streams
	// arrived up to 0.6 s late (p99 5 ms without it), while at 500 tasks/s
	// it saved no CPU (docs/BENCHMARKS.md, "The ack linger").
	DefaultAckLinger time.Duration = 0
	// DefaultAckRide is AckRide's default (dispatcher.DefaultAckRide).
	DefaultAckRide           = dispatcher.DefaultAckRide
	DefaultLateWarn          = dispatcher.DefaultLateWarn
	DefaultScheduleLookahead = schedule.DefaultLookahead
	DefaultSchedulePoll      = schedule.DefaultPoll
	DefaultPushConcurrency   = dispatcher.DefaultPushConcurrency
)

// defaultPolicy is the namespace policy a zero Config gives every
// namespace (MaxPayloadBytes, MaxDelay).
func defaultPolicy() storage.Policy { return storage.DefaultPolicy() }

// withDefaults returns c with empty fields set to their defaults. Fields
// whose default belongs to another part (Limits, SlowCall, StoreTimeout)
// are left zero and that part applies its own.
func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if c.LogFormat == "" {
		c.LogFormat = DefaultLogFormat
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.FullReconcileInterval <= 0 {
		c.FullReconcileInterval = DefaultFullReconcileInterval
	}
	if c.SafetyPoll <= 0 {
		c.SafetyPoll = DefaultSafetyPoll
	}
	if c.WakePrecision == 0 {
		c.WakePrecision = DefaultWakePrecision
	}
	if c.AckRide == 0 {
		c.AckRide = DefaultAckRide
	}
	if c.LateWarn == 0 {
		c.LateWarn = DefaultLateWarn
	}
	if c.ScheduleLookahead <= 0 {
		c.ScheduleLookahead = DefaultScheduleLookahead
	}
	if c.SchedulePoll <= 0 {
		c.SchedulePoll = DefaultSchedulePoll
	}
	if c.PushConcurrency <= 0 {
		c.PushConcurrency = DefaultPushConcurrency
	}
	if c.PushAllowPorts == "" {
		c.PushAllowPorts = push.DefaultPorts
	}
	return c
}

// policy is the namespace policy every namespace gets from this Config.
func (c Config) policy() storage.Policy {
	p := defaultPolicy()
	if c.MaxPayloadBytes > 0 {
		p.MaxPayloadBytes = c.MaxPayloadBytes
	}
	if c.MaxDelay > 0 {
		p.MaxDelay = c.MaxDelay
	}
	return p
}

// NewLogger returns a slog.Logger writing to w at level (debug, info, warn,
// error; "" = info) in format ("text" or "json"; "" = text).
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if level == "" {
		level = DefaultLogLevel
	}
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: allowed: debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: allowed: text, json", format)
}
