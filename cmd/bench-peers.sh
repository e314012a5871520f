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
#      ROUNDS (3): rounds 2.. run River's tuned single insert and ROUND_RUNS (default "wasm/go wasm-rust/go")
#      again, each Paddock run then also compared with the River run of its round (see "Rounds" below)
#      RESULTS_DIR (bin): where the run's JSON lines are kept, bench-peers-<UTC time>.jsonl
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
N="${N:-20000}"; KEYS="${KEYS:-1000}"; PRODUCERS="${PRODUCERS:-8}"
PADDOCK_RUNS="${PADDOCK_RUNS:-wasm/go wasm-rust/go wasm/http plugin/go}"
ROUNDS="${ROUNDS:-3}"; ROUND_RUNS="${ROUND_RUNS:-wasm/go wasm-rust/go}"
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
	echo "bench-peers: ROUNDS=$ROUNDS: want a whole number of rounds, at least 1" >&2
	exit 2
fi
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
	if [ -z "${KEPT:-}" ] && [ -s "${RESULTS:-}" ]; then
		# Stopped before the end (a peer failed under set -e, an interrupt):
		# keep what was measured.
		mkdir -p "${RESULTS_DIR:-$ROOT/bin}"
		partial="${RESULTS_DIR:-$ROOT/bin}/bench-peers-$(date -u +%Y%m%dT%H%M%SZ)-partial.jsonl"
		cp "$RESULTS" "$partial" && log "stopped early: the lines so far are kept in $partial"
	fi
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
#
# Rounds: the machine's speed drifts by a third within minutes (River's tuned
# single insert gave 2,760 to 3,740 jobs/s within an hour), so a Paddock
# figure is also put beside a River run taken just before it. Round 1 runs
# every peer, River's tuned single insert last, then every PADDOCK_RUNS;
# rounds 2..ROUNDS run River's tuned single insert and ROUND_RUNS again. Every line carries its round, and the
# report gives each configuration the median of its ratios to the River run
# of its round.
RUNS="$(sed -n 's/^peer \([a-z0-9-]*\) .*/\1/p' "$PEERS_DIR/run.sh")"
tag() { # round: append "round" to each JSON line of stdin
	sed -E "/^\{.*\}\$/ s/\}\$/,\"round\":$1}/"
}
peer_runs() { # round names...
	local round="$1" name line jobs per cpu0 cpu1; shift
	for name in "$@"; do
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
			echo "$line" | tag "$round" >>"$RESULTS"
		done <"$WORK/run.jsonl"
		rm -f "$WORK/run.jsonl"
	done
}
FAILED=""
paddock_runs() { # round runs...
	local round="$1" run worker signal module; shift
	for run in "$@"; do
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
		log "paddock (round $round): worker=$worker signal=$signal"
		"$ROOT/bin/paddock" bench --store postgres --dsn "$DATABASE_URL" --n "$N" --keys "$KEYS" --producers "$PRODUCERS" \
			--worker "$worker" --signal "$signal" --module "$module" --plugin "$ROOT/bin/hasher-plugin" \
			2> >(sed "s|^|  [paddock $run] |" >&2) | tag "$round" | tee -a "$RESULTS" | grep '^peer=' >&2 ||
			{ log "paddock $run FAILED"; FAILED=1; }
	done
}
if [ -z "$RUNS" ]; then
	# run.sh no longer declares its runs as `peer NAME …` lines: run them all
	# at once, as before, without their CPU or rounds.
	log "no peer runs found in $PEERS_DIR/run.sh: running it whole, the peers' CPU not measured"
	RESULTS="$RESULTS" N="$N" KEYS="$KEYS" PRODUCERS="$PRODUCERS" PG_BIN="$PG_BIN" "$PEERS_DIR/run.sh" >"$WORK/peers.out"
	ROUNDS=1
fi
if ! [[ river-single-tuned =~ ${ONLY:-.} ]] || ! grep -qx river-single-tuned <<<"$RUNS"; then
	[ "$ROUNDS" -gt 1 ] && log "no River tuned single-insert run (ONLY=${ONLY:-}): one round only"
	ROUNDS=1
fi
log "peers: River, DBOS, pgbench (N=$N keys=$KEYS producers=$PRODUCERS); $ROUNDS round(s)"
# River's tuned single insert last of the peers: nearest in time to the
# Paddock runs of round 1.
ORDERED="$(grep -vx river-single-tuned <<<"$RUNS" || true)"
grep -qx river-single-tuned <<<"$RUNS" && ORDERED="$ORDERED river-single-tuned"
peer_runs 1 ${RUNS:+pgbench $ORDERED}
paddock_runs 1 $PADDOCK_RUNS
for ((round = 2; round <= ROUNDS; round++)); do
	log "round $round of $ROUNDS: River's tuned single insert, then $ROUND_RUNS"
	peer_runs "$round" river-single-tuned
	paddock_runs "$round" $ROUND_RUNS
done
echo
"$ROOT/bin/paddock" bench report "$RESULTS"
mkdir -p "${RESULTS_DIR:-$ROOT/bin}"
KEEP="${RESULTS_DIR:-$ROOT/bin}/bench-peers-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
cp "$RESULTS" "$KEEP"
KEPT=1
echo "JSON lines kept in $KEEP (bin/paddock bench report $KEEP prints the table again)"
if [ -n "$FAILED" ]; then
	log "a Paddock run failed (its output is above)"
	exit 1
fi
