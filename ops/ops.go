// Package ops is delayd's operations listener: plain HTTP on its own port
// (--ops-listen, default :9070), apart from the gRPC port, serving
//
//	/metrics        Prometheus metrics (package metrics)
//	/healthz        200 "ok" while the process runs (liveness)
//	/readyz         200 "ready" while the replica serves; 503 with the reason
//	                in the body otherwise (readiness: store reachable, durable
//	                index complete, not shutting down)
//	/debug/pprof/   Go profiling, only when Config.Pprof is set; its cmdline
//	                names the flags set but shows none of their values
//	                (--admin-key, passwords in --redis-url or --mysql-dsn)
//
// A Server is started once with Start and stopped once with Stop.
package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"
)

// readyTimeout bounds one readiness check (its store pings).
const readyTimeout = 2 * time.Second

// Config configures the ops listener.
type Config struct {
	// Addr is the TCP address to listen on, host:port; port 0 picks a free
	// port (see Server.Addr). Required.
	Addr string
	// Metrics serves /metrics. If nil, /metrics answers 404.
	Metrics http.Handler
	// Ready tells whether the replica serves: nil, or the reason it does
	// not, which /readyz returns with status 503. If nil, always ready.
	Ready func(ctx context.Context) error
	// Pprof serves net/http/pprof under /debug/pprof/. Default off: profiles
	// reveal internals and cost CPU, so turn it on where the port is private.
	Pprof bool
	// Args is the command line /debug/pprof/cmdline shows, its values
	// redacted (see redactArgs). If nil, os.Args.
	Args []string
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
}

// Server is a running ops listener.
type Server struct {
	srv  *http.Server
	lis  net.Listener
	done chan struct{}
}

// Handler returns the ops routes of cfg, for tests and for embedding.
func Handler(cfg Config) http.Handler {
	mux := http.NewServeMux()
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if cfg.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			err := cfg.Ready(ctx)
			cancel()
			if err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		_, _ = fmt.Fprintln(w, "ready")
	})
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		args := cfg.Args
		if args == nil {
			args = os.Args
		}
		shown := strings.Join(redactArgs(args), "\x00")
		mux.HandleFunc("/debug/pprof/cmdline", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, shown)
		})
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// redacted stands for a value redactArgs hides.
const redacted = "REDACTED"

// redactArgs is a command line with every flag's value hidden: the
// program's name, then each flag's name as given ("--admin-key",
// "--redis-url=REDACTED") and REDACTED for every other argument (delayd
// takes no positional ones: each is a flag's value). Secrets are passed as
// flag values (--admin-key, a password in --redis-url or --mysql-dsn), and
// a rule that hides every value cannot miss a new one.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case i == 0:
			out[i] = a
		case a == "--" || a == "-" || !strings.HasPrefix(a, "-"):
			out[i] = redacted
		default:
			name, _, hasValue := strings.Cut(a, "=")
			out[i] = name
			if hasValue {
				out[i] = name + "=" + redacted
			}
		}
	}
	return out
}

// Start binds cfg.Addr and serves the ops routes in the background.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		return nil, errors.New("ops: Config.Addr is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("ops listen on %s: %w", cfg.Addr, err)
	}
	s := &Server{
		srv: &http.Server{
			Handler:           Handler(cfg),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		},
		lis:  lis,
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Logger.Error("ops listener stopped", "addr", lis.Addr().String(), "error", err)
		}
	}()
	return s, nil
}

// Addr is the address the listener is bound to.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Stop stops accepting, lets running requests finish until ctx ends (then
// closes them), and waits for the serving goroutine.
func (s *Server) Stop(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.done
	return err
}
