# delayd — make help lists the targets.

SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

# Tool versions, pinned. `make tools` installs them into ./bin. buf is the
# prebuilt binary from its npm package (pinned in tools/buf/package-lock.json),
# so a fresh clone does not compile buf from source.
PROTOC_GEN_GO_VERSION      ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.5.1
STATICCHECK_VERSION        ?= v0.8.2

BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
TEST_MYSQL_DSN ?= root@tcp(127.0.0.1:3306)/test
export TEST_REDIS_URL TEST_MYSQL_DSN

# -vet=off: go test's own vet pass is a subset of the checks make test's go
# vet has just run, with the same build flags, on the same packages
# (including test files); repeating it cost ~25 s of CPU on a fresh clone.
GO_TEST_FLAGS ?= -race -timeout 20m -vet=off

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

$(BIN)/buf: tools/buf/package-lock.json
	@command -v npm >/dev/null || { echo "buf comes from npm: install Node.js 22 (20 works, with an EBADENGINE warning) and npm (Debian: apt-get install -y nodejs npm)"; exit 1; }
	npm ci --prefix tools/buf --no-audit --no-fund --loglevel=error
	mkdir -p $(BIN) && ln -sf $(CURDIR)/tools/buf/node_modules/.bin/buf $(BIN)/buf
	@$(BIN)/buf --version >/dev/null
# The TypeScript client's npm dependencies (protoc-gen-es, the Connect
# runtime), pinned in clients/ts/package-lock.json.
TS_DEPS := clients/ts/node_modules/.package-lock.json
$(TS_DEPS): clients/ts/package-lock.json
	@command -v npm >/dev/null || { echo "the TypeScript client needs Node.js 22 (20 works, with an EBADENGINE warning) and npm (Debian: apt-get install -y nodejs npm)"; exit 1; }
	npm ci --prefix clients/ts --no-audit --no-fund --loglevel=error
	@touch $@

