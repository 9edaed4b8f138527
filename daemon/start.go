package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/delayd/delayd/buildinfo"
	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/history"
	"github.com/delayd/delayd/metrics"
	"github.com/delayd/delayd/ops"
	"github.com/delayd/delayd/push"
	"github.com/delayd/delayd/schedule"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/redisstore"
	"github.com/delayd/delayd/tracing"
	"github.com/delayd/delayd/web"
)

// This file is the composition root: Start runs the phases below in order
// over one parts struct; each phase reads what the ones before it built and
// pushes onto one cleanup stack whatever must be undone when a later phase
// fails. Stop (daemon.go) is the running daemon's way down.

// Start builds and starts delayd and returns once it serves: the listener
// is bound (Addr), the dispatcher runs and health reports SERVING (in
// durable mode as soon as the index is complete; see durable.go). On error
// everything already started is closed again, in reverse. ctx bounds only
// the start itself; the daemon runs until Stop. A nil logger means one built
// from cfg.LogLevel and cfg.LogFormat, writing to stderr.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Daemon, err error) {
	cfg = cfg.withDefaults()
	if logger == nil {
		if logger, err = NewLogger(os.Stderr, cfg.LogLevel, cfg.LogFormat); err != nil {
			return nil, err
		}
	}
	p := &parts{cfg: cfg, logger: logger, build: buildinfo.Get(),
		d: &Daemon{cfg: cfg, logger: logger, serveDone: make(chan struct{}), httpDone: make(chan struct{})}}
	logger.Info("delayd starting", "version", p.build.Version, "commit", p.build.Commit, "go", p.build.GoVersion)
	defer func() {
		if err != nil {
			p.undo.run()
		}
	}()
	for _, phase := range []func(context.Context) error{
		p.openIndex,      // the Redis that holds the task index, answering
		p.observability,  // tracer provider, metrics registry, gRPC instrumentation
		p.openStore,      // the task store (durable mode over the index), tenancy, history
		p.openDispatcher, // HTTP push client and the dispatcher
		p.openEdges,      // gRPC server, listeners, HTTP edge, ops; dispatcher started
	} {
		if err := phase(ctx); err != nil {
			return nil, err
		}
	}
	p.serve()
	return p.d, nil
}

// parts is what Start's phases build, in their order. d holds what the
// running daemon keeps (and Stop takes down); the rest lives only while
// Start runs.
type parts struct {
	cfg    Config
	logger *slog.Logger
	build  buildinfo.Info
	d      *Daemon
	undo   cleanups // what is started so far, undone in reverse if a phase fails

	// observability
	tp      trace.TracerProvider // nil: no tracing
	metrics *metrics.Metrics     // nil without an ops listener: nothing is measured
	grpcOps []grpc.ServerOption  // tracing and metrics of every gRPC call

	// store
	index  *redisstore.Store // the Redis store: the store itself, or durable mode's index
	tasks  storage.Store     // what the server and the dispatcher use (history-wrapped, measured)
	hist   server.History
	access *accessParts
	recent *history.Recent

	// dispatcher
	pushAllow *push.Allow
	schedules storage.Schedules // the Redis index's, or MySQL's in durable mode

	// edges
	httpHandler http.Handler // the HTTP edge's; nil when Config.HTTPListen is empty
}

// cleanups is a stack of undo steps.
type cleanups []func()

func (c *cleanups) push(f func()) { *c = append(*c, f) }

// run undoes every step, last pushed first.
func (c cleanups) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// openIndex connects to the Redis that holds the task index (or starts the
// embedded one) and checks that it answers.
func (p *parts) openIndex(ctx context.Context) (err error) {
	d := p.d
	if d.redis, err = openRedis(p.cfg.RedisURL); err != nil {
		return err
	}
	p.undo.push(func() { _ = d.redis.close() })
	if d.redis.embedded != nil {
		p.logger.Warn("embedded mode: tasks are kept in this process's memory and NOTHING SURVIVES A RESTART; set --redis-url (DELAYD_REDIS_URL) to use a real Redis",
			"store", "miniredis", "addr", d.redis.where)
	}
	pingCtx, cancel := context.WithTimeout(ctx, startPingTimeout)
	defer cancel()
	if err := d.redis.client.Ping(pingCtx).Err(); err != nil {
		return fmt.Errorf("redis at %s does not answer: %w", d.redis.where, err)
	}
	return nil
}

