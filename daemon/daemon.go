// Package daemon wires a delayd process together: Config → Redis (or the
// embedded store) → task store → dispatcher → gRPC server, and runs it until
// its context ends, then shuts it down in order within a bounded time.
//
// cmd/delayd is a thin main over Run. Tests, the benchmark tool and the
// examples start a real delayd in-process with Start on 127.0.0.1:0 and
// read the bound address from Daemon.Addr.
package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"

	"github.com/delayd/delayd/buildinfo"
	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/history"
	"github.com/delayd/delayd/metrics"
	"github.com/delayd/delayd/ops"
	"github.com/delayd/delayd/push"
	"github.com/delayd/delayd/server"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/redisstore"
	"github.com/delayd/delayd/tracing"
	"github.com/delayd/delayd/web"
)

// startPingTimeout bounds the check that Redis answers at start.
const startPingTimeout = 5 * time.Second

// Daemon is a running delayd: a gRPC server on a bound address with its
// store and dispatcher. Build it with Start; stop it once with Stop.
type Daemon struct {
	cfg    Config
	logger *slog.Logger

	redis      *redisConn
	durable    *durableMode // durable mode (durable.go); nil when Redis-only
	dispatcher *dispatcher.Dispatcher
	// pushClient sends HTTP pushes when --push-allow is set; else nil.
	pushClient *push.Client
	server     *server.Server
	lis        net.Listener
	httpLis    net.Listener // nil when Config.HTTPListen is empty
	ops        *ops.Server  // nil when Config.OpsListen is empty
	stopping   atomic.Bool  // set when Stop begins: /readyz says so

	tracerShutdown func(context.Context) error // flushes an OTEL_*-built tracer; nil otherwise

	serveDone chan struct{} // closed when Serve returns
	serveErr  error         // Serve's error; read after serveDone
	httpDone  chan struct{} // closed when the HTTP edge's Serve returns
	httpErr   error         // its error; read after httpDone

	stopOnce sync.Once
	stopErr  error
}

// Run starts delayd with cfg, serves until ctx is done (or the listener
// fails), then stops it within cfg.ShutdownTimeout. A nil logger means one
// built from cfg.LogLevel and cfg.LogFormat, writing to stderr. Run returns
// nil after a clean shutdown.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	d, err := Start(ctx, cfg, logger)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		d.logger.Info("shutting down", "reason", context.Cause(ctx), "timeout", d.cfg.ShutdownTimeout)
	case <-d.serveDone:
		d.logger.Error("gRPC server stopped unexpectedly", "error", d.serveErr)
	case <-d.httpDone:
		d.logger.Error("HTTP edge stopped unexpectedly", "error", d.httpErr)
	}
	// The run context is done; shutdown gets its own bounded context.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ShutdownTimeout)
	defer cancel()
	stopErr := d.Stop(stopCtx)
	if d.serveErr != nil || d.httpErr != nil {
		return errors.Join(d.serveErr, d.httpErr, stopErr)
	}
	return stopErr
}

