// Command delayctl manages a delayd server: namespaces, API keys, tasks,
// dead letters, and a live view of deliveries. Everything lives in package
// ctl; see `delayctl --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/delayd/delayd/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Main(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
