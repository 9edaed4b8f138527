// Command loanoverdue marks library loans overdue when their due date
// passes, with delayd doing the timing.
//
// Confirming a loan upserts a delayd task "loan N overdue" at its due date;
// returning the book removes it; renewing upserts it again with the new date
// (the task is replaced, so the old date never fires). When the task falls
// due the consumer runs
//
//	UPDATE borrow_order SET status='OVERDUE'
//	WHERE id=? AND status='BORROWED' AND due_at=?   -- the date the task was for
//
// and writes one overdue notice. A low-frequency reconciliation query finds
// loans past due and still BORROWED whose task was lost, and re-upserts it.
//
// It serves a small HTTP API (see README.md):
//
//	POST /loans              {"user_id": 7, "book_id": 42}
//	POST /loans/{id}/confirm
//	POST /loans/{id}/renew
//	POST /loans/{id}/return
//	GET  /loans/{id}
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
	DelaydAddr     string
	APIKey         string
	MySQLDSN       string
	Namespace      string
	LoanPeriod     time.Duration
	RenewBy        time.Duration
	ReconcileEvery time.Duration
	ReconcileGrace time.Duration
	HTTPAddr       string
	Concurrency    int
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
		logger.Error("loanoverdue failed", "error", err)
		os.Exit(1)
	}
}

// parseConfig reads the flags (and their environment defaults) into a
// Config.
func parseConfig(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("loanoverdue", flag.ContinueOnError)
	fs.StringVar(&cfg.DelaydAddr, "delayd", envOr("DELAYD_ADDR", "localhost:7070"), "delayd gRPC address (env DELAYD_ADDR)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("DELAYD_API_KEY"), "delayd API key with produce and consume scopes (env DELAYD_API_KEY)")
	fs.StringVar(&cfg.MySQLDSN, "mysql-dsn", envOr("MYSQL_DSN", "root@tcp(127.0.0.1:3306)/library"), "MySQL DSN, go-sql-driver form (env MYSQL_DSN)")
	fs.StringVar(&cfg.Namespace, "namespace", "example-loans", "delayd namespace of the overdue tasks")
	fs.DurationVar(&cfg.LoanPeriod, "loan-period", 30*24*time.Hour, "loan period from confirm to due date")
	fs.DurationVar(&cfg.RenewBy, "renew-by", 14*24*time.Hour, "how far a renewal moves the due date")
	fs.DurationVar(&cfg.ReconcileEvery, "reconcile-every", 10*time.Minute, "how often the reconciliation query runs (0: never)")
	fs.DurationVar(&cfg.ReconcileGrace, "reconcile-grace", time.Minute, "how long past its due date a BORROWED loan must be for the reconciliation to re-upsert its task")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8081", "HTTP API listen address")
	fs.IntVar(&cfg.Concurrency, "concurrency", 8, "overdue handlers running at once")
	err := fs.Parse(args)
	return cfg, err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// App is the wired program: database, delayd client and the loan service.
type App struct {
	cfg    Config
	db     *sql.DB
	delayd *client.Client
	outbox *outbox.Outbox
	loans  *Loans
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
	ob, err := outbox.New(db, outbox.Config{Dialect: outbox.MySQL, Table: "loanoverdue_outbox", Client: c,
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
		cfg: cfg, db: db, delayd: c, outbox: ob, logger: logger,
		loans: &Loans{db: db, outbox: ob, namespace: cfg.Namespace, period: cfg.LoanPeriod, renewBy: cfg.RenewBy, logger: logger},
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

// serve runs the HTTP API, the overdue consumer and the reconciliation loop
// until ctx ends, then stops taking requests and lets running handlers
// finish. If ready is not nil it is called with the HTTP address once all
// run.
func (a *App) serve(ctx context.Context, ready func(net.Addr)) error {
	lis, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	httpDone := make(chan error, 1)
	go func() { httpDone <- srv.Serve(lis) }()

	// The relay sends what committed loans wrote to the outbox; it runs
	// until the consumer and the reconciliation stopped (below).
	if err := a.outbox.Start(ctx); err != nil {
		_ = srv.Close()
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = a.outbox.Stop(stopCtx)
	}()
	bgCtx, stopBg := context.WithCancel(ctx)
	defer stopBg()
	consumeDone := make(chan error, 1)
	go func() {
		consumeDone <- a.delayd.Consume(bgCtx, a.cfg.Namespace, a.loans.Handler(),
			client.ConsumeOptions{Concurrency: a.cfg.Concurrency})
	}()
	reconcileDone := make(chan struct{})
	go func() {
		defer close(reconcileDone)
		if a.cfg.ReconcileEvery > 0 {
			a.loans.reconcileLoop(bgCtx, a.cfg.ReconcileEvery, a.cfg.ReconcileGrace)
		}
	}()
	a.logger.Info("loanoverdue running", "http", lis.Addr().String(), "delayd", a.cfg.DelaydAddr,
		"namespace", a.cfg.Namespace, "loan_period", a.cfg.LoanPeriod)
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
	stopBg()
	<-reconcileDone
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
	mux.HandleFunc("POST /loans", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			UserID uint64 `json:"user_id"`
			BookID uint64 `json:"book_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.UserID == 0 || req.BookID == 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body must be {"user_id": <id>, "book_id": <id>}`})
			return
		}
		ln, err := a.loans.Apply(r.Context(), req.UserID, req.BookID)
		a.reply(w, http.StatusCreated, ln, err)
	})
	for verb, op := range map[string]func(context.Context, uint64) (*Loan, error){
		"confirm": a.loans.Confirm,
		"renew":   a.loans.Renew,
		"return":  a.loans.Return,
	} {
		mux.HandleFunc("POST /loans/{id}/"+verb, func(w http.ResponseWriter, r *http.Request) {
			id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "loan id must be a number"})
				return
			}
			ln, err := op(r.Context(), id)
			a.reply(w, http.StatusOK, ln, err)
		})
	}
	mux.HandleFunc("GET /loans/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "loan id must be a number"})
			return
		}
		ln, err := a.loans.Get(r.Context(), id)
		a.reply(w, http.StatusOK, ln, err)
	})
	return mux
}

func (a *App) reply(w http.ResponseWriter, code int, v any, err error) {
	switch {
	case err == nil:
		writeJSON(w, code, v)
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case errors.Is(err, ErrWrongState):
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
