// Command delaybench measures delayd against the design it replaces: it
// starts (or targets) a delayd, drives it over gRPC with producers and
// subscribers, runs the source design's ZSET poller on the same Redis with
// the same workload, and prints throughput, lateness, early / duplicate /
// lost deliveries, CPU and Redis memory per task, with ratios. `make bench`
// runs `delaybench --short`; docs/BENCHMARKS.md has the full set and the
// command for every row. `delaybench --help` lists the flags; each has a
// DELAYBENCH_* environment variable.
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

	"github.com/peterbourgon/ff/v3"

	"github.com/delayd/delayd/bench"
)

func main() {
	fs := flag.NewFlagSet("delaybench", flag.ContinueOnError)
	var (
		cfg bench.Config
		w   bench.Workload
	)
	cfg.RegisterFlags(fs, &w)
	verbose := fs.Bool("v", false, "log delayd's and the benchmark's warnings to stderr")
	render := fs.String("render", "", "comma-separated JSON reports (from --json-out) to merge and print as Markdown; runs nothing")
	if err := ff.Parse(fs, os.Args[1:], ff.WithEnvVarPrefix("DELAYBENCH")); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "delaybench: %v\n", err)
		os.Exit(2)
	}
	if *render != "" {
		if err := bench.Render(strings.Split(*render, ","), os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "delaybench: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		cfg.DelaydLog = os.Stderr
	}
	if err := cfg.Finish(fs, &w); err != nil {
		fmt.Fprintf(os.Stderr, "delaybench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := bench.Run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "delaybench: %v\n", err)
		os.Exit(1)
	}
}
