// Command ordersclose closes orders that are not paid in time, with delayd
// doing the timing.
//
// Creating an order schedules a delayd task "close order N" 15 minutes out
// (-close-after); paying the order removes it. Both go through the
// transactional outbox (client/outbox): the task write is a row in the
// order's own MySQL transaction, and a relay in this process sends it to
// delayd after the commit. So an order that rolls back never closes, and
// creating or paying an order works while delayd is down. When the task
// falls due, the consumer runs, in one transaction that also records the
// delivery (outbox.Once),
//
//	UPDATE orders SET status='CLOSED' WHERE id=? AND status='WAIT_PAY'
//
// so a payment that wins the race changes nothing, and a redelivery after
// a crash between commit and ack is acked without running again. A failed
// close (the database is down) is nacked and retried by delayd.
//
// It serves a small HTTP API (see README.md):
//
//	POST /orders            {"amount_cents": 1999}
//	POST /orders/{id}/pay
//	GET  /orders/{id}
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
	"github.com/delayd/delayd/client/outbox"
)

//go:embed schema.sql
var schema string

// Config is what the program runs with; every field has a flag.
type Config struct {
	DelaydAddr  string
	APIKey      string
	MySQLDSN    string
	Namespace   string
	CloseAfter  time.Duration
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
		logger.Error("ordersclose failed", "error", err)
		os.Exit(1)
	}
}

// parseConfig reads the flags (and their environment defaults) into a
// Config.
func parseConfig(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("ordersclose", flag.ContinueOnError)
	fs.StringVar(&cfg.DelaydAddr, "delayd", envOr("DELAYD_ADDR", "localhost:7070"), "delayd gRPC address (env DELAYD_ADDR)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("DELAYD_API_KEY"), "delayd API key with produce and consume scopes (env DELAYD_API_KEY)")
	fs.StringVar(&cfg.MySQLDSN, "mysql-dsn", envOr("MYSQL_DSN", "root@tcp(127.0.0.1:3306)/orders"), "MySQL DSN, go-sql-driver form (env MYSQL_DSN)")
	fs.StringVar(&cfg.Namespace, "namespace", "example-orders", "delayd namespace of the close tasks")
	fs.DurationVar(&cfg.CloseAfter, "close-after", 15*time.Minute, "how long an order may wait for payment")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8080", "HTTP API listen address")
	fs.IntVar(&cfg.Concurrency, "concurrency", 8, "close handlers running at once")
	err := fs.Parse(args)
	return cfg, err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// App is the wired program: database, delayd client and the order service.
type App struct {
	cfg    Config
	db     *sql.DB
	delayd *client.Client
	outbox *outbox.Outbox
	orders *Orders
	logger *slog.Logger
}

// open connects to MySQL (creating the schema and the outbox tables) and
// to delayd.
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
	ob, err := outbox.New(db, outbox.Config{Dialect: outbox.MySQL, Table: "ordersclose_outbox", Client: c,
		Logger: logger.With("component", "outbox")})
	if err == nil {
		err = ob.Migrate(ctx)
	}
	if err != nil {
		c.Close()
		db.Close()
		return nil, err
	}
	return &App{
		cfg:    cfg,
		db:     db,
		delayd: c,
		outbox: ob,
		logger: logger,
		orders: &Orders{db: db, outbox: ob, namespace: cfg.Namespace, closeAfter: cfg.CloseAfter, logger: logger},
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

// serve runs the HTTP API and the close consumer until ctx ends, then stops
// taking requests and lets running closes finish. If ready is not nil it is
// called with the HTTP address once both run.
func (app *App) serve(ctx context.Context, ready func(net.Addr)) error {
	cfg, logger := app.cfg, app.logger
	lis, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app.Handler(), ReadHeaderTimeout: 5 * time.Second}
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(lis) }()

	// The relay sends what committed orders wrote to the outbox; it runs
	// until the consumer stopped (below).
	if err := app.outbox.Start(ctx); err != nil {
		_ = srv.Close()
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = app.outbox.Stop(stopCtx)
	}()
	consumeDone := make(chan error, 1)
	consumeCtx, stopConsume := context.WithCancel(ctx)
	defer stopConsume()
	go func() {
		consumeDone <- app.delayd.Consume(consumeCtx, cfg.Namespace, app.orders.Handler(),
			client.ConsumeOptions{Concurrency: cfg.Concurrency})
	}()
	logger.Info("ordersclose running", "http", lis.Addr().String(), "delayd", cfg.DelaydAddr,
		"namespace", cfg.Namespace, "close_after", cfg.CloseAfter)
	if ready != nil {
		ready(lis.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-consumeDone:
		consumeDone <- runErr
	case runErr = <-httpDone:
		httpDone <- runErr
	}
	// Stop taking requests first, then let running closes finish.
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
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			AmountCents int64 `json:"amount_cents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.AmountCents <= 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body must be {"amount_cents": <positive integer>}`})
			return
		}
		ord, err := a.orders.Create(r.Context(), req.AmountCents)
		if err != nil {
			a.fail(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, ord)
	})
	mux.HandleFunc("POST /orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "order id must be a number"})
			return
		}
		if err := a.orders.Pay(r.Context(), id); err != nil {
			a.fail(w, err)
			return
		}
		ord, err := a.orders.Get(r.Context(), id)
		if err != nil {
			a.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, ord)
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "order id must be a number"})
			return
		}
		ord, err := a.orders.Get(r.Context(), id)
		if err != nil {
			a.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, ord)
	})
	return mux
}

func (a *App) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case errors.Is(err, ErrOrderClosed):
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
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
