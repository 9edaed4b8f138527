#!/bin/sh
# own-session.sh CMD [ARG...]: run CMD in a session of its own, so that it
# shares the CPU with the Redis and MySQL it tests on equal terms.
#
# Why: with the kernel's autogroup scheduling on (/proc/sys/kernel/
# sched_autogroup_enabled = 1), CPU time is split between sessions first and
# between threads second, and a session can carry a nice value of its own
# (/proc/self/autogroup). A shell whose session runs at autogroup nice -20,
# as some remote-execution agents start theirs, gets about 87 times the CPU
# of the nice-0 sessions its services run in: a busy `go test -race ./...`
# then starves the shared redis-server and MariaDB for tens of seconds (a
# plain SELECT 1 took 35 s in one such run), and the tests fail on their
# store's deadlines, not on anything delayd did. In a session of its own,
# CMD starts at autogroup nice 0, like the services. Where autogroup is off
# this is only a new session.
#
# Ctrl-C (INT) and TERM reach CMD's whole process group as TERM (a command
# started in the background of a script ignores INT); the exit status is CMD's.
set -u
if ! command -v setsid >/dev/null 2>&1; then
	exec "$@"
fi
setsid "$@" &
pid=$!
trap 'kill -TERM "-$pid" 2>/dev/null' INT
trap 'kill -TERM "-$pid" 2>/dev/null' TERM
while :; do
	wait "$pid"
	rc=$?
	kill -0 "$pid" 2>/dev/null || exit "$rc"
done
