#!/bin/bash
# What the server's threads do during an open-loop join run:
#   bench/stall_trace.sh BIN_DIR DURABILITY PREFILL OUT_DIR
# starts BIN_DIR/waitroom with fjall's and the store's debug log (OUT_DIR/server.log),
# samples every thread's CPU and run-queue wait every 100 ms (OUT_DIR/threads.log, from
# /proc/PID/task/*/schedstat: "name=cpu_ms/runqueue_ms"), and drives it with
# BIN_DIR/waitroom-bench at 10,000 joins/s (OUT_DIR/bench.out, its timeline over 5 ms;
# OUT_DIR/bench.end is when it ended, so the measured window is the 10 s before).
set -eu
B=$1; DUR=$2; PF=$3; D=$4
mkdir -p "$D"
PORT=$((18500 + RANDOM % 400))
RUST_LOG=${RUST_LOG:-info,waitroom::store=debug,fjall=debug,lsm_tree=debug} "$B/waitroom" serve \
  --listen 127.0.0.1:$PORT --no-demo --data-dir "$D/data" --durability "$DUR" --admin-token tok \
  --joins-per-minute 100000000 --polls-per-second 1000000 --max-connections-per-client 100000 \
  > "$D/server.out" 2> "$D/server.log" &
SP=$!
for _ in $(seq 100); do grep -q listening "$D/server.out" 2>/dev/null && break; sleep 0.1; done
python3 "$(dirname "$0")/thread_sched.py" $SP 0.1 > "$D/threads.log" &
TP=$!
"$B/waitroom-bench" run --url http://127.0.0.1:$PORT --admin-token tok --scenario join \
  --rate "${RATE:-10000}" --connections 128 --duration 10 --timeline 5 --prefill "$PF" \
  > "$D/bench.out" 2> "$D/bench.err"
date -u +%H:%M:%S.%N > "$D/bench.end"
kill $SP; wait $SP || true; kill $TP 2>/dev/null || true
