package redisstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// The registry: namespaces and API keys, for Redis-only and embedded modes
// (durable mode keeps them in MySQL). It is small and read through the
// tenancy cache, so simplicity beats cleverness here: one hash tag,
// {registry}, holds it all (see keys.go), and the few writes that touch more
// than one key are Lua scripts.

var _ storage.Registry = (*Store)(nil)

// maxUpdateRetries bounds UpdateNamespace's compare-and-set loop.
const maxUpdateRetries = 32

// validRegistryNamespace accepts a namespace name or, where allowGlobal,
// storage.GlobalNamespace. Only such names reach the key builders.
func validRegistryNamespace(ns string, allowGlobal bool) bool {
	return (allowGlobal && ns == storage.GlobalNamespace) || storage.ValidateNamespace(ns) == nil
}

// CreateNamespace implements storage.Registry. Times are the Redis clock's.
func (s *Store) CreateNamespace(ctx context.Context, ns storage.Namespace) (storage.Namespace, error) {
	if !validRegistryNamespace(ns.Name, false) {
		return storage.Namespace{}, fmt.Errorf("create namespace: invalid name %q", ns.Name)
	}
	pol, err := storage.MarshalPolicy(ns.Policy)
	if err != nil {
		return storage.Namespace{}, fmt.Errorf("create namespace: %w", err)
	}
	v, err := s.run(ctx, "create namespace", registryScripts.nsCreate,
		[]string{registryNamespaceKey(ns.Name), registryNamespaceIndexKey(), registryBornKey()}, ns.Name, pol)
	if err != nil {
		return storage.Namespace{}, err
	}
	if n, ok := v.(int64); ok && n == 0 {
		return storage.Namespace{}, fmt.Errorf("create namespace %q: %w", ns.Name, storage.ErrAlreadyExists)
	}
	meta, err := registryMeta(v)
	if err != nil {
		return storage.Namespace{}, fmt.Errorf("create namespace: %w", err)
	}
	ns.CreateTime, ns.UpdateTime = msTime(meta[0]), msTime(meta[1])
	return ns, nil
}

// registryMeta decodes a {create_ms, update_ms, version} reply.
func registryMeta(v any) ([3]int64, error) {
	var out [3]int64
	a, err := replySlice(v)
	if err != nil {
		return out, err
	}
	if len(a) != 3 {
		return out, fmt.Errorf("reply has %d values, want 3", len(a))
	}
	for i := range a {
		s, err := replyString(a[i])
		if err != nil {
			return out, err
		}
		if out[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return out, fmt.Errorf("reply value %q: %w", s, err)
		}
	}
	return out, nil
}

// nsRecord is a namespace record as read: the namespace and its version.
type nsRecord struct {
	ns      storage.Namespace
	version string
}

