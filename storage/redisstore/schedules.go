package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/delayd/delayd/storage"
)

// Schedules (storage.Schedules) in Redis-only mode. A schedule lives in
// the shard of its id (keys.go: sched, schedids, schednext), where its
// firings' tasks land too (storage.FiringID), so UpdateSchedule moves the
// schedule and creates its firings in one script (lua/schedule_update.lua):
// a slot becomes a task exactly when the cursor moves past it, once,
// however many replicas race the step. The schedule loop finds due
// schedules through the set of namespaces that have some
// (scheduleNamespacesKey) and each shard's schednext.

var _ storage.Schedules = (*Store)(nil)

// scheduleScripts are the schedule entries of the Lua library
// (library.go; schedule_due is read-only, scripts.go).
var scheduleScripts = struct {
	create, update, del, due *entry
}{
	create: entryOf("schedule_create"),
	update: entryOf("schedule_update"),
	del:    entryOf("schedule_delete"),
	due:    entryOf("schedule_due"),
}

// scheduleShard is the shard of ns that holds schedule id.
func (s *Store) scheduleShard(ctx context.Context, ns, id string) (shard, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return shard{}, err
	}
	return s.shardOfN(ns, storage.ShardOf(id, n), n), nil
}

// advanceArg is a schedule's time in schednext as a script argument: ”
// when it has none (paused, done).
func advanceArg(sc storage.Schedule) string {
	if sc.Advance.IsZero() {
		return ""
	}
	return strconv.FormatInt(sc.Advance.UnixMilli(), 10)
}

// CreateSchedule implements storage.Schedules.
func (s *Store) CreateSchedule(ctx context.Context, sc storage.Schedule) (storage.Schedule, error) {
	rec, err := storage.MarshalSchedule(sc)
	if err != nil {
		return storage.Schedule{}, fmt.Errorf("create schedule: %w", err)
	}
	sh, err := s.scheduleShard(ctx, sc.Namespace, sc.ID)
	if err != nil {
		return storage.Schedule{}, err
	}
	// The namespace joins the loop's set before its schedule is written,
	// and again after (see dropIdleNamespace): no schedule is left outside
	// the set.
	if err := s.addScheduleNamespace(ctx, sc.Namespace); err != nil {
		return storage.Schedule{}, err
	}
	defer func() { _ = s.addScheduleNamespace(context.WithoutCancel(ctx), sc.Namespace) }()
	rep, err := sh.runSlice(ctx, "create schedule", scheduleScripts.create,
		[]string{sh.k.sched, sh.k.schedIDs, sh.k.schedNext}, sc.ID, rec, advanceArg(sc))
	if err != nil {
		return storage.Schedule{}, err
	}
	v, err := replyInts("create schedule", rep, 2)
	if err != nil {
		return storage.Schedule{}, err
	}
	if v[1] == 0 {
		return storage.Schedule{}, fmt.Errorf("create schedule %q: %w", sc.ID, storage.ErrAlreadyExists)
	}
	sc.Version, sc.CreateTime, sc.UpdateTime = 1, msTime(v[0]).UTC(), msTime(v[0]).UTC()
	return sc, nil
}

func (s *Store) addScheduleNamespace(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.SAdd(ctx, scheduleNamespacesKey, ns).Err(); err != nil {
		return wrapErr("create schedule", err)
	}
	return nil
}

// decodeSchedule reads a stored schedule ("version,create ms,update ms|"
// + the record).
func decodeSchedule(ns, id, v string) (storage.Schedule, error) {
	head, rec, ok := strings.Cut(v, "|")
	parts := strings.Split(head, ",")
	if !ok || len(parts) != 3 {
		return storage.Schedule{}, fmt.Errorf("schedule %q: malformed record", id)
	}
	var nums [3]int64
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return storage.Schedule{}, fmt.Errorf("schedule %q: malformed record", id)
		}
		nums[i] = n
	}
	sc := storage.Schedule{Namespace: ns, ID: id, Version: nums[0], CreateTime: msTime(nums[1]).UTC(), UpdateTime: msTime(nums[2]).UTC()}
	if err := storage.UnmarshalSchedule([]byte(rec), &sc); err != nil {
		return storage.Schedule{}, fmt.Errorf("schedule %q: %w", id, err)
	}
	return sc, nil
}

