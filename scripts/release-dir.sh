#!/usr/bin/env bash
# Usage: scripts/release-dir.sh DIR
#
# Puts into DIR, beside the delayd and delayctl binaries make release built
# there, everything else a release tarball holds: LICENSE, README.md,
# CHANGELOG.md, and systemd/ with the unit, the settings example and the
# install recipe (deploy/systemd/README.md). make release runs it for each
# platform; the deploy tests run it to build the directory the systemd
# recipe is tested in, so the recipe is tested against what ships.
set -euo pipefail

dir=${1:?usage: scripts/release-dir.sh DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
for bin in delayd delayctl; do
	[ -x "$dir/$bin" ] || { echo "release-dir: $dir/$bin is missing: build the binaries into $dir first" >&2; exit 1; }
done
install -m 0644 "$root/LICENSE" "$root/README.md" "$root/CHANGELOG.md" "$dir/"
install -d -m 0755 "$dir/systemd"
install -m 0644 "$root/deploy/systemd/delayd.service" "$root/deploy/systemd/delayd.env.example" \
	"$root/deploy/systemd/README.md" "$dir/systemd/"