// decodeNamespace builds a namespace from the record's HMGET fields
// policy, create_ms, update_ms, version.
func decodeNamespace(name string, f []any) (nsRecord, error) {
	if len(f) != 4 {
		return nsRecord{}, fmt.Errorf("namespace record has %d fields", len(f))
	}
	str := make([]string, 4)
	for i, v := range f {
		s, ok := v.(string)
		if !ok {
			return nsRecord{}, fmt.Errorf("namespace record %q: field %d missing", name, i)
		}
		str[i] = s
	}
	pol, err := storage.UnmarshalPolicy([]byte(str[0]))
	if err != nil {
		return nsRecord{}, fmt.Errorf("namespace record %q: %w", name, err)
	}
	c, err1 := strconv.ParseInt(str[1], 10, 64)
	u, err2 := strconv.ParseInt(str[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return nsRecord{}, fmt.Errorf("namespace record %q: %w", name, err)
	}
	return nsRecord{
		ns:      storage.Namespace{Name: name, Policy: pol, CreateTime: msTime(c), UpdateTime: msTime(u)},
		version: str[3],
	}, nil
}

func (s *Store) getNamespace(ctx context.Context, name string) (nsRecord, error) {
	if !validRegistryNamespace(name, false) {
		return nsRecord{}, fmt.Errorf("get namespace %q: %w", name, storage.ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	f, err := s.rdb.HMGet(ctx, registryNamespaceKey(name), "policy", "create_ms", "update_ms", "version").Result()
	if err != nil {
		return nsRecord{}, wrapErr("get namespace", err)
	}
	if f[0] == nil {
		return nsRecord{}, fmt.Errorf("get namespace %q: %w", name, storage.ErrNotFound)
	}
	return decodeNamespace(name, f)
}

// GetNamespace implements storage.Registry.
func (s *Store) GetNamespace(ctx context.Context, name string) (storage.Namespace, error) {
	r, err := s.getNamespace(ctx, name)
	return r.ns, err
}

// ListNamespaces implements storage.Registry: one ZRANGEBYLEX of the index
// and one pipeline of reads per round. limit is capped at MaxBatch. When
// every namespace of a round was deleted between the two reads, it reads
// on from the last name it saw, so "more" never comes with an empty page
// (a caller could not page on from nothing).
func (s *Store) ListNamespaces(ctx context.Context, after string, limit int) ([]storage.Namespace, bool, error) {
	limit = max(1, min(limit, MaxBatch))
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	for {
		out, more, last, err := s.listNamespacesOnce(ctx, after, limit)
		if err != nil || len(out) > 0 || !more {
			return out, more, err
		}
		after = last
	}
}

// listNamespacesOnce reads one round of ListNamespaces and also returns the
// last name it scanned.
func (s *Store) listNamespacesOnce(ctx context.Context, after string, limit int) ([]storage.Namespace, bool, string, error) {
	lo := "-"
	if after != "" {
		lo = "(" + after
	}
	names, err := s.rdb.ZRangeByLex(ctx, registryNamespaceIndexKey(), &redis.ZRangeBy{
		Min: lo, Max: "+", Count: int64(limit) + 1,
	}).Result()
	if err != nil {
		return nil, false, "", wrapErr("list namespaces", err)
	}
	more := len(names) > limit
	if more {
		names = names[:limit]
	}
	last := ""
	if len(names) > 0 {
		last = names[len(names)-1]
	}
	var valid []string
	for _, n := range names {
		if validRegistryNamespace(n, false) {
			valid = append(valid, n)
		}
	}
	if len(valid) == 0 {
		return nil, more, last, nil
	}
	cmds := make([]*redis.SliceCmd, len(valid))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range valid {
			cmds[i] = p.HMGet(ctx, registryNamespaceKey(n), "policy", "create_ms", "update_ms", "version")
		}
		return nil
	})
	if err != nil {
		return nil, false, "", wrapErr("list namespaces", err)
	}
	out := make([]storage.Namespace, 0, len(valid))
	for i, n := range valid {
		f := cmds[i].Val()
		if len(f) == 0 || f[0] == nil {
			continue // deleted between the two reads
		}
		r, err := decodeNamespace(n, f)
		if err != nil {
			return nil, false, "", fmt.Errorf("list namespaces: %w", err)
		}
		out = append(out, r.ns)
	}
	return out, more, last, nil
}

// UpdateNamespace implements storage.Registry with compare-and-set on the
// record's version: read, call update, write if unchanged, else again.
func (s *Store) UpdateNamespace(ctx context.Context, name string, update func(storage.Policy) (storage.Policy, error)) (storage.Namespace, error) {
	for range maxUpdateRetries {
		cur, err := s.getNamespace(ctx, name)
		if err != nil {
			return storage.Namespace{}, err
		}
		next, err := update(cur.ns.Policy)
		if err != nil {
			return storage.Namespace{}, err
		}
		pol, err := storage.MarshalPolicy(next)
		if err != nil {
			return storage.Namespace{}, fmt.Errorf("update namespace: %w", err)
		}
		v, err := s.run(ctx, "update namespace", registryScripts.nsUpdate,
			[]string{registryNamespaceKey(name)}, cur.version, pol)
		if err != nil {
			return storage.Namespace{}, err
		}
		if n, ok := v.(int64); ok {
			if n < 0 {
				return storage.Namespace{}, fmt.Errorf("update namespace %q: %w", name, storage.ErrNotFound)
			}
			continue // changed concurrently: read again
		}
		meta, err := registryMeta(v)
		if err != nil {
			return storage.Namespace{}, fmt.Errorf("update namespace: %w", err)
		}
		return storage.Namespace{Name: name, Policy: next, CreateTime: msTime(meta[0]), UpdateTime: msTime(meta[1])}, nil
	}
	return storage.Namespace{}, fmt.Errorf("update namespace %q: %w: too many concurrent updates", name, storage.ErrStale)
}

// DeleteNamespace implements storage.Registry: the record and every key of
// the namespace go in one script.
func (s *Store) DeleteNamespace(ctx context.Context, name string) error {
	if !validRegistryNamespace(name, false) {
		return fmt.Errorf("delete namespace %q: %w", name, storage.ErrNotFound)
	}
	v, err := s.run(ctx, "delete namespace", registryScripts.nsDelete,
		[]string{registryNamespaceKey(name), registryNamespaceIndexKey(), registryKeysKey(), registryNamespaceKeysKey(name), registryBornKey()}, name)
	if err != nil {
		return err
	}
	if n, _ := v.(int64); n < 0 {
		return fmt.Errorf("delete namespace %q: %w", name, storage.ErrNotFound)
	}
	return nil
}

// keyRecord is an API key's stored form (the field of the keys HASH).
type keyRecord struct {
	Namespace   string   `json:"ns"`
	Scopes      []string `json:"scopes"`
	Description string   `json:"desc,omitempty"`
	CreateMS    int64    `json:"create_ms"`
	Hash        string   `json:"sha256"` // hex
}

func scopeByName(name string) storage.Scope {
	for _, s := range []storage.Scope{storage.ScopeProduce, storage.ScopeConsume, storage.ScopeAdmin} {
		if s.String() == name {
			return s
		}
	}
	return storage.ScopeUnspecified
}

// CreateKey implements storage.Registry. A key for a namespace that does not
// exist is refused with storage.ErrNotFound.
func (s *Store) CreateKey(ctx context.Context, k storage.Key) error {
	if !validRegistryNamespace(k.Namespace, true) || k.ID == "" {
		return fmt.Errorf("create key: invalid id %q or namespace %q", k.ID, k.Namespace)
	}
	rec := keyRecord{Namespace: k.Namespace, Description: k.Description, CreateMS: toMS(k.CreateTime), Hash: hex.EncodeToString(k.Hash)}
	for _, sc := range k.Scopes {
		rec.Scopes = append(rec.Scopes, sc.String())
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("create key: %w", err)
	}
	global := luaBool(k.Namespace == storage.GlobalNamespace)
	v, err := s.run(ctx, "create key", registryScripts.keyCreate,
		[]string{registryKeysKey(), registryNamespaceKeysKey(k.Namespace), registryNamespaceKey(k.Namespace)},
		k.ID, b, rec.CreateMS, global)
	if err != nil {
		return err
	}
	switch n, _ := v.(int64); n {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("create key %q: %w", k.ID, storage.ErrAlreadyExists)
	default:
		return fmt.Errorf("create key: namespace %q: %w", k.Namespace, storage.ErrNotFound)
	}
}

func decodeKey(id, raw string) (storage.Key, error) {
	var rec keyRecord
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		return storage.Key{}, fmt.Errorf("key %q: %w", id, err)
	}
	hash, err := hex.DecodeString(rec.Hash)
	if err != nil {
		return storage.Key{}, fmt.Errorf("key %q: hash: %w", id, err)
	}
	k := storage.Key{ID: id, Namespace: rec.Namespace, Description: rec.Description, CreateTime: msTime(rec.CreateMS), Hash: hash}
	for _, name := range rec.Scopes {
		if sc := scopeByName(name); sc != storage.ScopeUnspecified {
			k.Scopes = append(k.Scopes, sc)
		}
	}
	return k, nil
}

