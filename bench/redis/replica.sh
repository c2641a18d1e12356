#!/usr/bin/env bash
# Issue 13 figures, reported in docs/PERFORMANCE.md ("Status from node-local replicas"):
#   1. status requests/s (waitroom-bench, closed loop) on one node of each kind, interleaved
#      round by round in one run: the embedded store; a Redis node with its replica
#      (`--redis-replica on`, the default); a Redis node without (`off`: one script per
#      status, as before);
#   2. Redis commands per status of both Redis nodes, from `INFO commandstats` deltas taken
#      during the measured window and divided by the node's own count of status requests
#      (its /metrics), so pre-joins and warm-up are left out;
#   3. the replica's staleness across nodes: node A takes joins as fast as wrk sends them
#      while node B serves a status load and follows the same event; B's
#      `waitroom_replica_lag_seconds` summary (operation time on A -> entry applied on B).
#
# Needs the release binaries (cargo build --release --bins), redis-server, redis-cli, wrk,
# curl, openssl, python3. Everything runs on loopback and is stopped at the end.
#
#   bench/redis/replica.sh                        # defaults below
#   ROUNDS=2 DUR=3 bench/redis/replica.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/bench/redis"
BIN=${BIN:-$ROOT/target/release/waitroom}
BENCH=${BENCH:-$ROOT/target/release/waitroom-bench}
DUR=${DUR:-5}           # seconds of each measured status phase
CONNS=${CONNS:-64}      # connections of the status load
PLACES=${PLACES:-2000}  # places polled at random
ROUNDS=${ROUNDS:-3}
LAGDUR=${LAGDUR:-10}    # seconds of the staleness phase
ADMIN=bench-admin

# shellcheck source=bench/redis/lib.sh
source "$ROOT/bench/redis/lib.sh"
redis_start waitroom-replica-bench

# start_node NAME ARGS…: a node (rate limits off: the load comes from one address); sets
# NODE_URL.
start_node() {
    local name=$1
    shift
    "$BIN" serve --listen 127.0.0.1:0 --signing-key "$WORK/key.pem" --admin-token "$ADMIN" \
        --no-demo --rate-limits off --data-dir "$WORK/$name" "$@" \
        >"$WORK/$name.out" 2>"$WORK/$name.err" &
    PIDS+=($!)
    until grep -q '^listening on' "$WORK/$name.out" 2>/dev/null; do sleep 0.05; done
    NODE_URL=$(sed -n 's/^listening on //p' "$WORK/$name.out")
}

# Redis commands so far (INFO itself left out), and script calls (round trips) so far.
calls() { R info commandstats | tr -d '\r' | awk -F'[:=,]' '/^cmdstat_/ && $1 != "cmdstat_info" { t += $3 } END { print t + 0 }'; }
scripts() { R info commandstats | tr -d '\r' | awk -F'[:=,]' '$1 == "cmdstat_fcall" || $1 == "cmdstat_evalsha" { n += $3 } END { print n + 0 }'; }
statuses() {
    curl -sf "$1/metrics" | awk '/^waitroom_http_requests_total/ && /route="\/api\/v1\/queue\/status"/ { t += $NF } END { print t + 0 }'
}

