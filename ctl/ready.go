package ctl

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/spf13/cobra"
)

// readyCommand asks a replica's ops listener whether it serves: the health
// check of images with no shell and no curl (deploy/compose, the
// Dockerfile's HEALTHCHECK). It speaks HTTP to the ops listener, not gRPC,
// so it needs no API key.
func readyCommand(g *globals, env Env) *cobra.Command {
	var opsAddr string
	cmd := &cobra.Command{
		Use:   "ready",
		Short: "Exit 0 when the replica's ops listener answers /readyz with 200 (a health check; no API key needed)",
		Long: `ready sends GET /readyz to delayd's ops listener and exits 0 when it
answers 200 "ready", 1 otherwise with the reason delayd gave (e.g. "redis:
..." while its store cannot answer). --ops-addr defaults to the port of
DELAYD_OPS_LISTEN on 127.0.0.1, so a check run beside delayd with delayd's
environment (docker's HEALTHCHECK, docker exec) finds it; else
127.0.0.1:9070. Images without a shell use it as their health check.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opsAddr == "" || strings.Contains(opsAddr, "/") {
				return usagef("--ops-addr %q: want host:port of delayd's ops listener, e.g. 127.0.0.1:9070", opsAddr)
			}
			hc := &http.Client{Timeout: g.timeout}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, "http://"+opsAddr+"/readyz", nil)
			if err != nil {
				return usagef("--ops-addr %q: %v", opsAddr, err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("ops listener %s: %w", opsAddr, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			text := strings.TrimSpace(string(body))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("not ready (%s): %s", resp.Status, text)
			}
			fmt.Fprintln(g.stdout, text)
			return nil
		},
	}
	cmd.Flags().StringVar(&opsAddr, "ops-addr", localOpsAddr(env("DELAYD_OPS_LISTEN")), "delayd's ops listener host:port; default: DELAYD_OPS_LISTEN's port on 127.0.0.1, else 127.0.0.1:9070")
	return cmd
}

// localOpsAddr is where a check on delayd's own machine reaches the ops
// listener delayd was told to bind (DELAYD_OPS_LISTEN): its port on
// loopback when it binds every interface.
func localOpsAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" {
		return "127.0.0.1:9070"
	}
	switch host {
	case "", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
