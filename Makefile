# readie pipeline. `make capture` and `make test` do all the set-up on a fresh Debian machine
# as root: Debian packages with apt-get, runsc with the pinned `go install`, the rootfs.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/readie
RUNSC_MODULE := gvisor.dev/gvisor/runsc
RUNSC_VERSION := v0.0.0-20260905035102-160fafc42237
# runsc's restore accepts only an image saved by the exact same version string.
RUNSC_LABEL := readie-20260905-160fafc42237
RUNSC := $(CACHE)/runsc/$(RUNSC_LABEL)/runsc
# runsc's helpers, laid out as gVisor ships them: gvisor-bin/ beside runsc (runsc/, docs/knobs.md).
GVISOR_BIN := $(CACHE)/runsc/$(RUNSC_LABEL)/gvisor-bin
ROOTFS := build/rootfs
# Debian's python3: the python3 on PATH may be a build that does not see python3-* packages.
PYTHON := /usr/bin/python3
PIPELINE := bin/pipeline
# The pipeline's own image (make pipeline-image): an OCI layout; PUSH=REF pushes it too.
PIPELINE_IMAGE := build/pipeline-image
PIPELINE_IMAGE_SOURCE ?= https://readie.dev/pipeline
GOTEST_FLAGS ?= -timeout 30m

# Defined before any rule names it: make expands a prerequisite list when it reads the rule,
# so a later definition leaves the prerequisite empty (and benchstat never installed).
BENCHSTAT := $(CACHE)/bin/benchstat
STATICCHECK := $(CACHE)/bin/staticcheck

export READIE_RUNSC := $(RUNSC)
export READIE_ROOTFS := $(abspath $(ROOTFS))
export READIE_PIPELINE_IMAGE := $(abspath $(PIPELINE_IMAGE))

.PHONY: help all build runsc image pipeline-image check-pipeline-image deps test test-go test-python check-golden golden lint test-unit test-race capture bench bench-sizes bench-knobs bench-helpers image-catalogue bench-catalogue bench-incremental bench-jobs bench-oci bench-go bench-proto soak clean

all: build ## the same as build

# `make help`: each target's `## ` comment, one line each (docs/commands.md says more).
help: ## list the targets, one line each
	@awk -F ':[^#]*## ' '/^[a-z][a-z-]*:[^=].*## /{printf "  %-22s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

build: ## go build of bin/pipeline
	go build -o $(PIPELINE) ./cmd/pipeline

# Host packages the tests and the image build need; installed only when missing.
deps: $(STATICCHECK) ## the Debian packages and staticcheck the build and tests need, when missing
	@missing=""; \
	for p in mmdebstrap python3-cloudpickle tzdata docker-registry skopeo bc curl podman runc busybox-static ca-certificates gcc libc6-dev; do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# runsc and its helpers. Each helper has a stamp beside it named by the digest of its sources
# and build flags: a cache that has runsc alone (the layout before gvisor-bin/) gets them, a
# change of their sources or flags builds them again, a fresh clone of the same sources (newer
# files, same contents) does not.
sources_digest = $(shell { cat $(1); echo '$(2)'; } | sha256sum | cut -c1-16)
SENTRY_SOURCES := runsc/sentry/main.go runsc/sentry/go.mod runsc/sentry/go.sum
SENTRY_FLAGS := -trimpath -buildvcs=false -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(RUNSC_LABEL)"
SENTRY_STAMP := $(GVISOR_BIN)/.gvisor_sentry-$(call sources_digest,$(SENTRY_SOURCES),$(SENTRY_FLAGS))
PREWARMER_CFLAGS := -std=c11 -Wall -Wextra -Werror -Os -ffreestanding -fno-stack-protector \
	-fno-asynchronous-unwind-tables -fno-pie -no-pie -static -nostdlib -Wl,--build-id=none -s
