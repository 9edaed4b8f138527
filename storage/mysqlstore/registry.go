package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/delayd/delayd/storage"
)

// The registry: namespaces with their policy and API keys, in MySQL
// (tables delayd_namespaces and delayd_api_keys), for durable mode. It is
// read through the tenancy cache, so every method is one or two plain
// statements. Times are this replica's clock corrected to the index's.

var _ storage.Registry = (*Store)(nil)

// erDupEntry is MySQL's duplicate-key error number.
const erDupEntry = 1062

func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == erDupEntry
}

// maxUpdateRetries bounds UpdateNamespace's compare-and-set loop.
const maxUpdateRetries = 32

// CreateNamespace implements storage.Registry. ErrAlreadyExists if the
// name is taken.
func (s *Store) CreateNamespace(ctx context.Context, ns storage.Namespace) (storage.Namespace, error) {
	pol, err := storage.MarshalPolicy(ns.Policy)
	if err != nil {
		return storage.Namespace{}, fmt.Errorf("create namespace: %w", err)
	}
	now := s.now(ctx, ns.Name).UnixMilli()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	// The create time is the namespace's incarnation: later than that of
	// an earlier namespace of this name, even one deleted this millisecond.
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		var born int64
		err := tx.QueryRowContext(ctx, "SELECT create_ms FROM delayd_namespace_born WHERE name = ? FOR UPDATE", ns.Name).Scan(&born)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		now = max(now, born+1)
		if _, err := tx.ExecContext(ctx, "INSERT INTO delayd_namespaces (name, policy, version, create_ms, update_ms) VALUES (?, ?, 1, ?, ?)",
			ns.Name, string(pol), now, now); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, "DELETE FROM delayd_namespace_born WHERE name = ?", ns.Name)
		return err
	})
	if isDuplicate(err) {
		return storage.Namespace{}, fmt.Errorf("create namespace %q: %w", ns.Name, storage.ErrAlreadyExists)
	}
	if err != nil {
		return storage.Namespace{}, classify("create namespace", err)
	}
	ns.CreateTime, ns.UpdateTime = msTime(now), msTime(now)
	return ns, nil
}

// getNamespace reads one namespace and its version.
func (s *Store) getNamespace(ctx context.Context, name string) (storage.Namespace, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	var (
		pol              string
		version          int64
		create, updateMS int64
	)
	err := s.db.QueryRowContext(ctx, "SELECT policy, version, create_ms, update_ms FROM delayd_namespaces WHERE name = ?", name).
		Scan(&pol, &version, &create, &updateMS)
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Namespace{}, 0, fmt.Errorf("namespace %q: %w", name, storage.ErrNotFound)
	}
	if err != nil {
		return storage.Namespace{}, 0, classify("get namespace", err)
	}
	p, err := storage.UnmarshalPolicy([]byte(pol))
	if err != nil {
		return storage.Namespace{}, 0, fmt.Errorf("namespace %q: %w", name, err)
	}
	return storage.Namespace{Name: name, Policy: p, CreateTime: msTime(create), UpdateTime: msTime(updateMS)}, version, nil
}

// GetNamespace implements storage.Registry.
func (s *Store) GetNamespace(ctx context.Context, name string) (storage.Namespace, error) {
	ns, _, err := s.getNamespace(ctx, name)
	return ns, err
}

