#!/usr/bin/env bash
# Benchmarks of the Redis backend over HTTP, reported in docs/perf-redis.md:
#   1. join and status requests/s with one node, then two nodes, on one Redis;
#   2. Redis commands and round trips per join and per status (INFO commandstats deltas).
# The script-level yardstick and memory per place are measured elsewhere (see the end).
#
# Needs the release binary (cargo build --release --bin waitroom), redis-server, redis-cli
# (Debian: redis-server), wrk (Debian: wrk), curl, openssl, python3.
# Everything runs on loopback and is stopped at the end.
#
#   bench/redis/run.sh                      # defaults below
#   DUR=5 CONNS=32 bench/redis/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/bench/redis"
BIN=${BIN:-$ROOT/target/release/waitroom}
DUR=${DUR:-10}          # seconds of each measured HTTP phase
CONNS=${CONNS:-64}      # HTTP connections in all (split evenly over the nodes)
THREADS=${THREADS:-2}   # wrk threads in all
ADMIN=bench-admin

# shellcheck source=bench/redis/lib.sh
source "$ROOT/bench/redis/lib.sh"
redis_start waitroom-redis-bench

# start_node NAME: starts a node on the shared Redis and key; sets NODE_URL.
start_node() {
    "$BIN" serve --listen 127.0.0.1:0 --store "redis://127.0.0.1:$PORT" \
        --signing-key "$WORK/key.pem" --admin-token "$ADMIN" --no-demo \
        --data-dir "$WORK/$1" >"$WORK/$1.out" 2>"$WORK/$1.err" &
    PIDS+=($!)
    until grep -q '^listening on' "$WORK/$1.out" 2>/dev/null; do sleep 0.05; done
    NODE_URL=$(sed -n 's/^listening on //p' "$WORK/$1.out")
}

# put_event URL ID: a paused event with one slot and a month of heartbeat grace, so every
# join stays waiting and nothing expires during the run (as waitroom-bench does).
put_event() {
    curl -sf -X PUT -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
        -d '{"paused": true, "max_active": 1, "waiting_idle_sec": 2592000}' \
        "$1/api/v1/admin/events/$2" >/dev/null
}

# CPU time (clock ticks) of a process, and of every node.
CLK=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
node_ticks() {
    local t=0
    for p in "${PIDS[@]}"; do t=$((t + $(ticks "$p"))); done
    echo "$t"
}

# Runs SCRIPT against every URL in NODES at once (connections split); prints the summed
# requests/s and the worst p99.
phase() {
    local script=$1
    shift
    local n=${#NODES[@]} files=() pids=()
    local r0 n0
    r0=$(ticks "$REDIS_PID")
    n0=$(node_ticks)
    for url in "${NODES[@]}"; do
        local f="$WORK/wrk-$RANDOM.txt"
        files+=("$f")
        wrk -t"$((THREADS / n > 0 ? THREADS / n : 1))" -c"$((CONNS / n))" -d"${DUR}s" --latency \
            -s "$script" "$url" -- "$@" >"$f" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    local total=0 reqs=0 p99="" non2xx=0
    for f in "${files[@]}"; do
        total=$(python3 -c "print($total + $(awk '/^Requests\/sec:/ {print $2}' "$f"))")
        reqs=$((reqs + $(awk '/requests in/ {print $1}' "$f")))
        non2xx=$((non2xx + $(awk '/Non-2xx/ {print $NF}' "$f" | tail -1 | grep -E '^[0-9]+$' || echo 0)))
        p99="$p99 $(awk '/^ +99%/ {print $2}' "$f")"
    done
    LAST_REQS=$reqs
    local rcpu ncpu
    rcpu=$(( ($(ticks "$REDIS_PID") - r0) * 100 / CLK / DUR ))
    ncpu=$(( ($(node_ticks) - n0) * 100 / CLK / DUR ))
    printf '%10.0f req/s  (p99 per node:%s; non-2xx: %d; CPU: redis %d%%, nodes %d%%)\n' \
        "$total" "$p99" "$non2xx" "$rcpu" "$ncpu"
}

cmdstats() { R info commandstats | tr -d '\r' | grep '^cmdstat_'; }

# per_request N FILE: commands per request from a commandstats dump, busiest first, and
# the Redis time of one script run (EVALSHA's usec_per_call, inner commands included).
per_request() {
    awk -F'[:=,]' -v n="$1" '{ sub("cmdstat_", "", $1); total += $3; printf "    %-18s %6.2f\n", $1, $3 / n }
        END { printf "    %-18s %6.2f\n", "(all)", total / n }' "$2" | sort -k2 -nr | head -12
    awk -F'[:=,]' '$1 == "cmdstat_fcall" || $1 == "cmdstat_evalsha" { printf "    Redis time per script run: %s us\n", $7 }' "$2"
}

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); redis $(redis-server --version | awk '{print $3}')"

start_node n1
NODES=("$NODE_URL")
put_event "$NODE_URL" bench

# Waiting tokens for the status phases.
wrk -t1 -c16 -d3s -s "$HERE/prejoin.lua" "$NODE_URL" -- "$WORK/tokens.txt" >/dev/null 2>&1
echo "== $(wc -l <"$WORK/tokens.txt") places pre-joined for status"

echo "== one node, $CONNS connections, ${DUR}s each"
printf '  join  '; phase "$HERE/join.lua"
printf '  status'; phase "$HERE/status.lua" "$WORK/tokens.txt"

echo "== Redis work per request (INFO commandstats deltas; one node; scheduler noise included)"
R config resetstat >/dev/null
sleep "$DUR"
cmdstats >"$WORK/idle.txt"
echo "  idle node, per second:"
per_request "$DUR" "$WORK/idle.txt"
for op in join status; do
    R config resetstat >/dev/null
    if [ "$op" = join ]; then phase "$HERE/join.lua" >/dev/null; else phase "$HERE/status.lua" "$WORK/tokens.txt" >/dev/null; fi
    cmdstats >"$WORK/$op.txt"
    echo "  per $op ($LAST_REQS requests):"
    per_request "$LAST_REQS" "$WORK/$op.txt"
done

start_node n2
NODES=("${NODES[0]}" "$NODE_URL")
echo "== two nodes, $CONNS connections split over them, ${DUR}s each"
printf '  join  '; phase "$HERE/join.lua"
printf '  status'; phase "$HERE/status.lua" "$WORK/tokens.txt"

# The script-level yardstick (redis-benchmark of a one-ZADD script beside batched joins) is
# bench/redis/batch.sh, and memory per waiting place is the `memory_per_place` test
# (`cargo test --test redis_batch memory_per_place -- --ignored --nocapture`): both follow
# the current key layout, which a hand-written EVALSHA here would have to copy.
echo "== script-level yardstick: bench/redis/batch.sh; memory per place: the memory_per_place test"
