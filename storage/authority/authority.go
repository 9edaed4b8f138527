// Package authority is the seam between durable mode (storage/durable) and
// the store that is the authority for every task (storage/mysqlstore): the
// Authority interface and the types its calls speak, the group commit's
// writes and segments, the rows of an upsert and an ack, a changed version.
//
// durable composes an Authority with the Redis index and decides nothing
// about SQL; mysqlstore implements the Authority and decides nothing about
// the index. Neither imports the other: the composition root (daemon)
// opens MySQL and hands it to durable.New, and durable's tests may hand it
// a fake.
package authority

import (
	"context"
	"database/sql"
	"time"

	"github.com/delayd/delayd/storage"
)

// Authority is the durable side of durable mode: the store every task is
// committed to before the index is written. mysqlstore.Store implements it
// over MySQL; a test may stand in for it. Its errors wrap
// storage.ErrUnavailable when it cannot serve now.
type Authority interface {
	storage.Registry

	// Commit runs the segments, in order, in one transaction, setting the
	// writes' results (Write's result fields). A failure fails every write
	// of the call; nothing of it is kept.
	Commit(segs []Segment) error
	// UpsertExact applies rows that name their generation (and any others
	// of the same call, which get the next generation) in one transaction
	// of their own. A row older than what the authority holds is Stale and
	// changes nothing. It returns a result per row and the indexes of the
	// rows it applied, in order.
	UpsertExact(ctx context.Context, ns string, rows []UpsertRow, nowMS int64) ([]storage.UpsertResult, []int, error)
	// Get reads one task; storage.ErrNotFound if there is none.
	Get(ctx context.Context, ns, id string) (storage.Task, error)
	// List pages through the scheduled or dead tasks of ns.
	List(ctx context.Context, ns string, p storage.ListParams) ([]storage.Task, string, error)
	// Purge deletes the named tasks that are dead and returns their ids.
	Purge(ctx context.Context, ns string, ids []string) ([]string, error)
	// DeleteVersions deletes exactly the named versions, in any state.
	DeleteVersions(ctx context.Context, ns string, vs []storage.Version) error
	// MatchVersions reads up to limit versions of the tasks of ns that f
	// selects, after id `after`, in id order.
	MatchVersions(ctx context.Context, ns string, f storage.TaskFilter, after string, limit int) ([]storage.Version, error)
	// DropTasks deletes every task of ns and returns how many there were;
	// with an incarnation it first ends it, so from then on Commit refuses
	// upserts made for it (Write.Ended).
	DropTasks(ctx context.Context, ns string, incarnation int64) (int64, error)
	// HasTasks reports whether any task of ns exists.
	HasTasks(ctx context.Context, ns string) (bool, error)
	// TaskNamespaces lists the namespaces that have tasks.
	TaskNamespaces(ctx context.Context) ([]string, error)
	// ReadVersions reads up to limit versions of ns after id, in id order.
	ReadVersions(ctx context.Context, ns, after string, limit int) ([]storage.Version, error)
	// VersionsOf reads the versions of the named tasks of ns that exist.
	VersionsOf(ctx context.Context, ns string, ids []string) ([]storage.Version, error)
	// ReadChanged reads up to limit versions updated at or after sinceMS,
	// in update order; ReadChangedAt every version updated at ms.
	ReadChanged(ctx context.Context, sinceMS int64, limit int) ([]Changed, error)
	ReadChangedAt(ctx context.Context, ms int64) ([]Changed, error)
	// Repair runs decide with the named tasks as held, under their locks
	// (no write of those tasks commits while decide runs), then deletes
	// the acked versions decide returns (into history with a retention),
	// and commits; decide's error rolls it back.
	Repair(ctx context.Context, ns string, ids []string, decide func(ctx context.Context, held []storage.Task) ([]AckRow, error)) error
	// ReadTasks reads the named tasks of ns (those that exist).
	ReadTasks(ctx context.Context, ns string, ids []string) ([]storage.Task, error)
	// PruneHistory deletes up to limit history rows acked before cutoff.
	PruneHistory(ctx context.Context, cutoff time.Time, limit int) (int64, error)
	// TaskEvents pages through one task's events (delayd_task_events);
	// PruneEvents trims a namespace's events to the newest keep (0: all).
	TaskEvents(ctx context.Context, ns string, p storage.HistoryParams) ([]storage.Event, string, error)
	PruneEvents(ctx context.Context, ns string, keep int64) (int64, error)
	// Schedules, MySQL being their authority in durable mode:
	// storage.Schedules' calls, except that UpdateSchedule also inserts
	// w's rows (a step's firings, create-only; nil: none) in its
	// transaction and sets w's results, and DueSchedules reads at the time
	// nowMS (the index's clock as durable mode knows it).
	CreateSchedule(ctx context.Context, s storage.Schedule) (storage.Schedule, error)
	GetSchedule(ctx context.Context, ns, id string) (storage.Schedule, error)
	ListSchedules(ctx context.Context, ns, after string, limit int) ([]storage.Schedule, bool, error)
	UpdateSchedule(ctx context.Context, s storage.Schedule, ifVersion int64, w *Write) (storage.Schedule, error)
	DeleteSchedule(ctx context.Context, ns, id string, ifVersion int64) error
	CountSchedules(ctx context.Context, ns string) (int64, error)
	DueSchedules(ctx context.Context, nowMS int64, limit int) (storage.DueSchedules, error)
	DropSchedules(ctx context.Context, ns string) (int64, error)
	// UseClock sets the time registry rows are stamped with (durable mode
	// passes the index's clock as it knows it). durable.New calls it once,
	// before any other call.
	UseClock(now func(ctx context.Context, ns string) time.Time)
	// DB is the connection pool (for tests and operators' tools).
	DB() *sql.DB
	// Database names the database, to scope the leader lease.
	Database() string
	// Close closes the connection pool.
	Close() error
}

