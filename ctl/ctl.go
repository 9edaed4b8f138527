// Package ctl is delayctl, the operator CLI of delayd: namespaces, API keys,
// tasks and dead letters over the public gRPC API (the typed admin client
// in package client), and `tail`, which watches a namespace's deliveries
// without taking them.
//
// # Output and errors
//
// Every command prints a table (-o table, the default) or JSON (-o json: one
// document, or one object per line for tail). A failed call prints
// "delayctl: <code>: <server's message>" to stderr and [Main] returns 1; a
// usage error returns 2.
//
// # Configuration
//
// Global flags, each with an environment variable: --addr (DELAYD_ADDR,
// default localhost:7070), --key (DELAYD_API_KEY; --key-file,
// DELAYD_API_KEY_FILE), --tls, --tls-ca,
// --tls-cert, --tls-key, --tls-server-name, -o/--output, --timeout.
package ctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/buildinfo"
	"github.com/delayd/delayd/client"
	"github.com/delayd/delayd/internal/duration"
)

// Exit codes of Main.
const (
	ExitOK    = 0
	ExitError = 1 // the server refused or failed, or the server is unreachable
	ExitUsage = 2 // bad flags or arguments
)

// Env reads an environment variable; os.Getenv in main, a map in tests.
type Env func(string) string

// globals are the flags every command shares.
type globals struct {
	addr          string
	key           string // --key; when empty, --key-file's, then DELAYD_API_KEY's
	keyFile       string
	envKey        string // DELAYD_API_KEY, never shown in help
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	output        string
	timeout       time.Duration

	stdout, stderr io.Writer
	stdin          io.Reader
	c              *client.Client // made by connect on first use
}

// usageError marks errors that are the caller's (flags, arguments).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Main runs delayctl with args (without the program name) and returns the
// exit code. ctx ends long-running commands (tail) cleanly.
func Main(ctx context.Context, args []string, env Env, stdin io.Reader, stdout, stderr io.Writer) int {
	if env == nil {
		env = os.Getenv
	}
	g := &globals{stdout: stdout, stderr: stderr, stdin: stdin}
	root := newRoot(g, env)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if g.c != nil {
		_ = g.c.Close()
	}
	if err == nil {
		return ExitOK
	}
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		fmt.Fprintf(stderr, "delayctl: %v\n", err)
		return ExitUsage
	}
	fmt.Fprintf(stderr, "delayctl: %s\n", describe(err))
	if hint := g.connectionHint(err); hint != "" {
		fmt.Fprintf(stderr, "delayctl: %s\n", hint)
	}
	return ExitError
}

// connectionHint says what to check when err is a failure to connect
// rather than an answer of the server (a handshake refused, a plaintext
// client on a TLS port or the reverse, a server certificate that does not
// name the address or whose CA is not trusted), or "" otherwise: the raw text
// ("write: broken pipe", "error reading server preface") does not say that
// TLS settings are the likely cause.
func (g *globals) connectionHint(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return ""
	}
	msg := st.Message()
	connErr := false
	// gRPC reports a name that does not resolve as "name resolver error:
	// produced zero addresses", not as a connection error.
	for _, s := range []string{"connection error", "broken pipe", "server preface", "handshake", "tls:", "connection reset", "EOF",
		"name resolver error", "produced zero addresses"} {
		connErr = connErr || strings.Contains(msg, s)
	}
	if !connErr {
		return ""
	}
	// Nothing to do with TLS: no server, or no such host.
	if strings.Contains(msg, "connection refused") {
		return "nothing accepts connections at " + g.addr + ": is delayd running there? (--addr or DELAYD_ADDR; default localhost:7070)"
	}
	if strings.Contains(msg, "no such host") || strings.Contains(msg, "produced zero addresses") {
		host, _, _ := strings.Cut(g.addr, ":")
		return "the host " + host + " of --addr " + g.addr + " is not known (DNS has no address for it): check the name"
	}
	if strings.Contains(msg, "x509: certificate is valid for") || strings.Contains(msg, "x509: cannot validate certificate for") ||
		strings.Contains(msg, "x509: certificate is not valid for any names") {
		return "the server's certificate does not name the host of " + g.addr + ": pass the name it was issued for with " +
			"--tls-server-name (or use that name in --addr)"
	}
	if strings.Contains(msg, "x509: certificate signed by unknown authority") {
		return "the server's certificate is not signed by a CA delayctl trusts: pass the CA that signed it with --tls-ca"
	}
	if g.tls || g.tlsCA != "" || g.tlsCert != "" {
		return "the TLS connection to " + g.addr + " failed: if the server requires client certificates (--tls-client-ca), " +
			"pass one signed by that CA with --tls-cert and --tls-key; check that --tls-ca holds the server's CA; " +
			"delayd logs why it refused a handshake (\"TLS handshake refused\")"
	}
	return "could not talk to delayd at " + g.addr + ": if it serves TLS, add --tls (and --tls-ca, and --tls-cert/--tls-key for mTLS)"
}

// isCobraUsage recognizes cobra's own argument and flag errors.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires at least", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// describe turns an error into "<code>: <the server's message>" when it
// carries a gRPC status, and its text otherwise.
func describe(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		st := se.GRPCStatus()
		return fmt.Sprintf("%s: %s", st.Code(), st.Message())
	}
	return err.Error()
}

