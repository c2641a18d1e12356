#!/bin/bash
# One 5 s closed-loop phase (64 connections, `sync`) with threads pinned to CPUs from
# outside, to see whether where the threads run bounds a phase. Prints requests/s.
#
#   bench/pin_threads.sh B SCENARIO MODE
#
# MODE: none (as the scheduler places them); sw (the server's two runtime workers on
# CPUs 0 and 1); split (that, and the generator's two workers on CPUs 0 and 1 too).
# B holds `waitroom` and `waitroom-bench` of one build. Pinned about 0.4 s after start,
# within the generator's warm-up.
set -u
B=$1; SC=$2; MODE=$3
OUT=$(mktemp)
"$B/waitroom-bench" run --bin "$B/waitroom" --scenario "$SC" --durability sync \
    --connections 64 --duration 5 > "$OUT" 2>&1 &
BP=$!
# Whatever happens, the generator, the server it started (a killed generator leaves it
# running) and the table go.
trap 'kill $BP $SP 2>/dev/null; rm -f "$OUT"' EXIT
SP=
for _ in $(seq 1 50); do
    SP=$(pgrep -P $BP -f waitroom | head -1)
    [ -n "$SP" ] && break
    sleep 0.05
done
sleep 0.4
workers() { for t in /proc/"$1"/task/*; do [ "$(cat "$t"/comm)" = tokio-rt-worker ] && basename "$t"; done; }
mapfile -t gw < <(workers $BP)
mapfile -t sw < <([ -n "$SP" ] && workers "$SP")
if [ "$MODE" != none ] && { [ ${#sw[@]} -lt 2 ] || [ ${#gw[@]} -lt 2 ]; }; then
    echo "pin_threads: did not find two runtime workers each in the generator and its server" >&2
    exit 1
fi
pin() { taskset -pc "$1" "$2" > /dev/null; }
case $MODE in
    sw) pin 0 "${sw[0]}"; pin 1 "${sw[1]}" ;;
    split) pin 0 "${sw[0]}"; pin 1 "${sw[1]}"; pin 0 "${gw[0]}"; pin 1 "${gw[1]}" ;;
esac
wait $BP
grep "^| $SC" "$OUT" | awk -F'|' '{gsub(/[ ,]/,"",$4); print $4}'
