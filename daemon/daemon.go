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
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/delayd/delayd/dispatcher"
	"github.com/delayd/delayd/ops"
	"github.com/delayd/delayd/push"
	"github.com/delayd/delayd/schedule"
	"github.com/delayd/delayd/server"
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
	// scheduler fires the schedules' slots (the schedule loop) and runs
	// ScheduleService's operations.
	scheduler *schedule.Scheduler
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
//     2a. the schedule loop stops: it creates no firing after this (a
//     step in progress is one atomic store call, applied or not);
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
		schedErr := d.scheduler.Stop(ctx) // 2a
		dispErr := d.dispatcher.Stop(ctx) // 2b
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
		d.stopErr = errors.Join(wrap("schedule loop stop", schedErr), wrap("dispatcher stop", dispErr), grpcErr, wrap("stop mysql store", durableErr), wrap("close redis", redisErr), wrap("stop ops listener", opsErr), wrap("flush traces", traceErr))
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