func newRoot(g *globals, env Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "delayctl",
		Short: "delayctl manages a delayd server: namespaces, API keys, tasks, schedules, dead letters, and live deliveries",
		Long: `delayctl manages a delayd server over its public gRPC API.

Connection: --addr (DELAYD_ADDR, default localhost:7070), the API key from
DELAYD_API_KEY or --key-file (DELAYD_API_KEY_FILE) (or --key, which ps shows),
TLS with --tls and --tls-ca/--tls-cert/--tls-key/--tls-server-name.
Output: -o table (default) or -o json.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version: the version and commit make build stamps, and the Go
		// version; it connects to nothing.
		Version: buildinfo.Get().Line("delayctl"),
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch g.output {
			case "table", "json":
			default:
				return usagef("-o %q: allowed: table, json", g.output)
			}
			return nil
		},
	}
	def := func(name, fallback string) string {
		if v := env(name); v != "" {
			return v
		}
		return fallback
	}
	root.SetVersionTemplate("{{.Version}}\n")
	pf := root.PersistentFlags()
	pf.StringVar(&g.addr, "addr", def("DELAYD_ADDR", "localhost:7070"), "delayd gRPC address host:port (env DELAYD_ADDR)")
	// The key's default is never shown: --help would print the secret.
	g.envKey = env("DELAYD_API_KEY")
	envState := "not set"
	if g.envKey != "" {
		envState = "set"
	}
	pf.StringVar(&g.key, "key", "", "API key, sent as \"authorization: Bearer <key>\"; prefer DELAYD_API_KEY or --key-file, which ps and shell history do not show (env DELAYD_API_KEY: "+envState+")")
	pf.StringVar(&g.keyFile, "key-file", env("DELAYD_API_KEY_FILE"), "file holding the API key (surrounding whitespace ignored) (env DELAYD_API_KEY_FILE)")
	pf.BoolVar(&g.tls, "tls", def("DELAYD_TLS", "") == "true", "connect over TLS (implied by --tls-ca/--tls-cert) (env DELAYD_TLS=true)")
	pf.StringVar(&g.tlsCA, "tls-ca", env("DELAYD_TLS_CA"), "PEM file of CAs to verify the server with; default: the system roots (env DELAYD_TLS_CA)")
	pf.StringVar(&g.tlsCert, "tls-cert", env("DELAYD_TLS_CERT"), "PEM client certificate for mTLS (env DELAYD_TLS_CERT)")
	pf.StringVar(&g.tlsKey, "tls-key", env("DELAYD_TLS_KEY"), "PEM private key of --tls-cert (env DELAYD_TLS_KEY)")
	pf.StringVar(&g.tlsServerName, "tls-server-name", env("DELAYD_TLS_SERVER_NAME"), "server name to verify instead of the --addr host (env DELAYD_TLS_SERVER_NAME)")
	pf.StringVarP(&g.output, "output", "o", def("DELAYCTL_OUTPUT", "table"), "output format: table or json (env DELAYCTL_OUTPUT)")
	g.timeout = 10 * time.Second
	pf.Var(duration.Value{P: &g.timeout}, "timeout", "deadline of each call (tail has none)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	root.AddCommand(nsCommand(g), keyCommand(g), taskCommand(g), deadCommand(g), scheduleCommand(g), tailCommand(g), whoamiCommand(g),
		readyCommand(g, env))
	return root
}

// connect returns the client, dialing it on first use.
func (g *globals) connect() (*client.Client, error) {
	if g.c != nil {
		return g.c, nil
	}
	opts := []client.Option{client.WithTimeout(g.timeout), client.WithRetry(client.RetryPolicy{MaxAttempts: 1})}
	key, err := g.apiKey()
	if err != nil {
		return nil, err
	}
	if key != "" {
		opts = append(opts, client.WithAPIKey(key))
	}
	if g.tls || g.tlsCA != "" || g.tlsCert != "" {
		cfg, err := g.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	c, err := client.New(g.addr, opts...)
	if err != nil {
		return nil, err
	}
	g.c = c
	return c, nil
}

// apiKey is the key to send: --key, else --key-file's content, else
// DELAYD_API_KEY ("" for none).
func (g *globals) apiKey() (string, error) {
	switch {
	case g.key != "" && g.keyFile != "":
		return "", usagef("--key and --key-file (DELAYD_API_KEY_FILE) go alone: give one")
	case g.key != "":
		return g.key, nil
	case g.keyFile != "":
		b, err := os.ReadFile(g.keyFile)
		if err != nil {
			return "", usagef("--key-file: %v", err)
		}
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", usagef("--key-file %s is empty; it must hold the API key", g.keyFile)
		}
		return k, nil
	}
	return g.envKey, nil
}

func (g *globals) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: g.tlsServerName}
	if g.tlsCA != "" {
		pem, err := os.ReadFile(g.tlsCA)
		if err != nil {
			return nil, usagef("--tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--tls-ca %s: no PEM certificate in it", g.tlsCA)
		}
		cfg.RootCAs = pool
	}
	if (g.tlsCert == "") != (g.tlsKey == "") {
		return nil, usagef("--tls-cert and --tls-key go together: give both or neither")
	}
	if g.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(g.tlsCert, g.tlsKey)
		if err != nil {
			return nil, usagef("--tls-cert/--tls-key: %v", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// admin returns the admin client.
func (g *globals) admin() (*client.Admin, error) {
	c, err := g.connect()
	if err != nil {
		return nil, err
	}
	return c.Admin(), nil
}
