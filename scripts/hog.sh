#!/bin/sh
# hog.sh start [N] | stop | status: busy neighbours for testing under load.
#
# start runs N (default 2) processes that each spin one core
# (`while :; do :; done`), each in a session of its own, the way a
# neighbour on a shared machine takes CPU from delayd and its tests; stop
# ends exactly those processes (their ids are kept in $HOG_PIDS, default
# ${TMPDIR:-/tmp}/delayd-hog.pids). `make test` runs its tests in a session
# of their own too (scripts/own-session.sh), so the loops, the tests and the
# Redis and MySQL they use share the cores on equal terms.
# Run the tests you suspect of timing flakes between the two:
#
#   scripts/hog.sh start
#   go test -race -count=10 -run 'TestConsumeAcksInBatches' ./client/
#   scripts/hog.sh stop
set -eu

pids=${HOG_PIDS:-${TMPDIR:-/tmp}/delayd-hog.pids}

case ${1:-} in
start)
	n=${2:-2}
	if [ -s "$pids" ]; then
		echo "hog.sh: already running ($(tr '\n' ' ' <"$pids")); run 'scripts/hog.sh stop' first" >&2
		exit 1
	fi
	i=0
	while [ "$i" -lt "$n" ]; do
		# Each loop in a session of its own, as a neighbour's process is:
		# with autogroup scheduling on, a loop started in this shell's
		# session would share (and with a raised autogroup priority,
		# dominate) the CPU share of whatever else this session runs.
		if command -v setsid >/dev/null 2>&1; then
			setsid sh -c 'while :; do :; done' &
		else
			sh -c 'while :; do :; done' &
		fi
		echo $! >>"$pids"
		i=$((i + 1))
	done
	echo "hog.sh: $n busy loops: $(tr '\n' ' ' <"$pids")"
	;;
stop)
	if [ ! -s "$pids" ]; then
		echo "hog.sh: nothing running"
		exit 0
	fi
	while read -r pid; do
		kill "$pid" 2>/dev/null || true
	done <"$pids"
	rm -f "$pids"
	echo "hog.sh: stopped"
	;;
status)
	if [ -s "$pids" ]; then
		echo "hog.sh: running: $(tr '\n' ' ' <"$pids")"
	else
		echo "hog.sh: not running"
	fi
	;;
*)
	echo "usage: scripts/hog.sh start [N] | stop | status" >&2
	exit 2
	;;
esac