# status_phase URL: runs waitroom-bench's status scenario; prints its requests/s. With
# COUNT=1 also prints Redis commands per status, sampled over the middle of the window.
status_phase() {
    local url=$1 out="$WORK/bench-$RANDOM.txt"
    "$BENCH" run --url "$url" --admin-token "$ADMIN" --scenario status --connections "$CONNS" \
        --duration "$DUR" --places "$PLACES" >"$out" 2>&1 &
    local pid=$! per=""
    if [ "${COUNT:-0}" = 1 ]; then
        # Wait for the status load to start (after the pre-joins), then sample.
        local s0
        s0=$(statuses "$url")
        until [ "$(statuses "$url")" -gt $((s0 + 1000)) ]; do sleep 0.1; done
        sleep 1.5
        local c1 e1 s1 c2 e2 s2
        c1=$(calls); e1=$(scripts); s1=$(statuses "$url")
        sleep 2
        c2=$(calls); e2=$(scripts); s2=$(statuses "$url")
        per=$(python3 -c "print(f'{($c2 - $c1) / max($s2 - $s1, 1):.3f}/{($e2 - $e1) / max($s2 - $s1, 1):.4f}')")
    fi
    wait "$pid"
    local rate
    # The table row of the phase: | status (external) | conns | req/s | …
    rate=$(awk -F'|' '/^\| status/ { gsub(/[ ,]/, "", $4); print $4; exit }' "$out")
    [ -n "$rate" ] || { cat "$out"; exit 1; }
    echo "$rate $per"
}

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); redis $(redis-server --version | awk '{print $3}')"
start_node emb
EMB=$NODE_URL
start_node on --store "redis://127.0.0.1:$PORT" --redis-replica on
ON=$NODE_URL
start_node off --store "redis://127.0.0.1:$PORT" --redis-replica off
OFF=$NODE_URL

echo "== status, closed loop, $CONNS connections, $PLACES places, ${DUR} s per phase"
printf '%-6s %12s %16s %16s %10s %10s\n' round embedded "redis replica" "redis script" "on/emb" "off/emb"
for r in $(seq 1 "$ROUNDS"); do
    read -r e _ <<<"$(status_phase "$EMB")"
    read -r on per_on <<<"$(COUNT=1 status_phase "$ON")"
    read -r off per_off <<<"$(COUNT=1 status_phase "$OFF")"
    printf '%-6s %12s %16s %16s %10s %10s\n' "$r" "$e" "$on" "$off" \
        "$(python3 -c "print(f'{$on / $e:.2f}')")" "$(python3 -c "print(f'{$off / $e:.2f}')")"
    echo "       Redis commands/script calls per status: replica $per_on, script $per_off"
done

echo "== staleness: joins on node A (wrk -c16), node B follows the event under a status load"
start_node b --store "redis://127.0.0.1:$PORT" --redis-replica on
B=$NODE_URL
A=$ON
curl -sf -X PUT -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
    -d '{"paused": true, "max_active": 1, "waiting_idle_sec": 2592000}' \
    "$A/api/v1/admin/events/bench" >/dev/null
TOKEN=$(curl -sf -X POST -H 'Content-Type: application/json' -d '{"event_id":"bench"}' \
    "$A/api/v1/queue/join" | python3 -c 'import json,sys; print(json.load(sys.stdin)["waiting_token"])')
# B polls one place of the event (its replica follows the event) …
(while true; do curl -sf "$B/api/v1/queue/status?token=$TOKEN" >/dev/null; sleep 0.2; done) &
PIDS+=($!)
sleep 1
# … and serves a status load of its own while A takes joins.
"$BENCH" run --url "$B" --admin-token "$ADMIN" --scenario status --connections 32 \
    --duration "$LAGDUR" --places 1000 >"$WORK/lag-status.txt" 2>&1 &
LOADPID=$!
sleep 2
wrk -t1 -c16 -d"$((LAGDUR - 3))s" -s "$HERE/join.lua" "$A" >"$WORK/lag-join.txt" 2>&1
wait "$LOADPID"
echo "  joins on A: $(awk '/^Requests\/sec:/ {print $2}' "$WORK/lag-join.txt") req/s; status on B: $(awk -F'|' '/^\| status/ { gsub(/[ ,]/, "", $4); print $4; exit }' "$WORK/lag-status.txt") req/s"
echo "  B's waitroom_replica_lag_seconds:"
curl -sf "$B/metrics" | grep '^waitroom_replica_lag_seconds' | sed 's/^/    /'
curl -sf "$B/metrics" | grep -E '^waitroom_replica_(status|resyncs)_total' | sed 's/^/    /'
echo "== machine after: load $(cut -d' ' -f1-3 /proc/loadavg)"