// ListNamespaces implements storage.Registry. limit is capped at 1,000.
func (s *Store) ListNamespaces(ctx context.Context, after string, limit int) ([]storage.Namespace, bool, error) {
	limit = max(1, min(limit, 1000))
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, "SELECT name, policy, create_ms, update_ms FROM delayd_namespaces WHERE name > ? ORDER BY name LIMIT ?", after, limit+1)
	if err != nil {
		return nil, false, classify("list namespaces", err)
	}
	defer rows.Close()
	var out []storage.Namespace
	for rows.Next() {
		var (
			name, pol        string
			create, updateMS int64
		)
		if err := rows.Scan(&name, &pol, &create, &updateMS); err != nil {
			return nil, false, classify("list namespaces", err)
		}
		p, err := storage.UnmarshalPolicy([]byte(pol))
		if err != nil {
			return nil, false, fmt.Errorf("namespace %q: %w", name, err)
		}
		out = append(out, storage.Namespace{Name: name, Policy: p, CreateTime: msTime(create), UpdateTime: msTime(updateMS)})
	}
	if err := rows.Err(); err != nil {
		return nil, false, classify("list namespaces", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// UpdateNamespace implements storage.Registry with compare-and-set on the
// row's version: read, call update, write if unchanged, else again.
func (s *Store) UpdateNamespace(ctx context.Context, name string, update func(storage.Policy) (storage.Policy, error)) (storage.Namespace, error) {
	for range maxUpdateRetries {
		cur, version, err := s.getNamespace(ctx, name)
		if err != nil {
			return storage.Namespace{}, err
		}
		next, err := update(cur.Policy)
		if err != nil {
			return storage.Namespace{}, err
		}
		pol, err := storage.MarshalPolicy(next)
		if err != nil {
			return storage.Namespace{}, fmt.Errorf("update namespace: %w", err)
		}
		now := s.now(ctx, name).UnixMilli()
		cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		res, err := s.db.ExecContext(cctx, "UPDATE delayd_namespaces SET policy = ?, version = version + 1, update_ms = ? WHERE name = ? AND version = ?",
			string(pol), now, name, version)
		cancel()
		if err != nil {
			return storage.Namespace{}, classify("update namespace", err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 1 {
			cur.Policy, cur.UpdateTime = next, msTime(now)
			return cur, nil
		}
		// Changed (or deleted) concurrently: read again.
	}
	return storage.Namespace{}, fmt.Errorf("update namespace %q: %w: too many concurrent updates", name, storage.ErrStale)
}

// DeleteNamespace implements storage.Registry: the namespace's row and its
// keys, in one transaction. Tasks are not touched (see DropNamespace).
func (s *Store) DeleteNamespace(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	found := false
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		// The registry row first, then the born row: the order every
		// transaction that locks both takes (endIncarnation; a group
		// commit's checkIncarnations reads them in share mode), so a
		// delete never deadlocks with the commits of late writes.
		var create int64
		err := tx.QueryRowContext(ctx, "SELECT create_ms FROM delayd_namespaces WHERE name = ? FOR UPDATE", name).Scan(&create)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if found = err == nil; found {
			// Keep the incarnation's create time: a re-created namespace
			// of this name must be born later (see CreateNamespace).
			if _, err := tx.ExecContext(ctx, "REPLACE INTO delayd_namespace_born (name, create_ms) VALUES (?, ?)", name, create); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "DELETE FROM delayd_namespaces WHERE name = ?", name); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, "DELETE FROM delayd_api_keys WHERE namespace = ?", name)
		return err
	})
	if err != nil {
		return classify("delete namespace", err)
	}
	if !found {
		return fmt.Errorf("delete namespace %q: %w", name, storage.ErrNotFound)
	}
	return nil
}

// scopeNames encodes scopes as "produce,consume".
func scopeNames(scopes []storage.Scope) string {
	names := make([]string, len(scopes))
	for i, sc := range scopes {
		names[i] = sc.String()
	}
	return strings.Join(names, ",")
}

// parseScopes decodes scopeNames; unknown names are dropped.
func parseScopes(s string) []storage.Scope {
	var out []storage.Scope
	for _, name := range strings.Split(s, ",") {
		for _, sc := range []storage.Scope{storage.ScopeProduce, storage.ScopeConsume, storage.ScopeAdmin} {
			if sc.String() == name {
				out = append(out, sc)
			}
		}
	}
	return out
}

// CreateKey implements storage.Registry. A key for a namespace that does
// not exist (other than storage.GlobalNamespace) is refused with
// storage.ErrNotFound; a taken id with storage.ErrAlreadyExists.
func (s *Store) CreateKey(ctx context.Context, k storage.Key) error {
	if k.ID == "" {
		return errors.New("create key: empty id")
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	missing := false
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if k.Namespace != storage.GlobalNamespace {
			var one int
			err := tx.QueryRowContext(ctx, "SELECT 1 FROM delayd_namespaces WHERE name = ? LOCK IN SHARE MODE", k.Namespace).Scan(&one)
			if errors.Is(err, sql.ErrNoRows) {
				missing = true
				return nil
			}
			if err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO delayd_api_keys (id, namespace, scopes, description, hash, create_ms) VALUES (?, ?, ?, ?, ?, ?)",
			k.ID, k.Namespace, scopeNames(k.Scopes), k.Description, k.Hash, timeMS(k.CreateTime))
		return err
	})
	switch {
	case isDuplicate(err):
		return fmt.Errorf("create key %q: %w", k.ID, storage.ErrAlreadyExists)
	case err != nil:
		return classify("create key", err)
	case missing:
		return fmt.Errorf("create key: namespace %q: %w", k.Namespace, storage.ErrNotFound)
	}
	return nil
}

const keyColumns = "id, namespace, scopes, description, hash, create_ms"

func scanKey(r rowScanner) (storage.Key, error) {
	var (
		k      storage.Key
		scopes string
		create int64
	)
	if err := r.Scan(&k.ID, &k.Namespace, &scopes, &k.Description, &k.Hash, &create); err != nil {
		return storage.Key{}, err
	}
	k.Scopes, k.CreateTime = parseScopes(scopes), msTime(create)
	return k, nil
}

// GetKey implements storage.Registry.
func (s *Store) GetKey(ctx context.Context, id string) (storage.Key, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	k, err := scanKey(s.db.QueryRowContext(ctx, "SELECT "+keyColumns+" FROM delayd_api_keys WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return storage.Key{}, fmt.Errorf("key %q: %w", id, storage.ErrNotFound)
	}
	if err != nil {
		return storage.Key{}, classify("get key", err)
	}
	return k, nil
}

// ListKeys implements storage.Registry: newest first, one page (keyset
// pagination on create time and id).
func (s *Store) ListKeys(ctx context.Context, ns string, after storage.KeyCursor, limit int) ([]storage.Key, bool, error) {
	limit = max(limit, 1)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	q := "SELECT " + keyColumns + " FROM delayd_api_keys WHERE namespace = ?"
	args := []any{ns}
	if !after.IsZero() {
		ms := after.CreateTime.UnixMilli()
		q += " AND (create_ms < ? OR (create_ms = ? AND id < ?))"
		args = append(args, ms, ms, after.ID)
	}
	q += " ORDER BY create_ms DESC, id DESC LIMIT ?"
	args = append(args, limit+1)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, false, classify("list keys", err)
	}
	defer rows.Close()
	var out []storage.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, false, classify("list keys", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, false, classify("list keys", err)
	}
	more := len(out) > limit
	return out[:min(len(out), limit)], more, nil
}

// RevokeKey implements storage.Registry.
func (s *Store) RevokeKey(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	res, err := s.db.ExecContext(ctx, "DELETE FROM delayd_api_keys WHERE id = ?", id)
	if err != nil {
		return classify("revoke key", err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("revoke key %q: %w", id, storage.ErrNotFound)
	}
	return nil
}