PREWARMER_STAMP := $(GVISOR_BIN)/.gvisor-sentry-prewarmer-$(call sources_digest,runsc/prewarmer.c,$(PREWARMER_CFLAGS))
runsc: $(RUNSC) $(SENTRY_STAMP) $(PREWARMER_STAMP) ## the pinned gVisor runsc and its helpers (gvisor-bin/), into the cache (about 2 minutes, once)
# CGO_ENABLED=0: a dynamically linked runsc cannot re-exec itself inside its empty chroot
# (the ELF interpreter is missing there) and every sandbox fails to start.
$(RUNSC):
	@echo "installing runsc $(RUNSC_VERSION) as $(RUNSC_LABEL) (about 2 minutes)"
	mkdir -p $(dir $@)
	CGO_ENABLED=0 GOBIN=$(abspath $(dir $@)) go install -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$(RUNSC_LABEL)" $(RUNSC_MODULE)@$(RUNSC_VERSION)
	$@ --version

# The sentry that runsc boots sandboxes with: the pinned gVisor's sentry commands under a main of
# ours (runsc/sentry, a module of its own), static and stamped with runsc's label as runsc is.
# Written beside, then renamed: runsc may be starting sandboxes from this directory meanwhile.
$(SENTRY_STAMP):
	@echo "building gvisor_sentry of $(RUNSC_VERSION) as $(RUNSC_LABEL)"
	mkdir -p $(GVISOR_BIN)
	cd runsc/sentry && CGO_ENABLED=0 go build $(SENTRY_FLAGS) -o $(GVISOR_BIN)/gvisor_sentry.tmp .
	mv -f $(GVISOR_BIN)/gvisor_sentry.tmp $(GVISOR_BIN)/gvisor_sentry
	rm -f $(GVISOR_BIN)/.gvisor_sentry-*
	touch $@

# The prewarmer runsc runs ahead of the sentry (runsc/prewarmer.c): freestanding C from Debian's
# gcc, static (the pipeline's image has no libc), no build id, stripped: the same bytes from the
# same compiler.
$(PREWARMER_STAMP):
	mkdir -p $(GVISOR_BIN)
	gcc $(PREWARMER_CFLAGS) -o $(GVISOR_BIN)/gvisor-sentry-prewarmer.tmp runsc/prewarmer.c
	mv -f $(GVISOR_BIN)/gvisor-sentry-prewarmer.tmp $(GVISOR_BIN)/gvisor-sentry-prewarmer
	rm -f $(GVISOR_BIN)/.gvisor-sentry-prewarmer-*
	touch $@

# runsc: the executor layer is put on by `pipeline rootfs`, which runs the base's python3 only
# in a sandbox.
image: deps runsc build ## the executor rootfs (Debian bookworm, python3, numpy, pandas); links build/rootfs
	./images/executor/build-image.sh

# The pipeline's image: static pipeline (CGO_ENABLED=0, -trimpath) and runsc, busybox's sh,
# the rootfs baked in (docs/fleet.md). Its last line is the image's digest.
pipeline-image: deps runsc image build ## the pipeline's own container image, into build/pipeline-image (PUSH=REF pushes it)
	@mkdir -p build/pipeline-image-bin
	CGO_ENABLED=0 go build -trimpath -buildvcs=false -o build/pipeline-image-bin/pipeline ./cmd/pipeline
	go run ./cmd/pipeline-image -out $(PIPELINE_IMAGE) -pipeline build/pipeline-image-bin/pipeline \
	  -runsc $(RUNSC) -rootfs $(ROOTFS) -source $(PIPELINE_IMAGE_SOURCE) \
	  -revision $$(git rev-parse HEAD) -created $$(git log -1 --format=%cI) \
	  -version $$(git describe --tags --always --dirty) $(if $(PUSH),-push $(PUSH))

# `make pipeline-image` twice gives the same digest: built again beside it, the digests match.
check-pipeline-image: pipeline-image ## pipeline-image built twice: the digests must be equal
	@first=$$(grep -o 'sha256:[0-9a-f]\{64\}' $(PIPELINE_IMAGE)/index.json | head -n1); \
	again=$$($(MAKE) --no-print-directory pipeline-image PIPELINE_IMAGE=build/pipeline-image-again | tail -n1); \
	rm -rf build/pipeline-image-again; \
	[ "$$first" = "$$again" ] || { echo "pipeline-image is not reproducible: $$first, then $$again"; exit 1; }; \
	echo "pipeline-image is reproducible: $$again"