$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(BIN)/staticcheck:
	GOBIN=$(BIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: tools
tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(TS_DEPS) ## Install the pinned code generators into ./bin (and clients/ts/node_modules).

.PHONY: generate
generate: tools ## Regenerate gen/ and clients/ts/src/gen/ from proto/.
	rm -rf gen clients/ts/src/gen
	buf generate
	buf generate --template clients/ts/buf.gen.yaml

.PHONY: check-generate
check-generate: generate ## Fail when gen/ differs from what proto/ generates.
	@if [ -n "$$(git status --porcelain -- gen proto clients/ts/src/gen)" ]; then \
		echo "gen/ or clients/ts/src/gen/ is stale: run 'make generate' and commit the result"; \
		git status --porcelain -- gen proto clients/ts/src/gen; exit 1; fi

# buf breaking compares proto/ with this ref (the main branch by default):
# a change that breaks the wire or JSON contract fails lint (docs/VERSIONING.md).
BUF_BREAKING_AGAINST ?= .git\#branch=main

.PHONY: lint
lint: tools $(BIN)/staticcheck check-generate ## gen/ staleness, buf lint, buf format check, buf breaking against main, go vet, staticcheck, the package-boundary check.
	buf lint
	buf format -d --exit-code
	buf breaking --against '$(BUF_BREAKING_AGAINST)'
	go vet ./...
	staticcheck ./...
	go test -count=1 ./internal/boundary

.PHONY: services
services: ## Make sure Redis and MySQL answer (start them if installed).
	@scripts/ensure-services.sh

# make test needs no code generator (no buf, no protoc plugins): gen/'s
# staleness is checked by make lint and make ci, so a fresh clone downloads
# only the Go modules before testing.
.PHONY: promtool
promtool: ## Make sure promtool is installed (Debian package prometheus).
	@scripts/ensure-promtool.sh

.PHONY: kustomize
kustomize: ## Make sure kustomize can run (kubectl kustomize, else go install kustomize into ./bin); the deploy tests render deploy/k8s with it.
	@scripts/ensure-kustomize.sh

.PHONY: chromium
chromium: ## Make sure headless Chromium is installed (Debian package chromium; the web console tests drive it).
	@scripts/ensure-chromium.sh

# The web console tests save their screenshots under DELAYD_TEST_ARTIFACTS
# (one directory per test); git ignores artifacts/.
DELAYD_TEST_ARTIFACTS ?= $(CURDIR)/artifacts
export DELAYD_TEST_ARTIFACTS

# make test compiles every package once, with -race: go vet gets go test's
# build flags (VET_FLAGS), so the packages it compiles to type-check are the
# ones the tests then link, and the delayd binaries the tests run (the fault
# suite's, make run's in TestMakeRunCtrlC, test-ts's) are -race builds of the
# same packages, i.e. links. A plain `go vet` would compile everything a
# second time (about a minute of CPU on a fresh clone).
VET_FLAGS ?= -race

.PHONY: test
test: services promtool chromium kustomize ## Check services, promtool, chromium and kustomize, go vet, then go test -race (no code generators needed); console screenshots go to artifacts/.
	@# test-ts's npm packages (network, on a fresh clone) download beside go vet (CPU).
	$(MAKE) --no-print-directory $(TS_DEPS) & npm=$$!; \
		go vet $(VET_FLAGS) ./... || { wait $$npm; exit 1; }; \
		wait $$npm
	go test $(GO_TEST_FLAGS) ./...
	$(MAKE) test-ts

# test-ts's delayd is a -race build (see VET_FLAGS) in a file of its own, so
# bin/delayd stays what make build and make run put there.
.PHONY: test-ts
test-ts: $(TS_DEPS) ## Run the TypeScript client's example (node --test) against a real delayd built from this tree.
	go build -race -o $(BIN)/delayd-race ./cmd/delayd
	cd clients/ts && DELAYD_BIN=$(BIN)/delayd-race node --test test/

.PHONY: ci
ci: check-generate test ## What CI runs (.ci/run): gen/ staleness, then make test.

.PHONY: run
run: ## Run delayd on :7070 (embedded store, on 127.0.0.1 only, unless DELAYD_REDIS_URL is set); Ctrl-C stops it cleanly.
	@go build -ldflags "$(LDFLAGS)" -o $(BIN)/delayd ./cmd/delayd
	@scripts/run-foreground.sh $(BIN)/delayd $(RUN_FLAGS)

# Stamped into `delayd --version`, delayd_build_info and the first log line.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/delayd/delayd/buildinfo.version=$(VERSION) -X github.com/delayd/delayd/buildinfo.commit=$(COMMIT)

.PHONY: build
build: ## Build every command in cmd/ into ./bin, stamped with VERSION and COMMIT.
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# The container image (Dockerfile): both commands built here, static
# (CGO_ENABLED=0), for the host's architecture unless IMAGE_ARCH says
# otherwise; the build context bin/image/ holds everything the image gets,
# so Docker pulls no base image and compiles nothing.
IMAGE      ?= delayd:$(VERSION)
IMAGE_ARCH ?= $(shell go env GOARCH)
DOCKER     ?= docker

.PHONY: image
image: ## Build the container image IMAGE (delayd:VERSION, also delayd:latest) from scratch: static binaries, the host's CA certificates, user 65532.
	@command -v $(DOCKER) >/dev/null || { echo "make image needs a Docker engine and client (Debian: apt-get install -y docker.io)"; exit 1; }
	rm -rf $(BIN)/image && mkdir -p $(BIN)/image
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(BIN)/image/ ./cmd/delayd ./cmd/delayctl
	cp Dockerfile deploy/image/passwd deploy/image/group /etc/ssl/certs/ca-certificates.crt $(BIN)/image/
	DOCKER_BUILDKIT=0 $(DOCKER) build --platform linux/$(IMAGE_ARCH) -t $(IMAGE) -t delayd:latest $(BIN)/image

# make release: static binaries (CGO_ENABLED=0) for each RELEASE_PLATFORMS
# entry, named delayd-VERSION-OS-ARCH.tar.gz under dist/, each holding
# delayd and delayctl stamped with VERSION (delayd --version names it),
# and SHA256SUMS over the archives. Tag first (git tag v0.2.0) so VERSION
# is the tag, and move CHANGELOG's Unreleased section under it.
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/arm64
DIST := $(CURDIR)/dist

.PHONY: release
release: ## Cross-compile static delayd and delayctl for RELEASE_PLATFORMS into dist/ (tar.gz each, SHA256SUMS), stamped with VERSION.
	rm -rf $(DIST) && mkdir -p $(DIST)
	@set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; name=delayd-$(VERSION)-$$os-$$arch; \
		echo "building $$name"; \
		mkdir -p $(DIST)/$$name; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $(DIST)/$$name/ ./cmd/delayd ./cmd/delayctl; \
		cp LICENSE README.md CHANGELOG.md $(DIST)/$$name/; \
		tar -C $(DIST) -czf $(DIST)/$$name.tar.gz $$name; \
		rm -rf $(DIST)/$$name; \
	done
	cd $(DIST) && sha256sum *.tar.gz > SHA256SUMS && cat SHA256SUMS

# deploy/k8s/base/prometheusrule.yaml is deploy/prometheus/alerts.yml, the
# one source of delayd's alerts, indented under a PrometheusRule's spec:
# kustomize cannot wrap a file in a resource, so this writes it, and
# TestKustomize (go test ./deploy) fails when a rendered rule differs.
K8S_RULE := deploy/k8s/base/prometheusrule.yaml

.PHONY: k8s-rules
k8s-rules: ## Regenerate deploy/k8s/base/prometheusrule.yaml from deploy/prometheus/alerts.yml.
	@{ printf '%s\n' \
		'# Generated by `make k8s-rules` from deploy/prometheus/alerts.yml: edit that' \
		'# file, then run make k8s-rules. go test ./deploy fails when this differs.' \
		'apiVersion: monitoring.coreos.com/v1' \
		'kind: PrometheusRule' \
		'metadata:' \
		'  name: delayd' \
		'spec:'; \
		grep -v '^#' deploy/prometheus/alerts.yml | sed -e 's/^./  &/'; } > $(K8S_RULE)

# test-image needs a running Docker engine, which a fresh CI machine does
# not have, so make test does not run it (see deploy/image_test.go).
.PHONY: test-image
test-image: services image ## Build the image, then run it (durable mode, host network) against a private Redis and the host's MariaDB: gRPC, /readyz, HEALTHCHECK, SIGTERM exits 0. Needs a Docker daemon.
	DELAYD_TEST_IMAGE=$(IMAGE) go test -tags shipimage -count=1 -run '^TestImage$$' ./deploy/

.PHONY: bench
bench: services ## Short benchmark run (under 3 minutes); see docs/BENCHMARKS.md.
	go run ./cmd/delaybench --short

FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Fuzz client-input parsers (validation, keys, records, tokens, auth) for FUZZTIME (30s) each.
	go test ./server -run '^$$' -fuzz '^FuzzValidateAndKeys$$' -fuzztime $(FUZZTIME)
	go test ./server -run '^$$' -fuzz '^FuzzDecodeToken$$' -fuzztime $(FUZZTIME)
	go test ./server -run '^$$' -fuzz '^FuzzAuthMetadata$$' -fuzztime $(FUZZTIME)
	go test ./storage/redisstore -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(FUZZTIME)
	go test ./storage/redisstore -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME)

SOAK ?= 3m

.PHONY: soak
soak: services ## Steady flow for SOAK (3m; SOAK=20m for longer): 500 tasks/s due 2 s after upsert, child delayd, own Redis; NOISE=1 spins one core beside it; fails on lost/duplicate/early.
	go run ./cmd/delaybench --soak $(SOAK) --server child --own-redis $(if $(NOISE),--noise) $(SOAK_FLAGS)
