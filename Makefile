# Paddock — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
EXAMPLES := notes faulty hasher chat
WASM := $(foreach e,$(EXAMPLES),examples/$(e)/$(e).wasm)
# Test packages need no external server: PostgreSQL tests start a throwaway
# cluster from the installed server binaries unless DATABASE_URL is set.
TEST_TIMEOUT ?= 20m
# Fuzz targets as package:Target (`go test -fuzz` takes one target per run);
# their seed corpora (testdata/fuzz/<Target>) also run in every `go test`.
FUZZTIME ?= 10s
FUZZ_TARGETS := ./abi:FuzzTurnResult ./abi:FuzzTurnRequest ./abi:FuzzCallRequest ./wasm:FuzzGuestMemory \
	./host/api:FuzzSignal ./host/api:FuzzSession ./host/api:FuzzAgent ./host/api:FuzzPlugin ./host/api:FuzzQuery \
	./host/config:FuzzLoad ./plugins/pluginhost:FuzzPluginFrames ./plugins/pluginhost:FuzzFrameRoundTrip \
	./fabric:FuzzBrokerReceive ./fabric:FuzzRemoteResult ./fabric/wire:FuzzParseHeader ./fabric/wire:FuzzSessionOpen \
	./wasm/internal/wire:FuzzDecodeTurnRequest ./wasm/internal/wire:FuzzAppendTurnResult \
	./wasm/internal/wire:FuzzDecodeTurnResult ./wasm/internal/wire:FuzzAppendTurnRequest

.PHONY: help build examples rust-examples plugins run test vet lint fmt-check bench bench-go bench-paddock bench-peers bench-backlog bench-stream chaos burst fuzz clean

help: ## list targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/paddock
	$(GO) build -o bin/paddock ./cmd/paddock

examples: $(WASM) plugins ## build the example agents: wasm modules (GOOS=wasip1) and the plugin workers

examples/%.wasm: FORCE
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $@ ./$(dir $@)cmd

FORCE:

# The bench agent in Rust (examples/hasher/rust): the same work as the Go
# module, with a guest compiled well. Debian's rustc with
# libstd-rust-dev-wasm32 and lld builds it (.ci/run installs them);
# RUSTC_WASM names another rustc, RUSTC_WASM_TARGET its name for WASI
# preview 1 (wasm32-wasip1 from Rust 1.78 on).
RUSTC_WASM ?= /usr/bin/rustc
RUSTC_WASM_TARGET ?= wasm32-wasi
examples/hasher/hasher-rust.wasm: examples/hasher/rust/hasher.rs
	$(RUSTC_WASM) --edition 2021 --target $(RUSTC_WASM_TARGET) --crate-type cdylib -C opt-level=3 -C panic=abort -C strip=symbols -o $@ $<

rust-examples: examples/hasher/hasher-rust.wasm ## build the Rust bench agent examples/hasher/hasher-rust.wasm (needs RUSTC_WASM: Debian's rustc, libstd-rust-dev-wasm32, lld)

plugins: ## build the example plugin workers bin/notes-plugin, bin/hasher-plugin, bin/chat-plugin and their checksum files
	@mkdir -p bin
	$(GO) build -o bin/notes-plugin ./examples/notes/plugin
	$(GO) build -o bin/hasher-plugin ./examples/hasher/plugin
	$(GO) build -o bin/chat-plugin ./examples/chat/plugin
	cd bin && for p in notes-plugin hasher-plugin chat-plugin; do sha256sum $$p > $$p.sha256; done