// Start builds and starts delayd and returns once it serves: the listener
// is bound (Addr), the dispatcher runs and health reports SERVING (in
// durable mode as soon as the index is complete; see durable.go). On error
// everything already started is closed again. ctx bounds only the start
// itself; the daemon runs until Stop. A nil logger means one built from
// cfg.LogLevel and cfg.LogFormat, writing to stderr.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (_ *Daemon, err error) {
	cfg = cfg.withDefaults()
	if logger == nil {
		if logger, err = NewLogger(os.Stderr, cfg.LogLevel, cfg.LogFormat); err != nil {
			return nil, err
		}
	}
	d := &Daemon{cfg: cfg, logger: logger, serveDone: make(chan struct{}), httpDone: make(chan struct{})}
	build := buildinfo.Get()
	logger.Info("delayd starting", "version", build.Version, "commit", build.Commit, "go", build.GoVersion)
	// cleanup undoes what has been started so far, in reverse order.
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	// 1. The Redis that holds the task index.
	d.redis, err = openRedis(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { _ = d.redis.close() })
	if d.redis.embedded != nil {
		logger.Warn("embedded mode: tasks are kept in this process's memory and NOTHING SURVIVES A RESTART; set --redis-url (DELAYD_REDIS_URL) to use a real Redis",
			"store", "miniredis", "addr", d.redis.where)
	}
	pingCtx, cancel := context.WithTimeout(ctx, startPingTimeout)
	err = d.redis.client.Ping(pingCtx).Err()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("redis at %s does not answer: %w", d.redis.where, err)
	}

	// 1b. Tracing: the given provider, or one from the OTEL_* environment.
	tp := cfg.TracerProvider
	if tp == nil {
		envTP, err := tracing.FromEnv(ctx)
		if err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
		if envTP != nil {
			tp, d.tracerShutdown = envTP, envTP.Shutdown
			cleanup = append(cleanup, func() { _ = envTP.Shutdown(context.Background()) })
			logger.Info("tracing on (OpenTelemetry, configured by OTEL_* environment)")
		}
	}

	// 2. The task store over it.
	// Each namespace's shard count comes from its policy in the registry:
	// this Redis's own, or MySQL's in durable mode (openDurable switches it).
	shards := redisstore.NewRegistryShards(nil)
	store := redisstore.New(d.redis.client, redisstore.Options{
		Logger:         logger.With("component", "redisstore"),
		Timeout:        cfg.StoreTimeout,
		Traces:         tp != nil,
		MaxScriptBytes: cfg.MaxScriptBytes,
		Shards:         shards,
	})
	shards.Use(store)
	// Tasks stored by a delayd from before the header/payload split are
	// converted before anything reads them (bounded steps; a no-op after).
	if n, err := store.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("redis at %s: converting task records: %w", d.redis.where, err)
	} else if n > 0 {
		logger.Info("converted task records to the current layout", "tasks", n)
	}

	// With an ops listener, everything reports to one metrics registry
	// (package metrics); without one, nothing is measured.
	var m *metrics.Metrics
	if cfg.OpsListen != "" {
		m = metrics.New(metrics.Options{Build: build})
	}

	// 2b. Durable mode: MySQL is the authority and store its index
	// (durable.go). tasks is what the server and the dispatcher use;
	// namespaces and their keys are kept where the tasks' authority is; the
	// lease reaper sweeps the namespaces the Redis index holds (leases live
	// there in both modes). Each is assigned a concrete store, so a store
	// lacking a method the server or the dispatcher needs is a compile error
	// here, not a feature that silently goes missing.
	var (
		tasks      server.Store               = store
		registry   storage.Registry           = store
		namespaces dispatcher.NamespaceLister = store
		hist       server.History             = store
	)
	if d.durable, err = openDurable(ctx, cfg, store, shards, logger, m); err != nil {
		return nil, err
	}
	if d.durable != nil {
		cleanup = append(cleanup, func() { _ = d.durable.close(context.Background()) })
		tasks, registry, hist = d.durable.store, d.durable.store.Registry(), d.durable.store
		// A Redis-only deployment switching to durable mode keeps its
		// namespaces and API keys (registryimport.go).
		if err := importRedisRegistry(ctx, store, registry, logger); err != nil {
			return nil, fmt.Errorf("durable mode: importing the Redis-only registry (namespaces, API keys) into MySQL: %w", err)
		}
	}

	// 2c. Tenancy (tenancy.go): namespaces with their policies and API keys;
	// auth; TLS.
	ten, err := openTenancy(cfg, d.redis.embedded != nil, registry, logger)
	if err != nil {
		return nil, err
	}
	// Task history (package history): the events of the namespaces whose
	// policy keeps some are recorded after each store call, into hist
	// (the Redis stream, or MySQL in durable mode).
	// recent keeps what this replica delivered lately per namespace (the
	// stats' recent rate and lateness percentiles), in memory.
	replica, _ := os.Hostname()
	recent := history.NewRecent()
	tasks = history.Wrap(tasks, history.Config{Policies: ten.registry, Sink: hist, Replica: replica,
		Logger: logger.With("component", "history"), Recent: recent})

	var instrumentation []grpc.ServerOption
	var dispMetrics dispatcher.Metrics
	if tp != nil {
		instrumentation = append(instrumentation, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(tracing.Propagator()))))
	}
	if m != nil {
		// The store the server and the dispatcher share is timed and its
		// outcomes counted once; the counts per state come from the Redis
		// index (cheap counters, no scan) when scraped.
		storeName := "redis"
		if d.durable != nil {
			storeName = "mysql"
		}
		tasks = m.InstrumentStore(storeName, tasks)
		if err = m.Register(m.NewTaskCounts(store, 0)); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		if err = m.ObserveReadiness(d.ready); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		instrumentation = append(instrumentation, m.GRPCServerOptions()...)
		dispMetrics = m
	}

	// 3. The dispatcher: pops due tasks for Subscribe streams and, with
	// --push-allow, for the namespaces' HTTP push targets.
	pushAllow, err := push.ParseAllow(cfg.PushAllow)
	if err != nil {
		return nil, fmt.Errorf("--push-allow: %w", err)
	}
	var pusher dispatcher.Pusher
	var pushMetrics dispatcher.PushMetrics
	if pushAllow.Enabled() {
		roots, err := pushRoots(cfg.PushCAFile)
		if err != nil {
			return nil, err
		}
		client := push.NewClient(push.ClientOptions{Allow: pushAllow, UserAgent: "delayd/" + build.Version,
			MaxConnsPerHost: cfg.PushConcurrency, RootCAs: roots})
		cleanup = append(cleanup, client.Close)
		pusher, d.pushClient = client, client
		logger.Info("HTTP push enabled", "allow", pushAllow.String(), "concurrency", cfg.PushConcurrency)
	}
	if m != nil {
		pushMetrics = m
	}
	d.dispatcher, err = dispatcher.New(dispatcher.Config{
		Store:           tasks,
		Wakeups:         store,
		Feed:            store,
		Policies:        ten.registry,
		Namespaces:      namespaces,
		Logger:          logger.With("component", "dispatcher"),
		Metrics:         dispMetrics,
		SafetyPoll:      cfg.SafetyPoll,
		WakePrecision:   cfg.WakePrecision,
		LateWarn:        cfg.LateWarn,
		Pusher:          pusher,
		PushConcurrency: cfg.PushConcurrency,
		PushMetrics:     pushMetrics,
	})
	if err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}

	// 4. The gRPC server; health says NOT_SERVING until the end of Start.
	d.server, err = server.New(server.Options{
		Logger:            logger.With("component", "server"),
		CallLog:           server.CallLog{SlowCall: cfg.SlowCall},
		Store:             tasks,
		Tenancy:           ten.registry,
		Subscriptions:     d.dispatcher,
		History:           hist,
		Recent:            recent,
		Auth:              ten.auth,
		TLS:               ten.tls,
		Limits:            cfg.Limits,
		SharedLimits:      store, // the Redis store in both modes: limits hold across replicas
		DisableReflection: cfg.DisableReflection,
		Instrumentation:   instrumentation,
		PushAllow:         pushAllow,
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if m != nil {
		m.InitGRPC(d.server)
	}
	var lc net.ListenConfig
	d.lis, err = lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	cleanup = append(cleanup, func() { _ = d.lis.Close() })

	// 4b. The HTTP edge (Connect, gRPC-Web, JSON and the console) over the
	// same server, when Config.HTTPListen is set.
	var httpHandler http.Handler
	if cfg.HTTPListen != "" {
		httpHandler, err = web.Handler(web.Options{
			GRPC:             d.server.HTTPHandler(),
			Services:         server.ServiceNames(),
			MaxMessageBytes:  d.server.MaxMessageBytes(),
			Admit:            d.server.AdmitHTTP,
			MaxRepeatedItems: d.server.MaxRepeatedItems(),
		})
		if err != nil {
			return nil, err
		}
		d.httpLis, err = lc.Listen(ctx, "tcp", cfg.HTTPListen)
		if err != nil {
			return nil, fmt.Errorf("listen on %s (--http-listen): %w", cfg.HTTPListen, err)
		}
		cleanup = append(cleanup, func() { _ = d.httpLis.Close() })
	}

	// The dispatcher's background work lives until Stop, not until the end
	// of ctx, so that shutdown happens in the order Stop writes down.
	if err = d.dispatcher.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("dispatcher: %w", err)
	}
	cleanup = append(cleanup, func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		_ = d.dispatcher.Stop(stopCtx)
	})

	// 5. The ops listener: /metrics, /healthz, /readyz (pprof if asked).
	if cfg.OpsListen != "" {
		d.ops, err = ops.Start(ctx, ops.Config{
			Addr:    cfg.OpsListen,
			Metrics: m.Handler(),
			Ready:   d.ready,
			Pprof:   cfg.Pprof,
			Logger:  logger.With("component", "ops"),
		})
		if err != nil {
			return nil, err
		}
	}

	go func() {
		defer close(d.serveDone)
		d.serveErr = d.server.Serve(d.lis)
	}()
	if d.httpLis != nil {
		go func() {
			defer close(d.httpDone)
			d.httpErr = d.server.ServeHTTPEdge(d.httpLis, httpHandler)
		}()
	}
	if d.durable == nil {
		d.server.SetServing(true)
	} else {
		go d.durable.serveWhenIndexed(d.server, logger) // SERVING once the index is complete
	}
	logger.Info("delayd serving", "addr", d.Addr(), "http_addr", d.HTTPAddr(), "store", d.redis.mode, "redis", d.redis.where,
		"durable", d.durable != nil, "auth", !ten.auth.Disabled, "tls", ten.tls != nil,
		"auto_create_namespaces", ten.registry.AutoCreate(), "reflection", !cfg.DisableReflection,
		"ops", d.OpsAddr(), "pprof", cfg.Pprof && d.ops != nil)
	return d, nil
}

