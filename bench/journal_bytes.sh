#!/bin/bash
# Journal bytes written per join, and the journal's and the memtables' rotations, in an
# open loop of joins (docs/PERFORMANCE.md, "The event's counters apart from its settings").
#   bench/journal_bytes.sh BIN_DIR DURABILITY RATE [SECONDS]
# Starts BIN_DIR/waitroom on a fresh data dir (fjall's debug log kept), drives it with
# BIN_DIR/waitroom-bench at RATE joins/s, and samples the bytes written to the journals
# (past the zeros ahead of the appends) every second; prints the bytes per join over the
# measured window and what fjall rotated.
set -eu
B=$1; DUR=$2; RATE=$3; SECS=${4:-10}
D=$(mktemp -d)
PORT=$((18900 + RANDOM % 400))
RUST_LOG=info,fjall=debug "$B/waitroom" serve --listen 127.0.0.1:$PORT --no-demo \
  --data-dir "$D/data" --durability "$DUR" --admin-token tok \
  --joins-per-minute 100000000 --polls-per-second 1000000 --max-connections-per-client 100000 \
  > "$D/server.out" 2> "$D/server.log" &
SP=$!
for _ in $(seq 100); do grep -q listening "$D/server.out" 2>/dev/null && break; sleep 0.1; done
python3 - "$D/data/store" > "$D/bytes.log" <<'PY' &
import glob, os, sys, time
def end(p):
    with open(p, "rb") as f:
        f.seek(0, 2); e = f.tell()
        while e > 0:
            s = max(0, e - 65536); f.seek(s); b = f.read(e - s).rstrip(b"\0")
            if b: return s + len(b)
            e = s
    return 0
seen = {}
while True:
    for p in glob.glob(sys.argv[1] + "/*.jnl"):
        try: seen[p] = end(p)
        except OSError: pass
    print(f"{time.time():.3f} {sum(seen.values())}", flush=True)
    time.sleep(1)
PY
PP=$!
"$B/waitroom-bench" run --url http://127.0.0.1:$PORT --admin-token tok --scenario join \
  --rate "$RATE" --connections 128 --duration "$SECS" --warmup 1 > "$D/bench.out" 2>&1 &
BP=$!
# The measured window: after the warm-up, SECS seconds.
sleep 3; A=$(tail -1 "$D/bytes.log"); sleep $((SECS - 4)); Z=$(tail -1 "$D/bytes.log")
wait $BP; kill $PP; kill $SP; wait $SP 2>/dev/null || true
python3 - "$A" "$Z" "$RATE" <<'PY'
import sys
(t0, b0), (t1, b1) = [map(float, a.split()) for a in sys.argv[1:3]]
rate = float(sys.argv[3])
print(f"journal bytes per join: {(b1 - b0) / ((t1 - t0) * rate):.0f} ({(b1 - b0) / (t1 - t0) / 1e6:.2f} MB/s over {t1 - t0:.1f} s at {rate:.0f} joins/s)")
PY
grep -E '^\| join' "$D/bench.out" || true
echo "memtable rotations: $(grep 'Rotating keyspace' "$D/server.log" | grep -o '"[a-z]*"' | sort | uniq -c | tr -s ' ' | tr '\n' ' ')"
echo "journal rotations: $(grep -c 'Rotating active journal' "$D/server.log")"
rm -rf "$D"
