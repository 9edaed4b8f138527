package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
)

// relayRun is one started relay: its loop's cancel and its end.
type relayRun struct {
	stop context.CancelFunc // ends the loop between rounds
	hard context.CancelFunc // ends a round in progress
	done chan struct{}
}

// Start runs a relay in this process until Stop (or until ctx is
// cancelled): it sends the committed rows of the table to delayd and
// deletes those delayd accepted. Any number of relays of one service (in
// one process or many) may run at once on the same table: each row is
// claimed by one of them at a time (FOR UPDATE SKIP LOCKED), and every
// call it makes is safe to repeat (see the package documentation). While
// delayd or the database is unreachable the relay backs off (MinBackoff up
// to MaxBackoff) and catches up when they are back.
func (o *Outbox) Start(ctx context.Context) error {
	if o.cfg.Client == nil {
		return errors.New("outbox: Config.Client is required to start a relay")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.running != nil {
		return errors.New("outbox: relay already started")
	}
	loopCtx, stop := context.WithCancel(ctx)
	roundCtx, hard := context.WithCancel(context.WithoutCancel(ctx))
	run := &relayRun{stop: stop, hard: hard, done: make(chan struct{})}
	o.running = run
	tasks := delaydv1.NewTaskServiceClient(o.cfg.Client.Conn())
	go func() {
		defer close(run.done)
		defer hard()
		o.loop(loopCtx, roundCtx, tasks)
	}()
	return nil
}

// Stop ends the relay and waits for it: the round in progress finishes
// (its calls are bounded by the client's timeout) unless ctx ends first,
// which cancels it; what it had not finished is sent by the next relay to
// run. Stop without Start does nothing.
func (o *Outbox) Stop(ctx context.Context) error {
	o.mu.Lock()
	run := o.running
	o.running = nil
	o.mu.Unlock()
	if run == nil {
		return nil
	}
	run.stop()
	select {
	case <-run.done:
		return nil
	case <-ctx.Done():
		run.hard()
		<-run.done
		return ctx.Err()
	}
}

func (o *Outbox) loop(loopCtx, roundCtx context.Context, tasks delaydv1.TaskServiceClient) {
	failures := 0
	for loopCtx.Err() == nil {
		claimed, err := o.round(roundCtx, tasks)
		var wait time.Duration
		switch {
		case err != nil:
			failures++
			ceiling := min(o.cfg.MaxBackoff, o.cfg.MinBackoff<<min(failures-1, 20))
			wait = rand.N(ceiling) + 1
			o.logger.Warn("outbox relay round failed; backing off", "error", err, "wait", wait, "failures", failures)
			o.cfg.Metrics.roundFailed()
		case claimed == o.cfg.BatchSize:
			failures = 0
			continue // more may be waiting
		default:
			failures = 0
			wait = o.cfg.PollInterval
		}
		t := time.NewTimer(wait)
		select {
		case <-loopCtx.Done():
		case <-t.C:
		case <-o.wake:
		}
		t.Stop()
	}
}

// row is one claimed outbox row.
type row struct {
	seq              int64
	ns, id           string
	op               int
	kind             string
	payload          []byte
	dueMS, createdUS int64
	parkInc, parkGen sql.NullInt64
}

// Relay protocol. A plain upsert sent twice is not harmless: if the first
// one was delivered and acked before the second arrives (the relay died
// between send and delete), the second creates the task again and it runs
// twice. So an upsert row goes out in two calls, each safe to repeat:
//
//  1. park: upsert the task (its kind and payload) due ParkFor from now,
//     and record the version delayd answered (incarnation, generation) in
//     the row, committed. A parked task cannot fire, so sending this again
//     (the relay died before the record committed) only parks it again.
//  2. arm: upsert it at its real due time with if_incarnation/
//     if_generation = the recorded version, then delete the row. Sent
//     again, it fails with FAILED_PRECONDITION: the first one applied (the
//     task is a generation further, or already delivered and acked — a
//     parked task cannot have been), so the row is done.
//
// A remove row is one RemoveTasks call: removing again is harmless, as no
// later write of the task is sent before the row is deleted.

// round claims up to BatchSize head rows (the oldest unsent row of each
// task), sends them, and deletes what delayd accepted. It returns how many
// rows it claimed and the first failure (whole calls that failed, items
// delayd could not take now); rows that failed stay for a later round.
func (o *Outbox) round(ctx context.Context, tasks delaydv1.TaskServiceClient) (int, error) {
	tx, err := o.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := o.claim(ctx, tx)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	var removes, park, arm []*row
	for _, r := range rows {
		switch {
		case r.op == opRemove:
			removes = append(removes, r)
		case r.parkGen.Valid:
			arm = append(arm, r)
		default:
			park = append(park, r)
		}
	}
	var firstErr error
	keep := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}

	// Removes: sent and deleted under the claim.
	var removed []*row
	for ns, rs := range byNamespace(removes) {
		ids := make([]string, len(rs))
		for i, r := range rs {
			ids[i] = r.id
		}
		if _, err := tasks.RemoveTasks(ctx, &delaydv1.RemoveTasksRequest{Namespace: ns, Ids: ids}); err != nil {
			keep(fmt.Errorf("remove tasks %s: %w", ns, err))
			continue
		}
		removed = append(removed, rs...)
	}
	o.at("remove-sent")
	if err := o.delete(ctx, tx, removed); err != nil {
		return len(rows), err
	}

	// Phase 1, park: recorded under the claim, committed before phase 2.
	parkDue := o.cfg.Now().Add(o.cfg.ParkFor).UnixMilli()
	var parked []*row
	for ns, rs := range byNamespace(park) {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: make([]*delaydv1.UpsertTaskRequest, len(rs))}
		for i, r := range rs {
			req.Tasks[i] = &delaydv1.UpsertTaskRequest{Id: r.id, Kind: r.kind, Payload: r.payload,
				When: &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(time.UnixMilli(max(r.dueMS, parkDue)))}}
		}
		results, err := batchUpsert(ctx, tasks, req)
		if err != nil {
			keep(err)
			continue
		}
		for i, res := range results {
			r := rs[i]
			if e := res.GetError(); e != nil {
				if err := o.itemFailed(ctx, tx, r, "park", e); err != nil {
					keep(err)
				}
				continue
			}
			inc, gen := res.GetTask().GetIncarnation(), res.GetTask().GetGeneration()
			r.parkInc, r.parkGen = sql.NullInt64{Int64: inc, Valid: true}, sql.NullInt64{Int64: gen, Valid: true}
			parked = append(parked, r)
		}
	}
	if err := o.recordPark(ctx, tx, parked); err != nil {
		return len(rows), err
	}
	arm = append(arm, parked...)
	o.at("park-sent")
	if err := tx.Commit(); err != nil {
		return len(rows), fmt.Errorf("commit park: %w", err)
	}
	o.cfg.Metrics.accepted(o.cfg.Now(), removed, "removed")
	if len(arm) > 0 {
		if err := o.arm(ctx, tasks, arm); err != nil {
			keep(err)
		}
	}
	return len(rows), firstErr
}