// WriteKind is what a Write does.
type WriteKind uint8

// The kinds of Write.
const (
	WriteUpsert WriteKind = iota + 1 // upsert with MySQL-assigned generations
	WriteRemove                      // delete a task in any state
	WriteAck                         // delete acked generations
	WriteMoved                       // write index transitions (nack, reap, requeue)
	WriteEvents                      // append task events (delayd_task_events)
)

// UpsertRow is one resolved upsert spec.
type UpsertRow struct {
	ID      string
	Kind    string
	Payload []byte
	DueMS   int64 // absolute due time; for a relative one, the estimate MySQL keeps
	Gen     int64 // explicit generation; 0 = assigned by MySQL
	// Inc is the incarnation a row this write creates gets; an existing
	// row keeps its own unless ExactInc (the spec named its incarnation).
	Inc      int64
	ExactInc bool
	// Relative: the spec gave a delay, which the index resolves exactly
	// against its own clock when it is written.
	Relative bool
	Delay    time.Duration
	// TraceParent is the W3C traceparent of the upsert, kept in the
	// row's traceparent column (schema version 4), so a task re-indexed
	// from MySQL delivers with it; '' for an untraced upsert.
	TraceParent string
	// CreateOnly and IfGen are the conditions of storage.UpsertSpec,
	// decided in the transaction against the row as stored.
	CreateOnly bool
	IfGen      int64
	IfInc      int64 // with IfGen; 0 = any incarnation
}

// AckRow is one acked delivery: the version it deletes.
type AckRow struct {
	ID       string
	Inc, Gen int64
	Attempt  int32
}

// Write is one caller's write to delayd_tasks.
type Write struct {
	Kind  WriteKind
	NS    string
	NowMS int64
	// NSInc, for WriteUpsert, is the namespace incarnation the write was
	// made for (storage.UpsertSpec.NamespaceIncarnation: the namespace's
	// create time, ms); 0 = not checked. Commit refuses the write (Ended)
	// unless delayd_namespaces holds ns with exactly that create time and
	// DropTasks has not ended it. For WriteEvents it is the incarnation
	// whose history the events join (storage.RecordParams.Incarnation);
	// Commit drops them when DropTasks has ended it or a later incarnation
	// is registered (0: kept, unchecked).
	NSInc int64

	Rows  []UpsertRow     // WriteUpsert
	ID    string          // WriteRemove
	IfGen int64           // WriteRemove: delete only this generation (0 = any)
	IfInc int64           // WriteRemove, with IfGen: and only this incarnation (0 = any)
	Acks  []AckRow        // WriteAck
	Moved []storage.Moved // WriteMoved
	// Events, for WriteEvents: the task events to append to ns's history,
	// each with its Time set.
	Events []storage.Event

	// Results, set by Commit.
	Upserts []storage.UpsertResult // WriteUpsert: the rows as committed
	// WriteUpsert with NSInc: the incarnation has ended (the namespace was
	// deleted, is being deleted, or was re-created); nothing was written.
	Ended      bool
	MySQLState storage.State // WriteRemove: state MySQL held; 0 = no row
	// WriteRemove with IfGen: true when the stored generation differed
	// (nothing deleted); Current is then the row's version and state.
	Mismatch bool
	Current  storage.Task
}

// Segment is a run of writes that touch disjoint tasks per kind: within a
// segment no task is written by two kinds, so the kinds' statements may run
// in any order. Writes of one kind may repeat a task; their statements keep
// the writes' order.
type Segment struct {
	Upserts, Removes, Acks, Moved []*Write
	// Events touch no task row: they go with whichever segment they fall
	// in, after its task statements.
	Events []*Write
}

// Changed is a task version read by ReadChanged.
type Changed struct {
	NS       string
	Version  storage.Version
	UpdateMS int64
}