// GetSchedule implements storage.Schedules.
func (s *Store) GetSchedule(ctx context.Context, ns, id string) (storage.Schedule, error) {
	sh, err := s.scheduleShard(ctx, ns, id)
	if err != nil {
		return storage.Schedule{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := s.rdb.HGet(cctx, sh.k.sched, id).Result()
	if errors.Is(err, redis.Nil) {
		return storage.Schedule{}, fmt.Errorf("schedule %q: %w", id, storage.ErrNotFound)
	}
	if err != nil {
		return storage.Schedule{}, wrapErr("get schedule", err)
	}
	return decodeSchedule(ns, id, v)
}

// ListSchedules implements storage.Schedules: each shard's next ids after
// `after` (ZRANGEBYLEX), merged in id order.
func (s *Store) ListSchedules(ctx context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error) {
	limit = max(1, min(limit, MaxBatch))
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return nil, false, err
	}
	lo := "-"
	if after != "" {
		lo = "(" + after
	}
	pages := make([][]storage.Schedule, n)
	err = fanOut(allShards(n), func(i int) error {
		k := keysForN(ns, i, n)
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		ids, err := s.rdb.ZRangeByLex(cctx, k.schedIDs, &redis.ZRangeBy{Min: lo, Max: "+", Count: int64(limit + 1)}).Result()
		if err != nil {
			return wrapErr("list schedules", err)
		}
		if len(ids) == 0 {
			return nil
		}
		vals, err := s.rdb.HMGet(cctx, k.sched, ids...).Result()
		if err != nil {
			return wrapErr("list schedules", err)
		}
		for j, v := range vals {
			str, ok := v.(string)
			if !ok {
				continue // deleted between the two reads
			}
			sc, err := decodeSchedule(ns, ids[j], str)
			if err != nil {
				return err
			}
			pages[i] = append(pages[i], sc)
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	all := slices.Concat(pages...)
	slices.SortFunc(all, func(a, b storage.Schedule) int { return strings.Compare(a.ID, b.ID) })
	if len(all) > limit {
		return all[:limit], true, nil
	}
	return all, false, nil
}

// UpdateSchedule implements storage.Schedules (lua/schedule_update.lua).
func (s *Store) UpdateSchedule(ctx context.Context, sc storage.Schedule, p storage.UpdateScheduleParams) (storage.UpdateScheduleResult, error) {
	if len(p.Fire) > storage.MaxFiringsPerStep {
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: %d firings, at most %d", sc.ID, len(p.Fire), storage.MaxFiringsPerStep)
	}
	rec, err := storage.MarshalSchedule(sc)
	if err != nil {
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule: %w", err)
	}
	n, err := s.shardCount(ctx, sc.Namespace)
	if err != nil {
		return storage.UpdateScheduleResult{}, err
	}
	home := storage.ShardOf(sc.ID, n)
	sh := s.shardOfN(sc.Namespace, home, n)
	var nsInc int64
	args := make([]any, 0, 8+4*len(p.Fire))
	args = append(args, sh.wakeChannel(), sc.Namespace, sc.ID, p.IfVersion, rec, advanceArg(sc), 0, len(p.Fire))
	for _, f := range p.Fire {
		if storage.ShardOf(f.ID, n) != home {
			return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: firing %q is not in the schedule's shard (use storage.FiringID)", sc.ID, f.ID)
		}
		if f.DueTime.IsZero() {
			return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: firing %q has no due time", sc.ID, f.ID)
		}
		nsInc = max(nsInc, f.NamespaceIncarnation)
		args = append(args, f.ID, storage.DueMilli(f.DueTime), f.Kind, f.Payload)
	}
	args[6] = nsInc
	k := sh.k
	rep, err := sh.runSlice(ctx, "update schedule", scheduleScripts.update,
		[]string{k.sched, k.schedNext, k.due, k.meta, k.body, k.life, k.hwm}, args...)
	if err != nil {
		return storage.UpdateScheduleResult{}, err
	}
	v, err := replyInts("update schedule", rep, 3)
	if err != nil {
		return storage.UpdateScheduleResult{}, err
	}
	now, code, ver := v[0], v[1], v[2]
	switch code {
	case 0:
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: %w", sc.ID, storage.ErrNotFound)
	case 2:
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: version %d, expected %d: %w", sc.ID, ver, p.IfVersion, storage.ErrGenerationMismatch)
	case -1:
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: namespace %q incarnation %d: %w", sc.ID, sc.Namespace, nsInc, storage.ErrNamespaceEnded)
	case 1:
	default:
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule %q: unexpected reply code %d", sc.ID, code)
	}
	if len(rep) != 3+len(p.Fire) {
		return storage.UpdateScheduleResult{}, fmt.Errorf("update schedule: reply of %d values for %d firings", len(rep), len(p.Fire))
	}
	stored := sc // as written, with the store's version and time
	stored.Version, stored.UpdateTime = ver, msTime(now).UTC()
	res := storage.UpdateScheduleResult{Schedule: stored, Fired: make([]storage.UpsertResult, len(p.Fire))}
	for i, f := range p.Fire {
		c := v[3+i]
		if c == 5 {
			res.Fired[i] = storage.UpsertResult{Task: storage.Task{Namespace: sc.Namespace, ID: f.ID}, Refused: storage.RefusedExists}
			continue
		}
		res.Fired[i] = storage.UpsertResult{
			Task: storage.Task{Namespace: sc.Namespace, ID: f.ID, Kind: f.Kind, Payload: f.Payload, DueTime: msTime(storage.DueMilli(f.DueTime)),
				State: storage.StateScheduled, Generation: 1, CreateTime: msTime(now), UpdateTime: msTime(now)},
			Created: true, Earliest: c == 3,
		}
	}
	return res, nil
}

// replyInts reads the first n values of a reply as integers; when the reply
// is shorter, it reads what there is and says so.
func replyInts(op string, rep []any, n int) ([]int64, error) {
	out := make([]int64, len(rep))
	for i, x := range rep {
		v, err := replyInt(x)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		out[i] = v
	}
	if len(rep) < n {
		return out, fmt.Errorf("%s: reply of %d values, want %d", op, len(rep), n)
	}
	return out, nil
}

// DeleteSchedule implements storage.Schedules.
func (s *Store) DeleteSchedule(ctx context.Context, ns, id string, ifVersion int64) error {
	sh, err := s.scheduleShard(ctx, ns, id)
	if err != nil {
		return err
	}
	rep, err := sh.runSlice(ctx, "delete schedule", scheduleScripts.del,
		[]string{sh.k.sched, sh.k.schedIDs, sh.k.schedNext}, id, ifVersion)
	if err != nil {
		return err
	}
	v, err := replyInts("delete schedule", rep, 1)
	if err != nil {
		return err
	}
	switch v[0] {
	case 0:
		return fmt.Errorf("delete schedule %q: %w", id, storage.ErrNotFound)
	case 2:
		if len(v) < 2 {
			return errors.New("delete schedule: short reply")
		}
		return fmt.Errorf("delete schedule %q: version %d, expected %d: %w", id, v[1], ifVersion, storage.ErrGenerationMismatch)
	}
	return nil
}

// CountSchedules implements storage.Schedules.
func (s *Store) CountSchedules(ctx context.Context, ns string) (int64, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return 0, err
	}
	counts := make([]int64, n)
	err = fanOut(allShards(n), func(i int) error {
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		c, err := s.rdb.ZCard(cctx, keysForN(ns, i, n).schedIDs).Result()
		if err != nil {
			return wrapErr("count schedules", err)
		}
		counts[i] = c
		return nil
	})
	var total int64
	for _, c := range counts {
		total += c
	}
	return total, err
}

// DueSchedules implements storage.Schedules: every shard of every
// namespace in the set of namespaces that have schedules. Now is the
// latest clock the shards answered (in a cluster each node reads its own).
func (s *Store) DueSchedules(ctx context.Context, limit int) (storage.DueSchedules, error) {
	limit = max(1, min(limit, MaxBatch))
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	nss, err := s.rdb.SMembers(cctx, scheduleNamespacesKey).Result()
	cancel()
	if err != nil {
		return storage.DueSchedules{}, wrapErr("due schedules", err)
	}
	slices.Sort(nss)
	var out storage.DueSchedules
	for _, ns := range nss {
		n, err := s.shardCount(ctx, ns)
		if err != nil {
			return storage.DueSchedules{}, err
		}
		var due []storage.Schedule
		held := 0 // shards holding schedules
		for i := range n {
			sh := s.shardOfN(ns, i, n)
			rep, err := sh.runSlice(ctx, "due schedules", scheduleScripts.due, []string{sh.k.schedNext, sh.k.sched, sh.k.schedIDs}, limit)
			if err != nil {
				return storage.DueSchedules{}, err
			}
			if len(rep) < 3 || len(rep)%2 != 1 {
				return storage.DueSchedules{}, fmt.Errorf("due schedules: reply of %d values", len(rep))
			}
			if c, _ := replyInt(rep[2]); c > 0 {
				held++
			}
			now, err := replyInt(rep[0])
			if err != nil {
				return storage.DueSchedules{}, fmt.Errorf("due schedules: %w", err)
			}
			if t := msTime(now).UTC(); t.After(out.Now) {
				out.Now = t
			}
			if next, _ := replyString(rep[1]); next != "" {
				ms, err := strconv.ParseInt(next, 10, 64)
				if err != nil {
					return storage.DueSchedules{}, fmt.Errorf("due schedules: next %q", next)
				}
				if t := msTime(ms).UTC(); out.Next.IsZero() || t.Before(out.Next) {
					out.Next = t
				}
			}
			for j := 3; j < len(rep); j += 2 {
				id, _ := replyString(rep[j])
				v, _ := replyString(rep[j+1])
				sc, err := decodeSchedule(ns, id, v)
				if err != nil {
					s.log.Warn("skipping a malformed schedule", "namespace", ns, "id", id, "err", err)
					continue
				}
				due = append(due, sc)
			}
		}
		if held == 0 {
			s.dropIdleNamespace(ctx, ns, n)
		}
		// The limit is per namespace: the earliest of its shards' answers.
		slices.SortFunc(due, func(a, b storage.Schedule) int {
			return cmp.Or(a.Advance.Compare(b.Advance), strings.Compare(a.ID, b.ID))
		})
		if len(due) > limit {
			if t := due[limit].Advance; out.Next.IsZero() || t.Before(out.Next) {
				out.Next = t
			}
			due = due[:limit]
		}
		out.Schedules = append(out.Schedules, due...)
	}
	return out, nil
}

// dropIdleNamespace takes a namespace that has no schedule left out of the
// loop's set, so the set does not grow with every namespace that ever had
// one. A schedule created meanwhile is not lost: CreateSchedule adds the
// namespace again after writing it, and this looks again after the
// removal and puts the namespace back if it finds one.
func (s *Store) dropIdleNamespace(ctx context.Context, ns string, n int) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.SRem(ctx, scheduleNamespacesKey, ns).Err(); err != nil {
		return
	}
	for i := range n {
		if c, err := s.rdb.ZCard(ctx, keysForN(ns, i, n).schedIDs).Result(); err != nil || c > 0 {
			s.rdb.SAdd(ctx, scheduleNamespacesKey, ns)
			return
		}
	}
}

// DropSchedules implements storage.Schedules: every shard's schedule keys,
// then the namespace leaves the loop's set.
func (s *Store) DropSchedules(ctx context.Context, ns string) (int64, error) {
	n, err := s.shardCount(ctx, ns)
	if err != nil {
		return 0, err
	}
	counts := make([]int64, n)
	err = fanOut(allShards(n), func(i int) error {
		k := keysForN(ns, i, n)
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		c, err := s.rdb.ZCard(cctx, k.schedIDs).Result()
		if err != nil {
			return wrapErr("drop schedules", err)
		}
		counts[i] = c
		// One key at a time: the three share a slot, but a cluster
		// client refuses a multi-key DEL it cannot prove is one slot.
		for _, key := range []string{k.schedNext, k.sched, k.schedIDs} {
			if err := s.rdb.Del(cctx, key).Err(); err != nil {
				return wrapErr("drop schedules", err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.rdb.SRem(cctx, scheduleNamespacesKey, ns).Err(); err != nil {
		return 0, wrapErr("drop schedules", err)
	}
	var total int64
	for _, c := range counts {
		total += c
	}
	return total, nil
}
