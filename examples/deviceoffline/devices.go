package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/delayd/delayd/client"
)

// Device states.
const (
	StatusOnline  = "ONLINE"
	StatusOffline = "OFFLINE"
)

// Errors the device API answers with.
var (
	ErrNotFound = errors.New("device not found")
	ErrBadID    = errors.New("device id must be 1-64 characters of [A-Za-z0-9._-]")
)

var deviceIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Device is one row of equipment_info.
type Device struct {
	ID              string     `json:"id"`
	Status          string     `json:"status"`
	HeartbeatSeq    uint64     `json:"heartbeat_seq"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at,omitempty"`
	OfflineAt       *time.Time `json:"offline_at,omitempty"`
}

// Ticket is one row of equipment_maintain.
type Ticket struct {
	ID           uint64     `json:"id"`
	DeviceID     string     `json:"device_id"`
	Reason       string     `json:"reason"`
	FailureTime  time.Time  `json:"failure_time"`
	HeartbeatSeq uint64     `json:"heartbeat_seq"`
	RecoveredAt  *time.Time `json:"recovered_at,omitempty"`
}

// offlinePayload is the offline task's payload: the device and the
// heartbeat that scheduled the task.
type offlinePayload struct {
	DeviceID string `json:"device_id"`
	Seq      uint64 `json:"seq"`
}

// Devices tracks device liveness. Each heartbeat renews one delayd task per
// device, "device X offline", offlineAfter out; the task fires only when the
// heartbeats stop.
type Devices struct {
	db           *sql.DB
	delayd       *client.Client
	namespace    string
	offlineAfter time.Duration
	logger       *slog.Logger

	// beforeOffline, if set, runs first in every offline delivery; an error
	// fails it. Tests use it to stage races.
	beforeOffline func(ctx context.Context, p offlinePayload, d *client.Delivery) error
}

func taskID(deviceID string) string { return "device-" + deviceID }

