#!/usr/bin/env bash
# run-foreground.sh CMD [ARGS...] runs CMD for `make run`.
#
# In a terminal, Ctrl-C sends SIGINT to the terminal's whole foreground
# process group: to CMD, and to make, which then reports "make: *** [run]
# Error 1" (or "Interrupt") and exits non-zero even when CMD shut down
# cleanly. So when this shell is the terminal's foreground process group,
# CMD runs as a job of its own (set -m gives it its own process group and
# hands it the terminal): Ctrl-C reaches CMD alone, delayd shuts down and
# exits 0, and make exits with that status. Otherwise (no terminal, CI, a
# pipe, a background job) CMD replaces this shell, so a signal sent to it or
# to its process group reaches it as before.
set -euo pipefail
if [ -t 0 ] && [ "$(ps -o tpgid= -p $$ | tr -d ' ')" = "$(ps -o pgid= -p $$ | tr -d ' ')" ]; then
	set -m
	"$@"
	exit
fi
exec "$@"
