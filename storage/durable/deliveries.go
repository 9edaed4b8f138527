package durable

import (
	"context"
	"fmt"
	"time"

	"github.com/delayd/delayd/storage"
	"github.com/delayd/delayd/storage/authority"
)

// storage.Deliveries, storage.DeadLetters, storage.Counter and
// storage.SharedLimits: decided by the index and written through to MySQL
// (see the package doc).

// Pop is the index's: pops are not written to MySQL.
func (s *Store) Pop(ctx context.Context, ns string, p storage.PopParams) ([]storage.Delivery, error) {
	return s.idx.Pop(ctx, ns, p)
}

// PopWake is the index's: pops are not written to MySQL.
func (s *Store) PopWake(ctx context.Context, ns string, p storage.PopParams) (storage.PopResult, error) {
	return s.idx.PopWake(ctx, ns, p)
}

// Ack acks in the index (which checks incarnation, generation and
// delivery) leaving an ack marker per acked task, then deletes each acked
// version from MySQL (or moves it to the history table when
// HistoryRetention is set), then drops the markers. A newer version's row
// is never deleted. If the MySQL delete fails, the statuses are returned
// with an ErrUnavailable error and the markers stay: the task is not
// delivered again (the reconciler never restores a version a marker names;
// it deletes the row itself once MySQL answers and drops the marker), and
// a retry of the same ack answers OK again (the marker matches its token)
// and retries the delete.
func (s *Store) Ack(ctx context.Context, ns string, tokens []storage.Token) ([]storage.TokenStatus, error) {
	st, err := s.idx.AckMarked(ctx, ns, tokens)
	if err != nil {
		return st, err
	}
	var acks []authority.AckRow
	var marks []storage.Token
	for i, t := range tokens {
		if i < len(st) && st[i] == storage.TokenOK {
			acks = append(acks, authority.AckRow{ID: t.ID, Inc: t.Incarnation, Gen: t.Generation, Attempt: t.Attempt})
			marks = append(marks, t)
		}
	}
	if len(acks) == 0 {
		return st, nil
	}
	o := &op{Write: authority.Write{Kind: kindAck, NS: ns, NowMS: s.cfg.Clock.Now().UnixMilli(), Acks: acks}}
	if err := s.commit.submit(ctx, o); err != nil {
		return st, fmt.Errorf("ack: write through: %w", err)
	}
	// Best effort: a marker left behind only costs memory until the
	// reconciler's full pass drops it.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	if _, err := s.idx.ClearAcked(cctx, ns, marks); err != nil {
		s.warn.warn("clear-acked", "could not drop ack markers; the reconciler will", "namespace", ns, "err", err)
	}
	return st, nil
}

// Nack is the index's, written through to MySQL (generation-guarded). A
// failed write-through returns the index's answers with an error; MySQL
// then lags (the task may come back with an older attempt count after a
// Redis loss).
func (s *Store) Nack(ctx context.Context, ns string, tokens []storage.Token, opts storage.NackOptions) ([]storage.TokenStatus, []storage.Moved, error) {
	st, moved, err := s.idx.Nack(ctx, ns, tokens, opts)
	if err != nil || len(moved) == 0 {
		return st, moved, err
	}
	return st, moved, s.writeMoved(ctx, ns, moved, "nack")
}

// Extend is the index's: leases are not written to MySQL.
func (s *Store) Extend(ctx context.Context, ns string, tokens []storage.Token, by time.Duration) ([]storage.ExtendResult, error) {
	return s.idx.Extend(ctx, ns, tokens, by)
}

// Reap is the index's, written through to MySQL like Nack.
func (s *Store) Reap(ctx context.Context, ns string, limit int, opts storage.NackOptions) ([]storage.Moved, error) {
	moved, err := s.idx.Reap(ctx, ns, limit, opts)
	if err != nil || len(moved) == 0 {
		return moved, err
	}
	return moved, s.writeMoved(ctx, ns, moved, "reap")
}

// NextWake is the index's.
func (s *Store) NextWake(ctx context.Context, ns string) (time.Time, time.Time, bool, error) {
	return s.idx.NextWake(ctx, ns)
}

// ExpectPop is the index's: the acks of durable mode (AckMarked) and its
// nacks ride the index's pops as Redis-only mode's do.
func (s *Store) ExpectPop(ns string, within time.Duration) {
	s.idx.ExpectPop(ns, within)
}

// Requeue is the index's, written through to MySQL.
func (s *Store) Requeue(ctx context.Context, ns string, p storage.RequeueParams) ([]storage.Moved, error) {
	moved, err := s.idx.Requeue(ctx, ns, p)
	if err != nil || len(moved) == 0 {
		return moved, err
	}
	return moved, s.writeMoved(ctx, ns, moved, "requeue")
}