// GetKey implements storage.Registry.
func (s *Store) GetKey(ctx context.Context, id string) (storage.Key, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	raw, err := s.rdb.HGet(ctx, registryKeysKey(), id).Result()
	if errors.Is(err, redis.Nil) {
		return storage.Key{}, fmt.Errorf("get key %q: %w", id, storage.ErrNotFound)
	}
	if err != nil {
		return storage.Key{}, wrapErr("get key", err)
	}
	return decodeKey(id, raw)
}

// ListKeys implements storage.Registry: newest first, one page. The key
// index ZSET holds id -> create time; members with the same score are read
// in reverse id order (ZREVRANGE's), which is the page order.
func (s *Store) ListKeys(ctx context.Context, ns string, after storage.KeyCursor, limit int) ([]storage.Key, bool, error) {
	if !validRegistryNamespace(ns, true) {
		return nil, false, nil
	}
	limit = max(limit, 1)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	zkey := registryNamespaceKeysKey(ns)
	start, ties := int64(0), int64(0)
	if !after.IsZero() {
		ms := after.CreateTime.UnixMilli()
		sc, err := s.rdb.ZScore(ctx, zkey, after.ID).Result()
		switch {
		case err == nil && int64(sc) == ms:
			rank, err := s.rdb.ZRevRank(ctx, zkey, after.ID).Result()
			if err != nil {
				return nil, false, wrapErr("list keys", err)
			}
			start = rank + 1
		case err == nil || errors.Is(err, redis.Nil):
			// The cursor's key was revoked (or re-scored): start at its
			// create time and skip the ids at or above it.
			msText := strconv.FormatInt(ms, 10)
			if start, err = s.rdb.ZCount(ctx, zkey, "("+msText, "+inf").Result(); err != nil {
				return nil, false, wrapErr("list keys", err)
			}
			if ties, err = s.rdb.ZCount(ctx, zkey, msText, msText).Result(); err != nil {
				return nil, false, wrapErr("list keys", err)
			}
		default:
			return nil, false, wrapErr("list keys", err)
		}
	}
	zs, err := s.rdb.ZRevRangeWithScores(ctx, zkey, start, start+int64(limit)+ties).Result()
	if err != nil {
		return nil, false, wrapErr("list keys", err)
	}
	ids := make([]string, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		if ties > 0 && int64(z.Score) == after.CreateTime.UnixMilli() && id >= after.ID {
			continue
		}
		ids = append(ids, id)
	}
	more := len(ids) > limit
	ids = ids[:min(len(ids), limit)]
	if len(ids) == 0 {
		return nil, false, nil
	}
	raws, err := s.rdb.HMGet(ctx, registryKeysKey(), ids...).Result()
	if err != nil {
		return nil, false, wrapErr("list keys", err)
	}
	out := make([]storage.Key, 0, len(ids))
	for i, raw := range raws {
		str, ok := raw.(string)
		if !ok {
			continue // revoked between the two reads
		}
		k, err := decodeKey(ids[i], str)
		if err != nil {
			return nil, false, fmt.Errorf("list keys: %w", err)
		}
		out = append(out, k)
	}
	return out, more, nil
}

