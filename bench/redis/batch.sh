#!/usr/bin/env bash
# Issue 13 (batched joins): side by side in one run, on one private redis-server,
#   1. the yardstick: redis-benchmark running EVALSHA of a script of one ZADD (before and
#      after the waitroom phases, to bracket the machine's noise);
#   2. for each binary (BASE_BIN, if given, then BIN): one fresh node on that Redis, the
#      closed-loop join scenario of waitroom-bench (CONNS connections, DUR seconds): join/s
#      and p99; from INFO commandstats deltas, Redis commands, script calls and Redis time
#      per join; the CPU of Redis and of the node; then the same joins in open loop at RATE
#      per second (below both binaries' maxima), whose p99 compares the latency of the two
#      at the same load (a closed loop's p99 is taken at different rates).
# REDIS_CPU=25 caps Redis at 25 % of one core (bench/redis/lib.sh `redis_cap`, needs root; keep
# each yardstick phase ~10 s, the default RB_N at 25 %: a phase of ~1 s came out cheaper per
# call and gave a lower ratio, see docs/PERFORMANCE.md):
# every phase is then bounded by Redis, as on a machine whose nodes have cores to spare, and
# join/s ÷ yardstick calls/s is the ratio of what a join and a yardstick call cost Redis.
# Each yardstick line gives Redis's CPU per call (user + system, from /proc) and each join
# phase its CPU per join; the last line gives join/s ÷ the mean of the two yardstick phases.
# (INFO commandstats' time per call, also printed, counts the time a capped Redis waits
# throttled: read /proc's CPU instead when capped.)
# Memory per waiting place is measured apart (the layout does not depend on batching):
#   cargo test --test redis_batch memory_per_place -- --ignored --nocapture
#
# Needs release binaries (cargo build --release --bin waitroom --bin waitroom-bench),
# redis-server, redis-cli, redis-benchmark, curl, openssl, python3. Loopback only; everything
# is stopped at the end.
#
#   bench/redis/batch.sh
#   BASE_BIN=/path/to/waitroom-before DUR=10 CONNS=64 bench/redis/batch.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${BIN:-$ROOT/target/release/waitroom}
BENCH=${BENCH:-$(dirname "$BIN")/waitroom-bench}
BASE_BIN=${BASE_BIN:-}
DUR=${DUR:-10}          # seconds of each measured join phase
CONNS=${CONNS:-64}      # HTTP connections
RB_N=${RB_N:-300000}    # redis-benchmark requests per yardstick phase
RATE=${RATE:-3000}      # joins/s of the open-loop latency phase (0: none)
REDIS_CPU=${REDIS_CPU:-}  # percent of one core Redis may use (empty: no cap)
ADMIN=bench-admin

# shellcheck source=bench/redis/lib.sh
source "$ROOT/bench/redis/lib.sh"
redis_start waitroom-batch-bench
if [ -n "$REDIS_CPU" ]; then redis_cap "$REDIS_CPU"; fi
CLK=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
now_ns() { date +%s%N; }

echo "== machine: $(nproc) cores; uptime:$(uptime | sed 's/.*up/ up/'); redis $(redis-server --version | awk '{print $3}')${REDIS_CPU:+; Redis capped at $REDIS_CPU % of a core}"
YARD=()      # each yardstick phase's calls/s
RESULTS=()   # "label join/s redis-us-per-join"

# The yardstick: a script of one ZADD, straight on Redis, 64 connections.
ZSHA=$(R script load "return redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])")
yardstick() {
    R config resetstat >/dev/null
    local r0 t0 t1 out
    r0=$(ticks "$REDIS_PID")
    t0=$(now_ns)
    out=$(redis-benchmark -p "$PORT" -c 64 -n "$RB_N" -r 1000000000 -q \
        EVALSHA "$ZSHA" 1 zb __rand_int__ m__rand_int__ | tr '\r' '\n' | grep 'requests per second' | tail -1)
    t1=$(now_ns)
    local usec rate rticks
    usec=$(R info commandstats | tr -d '\r' | awk -F'[:=,]' '$1 == "cmdstat_evalsha" { print $7 }')
    rate=$(echo "$out" | sed -E 's/.*: ([0-9.]+) requests per second.*/\1/')
    rticks=$(($(ticks "$REDIS_PID") - r0))
    YARD+=("$rate")
    printf '  redis-benchmark, EVALSHA of one ZADD: %10.0f calls/s  (%s; Redis CPU %d%%, %.1f us per call; %s us of Redis time per call in the script)\n' \
        "$rate" "$(echo "$out" | sed -E 's/.*(p50=[0-9.]+ msec).*/\1/')" \
        "$((rticks * 100 * 1000000000 / CLK / (t1 - t0)))" \
        "$(awk -v t="$rticks" -v c="$CLK" -v n="$RB_N" 'BEGIN { print t * 1e6 / c / n }')" "$usec"
    R del zb >/dev/null
}

joins_total() {
    curl -sf -H "Authorization: Bearer $ADMIN" "$1/metrics" |
        awk '/^waitroom_joins_total/ { s += $NF } END { printf "%d\n", s }'
}

