package mysqlstore

import (
	"context"
	"database/sql/driver"
	"fmt"
)

// readCommittedConnector opens MySQL connections whose session isolation
// is READ COMMITTED, so every transaction of the store takes no gap locks
// (concurrent batches inserting new tasks do not deadlock on gaps) and
// costs one round trip to begin, not two (a per-transaction isolation level
// is one more statement). The SET statement is the same on MySQL 8 and
// MariaDB, unlike the session variable's name.
type readCommittedConnector struct {
	driver.Connector
}

// Connect opens a connection and sets its isolation level.
func (c readCommittedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("mysql connection cannot execute statements")
	}
	if _, err := ex.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}
