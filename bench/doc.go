// Package bench measures delayd: it drives a delayd over its gRPC API (one
// it starts in-process, a delayd binary it runs as a child process, or an
// external one) and the source design it replaces (package baseline) on the
// same Redis with the same workload, and reports throughput, lateness,
// correctness (every task id is checked: early, duplicate and lost
// deliveries), CPU and Redis memory, as a table for people and as JSON.
//
// Nothing here asserts speed; the numbers are for docs/BENCHMARKS.md and for
// spotting regressions. cmd/delaybench is the command-line front end.
package bench
