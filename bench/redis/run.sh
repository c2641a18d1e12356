#!/usr/bin/env bash
# Benchmarks of the Redis backend, reported in docs/perf-redis.md:
#   1. join and status requests/s over HTTP with one node, then two nodes, on one Redis;
#   2. the physical limit beside it: redis-benchmark running the same script (EVALSHA of
#      the join and status operations) on the same Redis;
#   3. Redis commands and round trips per join and per status (INFO commandstats deltas);
#   4. Redis memory per waiting place (INFO memory used_memory over PLACES places).
#
# Needs the release binary (cargo build --release --bin waitroom), redis-server, redis-cli,
# redis-benchmark (Debian: redis-server), wrk (Debian: wrk), curl, openssl, python3.
# Everything runs on loopback and is stopped at the end.
#
#   bench/redis/run.sh                      # defaults below
#   DUR=5 CONNS=32 PLACES=20000 bench/redis/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/bench/redis"
BIN=${BIN:-$ROOT/target/release/waitroom}
DUR=${DUR:-10}          # seconds of each measured HTTP phase
CONNS=${CONNS:-64}      # HTTP connections in all (split evenly over the nodes)
THREADS=${THREADS:-2}   # wrk threads in all
RB_N=${RB_N:-200000}    # redis-benchmark requests per script phase
PLACES=${PLACES:-100000} # places for the memory measurement
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
    awk -F'[:=,]' '$1 == "cmdstat_evalsha" { printf "    Redis time per script run: %s us\n", $7 }' "$2"
}

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); redis $(redis-server --version | awk '{print $3}')"

start_node n1
NODES=("$NODE_URL")
put_event "$NODE_URL" bench
put_event "$NODE_URL" rb
put_event "$NODE_URL" mem
put_event "$NODE_URL" memu

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

echo "== redis-benchmark: the same script straight on Redis, 64 connections, $RB_N requests"
SHA=$(R script load "$(cat "$ROOT/src/store/redis/lua/rules.lua" "$ROOT/src/store/redis/lua/ops.lua")")
keys() { local e=$1; for s in m p u q ws ad as ae t to w md l; do printf 'wr:{%s}:%s ' "$e" "$s"; done; }
NOW=$(date +%s%3N)
# rb_phase LABEL COMMAND...: redis-benchmark of one command; prints its rate and Redis's CPU.
rb_phase() {
    local label=$1 r0 t0 t1 out
    shift
    r0=$(ticks "$REDIS_PID")
    t0=$(date +%s%N)
    out=$(redis-benchmark -p "$PORT" -c 64 -n "$RB_N" -r 1000000000 -q "$@" | tr '\r' '\n' | tail -1)
    t1=$(date +%s%N)
    printf '  %-7s %10.0f req/s  (%s; CPU: redis %d%%)\n' "$label" \
        "$(echo "$out" | sed -E 's/.*: ([0-9.]+) requests per second.*/\1/')" \
        "$(echo "$out" | sed -E 's/.*(p50=[0-9.]+ msec).*/\1/')" \
        "$(( ($(ticks "$REDIS_PID") - r0) * 100 * 1000000000 / CLK / (t1 - t0) ))"
}
# shellcheck disable=SC2046
rb_phase join EVALSHA "$SHA" 13 $(keys rb) join "$NOW" 0000__rand_int__ 0 "" 0 ""
MID=$(( $(R zcard 'wr:{rb}:q') / 2 ))
SEQ=$(R zrange 'wr:{rb}:q' "$MID" "$MID")
NONCE=$(R hget 'wr:{rb}:p' "$SEQ" | cut -c1-16)
# shellcheck disable=SC2046
rb_phase status EVALSHA "$SHA" 13 $(keys rb) status "$NOW" "$SEQ" "$NONCE"
rb_phase PING PING

echo "== Redis memory per waiting place ($PLACES places)"
mem() { R info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }
for ev in mem memu; do
    before=$(mem)
    if [ "$ev" = mem ]; then
        # shellcheck disable=SC2046
        redis-benchmark -p "$PORT" -c 32 -n "$PLACES" -r 1000000000 -q \
            EVALSHA "$SHA" 13 $(keys mem) join "$NOW" 0000__rand_int__ 0 "" 0 "" >/dev/null
        what="anonymous"
    else
        # shellcheck disable=SC2046
        redis-benchmark -p "$PORT" -c 32 -n "$PLACES" -r 1000000000 -q \
            EVALSHA "$SHA" 13 $(keys memu) join "$NOW" 0000__rand_int__ 1 user-__rand_int__ 0 "" >/dev/null
        what="with a 17-byte user id"
    fi
    after=$(mem)
    n=$(R zcard "wr:{$ev}:q")
    printf '  %-24s %8d places  %6.0f bytes each\n' "$what" "$n" "$(python3 -c "print(($after - $before) / $n)")"
done

echo "== the longest single script: clearing a queue of $PLACES places (Redis serves nothing else meanwhile)"
R config resetstat >/dev/null
# shellcheck disable=SC2046
R evalsha "$SHA" 13 $(keys mem) clear "$NOW" >/dev/null
usec=$(R info commandstats | tr -d '\r' | awk -F'[:=,]' '$1 == "cmdstat_evalsha" { print $5 }')
printf '  one EVALSHA, %d ms of Redis time (%.1f us per place)\n' "$((usec / 1000))" \
    "$(python3 -c "print($usec / $PLACES)")"