capture: deps runsc image build ## capture the default config (pipeline.yaml) into out/
	$(PIPELINE) capture --config pipeline.yaml --out out

lint: $(STATICCHECK) ## gofmt, go vet, staticcheck, go mod tidy -diff
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	go vet ./...
	$(STATICCHECK) ./...
	go mod tidy -diff

check-golden: ## the golden protocol fixture must match the Python writer
	tmp=$$(mktemp); trap 'rm -f $$tmp' EXIT; \
	$(PYTHON) images/executor/tests/generate_golden.py $$tmp; \
	cmp -s $$tmp testdata/frames.golden.json || { echo "testdata/frames.golden.json drifted from the Python writer: run make golden"; exit 1; }
	@echo "golden fixture matches the Python writer"

golden: ## regenerate testdata/frames.golden.json after a deliberate protocol change
	$(PYTHON) images/executor/tests/generate_golden.py

test-python: deps image ## the executor's Python tests
	cd images/executor && $(PYTHON) -m unittest discover -s tests -t .

# The race detector only on the packages with goroutines of their own: parallel (the worker
# pool), run (captures with --jobs), analyze and the planner (parallel.Each over modules;
# catalogue/plan's candidates, which setplan's tests plan on corpora), bench (concurrent
# restores), lease (its mutex), oci/output (push's uploads and the layer pipe), launch and
# orphans (a sandbox's stdio copies; both were internal/sandboxes), executorproto (Call's
# deadline), pool (its refill); in cmd/pipeline only the tests of its own goroutines (the
# signal watcher, --jobs in-process). Elsewhere it has no goroutine of the package's own to
# watch, and cmd/pipeline under it was 12 of make test's 18 minutes.
RACE_PACKAGES := ./internal/parallel ./internal/run ./internal/importcost ./internal/setplan ./pkg/catalogue/plan ./internal/bench \
	./internal/lease ./internal/oci/output ./internal/orphans ./pkg/launch ./pkg/executorproto ./pkg/pool
RACE_CMD_TESTS := ^(TestSignalInProcess|TestDispatchLeavesNoGoroutine|TestJobsWithAFailingSet)$$

# One pass, in a zone that is not UTC: the code that formats or parses times is tested under
# several zones where it lives (TestExplainInAnyTimeZone, TestRunscRunsInUTC, ...), so a second
# whole-suite pass in UTC adds nothing. -count=1: the test cache does not know TZ. The race
# detector's packages (test-race) run beside the rest (test-unit) rather than after it, and
# `make test` runs its checks beside them too: cmd/pipeline, the long pole, waits on sandboxes
# for much of its time and leaves room. make -k runs every one to the end (one failing fails the
# whole) and stops all on Ctrl-C; -Otarget prints each one's output whole once it ends.
test-go: runsc image build pipeline-image $(BENCHSTAT) ## the Go tests: test-unit beside test-race
	$(call in_test_tmpdir,TZ=America/New_York $(MAKE) --no-print-directory -k -j2 -Otarget test-unit test-race)

# Three at once: test-unit and test-race, and the checks one after another in the third. What
# this make built is not built again below (-o).
TEST_BUILT := deps runsc image build pipeline-image
test: $(TEST_BUILT) $(BENCHSTAT) ## every test: Go, race, lint, golden, pipeline image, Python (docs/testing.md)
	$(call in_test_tmpdir,TZ=America/New_York $(MAKE) --no-print-directory -k -j3 -Otarget $(TEST_BUILT:%=-o %) \
	  test-unit test-race lint check-golden check-pipeline-image test-python)

