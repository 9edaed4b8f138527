package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/redisstore"
)

// This file is the switch from Redis-only to durable mode. A Redis-only
// deployment keeps its namespaces and API keys in Redis; durable mode keeps
// them in MySQL. Without a copy, the first durable start would lose every
// namespace and make every API key answer "unknown, revoked or malformed".
// So the first durable start over a Redis that holds a registry copies it
// into MySQL, once.

// importRedisRegistry copies every namespace (name and policy) and every
// API key (id, namespace, scopes, description and the SHA-256 of its
// secret, so the same secrets keep working) from the Redis registry into
// the MySQL one, unless a previous durable start already did
// (redisstore.Store.RegistryImported). What MySQL already has wins: an
// existing namespace or key id is left as it is. The Redis registry is left
// in place. Replicas starting together may both copy; that is harmless
// (the second finds everything there).
func importRedisRegistry(ctx context.Context, from *redisstore.Store, to storage.Registry, logger *slog.Logger) error {
	done, err := from.RegistryImported(ctx)
	if err != nil || done {
		return err
	}
	var nss, keys, kept int
	copyKeys := func(ns string) error {
		var after storage.KeyCursor
		for {
			ks, more, err := from.ListKeys(ctx, ns, after, 1000)
			if err != nil {
				return fmt.Errorf("list keys of %q: %w", ns, err)
			}
			for _, k := range ks {
				switch err := to.CreateKey(ctx, k); {
				case errors.Is(err, storage.ErrAlreadyExists):
					kept++
				case err != nil:
					return fmt.Errorf("copy key %s: %w", k.ID, err)
				default:
					keys++
				}
			}
			if !more || len(ks) == 0 {
				return nil
			}
			after = storage.CursorOf(ks[len(ks)-1])
		}
	}
	after := ""
	for {
		page, more, err := from.ListNamespaces(ctx, after, redisstore.MaxBatch)
		if err != nil {
			return fmt.Errorf("list namespaces: %w", err)
		}
		for _, n := range page {
			switch _, err := to.CreateNamespace(ctx, storage.Namespace{Name: n.Name, Policy: n.Policy}); {
			case errors.Is(err, storage.ErrAlreadyExists):
				kept++
			case err != nil:
				return fmt.Errorf("copy namespace %q: %w", n.Name, err)
			default:
				nss++
			}
			if err := copyKeys(n.Name); err != nil {
				return err
			}
			after = n.Name
		}
		if !more || len(page) == 0 {
			break
		}
	}
	if err := copyKeys(storage.GlobalNamespace); err != nil {
		return err
	}
	if err := from.MarkRegistryImported(ctx); err != nil {
		return err
	}
	if nss+keys+kept > 0 {
		logger.Warn("durable mode: copied the Redis-only registry into MySQL (first durable start over this Redis)",
			"namespaces", nss, "api_keys", keys, "already_in_mysql", kept)
	}
	return nil
}
