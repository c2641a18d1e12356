#!/usr/bin/env bash
# What deleting a large event does to the other events' writes (docs/PERFORMANCE.md,
# "Deleting a large event"):
#
#   bench/delete_stall.sh BIN_DIR [PLACES] [RATE]      (defaults: 600000 places, 2000 joins/s)
#
# Starts BIN_DIR/waitroom (`relaxed`, no demo) on a free port in a temp dir, fills one event
# with PLACES places (BIN_DIR/waitroom-bench's prefill), then runs joins into another event
# at RATE per second (open loop) for 8 s, during which the big event is deleted (by the
# filling run's own clean-up, 2 s in). Prints the joins' latency (the open loop's table:
# p99, p99.9, max), the 100 ms windows with a join slower than 20 ms, and the store's slow
# writes from the server's log (`a journal write took long`: over 50 ms).
set -euo pipefail
B=$1; PLACES=${2:-600000}; RATE=${3:-2000}
tmp=$(mktemp -d)
cleanup() { [ -n "${SP:-}" ] && kill "$SP" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
RUST_LOG=info "$B/waitroom" serve --listen "127.0.0.1:$PORT" --no-demo --data-dir "$tmp/data" \
    --durability relaxed --admin-token tok --joins-per-minute 100000000 \
    --polls-per-second 1000000 --max-connections-per-client 100000 > "$tmp/out" 2> "$tmp/log" &
SP=$!
for _ in $(seq 100); do grep -q listening "$tmp/out" 2>/dev/null && break; sleep 0.1; done
# waitroom-bench fills its event, joins into it for the measured second, then deletes it:
# that deletion is the one measured, while a second run joins into an event of its own.
echo "filling an event with $PLACES places…"
"$B/waitroom-bench" run --url "$URL" --admin-token tok --scenario join --prefill "$PLACES" \
    --duration 2 > "$tmp/fill" 2>&1 &
FP=$!
until curl -s -H 'Authorization: Bearer tok' "$URL/api/v1/admin/events" | python3 -c "
import json, sys
sys.exit(0 if any(e.get('waiting', 0) >= $PLACES for e in json.load(sys.stdin)) else 1)"; do
    sleep 0.5
done
"$B/waitroom-bench" run --url "$URL" --admin-token tok --scenario join --rate "$RATE" \
    --connections 64 --duration 8 --timeline 20 > "$tmp/bench" 2>&1 &
BP=$!
wait "$FP" || { grep -v '^ ' "$tmp/fill" | head -5; exit 1; }
wait "$BP"
echo "joins into another event, ${RATE}/s, during the fill's last seconds and the deletion:"
grep -E '^\| (phase|join)' "$tmp/bench" | head -2
echo "100 ms windows with a join slower than 20 ms:"
grep -E '^\| [0-9.]+ \|' "$tmp/bench" || echo "  none"
echo "slow store writes (the store logs those over 50 ms):"
grep 'a journal write took long' "$tmp/log" | grep -oE 'ms=[0-9]+ changes=[0-9]+' || echo "  none"