run: build examples ## start `paddock serve` on SQLite under ./data with the example agents registered
	@echo
	@echo "Paddock is starting on http://$${PADDOCK_LISTEN:-127.0.0.1:8080} (SQLite under ./data). Wait until the server below logs that it is serving (its ready line), then in another terminal try:"
	@if [ -n "$$PADDOCK_LISTEN" ]; then echo "  export PADDOCK_SERVER=http://$$PADDOCK_LISTEN   # the client's address"; fi
	@if [ -n "$$PADDOCK_AUTH_TOKEN" ]; then echo "  export PADDOCK_TOKEN=...   # the auth_token you set: every request needs a bearer token"; fi
	@echo "  S=\$$(bin/paddock session create notes)"
	@echo "  bin/paddock signal send notes \$$S 'note buy milk'"
	@echo "  bin/paddock signal send notes \$$S 'note call mum'"
	@echo "  bin/paddock signal send notes \$$S list --wait"
	@echo "  bin/paddock transcript notes \$$S"
	@echo "  P=\$$(bin/paddock session create notes-plugin)   # the same agent as a plugin worker"
	@echo "  bin/paddock signal send notes-plugin \$$P 'note same here' --wait"
	@echo "  bin/paddock worker --connect $${PADDOCK_FABRIC__LISTEN:-tcp://127.0.0.1:7700} --id worker-1 --key-file examples/worker-1.key --pool remote &"
	@echo "  R=\$$(bin/paddock session create notes-remote); bin/paddock signal send notes-remote \$$R 'note far' --wait"
	@echo "  C=\$$(bin/paddock session create chat); bin/paddock signal send chat \$$C 'hello' --wait   # a model through the host (README: Host calls)"
	@echo "The web console: http://$${PADDOCK_LISTEN:-127.0.0.1:8080}/ui/"
	@echo
	bin/paddock serve --config examples/paddock.yaml

vet: ## go vet
	$(GO) vet ./...

lint: ## staticcheck (pinned in go.mod's tool block: `go tool staticcheck`)
	$(GO) tool staticcheck ./...

fmt-check: ## fail if gofmt would change a file
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

test: fmt-check vet lint examples ## gofmt check, vet, staticcheck, race tests on both store drivers and the examples (what CI runs)
	@mkdir -p bin && rm -f bin/figures.txt
	FIGURES_FILE=$(CURDIR)/bin/figures.txt $(GO) test -race -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v '/fabric')
	@# fabric's transport tests time heartbeats, write timeouts and 100 MB
	@# frames: they run alone, not beside another package's race tests.
	FIGURES_FILE=$(CURDIR)/bin/figures.txt $(GO) test -race -timeout $(TEST_TIMEOUT) ./fabric/...
	@echo "Figures measured by the tests:"; cat bin/figures.txt 2>/dev/null || echo "  (none)"
	@# A count, not a duration: a -fuzztime duration races Go 1.26's fuzz
	@# coordinator at its deadline and can fail a clean run with "context
	@# deadline exceeded" (golang/go#75804, fixed in Go 1.27).
	$(MAKE) fuzz FUZZTIME=1000x

fuzz: ## run every fuzz target for FUZZTIME each (default 10s, or a count like 1000x); a failing input lands in the package's testdata/fuzz
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) $${t%%:*}; \
	done

bench: bench-go bench-paddock ## the Go benchmarks, then `paddock bench` (the peers' workload) on SQLite, and on PostgreSQL when DATABASE_URL is set

bench-go: examples ## Go benchmarks (store claim/dispatch/commit, wasm instances, plugin and fabric round trips, wake latency, host calls, streamed turns, idle stream subscribers)
	$(GO) test -run '^$$' -bench . -benchmem ./store/... ./wasm/... ./plugins/... ./fabric/... ./examples/
	$(GO) test -run '^$$' -bench 'JournaledModelCall' -benchtime 2000x ./host/
	$(GO) test -run '^$$' -bench 'ConcurrentSlowCalls' -benchtime 1x ./host/
	$(GO) test -run '^$$' -bench 'StreamedTurn' -benchtime 3x ./host/
	$(GO) test -run '^$$' -bench 'IdleSubscribers' -benchtime 3x ./host/api/
	$(GO) test -run '^$$' -bench 'FanOut' -benchtime 200x ./host/stream/

