package mysqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/go-sql-driver/mysql"

	"github.com/delayd/delayd/storage"
)

// MySQL and MariaDB error numbers this package reacts to.
const (
	erLockWaitTimeout = 1205
	erLockDeadlock    = 1213
	erQueryInterrupt  = 1317 // KILL QUERY, or a statement cancelled
	erConnKilled      = 1927 // MariaDB: connection was killed
	erServerShutdown  = 1053
)

// dataErrors are MySQL errors caused by what was sent, not by the server's
// health: retrying cannot help and they are not ErrUnavailable.
var dataErrors = map[uint16]bool{
	1048: true, // column cannot be null
	1054: true, // unknown column
	1062: true, // duplicate entry
	1064: true, // syntax error
	1146: true, // table does not exist (schema not migrated)
	1153: true, // packet bigger than max_allowed_packet
	1264: true, // out of range value
	1366: true, // incorrect value for column
	1406: true, // data too long
}

// classify wraps err with op and, when it means MySQL cannot be reached or
// cannot serve right now (network, killed connection, timeout, lock
// contention, server shutting down), with storage.ErrUnavailable so the
// server answers Unavailable. The raw driver text stays in the chain for
// logs; the server never shows it to a client.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, storage.ErrUnavailable) || errors.Is(err, storage.ErrNotFound) {
		return fmt.Errorf("%s: %w", op, err)
	}
	if unavailable(err) {
		return fmt.Errorf("%s: %w: %w", op, storage.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// unavailable reports whether err says the database cannot serve now.
func unavailable(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return !dataErrors[me.Number]
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &ne)
}

// errConditionRace: a conditional upsert decided that a task did not exist,
// and another transaction created it before the insert (READ COMMITTED
// takes no lock on a missing row). The transaction is rolled back and run
// again, which then sees the row.
var errConditionRace = fmt.Errorf("a task a conditional upsert found missing was created concurrently: %w", storage.ErrUnavailable)

// retryable reports whether a transaction that failed with err (before its
// COMMIT was sent) may simply be run again: a deadlock or lock wait timeout
// rolled it back, or its connection died (killed, reset) and the server
// rolled it back with it.
func retryable(err error) bool {
	if errors.Is(err, errConditionRace) {
		return true
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case erLockDeadlock, erLockWaitTimeout, erQueryInterrupt, erConnKilled, erServerShutdown:
			return true
		}
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	return unavailable(err)
}
