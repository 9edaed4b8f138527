#!/usr/bin/env bash
# Makes sure a headless Chromium is on PATH: the web console's tests
# (web/console_test.go) drive it through chromedp. If it is missing and
# apt-get can run (root, Debian/Ubuntu), installs the Debian package
# `chromium`; otherwise says exactly what to do and fails.
set -uo pipefail

for b in chromium chromium-browser google-chrome; do
	if command -v "$b" >/dev/null; then
		exit 0
	fi
done
echo "chromium not found; installing the Debian package chromium (the web console tests drive it)..."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	if { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } >/tmp/ensure-chromium.log 2>&1 \
		&& command -v chromium >/dev/null; then
		echo "chromium installed: $(chromium --version 2>&1 | head -1)"
		exit 0
	fi
	echo "installing chromium failed; see /tmp/ensure-chromium.log" >&2
fi
cat >&2 <<'MSG'
chromium is required by the web console tests (go test ./web, headless, via chromedp).
Install it, then re-run:
  Debian/Ubuntu:  sudo apt-get install chromium
  elsewhere:      put a Chromium or Chrome binary on PATH as chromium (or set DELAYD_CHROMIUM to its path)
MSG
exit 1
