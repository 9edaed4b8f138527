// Command statements runs every shop's monthly statement at 00:30 on the
// 1st of the month in the shop's own time zone, with a delayd schedule per
// shop doing the timing.
//
// Opening a shop creates its schedule ("30 0 1 * *" in the shop's zone,
// catch-up latest within a week); each month's slot becomes a delayd task
// whose id names the shop's schedule and the slot, delivered to this
// program's consumer, which sums the month before the slot (in the shop's
// zone) and writes one statement row. Closing the shop deletes its
// schedule.
//
// It serves a small HTTP API (see README.md):
//
//	POST   /shops                 {"id": 7, "name": "Corner Books", "time_zone": "Europe/Berlin"}
//	DELETE /shops/{id}
//	GET    /shops/{id}/statements
package main

import (
	"context"
	"database/sql"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/delayd/delayd/client"
)

//go:embed schema.sql
var schema string

// Config is what the program runs with; every field has a flag.
type Config struct {
	DelaydAddr  string
	APIKey      string
	MySQLDSN    string
	Namespace   string
	Cron        string
	Every       time.Duration
	HTTPAddr    string
	Concurrency int
}

func main() {
	cfg, err := parseConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		os.Exit(2) // the flag package has printed the error and the usage
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, logger); err != nil {
		logger.Error("statements failed", "error", err)
		os.Exit(1)
	}
}

// parseConfig reads the flags (and their environment defaults) into a
// Config.
func parseConfig(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("statements", flag.ContinueOnError)
	fs.StringVar(&cfg.DelaydAddr, "delayd", envOr("DELAYD_ADDR", "localhost:7070"), "delayd gRPC address (env DELAYD_ADDR)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("DELAYD_API_KEY"), "delayd API key with produce and consume scopes (env DELAYD_API_KEY)")
	fs.StringVar(&cfg.MySQLDSN, "mysql-dsn", envOr("MYSQL_DSN", "root@tcp(127.0.0.1:3306)/shop"), "MySQL DSN, go-sql-driver form (env MYSQL_DSN)")
	fs.StringVar(&cfg.Namespace, "namespace", "example-statements", "delayd namespace of the statement schedules and their firings")
	fs.StringVar(&cfg.Cron, "cron", "30 0 1 * *", "when a statement runs, in each shop's time zone")
	fs.DurationVar(&cfg.Every, "every", 0, "run statements at this fixed rate instead of --cron (demos and tests)")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8084", "HTTP API listen address")
	fs.IntVar(&cfg.Concurrency, "concurrency", 4, "statement handlers running at once")
	err := fs.Parse(args)
	return cfg, err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// App is the wired program: database, delayd client and the statements.
type App struct {
	cfg        Config
	db         *sql.DB
	delayd     *client.Client
	statements *Statements
	logger     *slog.Logger
}

// open connects to MySQL (creating the schema) and to delayd.
func open(ctx context.Context, cfg Config, logger *slog.Logger) (*App, error) {
	dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	dsn.ParseTime = true
	db, err := sql.Open("mysql", dsn.FormatDSN())
	if err != nil {
		return nil, err
	}
	// The embedded schema, one statement at a time (comment lines dropped
	// first, so they may contain anything).
	var b strings.Builder
	for _, line := range strings.Split(schema, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line + "\n")
		}
	}
	for _, stmt := range strings.Split(b.String(), ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			db.Close()
			return nil, fmt.Errorf("create schema: %w", err)
		}
	}
	opts := []client.Option{client.WithLogger(logger.With("component", "delayd-client"))}
	if cfg.APIKey != "" {
		opts = append(opts, client.WithAPIKey(cfg.APIKey))
	}
	c, err := client.New(cfg.DelaydAddr, opts...)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &App{cfg: cfg, db: db, delayd: c, logger: logger,
		statements: &Statements{db: db, schedules: c.Schedules(), namespace: cfg.Namespace, cron: cfg.Cron, every: cfg.Every, logger: logger},
	}, nil
}

// Close releases the connections.
func (a *App) Close() {
	_ = a.delayd.Close()
	_ = a.db.Close()
}

// run opens the app and serves until ctx ends.
func run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	app, err := open(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer app.Close()
	return app.serve(ctx, nil)
}

// serve runs the HTTP API and the statement consumer until ctx ends. If
// ready is not nil it is called with the HTTP address once both run.
func (a *App) serve(ctx context.Context, ready func(net.Addr)) error {
	lis, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(lis) }()
	consumeCtx, stopConsume := context.WithCancel(ctx)
	defer stopConsume()
	consumeDone := make(chan error, 1)
	go func() {
		consumeDone <- a.delayd.Consume(consumeCtx, a.cfg.Namespace, a.statements.Handler(),
			client.ConsumeOptions{Concurrency: a.cfg.Concurrency})
	}()
	a.logger.Info("statements running", "http", lis.Addr().String(), "delayd", a.cfg.DelaydAddr, "namespace", a.cfg.Namespace)
	if ready != nil {
		ready(lis.Addr())
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-consumeDone:
		consumeDone <- runErr
	case runErr = <-httpDone:
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	stopConsume()
	if err := <-consumeDone; err != nil && runErr == nil {
		runErr = err
	}
	if errors.Is(runErr, http.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}

// Handler is the HTTP API.
func (a *App) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /shops", func(w http.ResponseWriter, r *http.Request) {
		var sh Shop
		if err := json.NewDecoder(r.Body).Decode(&sh); err != nil || sh.ID == 0 || sh.TimeZone == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body must be {"id": <id>, "name": "...", "time_zone": "Europe/Berlin"}`})
			return
		}
		a.reply(w, http.StatusCreated, sh, a.statements.Open(r.Context(), sh))
	})
	mux.HandleFunc("DELETE /shops/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "shop id must be a number"})
			return
		}
		a.reply(w, http.StatusOK, map[string]uint64{"closed": id}, a.statements.Close(r.Context(), id))
	})
	mux.HandleFunc("GET /shops/{id}/statements", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "shop id must be a number"})
			return
		}
		sts, err := a.statements.List(r.Context(), id)
		a.reply(w, http.StatusOK, sts, err)
	})
	return mux
}

func (a *App) reply(w http.ResponseWriter, code int, v any, err error) {
	switch {
	case err == nil:
		writeJSON(w, code, v)
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case errors.Is(err, ErrBadZone):
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	default:
		a.logger.Error("request failed", "error", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "try again later"})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
