#!/usr/bin/env bash
# Tail latency at scale (issue 10, item 5), two builds side by side, alternating:
# joins at 10,000/s open loop into an event that already holds 500,000 places (sync and
# relaxed), and status polls at 40,000/s over 500,000 places. With `perf` (root), each
# server's journal syncs (fdatasync) are traced too and summarised.
#
#   bench/tail.sh BEFORE_DIR AFTER_DIR [ROUNDS]
#
# Each DIR holds a `waitroom` and a `waitroom-bench` release binary (copy them out of
# target/release first so no other build replaces them). Outputs go to target/tail/.
set -euo pipefail
BEFORE=$1 AFTER=$2 ROUNDS=${3:-3}
OUT=target/tail
mkdir -p "$OUT"
summarise() {
  python3 - "$1" <<'PY'
import re, sys
t = sorted(float(m.group(1)) for l in open(sys.argv[1])
           if (m := re.search(r'\(\s*([\d.]+) ms\): waitroom-journ\S* fdatasync', l)))
if not t:
    sys.exit()
n = len(t); q = lambda x: t[min(n - 1, int(x * n))]
print(f"  fdatasync n={n} p50 {q(.5):.2f} p90 {q(.9):.2f} p99 {q(.99):.2f} "
      f"p99.9 {q(.999):.2f} max {t[-1]:.1f} ms; >20 ms: {sum(v > 20 for v in t)}, "
      f">100 ms: {sum(v > 100 for v in t)}; total {sum(t) / 1000:.1f} s")
PY
}
one() { # DIR NAME ARGS...
  local dir=$1 name=$2; shift 2
  "$dir/waitroom-bench" run --bin "$dir/waitroom" "$@" > "$OUT/$name.txt" 2>&1 &
  local b=$! t=
  if command -v perf > /dev/null; then
    sleep 1
    local s; s=$(pgrep -P $b waitroom | head -1 || true)
    if [ -n "$s" ]; then
      perf trace -p "$s" -e fdatasync -o "$OUT/$name.trace" 2> /dev/null &
      t=$!
    fi
  fi
  wait $b
  if [ -n "$t" ]; then sleep 0.5; kill -INT $t 2> /dev/null || true; wait $t 2> /dev/null || true; fi
  echo "$name:"
  grep -E '^\| (join|status) \(' "$OUT/$name.txt" || tail -3 "$OUT/$name.txt"
  [ -f "$OUT/$name.trace" ] && summarise "$OUT/$name.trace"
  return 0
}
echo "| phase | conns | target/s | achieved/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | service p99 ms | send lag p99 ms | errors | cpu server | cpu bench | cpu other | bench µs/req |"
for r in $(seq "$ROUNDS"); do
  for d in sync relaxed; do
    for side in before after; do
      dir=$BEFORE; [ $side = after ] && dir=$AFTER
      one "$dir" "join-$d-$side-$r" --scenario join --durability $d --rate 10000 \
        --prefill 500000 --connections 128 --duration 10 --timeline 5
    done
  done
  for side in before after; do
    dir=$BEFORE; [ $side = after ] && dir=$AFTER
    one "$dir" "status-$side-$r" --scenario status --durability sync --rate 40000 \
      --places 500000 --connections 128 --duration 10 --timeline 5
  done
done
