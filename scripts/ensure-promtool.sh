#!/usr/bin/env bash
# Makes sure promtool (Prometheus's checker) is on PATH: the tests run
# `promtool check metrics` on a real scrape and `promtool test rules` on
# deploy/prometheus/alerts.yml. If it is missing and apt-get can run (root,
# Debian/Ubuntu), installs the Debian package `prometheus`, which ships it;
# otherwise says exactly what to do and fails.
set -uo pipefail

if command -v promtool >/dev/null; then
	exit 0
fi
echo "promtool not found; installing the Debian package prometheus (it ships promtool)..."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	if { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; } >/tmp/ensure-promtool.log 2>&1 \
		&& command -v promtool >/dev/null; then
		echo "promtool installed: $(promtool --version 2>&1 | head -1)"
		exit 0
	fi
	echo "installing prometheus failed; see /tmp/ensure-promtool.log" >&2
fi
cat >&2 <<'MSG'
promtool is required by the tests (metrics exposition and alert-rule checks).
Install it, then re-run:
  Debian/Ubuntu:  sudo apt-get install prometheus      (ships /usr/bin/promtool)
  elsewhere:      put the promtool binary of a Prometheus 2.x release on PATH
MSG
exit 1
