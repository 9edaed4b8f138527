// Command delayd is the delayd server: it reads flags (each with a DELAYD_*
// environment variable), then runs until SIGINT or SIGTERM and shuts down
// within --shutdown-timeout. `delayd --help` lists the flags; they are
// defined, with their defaults, in package daemon (daemon.BindFlags).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/delayd/delayd/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := daemon.Main(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