// OpsAddr is the address the ops listener is bound to; "" when
// Config.OpsListen is empty.
func (d *Daemon) OpsAddr() string {
	if d.ops == nil {
		return ""
	}
	return d.ops.Addr()
}

// ready is /readyz: nil while this replica serves, else the reason it
// does not.
func (d *Daemon) ready(ctx context.Context) error {
	if d.stopping.Load() {
		return errors.New("shutting down")
	}
	if d.durable != nil {
		select {
		case <-d.durable.store.Ready():
		default:
			return errors.New("durable mode: the Redis index is being rebuilt from MySQL")
		}
	}
	if err := d.redis.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s does not answer: %w", d.redis.where, err)
	}
	if d.durable != nil {
		if err := d.durable.store.DB().PingContext(ctx); err != nil {
			return fmt.Errorf("mysql does not answer: %w", err)
		}
	}
	return nil
}

// Addr is the address the gRPC server listens on (with the real port when
// Config.Listen asked for port 0).
func (d *Daemon) Addr() string { return d.lis.Addr().String() }

// HTTPAddr is the address the HTTP edge listens on (with the real port when
// Config.HTTPListen asked for port 0), or "" when it is off.
func (d *Daemon) HTTPAddr() string {
	if d.httpLis == nil {
		return ""
	}
	return d.httpLis.Addr().String()
}