// arm runs phase 2 for rows whose park is recorded: claimed again (rows
// another relay took meanwhile are left to it), upserted at their due
// time on the recorded version, and deleted.
func (o *Outbox) arm(ctx context.Context, tasks delaydv1.TaskServiceClient, rs []*row) error {
	tx, err := o.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	bySeq := make(map[int64]*row, len(rs))
	args := make([]any, len(rs))
	for i, r := range rs {
		bySeq[r.seq], args[i] = r, r.seq
	}
	res, err := tx.QueryContext(ctx, o.q.relockPrefix+o.q.in(len(rs))+" FOR UPDATE SKIP LOCKED", args...)
	if err != nil {
		return fmt.Errorf("claim armed rows: %w", err)
	}
	var mine []*row
	for res.Next() {
		var seq int64
		var inc, gen sql.NullInt64
		if err := res.Scan(&seq, &inc, &gen); err != nil {
			res.Close()
			return fmt.Errorf("claim armed rows: %w", err)
		}
		if r := bySeq[seq]; r != nil && gen.Valid && inc.Valid {
			r.parkInc, r.parkGen = inc, gen
			mine = append(mine, r)
		}
	}
	res.Close()
	if err := res.Err(); err != nil {
		return fmt.Errorf("claim armed rows: %w", err)
	}
	var firstErr error
	var accepted, superseded []*row
	for ns, rs := range byNamespace(mine) {
		req := &delaydv1.BatchUpsertTasksRequest{Namespace: ns, Tasks: make([]*delaydv1.UpsertTaskRequest, len(rs))}
		for i, r := range rs {
			req.Tasks[i] = &delaydv1.UpsertTaskRequest{Id: r.id, Kind: r.kind, Payload: r.payload,
				When:         &delaydv1.UpsertTaskRequest_DueTime{DueTime: timestamppb.New(time.UnixMilli(r.dueMS))},
				IfGeneration: r.parkGen.Int64, IfIncarnation: r.parkInc.Int64}
		}
		results, err := batchUpsert(ctx, tasks, req)
		if err != nil {
			firstErr = cmpErr(firstErr, err)
			continue
		}
		for i, res := range results {
			r := rs[i]
			e := res.GetError()
			switch {
			case e == nil:
				accepted = append(accepted, r)
			case codes.Code(e.GetCode()) == codes.FailedPrecondition:
				// This row's arm applied before (the relay that sent it
				// died before deleting), or another writer changed the
				// task since it was parked: either way the row is done.
				superseded = append(superseded, r)
			default:
				if err := o.itemFailed(ctx, tx, r, "arm", e); err != nil {
					firstErr = cmpErr(firstErr, err)
				}
			}
		}
	}
	o.at("arm-sent")
	if err := o.delete(ctx, tx, append(accepted, superseded...)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit arm: %w", err)
	}
	now := o.cfg.Now()
	o.cfg.Metrics.accepted(now, accepted, "accepted")
	o.cfg.Metrics.accepted(now, superseded, "superseded")
	return firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// claim locks up to BatchSize head rows.
func (o *Outbox) claim(ctx context.Context, tx *sql.Tx) ([]*row, error) {
	res, err := tx.QueryContext(ctx, o.q.claim, o.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer res.Close()
	var rows []*row
	for res.Next() {
		r := &row{}
		if err := res.Scan(&r.seq, &r.ns, &r.id, &r.op, &r.kind, &r.payload, &r.dueMS, &r.createdUS, &r.parkInc, &r.parkGen); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		rows = append(rows, r)
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return rows, nil
}

// recordPark stores the parked versions of rs, in one statement.
func (o *Outbox) recordPark(ctx context.Context, tx *sql.Tx, rs []*row) error {
	if len(rs) == 0 {
		return nil
	}
	var inc, gen strings.Builder
	args := make([]any, 0, 5*len(rs))
	for _, r := range rs {
		inc.WriteString(" WHEN ? THEN " + o.q.bigint)
		args = append(args, r.seq, r.parkInc.Int64)
	}
	for _, r := range rs {
		gen.WriteString(" WHEN ? THEN " + o.q.bigint)
		args = append(args, r.seq, r.parkGen.Int64)
	}
	for _, r := range rs {
		args = append(args, r.seq)
	}
	stmt := o.q.rebind("UPDATE " + o.q.table + " SET park_incarnation = CASE seq" + inc.String() + " END, park_generation = CASE seq" +
		gen.String() + " END WHERE seq IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(rs)), ", ") + ")")
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return fmt.Errorf("record park: %w", err)
	}
	return nil
}

// delete deletes rs inside tx.
func (o *Outbox) delete(ctx context.Context, tx *sql.Tx, rs []*row) error {
	if len(rs) == 0 {
		return nil
	}
	args := make([]any, len(rs))
	for i, r := range rs {
		args[i] = r.seq
	}
	if _, err := tx.ExecContext(ctx, o.q.deletePrefix+o.q.in(len(rs)), args...); err != nil {
		return fmt.Errorf("delete sent rows: %w", err)
	}
	return nil
}

// itemFailed handles one item delayd refused. InvalidArgument will never
// pass: the row is marked failed (kept for a person to look at; later rows
// of the task go on without it). Anything else (a quota, a rate limit) is
// retried by a later round, and reported as this round's error.
func (o *Outbox) itemFailed(ctx context.Context, tx *sql.Tx, r *row, phase string, e *delaydv1.ItemError) error {
	st := status.New(codes.Code(e.GetCode()), e.GetMessage())
	if st.Code() != codes.InvalidArgument {
		return fmt.Errorf("%s %s/%s: %w", phase, r.ns, r.id, st.Err())
	}
	msg := e.GetMessage()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	o.logger.Error("outbox row refused by delayd; kept as failed, later rows of the task go on", "seq", r.seq,
		"namespace", r.ns, "id", r.id, "error", msg)
	o.cfg.Metrics.failed()
	if _, err := tx.ExecContext(ctx, o.q.fail, msg, r.seq); err != nil {
		return fmt.Errorf("mark row %d failed: %w", r.seq, err)
	}
	return nil
}

// batchUpsert sends one BatchUpsertTasks call and checks it answered per
// item.
func batchUpsert(ctx context.Context, tasks delaydv1.TaskServiceClient, req *delaydv1.BatchUpsertTasksRequest) ([]*delaydv1.BatchUpsertTaskResult, error) {
	resp, err := tasks.BatchUpsertTasks(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("batch upsert %s: %w", req.GetNamespace(), err)
	}
	if len(resp.GetResults()) != len(req.GetTasks()) {
		return nil, fmt.Errorf("batch upsert %s: server answered %d results for %d items", req.GetNamespace(), len(resp.GetResults()), len(req.GetTasks()))
	}
	return resp.GetResults(), nil
}

// byNamespace groups rows by namespace, keeping their order within each.
func byNamespace(rs []*row) map[string][]*row {
	m := map[string][]*row{}
	for _, r := range rs {
		m[r.ns] = append(m[r.ns], r)
	}
	return m
}

// at calls the test hook, if any.
func (o *Outbox) at(point string) {
	if o.hook != nil {
		o.hook(point)
	}
}