// observability builds the tracer provider (the given one, or one from the
// OTEL_* environment) and, with an ops listener, the one metrics registry
// everything reports to, and the gRPC server options that feed both.
func (p *parts) observability(ctx context.Context) error {
	p.tp = p.cfg.TracerProvider
	if p.tp == nil {
		envTP, err := tracing.FromEnv(ctx)
		if err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
		if envTP != nil {
			p.tp, p.d.tracerShutdown = envTP, envTP.Shutdown
			p.undo.push(func() { _ = envTP.Shutdown(context.Background()) })
			p.logger.Info("tracing on (OpenTelemetry, configured by OTEL_* environment)")
		}
	}
	if p.tp != nil {
		p.grpcOps = append(p.grpcOps, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(p.tp), otelgrpc.WithPropagators(tracing.Propagator()))))
	}
	if p.cfg.OpsListen != "" {
		p.metrics = metrics.New(metrics.Options{Build: p.build})
		p.grpcOps = append(p.grpcOps, p.metrics.GRPCServerOptions()...)
	}
	return nil
}

// openStore builds the task store over the index: the Redis store, and in
// durable mode the MySQL authority with the Redis store as its index
// (durable.go); then tenancy over the registry kept where the tasks'
// authority is, task history, and the store's metrics. The store's parts
// are assigned to the interfaces the server and the dispatcher declare, so
// a store lacking a method they need is a compile error here, not a feature
// that silently goes missing.
func (p *parts) openStore(ctx context.Context) (err error) {
	cfg, d, logger := p.cfg, p.d, p.logger
	// Each namespace's shard count comes from its policy in the registry:
	// this Redis's own, or MySQL's in durable mode (openDurable switches it).
	shards := redisstore.NewRegistryShards(nil)
	opts := redisstore.Options{
		Logger:         logger.With("component", "redisstore"),
		Timeout:        cfg.StoreTimeout,
		Traces:         p.tp != nil,
		MaxScriptBytes: cfg.MaxScriptBytes,
		Shards:         shards,
		AckLinger:      max(cfg.AckLinger, 0),
	}
	if p.metrics != nil {
		opts.LibraryMetrics = p.metrics
	}
	p.index = redisstore.New(d.redis.client, opts)
	shards.Use(p.index)
	// The Lua library, on every master (docs/ARCHITECTURE.md, "The Lua
	// library"): a Redis that refuses it fails the start here rather than
	// every call later.
	if err := p.index.LoadLibrary(ctx); err != nil {
		return fmt.Errorf("redis at %s: %w", d.redis.where, err)
	}
	// Tasks stored by a delayd from before the header/payload split are
	// converted before anything reads them (bounded steps; a no-op after).
	if n, err := p.index.Migrate(ctx); err != nil {
		return fmt.Errorf("redis at %s: converting task records: %w", d.redis.where, err)
	} else if n > 0 {
		logger.Info("converted task records to the current layout", "tasks", n)
	}

	var registry storage.Registry = p.index
	p.tasks, p.hist, p.schedules = p.index, p.index, p.index
	if d.durable, err = openDurable(ctx, cfg, p.index, shards, logger, p.metrics); err != nil {
		return err
	}
	if d.durable != nil {
		p.undo.push(func() { _ = d.durable.close(context.Background()) })
		p.tasks, registry, p.hist, p.schedules = d.durable.store, d.durable.store.Registry(), d.durable.store, d.durable.store
		// A Redis-only deployment switching to durable mode keeps its
		// namespaces and API keys (registryimport.go).
		if err := importRedisRegistry(ctx, p.index, registry, logger); err != nil {
			return fmt.Errorf("durable mode: importing the Redis-only registry (namespaces, API keys) into MySQL: %w", err)
		}
	}

	// Access (access.go): namespaces with their policies and API keys;
	// auth; TLS.
	if p.access, err = openAccess(cfg, d.redis.embedded != nil, registry, logger); err != nil {
		return err
	}
	// Task history (package history): the events of the namespaces whose
	// policy keeps some are recorded after each store call, into hist (the
	// Redis stream, or MySQL in durable mode). recent keeps what this
	// replica delivered lately per namespace (the stats' recent rate and
	// lateness percentiles), in memory.
	replica, _ := os.Hostname()
	p.recent = history.NewRecent()
	p.tasks = history.Wrap(p.tasks, history.Config{Policies: p.access.registry, Sink: p.hist, Replica: replica,
		Logger: logger.With("component", "history"), Recent: p.recent})

	if m := p.metrics; m != nil {
		// The store the server and the dispatcher share is timed and its
		// outcomes counted once; the counts per state come from the Redis
		// index (cheap counters, no scan) when scraped.
		storeName := "redis"
		if d.durable != nil {
			storeName = "mysql"
		}
		p.tasks = m.InstrumentStore(storeName, p.tasks)
		if err := m.Register(m.NewTaskCounts(p.index, 0)); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		// A deleted namespace's series go: at once on the replica that
		// deletes it, within a scrape interval on the others.
		m.ForgetDeleted(p.access.registry, 0)
		if err := m.ObserveReadiness(d.ready); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}

// openDispatcher builds the dispatcher: it pops due tasks for Subscribe
// streams and, with --push-allow, for the namespaces' HTTP push targets.
// It is started by openEdges, once everything that can fail has been built.
func (p *parts) openDispatcher(context.Context) (err error) {
	cfg, d := p.cfg, p.d
	if p.pushAllow, err = push.ParseAllow(cfg.PushAllow); err != nil {
		return fmt.Errorf("--push-allow: %w", err)
	}
	if p.pushAllow, err = p.pushAllow.WithPorts(cfg.PushAllowPorts); err != nil {
		return fmt.Errorf("--push-allow-ports: %w", err)
	}
	var pusher dispatcher.Pusher
	if p.pushAllow.Enabled() {
		roots, err := pushRoots(cfg.PushCAFile)
		if err != nil {
			return err
		}
		client := push.NewClient(push.ClientOptions{Allow: p.pushAllow, UserAgent: "delayd/" + p.build.Version,
			MaxConnsPerHost: cfg.PushConcurrency, RootCAs: roots, Logger: p.logger.With("component", "push")})
		p.undo.push(client.Close)
		pusher, d.pushClient = client, client
		p.logger.Info("HTTP push enabled", "allow", p.pushAllow.String(), "ports", p.pushAllow.Ports(), "concurrency", cfg.PushConcurrency)
	}
	// A nil *metrics.Metrics must not become a non-nil interface.
	var dispMetrics dispatcher.Metrics
	var pushMetrics dispatcher.PushMetrics
	if p.metrics != nil {
		dispMetrics, pushMetrics = p.metrics, p.metrics
	}
	d.dispatcher, err = dispatcher.New(dispatcher.Config{
		Store:           p.tasks,
		Wakeups:         p.index,
		Feed:            p.index,
		Policies:        p.access.registry,
		Namespaces:      p.index, // leases live in the Redis index in both modes
		Logger:          p.logger.With("component", "dispatcher"),
		Metrics:         dispMetrics,
		SafetyPoll:      cfg.SafetyPoll,
		WakePrecision:   cfg.WakePrecision,
		AckRide:         cfg.AckRide,
		LateWarn:        cfg.LateWarn,
		Pusher:          pusher,
		PushConcurrency: cfg.PushConcurrency,
		PushMetrics:     pushMetrics,
	})
	if err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	// The schedule loop: schedules kept where the tasks' authority is;
	// firings' tasks read and removed through the store the server uses
	// (history-recording); firings' events into the same history.
	var schedMetrics schedule.Metrics
	if p.metrics != nil {
		schedMetrics = p.metrics
	}
	d.scheduler, err = schedule.New(schedule.Config{
		Schedules:  p.schedules,
		Tasks:      p.tasks,
		Namespaces: p.access.registry,
		History:    p.hist,
		Logger:     p.logger.With("component", "schedule"),
		Metrics:    schedMetrics,
		Lookahead:  cfg.ScheduleLookahead,
		Poll:       cfg.SchedulePoll,
	})
	if err != nil {
		return fmt.Errorf("schedules: %w", err)
	}
	return nil
}

// openEdges builds the gRPC server (health NOT_SERVING until serve), binds
// its listener and, when Config.HTTPListen is set, the HTTP edge's
// (Connect, gRPC-Web, JSON and the console over the same server); then
// starts the dispatcher and the ops listener (/metrics, /healthz, /readyz,
// pprof if asked).
func (p *parts) openEdges(ctx context.Context) (err error) {
	cfg, d := p.cfg, p.d
	d.server, err = server.New(server.Options{
		Logger:          p.logger.With("component", "server"),
		CallLog:         server.CallLog{SlowCall: cfg.SlowCall},
		Store:           p.tasks,
		Tenancy:         p.access.registry,
		Subscriptions:   d.dispatcher,
		History:         p.hist,
		Schedules:       d.scheduler,
		Recent:          p.recent,
		Auth:            p.access.auth,
		TLS:             p.access.tls,
		Limits:          cfg.Limits,
		SharedLimits:    p.index, // the Redis store in both modes: limits hold across replicas
		Reflection:      cfg.Reflection,
		Instrumentation: p.grpcOps,
		PushAllow:       p.pushAllow,
	})
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	// The server's stream workers run from New on: a failed start stops them.
	p.undo.push(func() { _ = d.server.GracefulStop(context.Background()) })
	if p.metrics != nil {
		p.metrics.InitGRPC(d.server)
	}
	var lc net.ListenConfig
	if d.lis, err = lc.Listen(ctx, "tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	p.undo.push(func() { _ = d.lis.Close() })

	if cfg.HTTPListen != "" {
		if p.httpHandler, err = web.Handler(web.Options{
			GRPC:             d.server.HTTPHandler(),
			Services:         server.ServiceNames(),
			MaxMessageBytes:  d.server.MaxMessageBytes(),
			Admit:            d.server.AdmitHTTP,
			MaxRepeatedItems: d.server.MaxRepeatedItems(),
		}); err != nil {
			return err
		}
		if d.httpLis, err = lc.Listen(ctx, "tcp", cfg.HTTPListen); err != nil {
			return fmt.Errorf("listen on %s (--http-listen): %w", cfg.HTTPListen, err)
		}
		p.undo.push(func() { _ = d.httpLis.Close() })
	}

	// The dispatcher's background work lives until Stop, not until the end
	// of ctx, so that shutdown happens in the order Stop writes down.
	if err = d.dispatcher.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("dispatcher: %w", err)
	}
	p.undo.push(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		_ = d.dispatcher.Stop(stopCtx)
	})
	if err = d.scheduler.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("schedules: %w", err)
	}
	p.undo.push(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		_ = d.scheduler.Stop(stopCtx)
	})

	if cfg.OpsListen != "" {
		if d.ops, err = ops.Start(ctx, ops.Config{
			Addr:    cfg.OpsListen,
			Metrics: p.metrics.Handler(),
			Ready:   d.ready,
			Pprof:   cfg.Pprof,
			Logger:  p.logger.With("component", "ops"),
		}); err != nil {
			return err
		}
	}
	return nil
}

// serve starts serving on the bound listeners; it cannot fail. Health turns
// SERVING now, or in durable mode once the index is complete.
func (p *parts) serve() {
	d := p.d
	go func() {
		defer close(d.serveDone)
		d.serveErr = d.server.Serve(d.lis)
	}()
	if d.httpLis != nil {
		go func() {
			defer close(d.httpDone)
			d.httpErr = d.server.ServeHTTPEdge(d.httpLis, p.httpHandler)
		}()
	}
	if d.durable == nil {
		d.server.SetServing(true)
	} else {
		go d.durable.serveWhenIndexed(d.server, p.logger) // SERVING once the index is complete
	}
	p.logger.Info("delayd serving", "addr", d.Addr(), "http_addr", d.HTTPAddr(), "store", d.redis.mode, "redis", d.redis.where,
		"durable", d.durable != nil, "auth", !p.access.auth.Disabled, "tls", p.access.tls != nil,
		"auto_create_namespaces", p.access.registry.AutoCreate(), "reflection", p.cfg.Reflection,
		"ops", d.OpsAddr(), "pprof", p.cfg.Pprof && d.ops != nil)
}
