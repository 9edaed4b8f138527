// Command delayd is the delayd server: it reads flags (each with a DELAYD_*
// environment variable), then runs daemon.Run until SIGINT or SIGTERM and
// shuts down within --shutdown-timeout. `delayd --help` lists the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/peterbourgon/ff/v3"
	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/daemon"
	"github.com/delayd/delayd/server"
)

const envPrefix = "DELAYD"

func main() {
	fs := flag.NewFlagSet("delayd", flag.ContinueOnError)
	var cfg daemon.Config
	fs.StringVar(&cfg.Listen, "listen", daemon.DefaultListen, "gRPC listen address, host:port")
	fs.StringVar(&cfg.RedisURL, "redis-url", "", "Redis for the task index: redis://host:port/db, rediss://..., or redis-cluster://h1:p1,h2:p2; empty = embedded in-memory store (nothing survives a restart)")
	fs.StringVar(&cfg.MySQLDSN, "mysql-dsn", "", "MySQL DSN for durable mode, user:pass@tcp(host:3306)/db; empty = Redis-only")
	fs.DurationVar(&cfg.ReconcileInterval, "reconcile-interval", 30*time.Second, "durable mode: how often the leader re-indexes tasks MySQL has and Redis lacks")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "lowest level logged: debug, info, warn, error; debug logs every gRPC call (info logs failed and slow calls only)")
	fs.DurationVar(&cfg.SlowCall, "log-slow-calls", server.DefaultSlowCall, "log unary calls that take at least this long at WARN; negative = never")
	fs.StringVar(&cfg.LogFormat, "log-format", "text", "log format: text or json")
	fs.IntVar(&cfg.Limits.MaxBatch, "max-batch", 1000, "most items in one batch call (BatchUpsertTasks, AckTasks, ...)")
	fs.IntVar(&cfg.Limits.MaxMessageBytes, "max-message-bytes", 16<<20, "largest gRPC message received or sent, in bytes")
	maxStreams := fs.Uint("max-concurrent-streams", 1000, "most concurrent calls per client connection")
	fs.IntVar(&cfg.MaxPayloadBytes, "max-payload-bytes", 64<<10, "largest task payload, in bytes")
	fs.DurationVar(&cfg.MaxDelay, "max-delay", 366*24*time.Hour, "horizon: the furthest ahead a task may be due")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", 0, "deadline of each store call; 0 = the store's default")
	fs.DurationVar(&cfg.SafetyPoll, "safety-poll", 0, "dispatcher safety-net poll interval; 0 = 1s")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "bound on graceful shutdown; then connections are closed")
	reflection := fs.Bool("reflection", true, "serve gRPC server reflection (for grpcurl)")
	fs.StringVar(&cfg.AdminKey, "admin-key", "", "bootstrap admin key (16-512 printable ASCII); turns API-key auth on; e.g. $(openssl rand -hex 32)")
	noAuth := fs.Bool("no-auth", false, "run without authentication against a real Redis: every client may do everything")
	fs.BoolVar(&cfg.AutoCreateNamespaces, "auto-create-namespaces", false, "create an unknown namespace on first use (always on in embedded mode and without auth)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate chain to serve TLS with (with --tls-key)")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.TLSClientCAFile, "tls-client-ca", "", "PEM CAs whose client certificates are required (mTLS)")
	fs.Usage = func() { usage(fs) }

	if err := ff.Parse(fs, os.Args[1:], ff.WithEnvVarPrefix(envPrefix)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "delayd: %v\n", err)
		os.Exit(2)
	}
	cfg.Limits.MaxConcurrentStreams = uint32(*maxStreams)
	cfg.DisableReflection = !*reflection
	// A shared Redis is never open to everyone by accident: without an
	// admin key, --no-auth must say so (embedded mode is open by default).
	if _, err := server.ResolveAuth(cfg.AdminKey, *noAuth, cfg.RedisURL == ""); err != nil {
		fmt.Fprintf(os.Stderr, "delayd: %v\n", err)
		os.Exit(2)
	}

	logger, err := daemon.NewLogger(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(os.Stderr, "delayd: %v\n", err)
		os.Exit(2)
	}
	// go-redis logs reconnect failures through a package-level logger; send
	// them to ours so the log stays one structured stream.
	redis.SetLogger(redisLogger{logger.With("component", "go-redis")})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := daemon.Run(ctx, cfg, logger); err != nil {
		logger.Error("delayd failed", "error", err)
		os.Exit(1)
	}
}

// redisLogger adapts slog to go-redis's internal logger, at WARN.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...))
}

// usage prints every flag with its environment variable and default.
func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, "delayd: the delay-task gRPC server.\n\nUsage: delayd [flags]\n\nEvery flag can also be set by the environment variable shown; a flag given on\nthe command line wins.\n\n")
	fs.VisitAll(func(f *flag.Flag) {
		env := envPrefix + "_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		fmt.Fprintf(w, "  --%s  (%s)\n        %s", f.Name, env, f.Usage)
		if f.DefValue != "" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}