// Heartbeat records that a device is alive: ONLINE, heartbeat_seq + 1, any
// open maintenance ticket recovered; and upserts its offline task
// offlineAfter from now, which replaces the previous one (renewal).
//
// The upsert runs while the transaction holds the device's row lock, so
// two heartbeats of one device upsert in the order of their seqs: the task
// delayd ends up with always carries the latest seq.
func (s *Devices) Heartbeat(ctx context.Context, deviceID string) (*Device, error) {
	if !deviceIDPattern.MatchString(deviceID) {
		return nil, ErrBadID
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("heartbeat %s: %w", deviceID, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO equipment_info (equipment_id, status, heartbeat_seq, last_heartbeat_at)
		VALUES (?, 'ONLINE', 1, NOW(3))
		ON DUPLICATE KEY UPDATE status = 'ONLINE', heartbeat_seq = heartbeat_seq + 1,
		                        last_heartbeat_at = NOW(3), offline_at = NULL`,
		deviceID); err != nil {
		return nil, fmt.Errorf("heartbeat %s: %w", deviceID, err)
	}
	var seq uint64
	if err := tx.QueryRowContext(ctx, `SELECT heartbeat_seq FROM equipment_info WHERE equipment_id = ?`, deviceID).Scan(&seq); err != nil {
		return nil, fmt.Errorf("heartbeat %s: %w", deviceID, err)
	}
	res, err := tx.ExecContext(ctx,
		`UPDATE equipment_maintain SET recovered_at = NOW(3) WHERE equipment_id = ? AND recovered_at IS NULL`, deviceID)
	if err != nil {
		return nil, fmt.Errorf("heartbeat %s: %w", deviceID, err)
	}
	payload, _ := json.Marshal(offlinePayload{DeviceID: deviceID, Seq: seq})
	if _, err := s.delayd.Upsert(ctx, s.namespace, client.TaskSpec{
		ID:      taskID(deviceID),
		Kind:    "device.offline",
		Payload: payload,
		When:    client.After(s.offlineAfter),
	}); err != nil {
		return nil, fmt.Errorf("heartbeat %s: renew offline task: %w", deviceID, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("heartbeat %s: %w", deviceID, err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		s.logger.Info("device back online; maintenance ticket recovered", "device", deviceID, "seq", seq)
	}
	return s.Get(ctx, deviceID)
}

// HandleOffline is the delayd handler for "device.offline" tasks: if the
// device is ONLINE and its last heartbeat is the one that scheduled this
// task, it marks it OFFLINE and opens a maintenance ticket, in one
// transaction. A heartbeat that came in meanwhile (even while this delivery
// was in flight) has bumped heartbeat_seq, so the UPDATE matches no row and
// the device stays ONLINE. A database error nacks, so delayd retries.
func (s *Devices) HandleOffline(ctx context.Context, d *client.Delivery) error {
	var p offlinePayload
	if err := json.Unmarshal(d.Payload, &p); err != nil || p.DeviceID == "" {
		s.logger.Error("offline task with a bad payload; dropping it", "task", d.ID, "payload_bytes", len(d.Payload)) // never the payload: it may be large or private
		return nil
	}
	if s.beforeOffline != nil {
		if err := s.beforeOffline(ctx, p, d); err != nil {
			return err
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("offline %s: %w", p.DeviceID, err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx,
		`UPDATE equipment_info SET status = ?, offline_at = NOW(3)
		 WHERE equipment_id = ? AND status = ? AND heartbeat_seq = ?`,
		StatusOffline, p.DeviceID, StatusOnline, p.Seq)
	if err != nil {
		return fmt.Errorf("offline %s: %w", p.DeviceID, err)
	}
	n, _ := res.RowsAffected()
	if n == 1 {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO equipment_maintain (equipment_id, failure_reason, failure_time, heartbeat_seq) VALUES (?, 'offline', NOW(3), ?)`,
			p.DeviceID, p.Seq); err != nil {
			return fmt.Errorf("offline %s: %w", p.DeviceID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("offline %s: %w", p.DeviceID, err)
	}
	if n == 1 {
		s.logger.Info("device offline; maintenance ticket opened", "device", p.DeviceID, "last_seq", p.Seq)
	}
	return nil
}

// Get returns one device.
func (s *Devices) Get(ctx context.Context, deviceID string) (*Device, error) {
	var dev Device
	var hb, off sql.NullTime
	err := s.db.QueryRowContext(ctx,
		`SELECT equipment_id, status, heartbeat_seq, last_heartbeat_at, offline_at FROM equipment_info WHERE equipment_id = ?`, deviceID).
		Scan(&dev.ID, &dev.Status, &dev.HeartbeatSeq, &hb, &off)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get device %s: %w", deviceID, err)
	}
	if hb.Valid {
		dev.LastHeartbeatAt = &hb.Time
	}
	if off.Valid {
		dev.OfflineAt = &off.Time
	}
	return &dev, nil
}

// Tickets returns a device's maintenance tickets, oldest first.
func (s *Devices) Tickets(ctx context.Context, deviceID string) ([]Ticket, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT id, equipment_id, failure_reason, failure_time, heartbeat_seq, recovered_at
		 FROM equipment_maintain WHERE equipment_id = ? ORDER BY id`, deviceID)
	if err != nil {
		return nil, fmt.Errorf("tickets of %s: %w", deviceID, err)
	}
	defer rows.Close()
	out := []Ticket{}
	for rows.Next() {
		var tk Ticket
		var rec sql.NullTime
		if err := rows.Scan(&tk.ID, &tk.DeviceID, &tk.Reason, &tk.FailureTime, &tk.HeartbeatSeq, &rec); err != nil {
			return nil, fmt.Errorf("tickets of %s: %w", deviceID, err)
		}
		if rec.Valid {
			tk.RecoveredAt = &rec.Time
		}
		out = append(out, tk)
	}
	return out, rows.Err()
}