// Purge deletes dead tasks from the index, then exactly the versions the
// index deleted from MySQL (whatever state MySQL still records: a death
// whose write-through lags is still a death). Named ids the index holds in
// no state (a namespace not rebuilt yet) are purged from MySQL when MySQL
// holds them dead. A named task the index holds in another state (say,
// requeued, while MySQL still records it dead) is left alone in both. It
// returns every id deleted from either store.
func (s *Store) Purge(ctx context.Context, ns string, p storage.PurgeParams) ([]string, error) {
	vs, err := s.idx.PurgeVersions(ctx, ns, p)
	if err != nil {
		return nil, err
	}
	purged := make([]string, len(vs))
	seen := make(map[string]bool, len(vs))
	for i, v := range vs {
		purged[i] = v.ID
		seen[v.ID] = true
	}
	if len(vs) > 0 {
		if err := s.db.DeleteVersions(ctx, ns, vs); err != nil {
			return purged, err
		}
	}
	if p.All {
		return purged, nil
	}
	var rest []string
	for _, id := range p.IDs {
		if !seen[id] {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return purged, nil
	}
	have, _, err := s.idx.Versions(ctx, ns, rest)
	if err != nil {
		return purged, err
	}
	var absent []string
	for i, v := range have {
		if v.Incarnation == 0 && v.Generation == 0 {
			absent = append(absent, rest[i])
		}
	}
	if len(absent) == 0 {
		return purged, nil
	}
	deleted, err := s.db.Purge(ctx, ns, absent)
	if err != nil {
		return purged, err
	}
	for _, id := range deleted {
		if !seen[id] {
			seen[id] = true
			purged = append(purged, id)
		}
	}
	return purged, nil
}

// Stats is the index's.
func (s *Store) Stats(ctx context.Context, ns string) (storage.Stats, error) {
	return s.idx.Stats(ctx, ns)
}

// DueKinds counts due tasks per kind from the index (see storage.Counter).
func (s *Store) DueKinds(ctx context.Context, ns string) (storage.DueKinds, error) {
	return s.idx.DueKinds(ctx, ns)
}

// DropNamespace deletes every task of ns and returns how many there were
// (the larger of the index's and MySQL's counts). DeleteNamespace uses it.
// With an incarnation (the namespace's create time, ms) the index ends it
// first, so from then on no write of that incarnation lands in either
// store (the durable Upsert claims its incarnation from the index before
// writing MySQL, and Restore writes nothing into an ended namespace);
// then MySQL ends it too, under the registry row's lock that every group
// commit of an upsert for it reads (so a write that was past the index's
// check is either committed before the drop or refused), then MySQL's rows
// go (in batches of 10,000), then the index is dropped once more for any
// write that was past its check when the first drop ran.
func (s *Store) DropNamespace(ctx context.Context, ns string, incarnation int64) (int64, error) {
	inIndex, err := s.idx.DropNamespace(ctx, ns, incarnation)
	if err != nil {
		return 0, fmt.Errorf("drop namespace: index: %w", err)
	}
	deleted, err := s.db.DropTasks(ctx, ns, incarnation)
	if err != nil {
		return max(deleted, inIndex), err
	}
	if incarnation > 0 {
		// A deleted namespace's history goes with it.
		if _, err := s.db.PruneEvents(ctx, ns, 0); err != nil {
			return max(deleted, inIndex), fmt.Errorf("drop namespace: history: %w", err)
		}
	}
	n, err := s.idx.DropNamespace(ctx, ns, incarnation)
	if err != nil {
		return max(deleted, inIndex), fmt.Errorf("drop namespace: index: %w", err)
	}
	return max(deleted, inIndex+n), nil
}

// TakeRequestToken implements storage.SharedLimits on the index.
func (s *Store) TakeRequestToken(ctx context.Context, ns string, rate float64, burst int) (bool, error) {
	return s.idx.TakeRequestToken(ctx, ns, rate, burst)
}

// AcquireSubscriber implements storage.SharedLimits on the index.
func (s *Store) AcquireSubscriber(ctx context.Context, ns, id string, most int, lease time.Duration) (bool, int, error) {
	return s.idx.AcquireSubscriber(ctx, ns, id, most, lease)
}

// RenewSubscribers implements storage.SharedLimits on the index.
func (s *Store) RenewSubscribers(ctx context.Context, ns string, ids []string, lease time.Duration) error {
	return s.idx.RenewSubscribers(ctx, ns, ids, lease)
}

// ReleaseSubscriber implements storage.SharedLimits on the index.
func (s *Store) ReleaseSubscriber(ctx context.Context, ns, id string) error {
	return s.idx.ReleaseSubscriber(ctx, ns, id)
}

// writeMoved writes index transitions through to MySQL.
func (s *Store) writeMoved(ctx context.Context, ns string, moved []storage.Moved, what string) error {
	o := &op{Write: authority.Write{Kind: kindMoved, NS: ns, NowMS: s.cfg.Clock.Now().UnixMilli(), Moved: moved}}
	if err := s.commit.submit(ctx, o); err != nil {
		return fmt.Errorf("%s: write through: %w", what, err)
	}
	return nil
}

var _ storage.SharedLimits = (*Store)(nil)