// RevokeKey implements storage.Registry.
func (s *Store) RevokeKey(ctx context.Context, id string) error {
	k, err := s.GetKey(ctx, id)
	if err != nil {
		return err
	}
	v, err := s.run(ctx, "revoke key", registryScripts.keyRevoke,
		[]string{registryKeysKey(), registryNamespaceKeysKey(k.Namespace)}, id)
	if err != nil {
		return err
	}
	if n, _ := v.(int64); n == 0 {
		return fmt.Errorf("revoke key %q: %w", id, storage.ErrNotFound)
	}
	return nil
}

// DropNamespace deletes every task of ns in one script (UNLINK, so Redis
// frees the memory in the background) and returns how many there were.
// DeleteNamespace uses it. With an incarnation (the namespace's create
// time, ms; 0 = none) it also ends that incarnation at once: from then on
// upserts that name it or an earlier one fail with
// storage.ErrNamespaceEnded, and so do unchecked upserts and Restore
// until a later incarnation has written.
func (s *Store) DropNamespace(ctx context.Context, ns string, incarnation int64) (int64, error) {
	if storage.ValidateNamespace(ns) != nil {
		return 0, nil
	}
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return 0, fmt.Errorf("drop namespace: %w", err)
	}
	counts := make([]int64, n)
	err = fanOut(allShards(n), func(sh int) error {
		k := keysForN(ns, sh, n)
		v, err := s.run(ctx, "drop namespace", registryScripts.dropNamespace,
			[]string{k.due, k.inflight, k.dead, k.meta, k.indexed, k.body, k.acked, k.legacy, k.life, k.hwm}, max(incarnation, 0))
		if err != nil {
			return err
		}
		counts[sh], err = replyInt(v)
		return err
	})
	if err == nil && incarnation > 0 {
		// A deleted namespace's task history goes with it (after life
		// marks the incarnation ended: a write racing the drop either
		// ran before and is removed here, or sees the mark and removes
		// what it wrote; history.go), and so does the stream of delayd
		// before histories were kept per incarnation.
		k := keysForN(ns, 0, n)
		err = s.unlink(ctx, "drop namespace", k.historyOf(incarnation), k.historyIDsOf(incarnation), k.historyFirstOf(incarnation), k.history)
	}
	s.forgetShards(ns)
	var total int64
	for _, c := range counts {
		total += c
	}
	return total, err
}

// RegistryImported reports whether durable mode has copied this Redis
// registry into MySQL (MarkRegistryImported), so it is copied only once.
func (s *Store) RegistryImported(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.rdb.Exists(ctx, registryImportedKey()).Result()
	if err != nil {
		return false, wrapErr("registry imported", err)
	}
	return n == 1, nil
}

// MarkRegistryImported records that durable mode copied this registry into
// MySQL; the registry itself is left as it was (a way back to Redis-only).
func (s *Store) MarkRegistryImported(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.Set(ctx, registryImportedKey(), time.Now().UnixMilli(), 0).Err(); err != nil {
		return wrapErr("mark registry imported", err)
	}
	return nil
}