// Stop shuts delayd down; ctx bounds the dispatcher hand-back and the drain
// of running calls together. Calling it again returns the first result.
//
// The order, senders before receivers:
//  1. health NOT_SERVING, so probes and load balancers send no new work;
//  2. dispatcher Stop: stop popping, hand back what streams still hold,
//     end the Subscribe streams, cancel push requests in flight (handed
//     back); then close the push client's idle connections;
//  3. gRPC GracefulStop and the HTTP edge's shutdown, together: running
//     unary calls finish; when ctx ends first, the remaining connections
//     are closed;
//     3b. durable mode: stop the MySQL store (writes already accepted are
//     committed and indexed, the reconciler ends, the pool closes);
//  4. close Redis (and the embedded store): nothing uses it any more. (When
//     ctx ends before the drain does, Redis is closed at once, so calls stuck
//     in the store fail instead of holding the shutdown past its bound.)
//  5. stop the ops listener, last, so /readyz answers "shutting down" (503)
//     for the whole shutdown and /metrics can be scraped until the end;
//  6. flush the spans of a tracer built from the OTEL_* environment.
func (d *Daemon) Stop(ctx context.Context) error {
	d.stopOnce.Do(func() {
		start := time.Now()
		d.stopping.Store(true)
		if d.durable != nil {
			d.durable.stopWaiting() // no SERVING after this point
		}
		d.server.SetServing(false)        // 1
		dispErr := d.dispatcher.Stop(ctx) // 2
		if d.pushClient != nil {
			d.pushClient.Close()
		}
		grpcDone := make(chan error, 1) // 3
		go func() {
			httpErr := make(chan error, 1)
			go func() { httpErr <- d.server.ShutdownHTTPEdge(ctx) }()
			grpcErr := d.server.GracefulStop(ctx)
			grpcDone <- errors.Join(grpcErr, <-httpErr)
		}()
		var grpcErr, durableErr, redisErr error
		select {
		case grpcErr = <-grpcDone:
			<-d.serveDone
			d.waitHTTP()
			if d.durable != nil { // 3b. commit what was accepted, close MySQL
				durableErr = d.durable.close(ctx)
			}
			redisErr = d.redis.close() // 4
		case <-ctx.Done():
			// Out of time: GracefulStop closes the connections, but a
			// handler blocked in a store call holds its connection until
			// the call returns. Closing Redis now makes those calls fail at
			// once, so the stop stays bounded.
			redisErr = d.redis.close() // 4, early
			grpcErr = <-grpcDone
			<-d.serveDone
			d.waitHTTP()
			if d.durable != nil {
				durableErr = d.durable.close(ctx)
			}
		}
		var opsErr, traceErr error
		if d.ops != nil { // 5. last, so /readyz says "shutting down" throughout
			opsErr = d.ops.Stop(ctx)
		}
		if d.tracerShutdown != nil { // 6. flush the spans of the shutdown too
			traceErr = d.tracerShutdown(ctx)
		}
		d.stopErr = errors.Join(wrap("dispatcher stop", dispErr), grpcErr, wrap("stop mysql store", durableErr), wrap("close redis", redisErr), wrap("stop ops listener", opsErr), wrap("flush traces", traceErr))
		if d.stopErr != nil {
			d.logger.Warn("delayd stopped, not cleanly", "error", d.stopErr, "took", time.Since(start))
		} else {
			d.logger.Info("delayd stopped cleanly", "took", time.Since(start))
		}
	})
	return d.stopErr
}

// waitHTTP waits for the HTTP edge's Serve to return, if it runs.
func (d *Daemon) waitHTTP() {
	if d.httpLis != nil {
		<-d.httpDone
	}
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}

// pushRoots is the pool https push targets are verified against: nil (the
// system's) without a file, else the system's plus the file's PEM CAs.
func pushRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--push-ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--push-ca: %s holds no PEM certificate", file)
	}
	return pool, nil
}
