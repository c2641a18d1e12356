#!/bin/bash
# The open-loop generator's own cost per request, two generators against one server:
# status at RATE/s, `perf stat` on the bench process for 5 s inside the measured window
# (CPU, context switches and syscalls per request), the generators alternately.
#
#   OLD=/tmp/wr-s23 NEW=/tmp/gen-after bench/gen_cost.sh [ROUNDS] [RATE] [extra run flags…]
#
# OLD and NEW each hold a `waitroom-bench`; the server is $SERVER (default
# $OLD/waitroom). Needs `perf` (as root, or with perf_event_paranoid ≤ 1).
set -eu
OLD=${OLD:?a directory with the old waitroom-bench}
NEW=${NEW:?a directory with the new waitroom-bench}
SERVER=${SERVER:-$OLD/waitroom}
ROUNDS=${1:-2}
RATE=${2:-10000}
shift $(($# < 2 ? $# : 2))
OUT=$(mktemp -d /tmp/gen-cost.XXXXXX)
for r in $(seq "$ROUNDS"); do
  for g in old new; do
    dir=$OLD; [ $g = new ] && dir=$NEW
    f=$OUT/$g-$RATE-$r
    "$dir/waitroom-bench" run --bin "$SERVER" --scenario status --rate "$RATE" \
      --connections 128 --duration 10 "$@" > "$f.txt" 2> "$f.err" &
    bp=$!
    until grep -q 'pre-joining' "$f.err" 2> /dev/null; do sleep 0.2; done
    sleep 5   # the pre-join of 10,000 places and the 1 s warm-up
    perf stat -x, -e task-clock,context-switches,raw_syscalls:sys_enter -p $bp -- sleep 5 2> "$f.stat"
    wait $bp
    echo "$g round $r, load $(cut -d' ' -f1 /proc/loadavg): $(grep -E '^\| status' "$f.txt")"
    awk -F, -v rate="$RATE" '{v=$1/(rate*5); if ($3 ~ /task-clock/) v=v*1000; printf "   %s per request: %.2f\n", $3, v}' "$f.stat"
  done
done
echo "(outputs in $OUT; task-clock per request is in µs)"