# measure LABEL BINARY: one fresh node of BINARY on the (flushed) Redis, the join scenario.
measure() {
    local label=$1 bin=$2
    R flushall >/dev/null
    "$bin" serve --listen 127.0.0.1:0 --store "redis://127.0.0.1:$PORT" \
        --signing-key "$WORK/key.pem" --admin-token "$ADMIN" --no-demo --rate-limits off \
        --data-dir "$WORK/$label" >"$WORK/$label.out" 2>"$WORK/$label.err" &
    NODE_PID=$!
    until grep -q '^listening on' "$WORK/$label.out" 2>/dev/null; do sleep 0.05; done
    local url
    url=$(sed -n 's/^listening on //p' "$WORK/$label.out")
    R config resetstat >/dev/null
    local j0 r0 n0 t0 t1 j1
    j0=$(joins_total "$url")
    r0=$(ticks "$REDIS_PID")
    n0=$(ticks "$NODE_PID")
    t0=$(now_ns)
    "$BENCH" run --url "$url" --admin-token "$ADMIN" --scenario join --connections "$CONNS" \
        --duration "$DUR" --warmup 1 >"$WORK/$label.bench" 2>&1
    t1=$(now_ns)
    j1=$(joins_total "$url")
    local rcpu ncpu
    rcpu=$(( ($(ticks "$REDIS_PID") - r0) * 100 * 1000000000 / CLK / (t1 - t0) ))
    ncpu=$(( ($(ticks "$NODE_PID") - n0) * 100 * 1000000000 / CLK / (t1 - t0) ))
    R info commandstats | tr -d '\r' | grep '^cmdstat_' >"$WORK/$label.stats"
    local rus
    rus=$(awk -v t="$(($(ticks "$REDIS_PID") - r0))" -v c="$CLK" -v n="$((j1 - j0))" 'BEGIN { printf "%.1f", t * 1e6 / c / n }')
    if [ "$RATE" != 0 ]; then
        "$BENCH" run --url "$url" --admin-token "$ADMIN" --scenario join --connections "$CONNS" \
            --duration "$DUR" --warmup 1 --rate "$RATE" >"$WORK/$label.rate" 2>&1
    fi
    kill "$NODE_PID"
    wait "$NODE_PID" 2>/dev/null || true
    NODE_PID=""
    local row
    row=$(grep '^| join' "$WORK/$label.bench" | tail -1)
    local jps
    jps=$(echo "$row" | awk -F'|' '{gsub(/[ ,]/, "", $4); print $4}')
    RESULTS+=("$label $jps $rus")
    # The closed loop's row: | phase | conns | req/s | p50 | p90 | p99 | p99.9 | ...
    echo "  $label: $(echo "$row" | awk -F'|' '{gsub(/ /, "", $4); gsub(/ /, "", $7); printf "%s join/s, p99 %s ms", $4, $7}')  (Redis CPU ${rcpu}%, $rus us per join; node CPU ${ncpu}%)"
    if [ "$RATE" != 0 ]; then
        row=$(grep '^| join' "$WORK/$label.rate" | tail -1)
        echo "    open loop at $RATE joins/s: $(echo "$row" | awk -F'|' '{for (i = 5; i <= 13; i++) gsub(/ /, "", $i); printf "%s join/s, p50 %s ms, p99 %s ms (service p99 %s ms, send lag p99 %s ms), errors %s", $5, $6, $8, $11, $12, $13}')"
    fi
    local joins=$((j1 - j0))
    awk -F'[:=,]' -v n="$joins" '
        { sub("cmdstat_", "", $1); total += $3; calls[$1] = $3; usec[$1] = $5 }
        END {
            printf "    per join (%d joins): %.2f Redis commands, %.3f script calls, %.1f us of Redis time in scripts\n",
                n, total / n, (calls["fcall"] + calls["evalsha"] + calls["eval"]) / n, (usec["fcall"] + usec["evalsha"] + usec["eval"]) / n
            for (c in calls) if (calls[c] / n >= 0.01) printf "      %-12s %6.3f\n", c, calls[c] / n
        }' "$WORK/$label.stats"
}

echo "== one node, one Redis; join scenario, $CONNS connections, ${DUR}s; the yardstick around it"
yardstick
if [ -n "$BASE_BIN" ]; then measure before "$BASE_BIN"; fi
measure after "$BIN"
yardstick
for r in "${RESULTS[@]}"; do
    read -r label jps rus <<<"$r"
    if [ -z "$rus" ] || [ "${#YARD[@]}" -lt 2 ] || [ -z "${YARD[0]}" ] || [ -z "${YARD[1]}" ]; then
        echo "$label: a phase's figures could not be read (see above)" >&2
        continue
    fi
    awk -v l="$label" -v j="$jps" -v a="${YARD[0]}" -v b="${YARD[1]}" -v u="$rus" \
        'BEGIN { printf "%s: join/s ÷ yardstick calls/s = %.2f (%.0f ÷ %.0f, the mean of the two phases); %s us of Redis CPU per join\n", l, j / ((a + b) / 2), j, (a + b) / 2, u }'
done
