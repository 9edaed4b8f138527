package server

import (
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	delaydv1 "github.com/delayd/delayd/gen/delayd/v1"
	"github.com/delayd/delayd/server/wire"
	"github.com/delayd/delayd/storage"
)

// historyTokenState marks GetTaskHistory's page tokens (encodePageToken's
// state byte), so a ListTasks token is refused there and the reverse.
const historyTokenState = storage.State(0xff)

// historyTokenScope is what a history page token is bound to: the
// namespace and the task id.
func historyTokenScope(ns, id string) string { return ns + "/" + id }

// eventToProto is a task event's wire form; zero fields are left unset.
func eventToProto(e storage.Event) *delaydv1.TaskEvent {
	return &delaydv1.TaskEvent{
		Kind:       wire.EventKind(e.Kind),
		Time:       wire.Time(e.Time),
		KeyId:      e.KeyID,
		Generation: e.Generation,
		DueTime:    wire.Time(e.Due),
		Attempt:    e.Attempt,
		Replica:    e.Replica,
		Lateness:   durationOrNil(e.Lateness, e.Kind == storage.EventDelivered),
		Reason:     e.Reason,
		RetryAfter: durationOrNil(e.RetryAfter, false),
		ScheduleId: e.Schedule,
		SlotTime:   wire.Time(e.Slot),
	}
}

// durationOrNil is d's wire form, unset when zero unless always.
func durationOrNil(d time.Duration, always bool) *durationpb.Duration {
	if d == 0 && !always {
		return nil
	}
	return durationpb.New(d)
}

// forecastToProto fills the forecast fields of a stats response.
func forecastToProto(resp *delaydv1.GetNamespaceStatsResponse, f storage.Forecast) {
	resp.DuePerMinute = f.PerMinute
	resp.DuePerHour = f.PerHour
	resp.ForecastTime = wire.Time(f.Now)
}

// addForecast is a's counts plus b's, bucket by bucket (a's Now).
func addForecast(a, b storage.Forecast) storage.Forecast {
	out := storage.Forecast{Now: a.Now, PerMinute: slices.Clone(a.PerMinute), PerHour: slices.Clone(a.PerHour)}
	for i := range min(len(out.PerMinute), len(b.PerMinute)) {
		out.PerMinute[i] += b.PerMinute[i]
	}
	for i := range min(len(out.PerHour), len(b.PerHour)) {
		out.PerHour[i] += b.PerHour[i]
	}
	return out
}

// recentToProto fills the recent-delivery fields of a stats response.
func recentToProto(resp *delaydv1.GetNamespaceStatsResponse, r storage.RecentDeliveries) {
	resp.RecentWindow = durationpb.New(r.Window)
	resp.RecentDeliveryRate = r.PerSecond
	if r.Count > 0 {
		resp.RecentLatenessP50 = durationpb.New(r.P50)
		resp.RecentLatenessP90 = durationpb.New(r.P90)
		resp.RecentLatenessP99 = durationpb.New(r.P99)
	}
}