# BENCH_FLAGS are passed to `paddock bench` (bin/paddock bench -h lists them).
BENCH_FLAGS ?=
bench-paddock: build examples ## `paddock bench`: N turns over K sessions from P producers, durable before each signal returns
	bin/paddock bench --store sqlite $(BENCH_FLAGS)
	@if [ -n "$$DATABASE_URL" ]; then bin/paddock bench --store postgres $(BENCH_FLAGS); fi

# The backlog bench: turns/s while each session has B open events waiting behind its turn, B = 100 then 10,000.
BACKLOG_FLAGS ?= --keys 8 --producers 8 --n 799
bench-backlog: build examples ## turns/s with 100 and with 10,000 open events per session, on SQLite and (DATABASE_URL) PostgreSQL: the cost of a turn must not grow with the events behind it (≈ 3 min)
	@for b in 100 10000; do bin/paddock bench --store sqlite --backlog $$b $(BACKLOG_FLAGS) | grep '^peer='; done
	@if [ -n "$$DATABASE_URL" ]; then for b in 100 10000; do bin/paddock bench --store postgres --backlog $$b $(BACKLOG_FLAGS) | grep '^peer='; done; fi

bench-stream: ## the session stream: chunk latency emit → SSE client on the same and another host, store writes per 1,000 tokens, idle subscribers (two `paddock serve` on PostgreSQL — DATABASE_URL or a throwaway cluster — then one on SQLite; ≈ 2 min)
	STREAMBENCH=1 $(GO) test -run '^TestStreamBenchFigures$$' -count=1 -v -timeout 10m ./cmd/paddock/ | grep -E 'stream bench|^(--- |ok|FAIL)'
	STREAMBENCH=1 STREAMBENCH_STORE=sqlite $(GO) test -run '^TestStreamBenchFigures$$' -count=1 -v -timeout 10m ./cmd/paddock/ | grep -E 'stream bench|^(--- |ok|FAIL)'
	$(GO) test -run '^$$' -bench 'IdleSubscribers' -benchtime 3x ./host/api/

bench-peers: build examples ## Paddock beside River, DBOS and pgbench (../shared/peers) on one PostgreSQL, with the ratios; the wasm runs with the Go and (when rust-examples builds) the Rust bench agent; ROUNDS (3) pair River's tuned run with Paddock's again (≈ 6 min)
	@$(MAKE) --no-print-directory rust-examples || echo "bench-peers: the Rust bench agent did not build (RUSTC_WASM=$(RUSTC_WASM)): its run is skipped"
	bash cmd/bench-peers.sh

# The long fault-injection run; CHAOS_FLAGS changes it (go run ./cmd/paddock-chaos -h lists the flags).
CHAOS_FLAGS ?= -sessions 24 -signals 3000 -faults 50 -fault-interval 1200ms

chaos: build examples ## fault injection: 3 hosts, remote workers and plugins on a throwaway PostgreSQL, ≥ 50 faults of each kind, then the invariants checked in SQL (≈ 6 min)
	$(GO) run ./cmd/paddock-chaos $(CHAOS_FLAGS)

# The burst at full size (DESIGN invariant 11): `go test` runs it small (600 sessions, capacity 8).
BURST_FLAGS ?= BURST_SESSIONS=3000 BURST_CAPACITY=64 BURST_IDLE=30s BURST_PENDING=60s

burst: ## liveness under a burst: 3,000 notes sessions × 1 signal, two `paddock serve` on one PostgreSQL, capacity 64, idle 30 s, pending 60 s; prints the time to drain and stranded = 0
	@mkdir -p bin && rm -f bin/figures-burst.txt
	$(BURST_FLAGS) FIGURES_FILE=$(CURDIR)/bin/figures-burst.txt $(GO) test -count=1 -timeout 30m -run '^TestBurstAgainstACapacityPoolStrandsNoEvent$$' ./cmd/paddock/
	@cat bin/figures-burst.txt

clean: ## remove build outputs and ./data
	rm -rf bin data $(WASM)
