package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// mysqlSizer reads how many bytes a durable delayd's MySQL database holds,
// for the MySQL bytes-per-task figures. Only a durable deployment has one.
type mysqlSizer struct {
	db   *sql.DB
	name string // the database delaybench created for the deployment
}

// historyTables are the tables that keep what happened to tasks after they
// are gone: the event log (task history, NamespacePolicy.
// history_retention_bytes) and acked tasks kept by the durable store.
var historyTables = []string{"delayd_task_events", "delayd_task_history"}

// tableBytes are data_length + index_length per table.
type tableBytes map[string]int64

// total sums the tables named (every table when names is empty).
func (t tableBytes) total(names ...string) int64 {
	var n int64
	for k, v := range t {
		if len(names) == 0 {
			n += v
			continue
		}
		for _, want := range names {
			if k == want {
				n += v
			}
		}
	}
	return n
}

// sizes runs ANALYZE TABLE on every table of the database (InnoDB's
// information_schema sizes are statistics, refreshed by ANALYZE) and reads
// data_length + index_length of each.
func (m *mysqlSizer) sizes(ctx context.Context) (tableBytes, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rows, err := m.db.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", m.name)
	if err != nil {
		return nil, fmt.Errorf("mysql sizes: %w", err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("mysql sizes: %w", err)
		}
		names = append(names, n)
	}
	rows.Close()
	if len(names) == 0 {
		return tableBytes{}, nil
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = "`" + m.name + "`.`" + n + "`"
	}
	// ANALYZE answers a result set per table; drain it.
	ar, err := m.db.QueryContext(ctx, "ANALYZE TABLE "+strings.Join(quoted, ", "))
	if err != nil {
		return nil, fmt.Errorf("mysql sizes: analyze: %w", err)
	}
	for ar.Next() {
	}
	ar.Close()
	out := tableBytes{}
	rows, err = m.db.QueryContext(ctx, "SELECT table_name, COALESCE(data_length, 0) + COALESCE(index_length, 0) FROM information_schema.tables WHERE table_schema = ?", m.name)
	if err != nil {
		return nil, fmt.Errorf("mysql sizes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		var b int64
		if err := rows.Scan(&n, &b); err != nil {
			return nil, fmt.Errorf("mysql sizes: %w", err)
		}
		out[n] = b
	}
	return out, rows.Err()
}
