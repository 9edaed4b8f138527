// Command deviceoffline marks devices offline when their heartbeats stop,
// with delayd doing the timing, and opens a maintenance ticket for each.
//
// Every heartbeat upserts one delayd task per device, "device X offline",
// 90 seconds out (-offline-after): each upsert replaces the previous task,
// so the task only falls due when no heartbeat renewed it in time. The
// consumer then runs, in one transaction,
//
//	UPDATE equipment_info SET status='OFFLINE'
//	WHERE equipment_id=? AND status='ONLINE' AND heartbeat_seq=?  -- the heartbeat that scheduled it
//	INSERT INTO equipment_maintain ...                            -- only if a row changed
//
// A heartbeat that arrives after that (or while the delivery is in flight)
// puts the device back ONLINE and closes the ticket.
//
// It serves a small HTTP API (see README.md):
//
//	POST /devices/{id}/heartbeat
//	GET  /devices/{id}
//	GET  /devices/{id}/tickets
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
	DelaydAddr   string
	APIKey       string
	MySQLDSN     string
	Namespace    string
	OfflineAfter time.Duration
	HTTPAddr     string
	Concurrency  int
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
		logger.Error("deviceoffline failed", "error", err)
		os.Exit(1)
	}
}

// parseConfig reads the flags (and their environment defaults) into a
// Config.
func parseConfig(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("deviceoffline", flag.ContinueOnError)
	fs.StringVar(&cfg.DelaydAddr, "delayd", envOr("DELAYD_ADDR", "localhost:7070"), "delayd gRPC address (env DELAYD_ADDR)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("DELAYD_API_KEY"), "delayd API key with produce and consume scopes (env DELAYD_API_KEY)")
	fs.StringVar(&cfg.MySQLDSN, "mysql-dsn", envOr("MYSQL_DSN", "root@tcp(127.0.0.1:3306)/devices"), "MySQL DSN, go-sql-driver form (env MYSQL_DSN)")
	fs.StringVar(&cfg.Namespace, "namespace", "example-devices", "delayd namespace of the offline tasks")
	fs.DurationVar(&cfg.OfflineAfter, "offline-after", 90*time.Second, "silence after the last heartbeat that makes a device offline")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8082", "HTTP API listen address")
	fs.IntVar(&cfg.Concurrency, "concurrency", 8, "offline handlers running at once")
	err := fs.Parse(args)
	return cfg, err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// App is the wired program: database, delayd client and the device service.
type App struct {
	cfg     Config
	db      *sql.DB
	delayd  *client.Client
	devices *Devices
	logger  *slog.Logger
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
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
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
	return &App{
		cfg: cfg, db: db, delayd: c, logger: logger,
		devices: &Devices{db: db, delayd: c, namespace: cfg.Namespace, offlineAfter: cfg.OfflineAfter, logger: logger},
	}, nil
}

// migrate runs the embedded schema, one statement at a time (comment lines
// dropped first, so they may contain anything).
func migrate(ctx context.Context, db *sql.DB) error {
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
			return fmt.Errorf("create schema: %w", err)
		}
	}
	return nil
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

// serve runs the HTTP API and the offline consumer until ctx ends, then
// stops taking requests and lets running handlers finish. If ready is not
// nil it is called with the HTTP address once both run.
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
		consumeDone <- a.delayd.Consume(consumeCtx, a.cfg.Namespace, a.devices.HandleOffline,
			client.ConsumeOptions{Concurrency: a.cfg.Concurrency})
	}()
	a.logger.Info("deviceoffline running", "http", lis.Addr().String(), "delayd", a.cfg.DelaydAddr,
		"namespace", a.cfg.Namespace, "offline_after", a.cfg.OfflineAfter)
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
	mux.HandleFunc("POST /devices/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		dev, err := a.devices.Heartbeat(r.Context(), r.PathValue("id"))
		a.reply(w, dev, err)
	})
	mux.HandleFunc("GET /devices/{id}", func(w http.ResponseWriter, r *http.Request) {
		dev, err := a.devices.Get(r.Context(), r.PathValue("id"))
		a.reply(w, dev, err)
	})
	mux.HandleFunc("GET /devices/{id}/tickets", func(w http.ResponseWriter, r *http.Request) {
		tks, err := a.devices.Tickets(r.Context(), r.PathValue("id"))
		a.reply(w, tks, err)
	})
	return mux
}

func (a *App) reply(w http.ResponseWriter, v any, err error) {
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, v)
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case errors.Is(err, ErrBadID):
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
