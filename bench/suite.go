package bench

import "time"

// Deployments a delayd row can run on.
const (
	// deployRedis is delayd in Redis-only mode.
	deployRedis = "redis"
	// deployDurable is delayd in durable mode (MySQL authority).
	deployDurable = "durable"
)

// Systems a row can run on.
const (
	SystemDelayd        = "delayd"
	SystemDelaydDurable = "delayd-durable"
	SystemBaseline1s    = "baseline-1s"
	SystemBaseline10ms  = "baseline-10ms"
	// SystemDelaydSDK is delayd driven through the Go SDK (package client):
	// unary upserts are Client.Upsert calls, which the SDK coalesces into
	// BatchUpsertTasks calls; delivery is the SDK's path, StreamDeliveries
	// (several deliveries per message, acks batched on the same stream).
	SystemDelaydSDK = "delayd-sdk"
	// SystemAsynq is hibiken/asynq on the same Redis (asynqsys.go).
	SystemAsynq = "asynq"
)

// allSystems are the names --systems accepts.
var allSystems = []string{SystemDelayd, SystemDelaydSDK, SystemDelaydDurable, SystemBaseline1s, SystemBaseline10ms, SystemAsynq}

// preset is a named workload and the systems it is run on by default.
type preset struct {
	w       Workload
	systems []string
}

// all three systems compared on the same workload.
var compared = []string{SystemDelayd, SystemBaseline1s, SystemBaseline10ms}

// comparedSDK adds the Go SDK's path (StreamDeliveries) to compared: the
// rows issue 37's targets name for both clients (spread, backlog).
var comparedSDK = []string{SystemDelayd, SystemDelaydSDK, SystemBaseline1s, SystemBaseline10ms}

// Presets returns the names of the workloads in run order.
func Presets() []string {
	return []string{"spread", "backlog", "unary", "producers-64", "steady-500", "idle", "scale-100k", "scale-1m", "scale-10m", "durable"}
}

// presets returns the workloads by name: the full set of docs/BENCHMARKS.md,
// or with short the reduced set `make bench` runs in under 3 minutes.
func presets(short bool) map[string]preset {
	p := map[string]preset{
		// (a) 100,000 tasks due evenly over 5 s, loaded in batches before
		// the first falls due: lateness and early deliveries.
		"spread": {Workload{Name: "spread", Tasks: 100_000, Spread: 5 * time.Second, Lead: 15 * time.Second,
			Batch: 1000, PayloadBytes: 100, Producers: 4, Subscribers: 4, MaxInFlight: 1000}, comparedSDK},
		// (b) 100,000 tasks already due, batched upserts, then the
		// subscribers connect: batched upsert rate, drain capacity and
		// memory per pending task.
		"backlog": {Workload{Name: "backlog", Tasks: 100_000, Backlog: true, Batch: 1000,
			PayloadBytes: 100, Producers: 4, Subscribers: 4, MaxInFlight: 1000}, comparedSDK},
		// The unary upsert rate: one UpsertTask per task from 32
		// concurrent producers, then the drain.
		"unary": {Workload{Name: "unary", Tasks: 100_000, Backlog: true,
			PayloadBytes: 100, Producers: 32, Subscribers: 4, MaxInFlight: 1000}, compared},
		// The upsert figure of issue 25: 64 goroutines each making one
		// upsert call per task (raw unary gRPC, the Go SDK's Upsert, the
		// source design's Lua upsert, asynq's Enqueue), then the drain.
		"producers-64": {Workload{Name: "producers-64", Tasks: 100_000, Backlog: true,
			PayloadBytes: 100, Producers: 64, Subscribers: 4, MaxInFlight: 1000},
			[]string{SystemDelayd, SystemDelaydSDK, SystemBaseline10ms, SystemAsynq}},
		// The steady flow of issues 25 and 37: 500 tasks/s for 60 s
		// (30,000 due evenly over 60 s), loaded first by 32 unary
		// producers (one upsert call per task, as a new user writes it;
		// the SDK's Upsert for delayd-sdk), so CPU and counts per
		// delivered task and lateness are those of a service that is
		// neither idle nor saturated; against the baseline polling every
		// 10 ms and asynq.
		"steady-500": {Workload{Name: "steady-500", Tasks: 30_000, Spread: 60 * time.Second, Lead: 20 * time.Second,
			PayloadBytes: 100, Producers: 32, Subscribers: 4, MaxInFlight: 1000},
			[]string{SystemDelayd, SystemDelaydSDK, SystemBaseline10ms, SystemAsynq}},
		// (c) 1,000 tasks over 60 s: the CPU of an (almost) idle service.
		"idle": {Workload{Name: "idle", Tasks: 1000, Spread: 60 * time.Second, Lead: 2 * time.Second,
			Batch: 1000, PayloadBytes: 100, Producers: 1, Subscribers: 4, MaxInFlight: 1000}, compared},
		// (d) the unary workload with 100k, 1M and 10M other tasks pending
		// (due in 2 h, loaded in batches first).
		"scale-100k": {scale("scale-100k", 100_000, 100), []string{SystemDelayd, SystemBaseline10ms}},
		"scale-1m":   {scale("scale-1m", 1_000_000, 100), []string{SystemDelayd, SystemBaseline10ms}},
		"scale-10m":  {scale("scale-10m", 10_000_000, 16), []string{SystemDelayd, SystemBaseline10ms}},
		// (e) 64 concurrent unary producers, Redis-only against durable.
		"durable": {Workload{Name: "durable", Tasks: 100_000, Backlog: true,
			PayloadBytes: 100, Producers: 64, Subscribers: 4, MaxInFlight: 1000}, []string{SystemDelayd, SystemDelaydDurable}},
	}
	if !short {
		return p
	}
	shrink := func(name string, f func(w *Workload)) {
		q := p[name]
		f(&q.w)
		p[name] = q
	}
	shrink("spread", func(w *Workload) { w.Tasks, w.Spread, w.Lead = 10_000, 2*time.Second, 3*time.Second })
	shrink("backlog", func(w *Workload) { w.Tasks = 20_000 })
	shrink("unary", func(w *Workload) { w.Tasks = 10_000 })
	shrink("producers-64", func(w *Workload) { w.Tasks = 20_000 })
	shrink("idle", func(w *Workload) { w.Tasks, w.Spread, w.Lead = 200, 10*time.Second, time.Second })
	shrink("scale-100k", func(w *Workload) { w.Tasks = 10_000 })
	shrink("durable", func(w *Workload) { w.Tasks = 10_000 })
	for _, n := range []string{"idle", "unary"} {
		q := p[n]
		q.systems = []string{SystemDelayd, SystemBaseline10ms}
		p[n] = q
	}
	delete(p, "scale-1m")
	delete(p, "scale-10m")
	delete(p, "steady-500") // a minute per system; run it by name
	return p
}

// scale is the scale workload with filler pending tasks of fillerPayload
// bytes each.
func scale(name string, filler, fillerPayload int) Workload {
	return Workload{Name: name, Tasks: 100_000, Backlog: true, PayloadBytes: 100, Producers: 32,
		Subscribers: 4, MaxInFlight: 1000, Filler: filler, FillerPayloadBytes: fillerPayload}
}
