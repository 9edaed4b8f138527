package storagefake

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/storage"
)

// Registry is an in-memory namespace and key registry with the semantics of
// the real ones (storage/registrytest runs against it), for tests of the
// layers above the stores. Safe for concurrent use.
type Registry struct {
	clock storage.Clock

	mu   sync.Mutex
	nss  map[string]storage.Namespace
	keys map[string]storage.Key
	last time.Time
	// born is the create time of each name's latest incarnation, kept
	// after a delete: a re-created namespace is always born later, even
	// within the same millisecond (its create time is its incarnation).
	born map[string]time.Time
}

var _ storage.Registry = (*Registry)(nil)

// NewRegistry returns an empty registry on clock (storage.SystemClock{}
// when nil).
func NewRegistry(clock storage.Clock) *Registry {
	if clock == nil {
		clock = storage.SystemClock{}
	}
	return &Registry{clock: clock, nss: map[string]storage.Namespace{}, keys: map[string]storage.Key{}, born: map[string]time.Time{}}
}

// now is the clock in milliseconds, as the stores keep times, never going
// back. r.mu is held.
func (r *Registry) now() time.Time {
	t := time.UnixMilli(r.clock.Now().UnixMilli())
	if t.Before(r.last) {
		t = r.last
	}
	r.last = t
	return t
}

// CreateNamespace stores a new namespace.
func (r *Registry) CreateNamespace(_ context.Context, ns storage.Namespace) (storage.Namespace, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.nss[ns.Name]; ok {
		return storage.Namespace{}, storage.ErrAlreadyExists
	}
	ns.CreateTime = r.now()
	if last, ok := r.born[ns.Name]; ok && !ns.CreateTime.After(last) {
		ns.CreateTime = last.Add(time.Millisecond)
	}
	r.born[ns.Name] = ns.CreateTime
	ns.UpdateTime = ns.CreateTime
	r.nss[ns.Name] = ns
	return ns, nil
}

// GetNamespace returns one namespace.
func (r *Registry) GetNamespace(_ context.Context, name string) (storage.Namespace, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ns, ok := r.nss[name]
	if !ok {
		return storage.Namespace{}, storage.ErrNotFound
	}
	return ns, nil
}

// ListNamespaces returns up to limit namespaces in name order after `after`.
func (r *Registry) ListNamespaces(_ context.Context, after string, limit int) ([]storage.Namespace, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []storage.Namespace
	for name, ns := range r.nss {
		if name > after {
			all = append(all, ns)
		}
	}
	slices.SortFunc(all, func(a, b storage.Namespace) int { return strings.Compare(a.Name, b.Name) })
	limit = max(limit, 1)
	if len(all) > limit {
		return all[:limit], true, nil
	}
	return all, false, nil
}

// UpdateNamespace replaces a namespace's policy with update's answer.
func (r *Registry) UpdateNamespace(_ context.Context, name string, update func(storage.Policy) (storage.Policy, error)) (storage.Namespace, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ns, ok := r.nss[name]
	if !ok {
		return storage.Namespace{}, storage.ErrNotFound
	}
	p, err := update(ns.Policy)
	if err != nil {
		return storage.Namespace{}, err
	}
	ns.Policy = p
	ns.UpdateTime = r.now()
	r.nss[name] = ns
	return ns, nil
}

// DeleteNamespace deletes a namespace and its keys.
func (r *Registry) DeleteNamespace(_ context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.nss[name]; !ok {
		return storage.ErrNotFound
	}
	delete(r.nss, name)
	for id, k := range r.keys {
		if k.Namespace == name {
			delete(r.keys, id)
		}
	}
	return nil
}

// CreateKey stores a new key of an existing namespace (or a global one).
func (r *Registry) CreateKey(_ context.Context, k storage.Key) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.keys[k.ID]; ok {
		return storage.ErrAlreadyExists
	}
	if _, ok := r.nss[k.Namespace]; !ok && k.Namespace != storage.GlobalNamespace {
		return storage.ErrNotFound
	}
	k.Scopes = slices.Clone(k.Scopes)
	k.Hash = slices.Clone(k.Hash)
	r.keys[k.ID] = k
	return nil
}

// GetKey returns one key by id.
func (r *Registry) GetKey(_ context.Context, id string) (storage.Key, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, ok := r.keys[id]
	if !ok {
		return storage.Key{}, storage.ErrNotFound
	}
	return k, nil
}

// ListKeys returns one page of the keys of one namespace, newest first.
func (r *Registry) ListKeys(_ context.Context, ns string, after storage.KeyCursor, limit int) ([]storage.Key, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []storage.Key
	for _, k := range r.keys {
		if k.Namespace != ns {
			continue
		}
		if !after.IsZero() && cmp.Or(k.CreateTime.Compare(after.CreateTime), strings.Compare(k.ID, after.ID)) >= 0 {
			continue
		}
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b storage.Key) int {
		return cmp.Or(b.CreateTime.Compare(a.CreateTime), strings.Compare(b.ID, a.ID))
	})
	limit = max(limit, 1)
	more := len(out) > limit
	return out[:min(len(out), limit)], more, nil
}

// RevokeKey deletes a key.
func (r *Registry) RevokeKey(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.keys[id]; !ok {
		return storage.ErrNotFound
	}
	delete(r.keys, id)
	return nil
}
