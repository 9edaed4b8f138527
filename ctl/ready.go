package ctl

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// readyCommand asks a replica's ops listener whether it serves: the health
// check of images with no shell and no curl (deploy/compose, the
// Dockerfile's HEALTHCHECK). It speaks HTTP to the ops listener, not gRPC,
// so it needs no API key.
func readyCommand(g *globals, env Env) *cobra.Command {
	var opsAddr string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "ready",
		Short: "Exit 0 when the replica's ops listener answers /readyz with 200 (a health check; no API key needed)",
		Long: `ready sends GET /readyz to delayd's ops listener and exits 0 when it
answers 200 "ready", 1 otherwise with the reason delayd gave (e.g. "redis:
..." while its store cannot answer). --ops-addr defaults to the port of
DELAYD_OPS_LISTEN on 127.0.0.1, so a check run beside delayd with delayd's
environment (docker's HEALTHCHECK, docker exec) finds it; else
127.0.0.1:9070. Images without a shell use it as their health check.
--wait 30s asks again every half second until delayd is ready or 30 s have
passed (after systemctl start, say), and fails with the last answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opsAddr == "" || strings.Contains(opsAddr, "/") {
				return usagef("--ops-addr %q: want host:port of delayd's ops listener, e.g. 127.0.0.1:9070", opsAddr)
			}
			if wait < 0 {
				return usagef("--wait %s: want a duration of 0 or more, e.g. 30s", wait)
			}
			// The CLI's own wall clock: how long a person waits.
			deadline := time.Now().Add(wait)
			for {
				text, err := askReady(cmd, g, opsAddr)
				if err == nil {
					fmt.Fprintln(g.stdout, text)
					return nil
				}
				if !time.Now().Add(readyPoll).Before(deadline) {
					return err
				}
				select {
				case <-cmd.Context().Done():
					return err
				case <-time.After(readyPoll):
				}
			}
		},
	}
	cmd.Flags().StringVar(&opsAddr, "ops-addr", localOpsAddr(env("DELAYD_OPS_LISTEN")), "delayd's ops listener host:port; default: DELAYD_OPS_LISTEN's port on 127.0.0.1, else 127.0.0.1:9070")
	cmd.Flags().DurationVar(&wait, "wait", 0, "ask again every 0.5s until ready or this long has passed (0 = ask once)")
	return cmd
}

// readyPoll is how often ready --wait asks again.
const readyPoll = 500 * time.Millisecond

// askReady asks opsAddr's /readyz once: its answer's text when it is 200,
// else an error with delayd's reason.
func askReady(cmd *cobra.Command, g *globals, opsAddr string) (string, error) {
	hc := &http.Client{Timeout: g.timeout}
	req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, "http://"+opsAddr+"/readyz", nil)
	if err != nil {
		return "", usagef("--ops-addr %q: %v", opsAddr, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("ops listener %s: %w", opsAddr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("not ready (%s): %s", resp.Status, text)
	}
	return text, nil
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
