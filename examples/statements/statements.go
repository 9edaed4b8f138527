package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/delayd/delayd/client"
)

// Errors the shop API answers with.
var (
	ErrNotFound = errors.New("shop not found")
	ErrBadZone  = errors.New("time_zone is not an IANA zone name delayd knows")
)

// Shop is a merchant; Statement one of its months.
type Shop struct {
	ID       uint64 `json:"id"`
	Name     string `json:"name"`
	TimeZone string `json:"time_zone"`
}

// Statement is one shop's month, as written by the handler.
type Statement struct {
	Period     string    `json:"period"`
	TotalCents int64     `json:"total_cents"`
	Sales      int       `json:"sales"`
	SlotAt     time.Time `json:"slot_at"`
}

// payload is what each firing of a shop's schedule carries.
type payload struct {
	ShopID uint64 `json:"shop_id"`
}

// Statements registers shops, keeps one delayd schedule per shop (in the
// shop's zone), and writes the statements its firings ask for.
type Statements struct {
	db        *sql.DB
	schedules *client.Schedules
	namespace string
	cron      string        // the statement rule, in each shop's zone
	every     time.Duration // a fixed rate instead (demos and tests)
	logger    *slog.Logger
}

// scheduleID names shop id's schedule; its firings' task ids are
// "stmt-shop-<id>.<slot>".
func scheduleID(id uint64) string { return "shop-" + strconv.FormatUint(id, 10) }

// Open registers a shop and creates its schedule (a shop opened again
// finds its schedule there: AlreadyExists is fine).
func (s *Statements) Open(ctx context.Context, sh Shop) error {
	if _, err := time.LoadLocation(sh.TimeZone); err != nil || sh.TimeZone == "" || sh.TimeZone == "Local" {
		return ErrBadZone
	}
	if _, err := s.db.ExecContext(ctx, "INSERT INTO shop (id, name, time_zone) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE name = VALUES(name), time_zone = VALUES(time_zone), closed_at = NULL",
		sh.ID, sh.Name, sh.TimeZone); err != nil {
		return err
	}
	body, _ := json.Marshal(payload{ShopID: sh.ID})
	sc := client.Schedule{Namespace: s.namespace, ID: scheduleID(sh.ID), Description: "monthly statement of " + sh.Name,
		Cron: s.cron, TimeZone: sh.TimeZone, Kind: "statement.monthly", Payload: body, IDPrefix: "stmt-",
		// delayd down over a month's first night: the statement still
		// goes out when it is back (once), within a week.
		CatchUp: client.CatchUpLatest, CatchUpWindow: 7 * 24 * time.Hour}
	if s.every > 0 {
		sc.Cron, sc.Every = "", s.every
	}
	_, err := s.schedules.Create(ctx, sc, false)
	if status.Code(err) == codes.AlreadyExists {
		_, _, err = s.schedules.Update(ctx, sc, []string{"time_zone", "description"}, 0)
	}
	return err
}

// Close stops a shop's statements: its schedule goes (statements already
// written stay).
func (s *Statements) Close(ctx context.Context, id uint64) error {
	res, err := s.db.ExecContext(ctx, "UPDATE shop SET closed_at = CURRENT_TIMESTAMP(3) WHERE id = ? AND closed_at IS NULL", id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	if _, err := s.schedules.Delete(ctx, s.namespace, scheduleID(id), 0); err != nil && status.Code(err) != codes.NotFound {
		return err
	}
	return nil
}

// List returns a shop's statements, newest first.
func (s *Statements) List(ctx context.Context, id uint64) ([]Statement, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT period, total_cents, sales, slot_at FROM statement WHERE shop_id = ? ORDER BY period DESC", id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Statement{}
	for rows.Next() {
		var st Statement
		if err := rows.Scan(&st.Period, &st.TotalCents, &st.Sales, &st.SlotAt); err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, rows.Err()
}

// Handler writes the statement a firing asks for: the calendar month
// before the firing's slot, in the shop's zone. The firing's id carries
// the slot (…<schedule>.<20060102T150405Z>), so a redelivery, or another
// firing of the same month, computes the same period, and the primary key
// (shop_id, period) keeps one statement: the handler is idempotent.
func (s *Statements) Handler() client.Handler {
	return func(ctx context.Context, d *client.Delivery) error {
		var p payload
		stamp := d.ID[strings.LastIndexByte(d.ID, '.')+1:]
		stamp, _, _ = strings.Cut(stamp, "_") // a shard suffix, in a namespace of several shards
		slot, terr := time.Parse("20060102T150405Z", stamp)
		if err := json.Unmarshal(d.Payload, &p); err != nil || p.ShopID == 0 || terr != nil {
			// Not a statement firing: nothing to do, ever. Ack it.
			s.logger.Warn("not a statement firing; acked and dropped", "task", d.ID, "payload_bytes", len(d.Payload))
			return nil
		}
		var zone string
		err := s.db.QueryRowContext(ctx, "SELECT time_zone FROM shop WHERE id = ?", p.ShopID).Scan(&zone)
		if errors.Is(err, sql.ErrNoRows) {
			s.logger.Warn("statement firing of an unknown shop; acked", "task", d.ID, "shop", p.ShopID)
			return nil
		}
		if err != nil {
			return err // nacked: retried with the namespace's backoff
		}
		loc, err := time.LoadLocation(zone)
		if err != nil {
			return fmt.Errorf("shop %d: zone %q: %w", p.ShopID, zone, err)
		}
		period, from, to := previousMonth(slot, loc)
		var total int64
		var sales int
		if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(SUM(amount_cents), 0), COUNT(*) FROM sale WHERE shop_id = ? AND sold_at >= ? AND sold_at < ?",
			p.ShopID, from.UTC(), to.UTC()).Scan(&total, &sales); err != nil {
			return err
		}
		_, err = s.db.ExecContext(ctx, "INSERT IGNORE INTO statement (shop_id, period, total_cents, sales, slot_at) VALUES (?, ?, ?, ?, ?)",
			p.ShopID, period, total, sales, slot)
		return err
	}
}

// previousMonth is the calendar month before slot's in loc: its name
// (YYYY-MM) and its first instant and the next month's.
func previousMonth(slot time.Time, loc *time.Location) (string, time.Time, time.Time) {
	local := slot.In(loc)
	to := time.Date(local.Year(), local.Month(), 1, 0, 0, 0, 0, loc)
	from := to.AddDate(0, -1, 0)
	return from.Format("2006-01"), from, to
}
