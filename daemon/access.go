package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/delayd/delayd/server/guard"
	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/tenancy"
)

// This file is the wiring of access: who may do what, where. The namespace
// registry (per-namespace policies and API keys, cached by package
// tenancy), the API-key authentication options, and the listener's TLS
// configuration; the server builds its guard (package server/guard) from them.

// accessParts are what the server and the dispatcher get from openAccess.
type accessParts struct {
	registry *tenancy.Registry // serves as storage.Policies too
	auth     guard.AuthOptions
	tls      *tls.Config // nil: plaintext
}

// openAccess builds the registry over regStore (MySQL in durable mode,
// Redis otherwise), the auth options and the TLS configuration from cfg.
//
// Authentication is on exactly when cfg.AdminKey is set. Namespaces are
// auto-created on first use in embedded mode, whenever authentication is
// off, and when cfg.AutoCreateNamespaces says so.
func openAccess(cfg Config, embedded bool, regStore storage.Registry, logger *slog.Logger) (*accessParts, error) {
	// An empty admin key means "no auth" here: the delayd binary has already
	// refused that against a real Redis unless --no-auth was given (see
	// guard.ResolveAuth); in-process users (tests, tools) may run open.
	auth, err := guard.ResolveAuth(cfg.AdminKey, cfg.AdminKey == "", embedded)
	if err != nil {
		return nil, err
	}
	reg, err := tenancy.New(tenancy.Config{
		Store:      regStore,
		Defaults:   cfg.policy(),
		AutoCreate: embedded || auth.Disabled || cfg.AutoCreateNamespaces,
		TTL:        cfg.RegistryCacheTTL,
		Logger:     logger.With("component", "tenancy"),
	})
	if err != nil {
		return nil, fmt.Errorf("namespace registry: %w", err)
	}
	if !auth.Disabled {
		warmKeys(reg, logger)
	}
	p := &accessParts{registry: reg, auth: auth}
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" || cfg.TLSClientCAFile != "" {
		p.tls, err = guard.LoadTLSConfig(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile, logger.With("component", "tls"))
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// warmKeysTimeout bounds how long start waits for the registry's API keys.
const warmKeysTimeout = 10 * time.Second

// warmKeys reads every API key into reg's cache before the server serves,
// so that real keys are answered from the cache while made-up ones are
// being tried (tenancy.Registry.WarmKeys). When the registry cannot be
// read in time delayd starts anyway: keys are then looked up on first use.
func warmKeys(reg *tenancy.Registry, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), warmKeysTimeout)
	defer cancel()
	start := time.Now()
	n, err := reg.WarmKeys(ctx)
	if err != nil {
		logger.Warn("could not read every API key into the cache at start; the others are looked up on first use",
			"cached", n, "error", err)
		return
	}
	logger.Info("API keys cached", "keys", n, "took", time.Since(start).Round(time.Millisecond))
}
