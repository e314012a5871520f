#!/usr/bin/env bash
# make bench-peers: Paddock's durable-turn benchmark beside River, DBOS and
# pgbench (../shared/peers), all on ONE PostgreSQL in one run, with ratios.
#
#   make bench-peers                          # throwaway PostgreSQL 15 cluster (stock durable settings), removed after
#   DATABASE_URL=postgres://… make bench-peers  # that database instead (river_*, dbos, pgbench_* and schema paddock_bench are reset in it)
#
# Env: N (20000) KEYS (1000) PRODUCERS (8) PG_BIN (/usr/lib/postgresql/15/bin)
#      PEERS_DIR (../shared/peers) ONLY (regex over the peers' run names, default all)
#      PADDOCK_RUNS (space-separated worker/signal pairs, default "wasm/go wasm-rust/go wasm/http plugin/go";
#      wasm-rust is the wasm worker with the Rust bench agent, examples/hasher/hasher-rust.wasm; fabric/go
#      too, with KEYS ≤ 64: one remote worker's send queue holds 64 turns)
#      RESULTS_DIR (bin): where the run's JSON lines are kept, bench-peers-<UTC time>.jsonl
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
N="${N:-20000}"; KEYS="${KEYS:-1000}"; PRODUCERS="${PRODUCERS:-8}"
PADDOCK_RUNS="${PADDOCK_RUNS:-wasm/go wasm-rust/go wasm/http plugin/go}"
PEERS_DIR="${PEERS_DIR:-$ROOT/../shared/peers}"
if [ ! -x "$PEERS_DIR/run.sh" ]; then
	echo "bench-peers: no peers at $PEERS_DIR (set PEERS_DIR to the peersbench directory)" >&2
	exit 2
fi
WORK="$(mktemp -d /tmp/paddock-bench-peers.XXXXXX)"
RESULTS="$WORK/results.jsonl"
STARTED=""
log() { echo "[bench-peers $(date +%H:%M:%S)] $*" >&2; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
	if [ -n "$STARTED" ]; then
		log "stopping the throwaway cluster"
		as_pg "$PG_BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null 2>&1 || true
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

if [ -n "${DATABASE_URL:-}" ]; then
	log "using DATABASE_URL: river_*, schema dbos, pgbench_* and schema paddock_bench are reset in it"
else
	PORT=55433
	while (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; do PORT=$((PORT + 1)); done
	log "starting a throwaway cluster (stock settings: fsync=on, synchronous_commit=on) on port $PORT"
	if [ "$(id -u)" = 0 ]; then chown postgres "$WORK"; chmod 755 "$WORK"; fi
	as_pg "$PG_BIN/initdb" -D "$WORK/data" -U postgres -A trust -E UTF8 >"$WORK/initdb.log" 2>&1 ||
		{ cat "$WORK/initdb.log" >&2; exit 1; }
	as_pg "$PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/data/server.log" -w \
		-o "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$WORK" start >/dev/null
	STARTED=1
	"$PG_BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres bench_peers
	export DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/bench_peers?sslmode=disable"
fi

# The peers run one at a time (run.sh's ONLY), each between two readings of the
# server's CPU (`paddock bench server-cpu`), and each of its result lines gets
# db_cpu_ms_per_turn: the server's CPU per job of that run (its CHECKPOINT
# included), the figure `paddock bench` gives for a turn. Without the server's
# processes in this /proc the lines stay as the peers wrote them.
log "peers: River, DBOS, pgbench (N=$N keys=$KEYS producers=$PRODUCERS)"
RUNS="$(sed -n 's/^peer \([a-z0-9-]*\) .*/\1/p' "$PEERS_DIR/run.sh")"
if [ -z "$RUNS" ]; then
	# run.sh no longer declares its runs as `peer NAME …` lines: run them all
	# at once, as before, without their CPU.
	log "no peer runs found in $PEERS_DIR/run.sh: running it whole, the peers' CPU not measured"
	RESULTS="$RESULTS" N="$N" KEYS="$KEYS" PRODUCERS="$PRODUCERS" PG_BIN="$PG_BIN" "$PEERS_DIR/run.sh" >"$WORK/peers.out"
fi
for name in ${RUNS:+pgbench $RUNS}; do
	[[ "$name" =~ ${ONLY:-.} ]] || continue
	cpu0="$("$ROOT/bin/paddock" bench server-cpu --dsn "$DATABASE_URL" 2>/dev/null || true)"
	RESULTS="$WORK/run.jsonl" N="$N" KEYS="$KEYS" PRODUCERS="$PRODUCERS" PG_BIN="$PG_BIN" ONLY="^$name\$" \
		"$PEERS_DIR/run.sh" >>"$WORK/peers.out"
	cpu1="$("$ROOT/bin/paddock" bench server-cpu --dsn "$DATABASE_URL" 2>/dev/null || true)"
	touch "$WORK/run.jsonl"
	while IFS= read -r line; do
		jobs="$(echo "$line" | sed -n 's/.*"completed":\([0-9]*\).*/\1/p')"
		if [ -n "$cpu0" ] && [ -n "$cpu1" ] && [ -n "$jobs" ] && [ "$jobs" -gt 0 ] && [ "${line: -1}" = "}" ]; then
			per="$(awk -v t="$((cpu1 - cpu0))" -v n="$jobs" 'BEGIN { printf "%.3f", t * 10 / n }')"
			line="${line%\}},\"db_cpu_ms_per_turn\":$per}"
			log "$name: server CPU $per ms per job"
		fi
		echo "$line" >>"$RESULTS"
	done <"$WORK/run.jsonl"
	rm -f "$WORK/run.jsonl"
done
FAILED=""
for run in $PADDOCK_RUNS; do
	worker="${run%/*}"; signal="${run#*/}"; module="$ROOT/examples/hasher/hasher.wasm"
	if [ "$worker" = wasm-rust ]; then
		# The same agent in Rust (examples/hasher/rust): the host's cost
		# with a guest compiled well.
		worker=wasm; module="$ROOT/examples/hasher/hasher-rust.wasm"
		if [ ! -f "$module" ]; then
			log "paddock $run skipped: no $module (make rust-examples)"
			continue
		fi
	fi
	"$PG_BIN/psql" "$DATABASE_URL" -qAtc CHECKPOINT >/dev/null
	sleep 1
	log "paddock: worker=$worker signal=$signal"
	"$ROOT/bin/paddock" bench --store postgres --dsn "$DATABASE_URL" --n "$N" --keys "$KEYS" --producers "$PRODUCERS" \
		--worker "$worker" --signal "$signal" --module "$module" --plugin "$ROOT/bin/hasher-plugin" \
		2> >(sed "s|^|  [paddock $run] |" >&2) | tee -a "$RESULTS" | grep '^peer=' >&2 || { log "paddock $run FAILED"; FAILED=1; }
done
echo
"$ROOT/bin/paddock" bench report "$RESULTS"
mkdir -p "${RESULTS_DIR:-$ROOT/bin}"
KEEP="${RESULTS_DIR:-$ROOT/bin}/bench-peers-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
cp "$RESULTS" "$KEEP"
echo "JSON lines kept in $KEEP (bin/paddock bench report $KEEP prints the table again)"
if [ -n "$FAILED" ]; then
	log "a Paddock run failed (its output is above)"
	exit 1
fi