# in_test_tmpdir runs its command with TMPDIR a directory of its own (the tests' outputs,
# stores, caches of images unpacked, runsc roots) on a tmpfs when $(TEST_TMPFS) is one with
# $(TEST_TMPFS_MIN_GIB) GiB free and programs may run from it (their peak is about 1 GiB): on
# this machine's disk, making the rootfs's 11,000 files costs 5 s of system time against 0.7 s
# on tmpfs, and cmd/pipeline unpacks images and writes checkpoints in most of its tests
# (docs/testing.md). Elsewhere the directory is made where TMPDIR says, slower, and it says so.
# Its name is short: the tests' executor sockets are under it, and a Unix socket path holds 107
# bytes. The command runs as a job of its own (set -m: its own process group), and a SIGINT,
# SIGTERM or SIGHUP to this shell reaches its make and go test processes as a SIGINT, as Ctrl-C
# would (killing make alone once left them running). The directory goes once the command has
# ended, however it ends.
TEST_TMPFS ?= /dev/shm
TEST_TMPFS_MIN_GIB := 4
define in_test_tmpdir
@parent=$${TMPDIR:-/tmp}; \
if [ "$$(stat -f -c %T $(TEST_TMPFS) 2>/dev/null)" = tmpfs ] && \
   [ $$(( $$(df -k --output=avail $(TEST_TMPFS) | tail -n1) / 1048576 )) -ge $(TEST_TMPFS_MIN_GIB) ] && \
   opts=$$(findmnt -no OPTIONS --target $(TEST_TMPFS)) && ! echo ",$$opts," | grep -q ',noexec,'; then \
	parent=$(TEST_TMPFS); \
else \
	echo "$(TEST_TMPFS) is not a tmpfs with $(TEST_TMPFS_MIN_GIB) GiB free that allows exec: the tests' files go to $$parent (slower)"; \
fi; \
tmp=$$(mktemp -d "$$parent/rt-XXXXXX"); \
trap 'rm -rf "$$tmp"' EXIT; \
echo "TMPDIR=$$tmp $(1)"; \
set -m; TMPDIR=$$tmp $(1) & job=$$!; set +m; \
trap 'kill -INT -- -$$job 2>/dev/null || true' INT TERM HUP; \
while kill -0 $$job 2>/dev/null; do wait $$job || :; done; \
wait $$job
endef

# test-go's two halves; they build nothing (test-go and test have). Integration tests run two
# per CPU (-parallel; go test's default is one per CPU): they wait on sandboxes, and one per CPU
# left a core idle here (cmd/pipeline alone: 297 s against 345 s).
TEST_PARALLEL ?= $(shell echo $$(( $$(nproc) * 2 )))
test-unit: ## the Go tests outside RACE_PACKAGES, without the race detector
	go test $(GOTEST_FLAGS) -count=1 -parallel $(TEST_PARALLEL) $$(go list ./... | grep -vxF -e "$$(go list $(RACE_PACKAGES))")

test-race: ## RACE_PACKAGES and RACE_CMD_TESTS under the race detector
	go test $(GOTEST_FLAGS) -race -count=1 $(RACE_PACKAGES)
	go test $(GOTEST_FLAGS) -race -count=1 -run '$(RACE_CMD_TESTS)' ./cmd/pipeline

$(BENCHSTAT):
	GOBIN=$(abspath $(dir $@)) go install golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da

# 2026.2.2: the first release that reads Go 1.26.
$(STATICCHECK):
	GOBIN=$(abspath $(dir $@)) go install honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Restore latency side by side on the default config (captures first), summarized by benchstat.
bench: deps runsc image build $(BENCHSTAT) ## restore latency side by side on the default config, benchstat summary (docs/bench.md)
	$(PIPELINE) bench --capture --explain --config pipeline.yaml --out out
	$(BENCHSTAT) out/bench/latest/bench.txt

# The size sweep: its own image (bench/sizes-packages.txt) and bench/sizes.yaml.
bench-sizes: deps runsc build $(BENCHSTAT) ## the size sweep: its own image and bench/sizes.yaml
	READIE_PACKAGES=$(abspath bench/sizes-packages.txt) READIE_LINK=$(abspath build/rootfs-sizes) ./images/executor/build-image.sh
	$(PIPELINE) bench --capture --config bench/sizes.yaml --variants=false --concurrency "" --rounds 5

# The knob sweep (docs/knobs.md): bench/knobs.yaml on the default image, pandas, 1 and 2
# restores at once, then benchstat's verdict per knob (bench/knobs.sh).
bench-knobs: deps runsc image build $(BENCHSTAT) ## the knob sweep of bench/knobs.yaml (docs/knobs.md)
	BENCHSTAT=$(BENCHSTAT) bench/knobs.sh

