#!/bin/sh
# hog.sh start [N] | stop | status: busy neighbours for testing under load.
#
# start runs N (default 2) processes that each spin one core
# (`while :; do :; done`), the way a neighbour on a shared machine takes
# CPU from delayd and its tests; stop ends exactly those processes (their
# ids are kept in $HOG_PIDS, default ${TMPDIR:-/tmp}/delayd-hog.pids).
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
		sh -c 'while :; do :; done' &
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
