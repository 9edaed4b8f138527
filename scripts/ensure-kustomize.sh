#!/usr/bin/env bash
# Makes sure the deploy tests can render deploy/k8s with kustomize: kubectl's
# built-in `kubectl kustomize` (TestKustomize uses it first), else a
# kustomize binary on PATH. When neither is there, installs kustomize
# KUSTOMIZE_VERSION into ./bin with go install (it is a Go module, so this
# needs only the Go toolchain); otherwise says exactly what to do and fails.
set -uo pipefail

KUSTOMIZE_VERSION=${KUSTOMIZE_VERSION:-v5.5.0}
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin}

if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
	exit 0
fi
if command -v kustomize >/dev/null || [ -x "$BIN/kustomize" ]; then
	exit 0
fi
echo "neither kubectl nor kustomize found; installing kustomize $KUSTOMIZE_VERSION into $BIN with go install..."
if CGO_ENABLED=0 GOBIN=$BIN go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" >/tmp/ensure-kustomize.log 2>&1 \
	&& "$BIN/kustomize" version >/dev/null; then
	echo "kustomize installed: $("$BIN/kustomize" version)"
	exit 0
fi
cat >&2 <<MSG
installing kustomize failed; see /tmp/ensure-kustomize.log.
The deploy tests render deploy/k8s with kustomize. Install one, then re-run:
  kubectl (1.27+; its 'kubectl kustomize' is enough), or
  go install sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION   (puts kustomize in \$(go env GOPATH)/bin)
MSG
exit 1