# runsc with and without its helpers, interleaved (docs/knobs.md): bench/helpers.yaml through
# bench/knobs.sh's run and verdicts; ROUNDS=25 by default.
bench-helpers: deps runsc image build $(BENCHSTAT) ## runsc with and without its helpers, interleaved (docs/knobs.md)
	BENCHSTAT=$(BENCHSTAT) CONFIG=bench/helpers.yaml OUT=out-helpers KNOBS=without-helpers ROUNDS=$(or $(ROUNDS),25) bench/knobs.sh

# The catalogue image: the commonly requested stacks Debian ships (bench/catalogue-packages.txt),
# beside the default image (a few GB; built once, then cached).
image-catalogue: deps build ## the catalogue image: the stacks Debian ships (a few GB, once)
	READIE_PACKAGES=$(abspath bench/catalogue-packages.txt) READIE_LINK=$(abspath build/rootfs-catalogue) ./images/executor/build-image.sh

# Which sets to checkpoint, end to end on the catalogue image: analyze a corpus, plan the sets,
# capture them, and replay SAMPLE held-out requests beside cold starts (bench/catalogue.yaml).
CORPUS ?= ../shared/corpus/requests.jsonl
SAMPLE ?= 40
bench-catalogue: deps runsc build image-catalogue $(BENCHSTAT) ## analyze, plan-sets, capture and bench --corpus on the catalogue image (CORPUS, SAMPLE)
	$(PIPELINE) analyze --config bench/catalogue.yaml --corpus $(CORPUS)
	$(PIPELINE) plan-sets --config bench/catalogue.yaml --corpus $(CORPUS)
	$(PIPELINE) capture --config bench/catalogue.yaml --plan out-catalogue/plan.json
	$(PIPELINE) bench --config bench/catalogue.yaml --corpus $(CORPUS) --sample $(SAMPLE) --rounds 3
	$(BENCHSTAT) -filter '.name:Corpus' -row .name -col /series out-catalogue/bench/latest/bench.txt

# Incremental capture (first, unchanged, one set changed) and parallel capture (--jobs 1 and 2),
# side by side; ROUNDS=5 by default.
bench-incremental: deps runsc image build ## first, unchanged and one-set-changed captures side by side
	bench/incremental.sh

bench-jobs: deps runsc image build ## the six-set config with --jobs 1 and --jobs 2
	bench/jobs.sh

# Unpacking an image (ours beside tar -x), push/pull of the default output to a local
# registry (it captures first), and push's peak memory for an output of 1 and of 12 sets.
bench-oci: capture ## image unpacking, push and pull, push memory
	go test -run '^$$' -bench Unpack -benchtime 1x -count 5 -timeout 30m ./internal/oci/unpack
	bench/oci.sh
	bench/push-rss.sh

# The pipeline's own hot paths that are not sandboxes.
bench-go: ## Go benchmarks of the pipeline's hot paths
	go test -run '^$$' -bench . -benchtime 20x -count 6 ./pkg/executorproto ./pkg/sandbox ./pkg/manifest

bench-proto: ## the framing benchmarks, Go and Python
	go test -run '^$$' -bench . -benchtime 20x -count 6 ./pkg/executorproto
	$(PYTHON) images/executor/tests/bench_protocol.py

# Long runs (docs/reliability.md "Long runs"): SOAK restores of the default output, 2 at once,
# through the worker's kit, then the same with a sandbox killed with SIGKILL every 100 restores,
# each with a TMPDIR of its own; then the capture soak (bench/capture-soak.sh, CAPTURES=200).
SOAK ?= 5000
soak: capture ## long runs: SOAK restores, with and without kills, then 200 captures
	tmp=$$(mktemp -d /tmp/readie-soak.XXXXXX); trap 'rm -rf "$$tmp"' EXIT; \
	TMPDIR=$$tmp $(PIPELINE) bench --config pipeline.yaml --soak $(SOAK) --concurrency 2 out; \
	TMPDIR=$$tmp $(PIPELINE) bench --config pipeline.yaml --soak $(SOAK) --concurrency 2 --soak-kill-every 100 out
	bench/capture-soak.sh

clean: ## remove bin/, out/ and build/ (the cache stays)
	rm -rf bin out build
