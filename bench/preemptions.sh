#!/bin/bash
# Who takes the CPU from whom during one `waitroom-bench run` phase: every involuntary
# context switch (the thread was still runnable) over 1 s in the middle of a 10 s phase,
# counted by the pair (thread preempted, thread that ran next), with each thread named by
# its process (srv- for the server, bench- for the load generator). On 2 shared cores the
# server's workers, its journal thread and the generator's workers take turns; this tells
# which wake-ups cut into the server's work.
#
#   bench/preemptions.sh B sync join                 # closed loop, 64 connections
#   bench/preemptions.sh B sync healthz
#   bench/preemptions.sh B sync join --connections 256
#
# B is a directory holding `waitroom` and `waitroom-bench` (a release build copied out of
# target/). Needs perf with the sched tracepoints (root, or perf_event_paranoid <= 1).
set -euo pipefail
B=$1; MODE=$2; SC=$3; shift 3
# shellcheck source=bench/phase.sh
. "$(dirname "$0")/phase.sh"
start_phase "$B" "$MODE" "$SC" "$@"
sleep 5
ps -eLo pid,tid,comm | awk -v s="$SP" -v b="$BP" \
    '$1==s {print $2, "srv-" $3} $1==b {print $2, "bench-" $3}' > "$OUT/tids"
perf record -q -e sched:sched_switch -a -o "$OUT/perf.data" -- sleep 1 > /dev/null 2>&1
wait $BP
perf script -i "$OUT/perf.data" -F trace 2> /dev/null > "$OUT/switches"
python3 - "$OUT" "$B $MODE $SC $*" <<'PY'
import collections, re, sys
out, label = sys.argv[1], sys.argv[2]
rows = [l.split('|')[1:-1] for l in open(out + '/bench') if l.startswith('| ')]
head = [c.strip() for c in rows[0]]
row = dict(zip(head, (c.strip() for c in rows[-1])))
names = dict(l.split(None, 1) for l in open(out + '/tids'))
name = lambda tid, comm: names.get(tid, comm).strip()
pre, sleeps = collections.Counter(), collections.Counter()
sw = re.compile(r'prev_comm=(.+?) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(.+?) next_pid=(\d+)')
for l in open(out + '/switches'):
    m = sw.search(l)
    if not m:
        continue
    prev = name(m.group(2), m.group(1))
    if prev.startswith('swapper'):
        continue  # the idle task: always runnable, never preempted from work
    if m.group(3).startswith('R'):
        pre[(prev, name(m.group(5), m.group(4)))] += 1
    else:
        sleeps[prev] += 1
print(f"{label}: {row.get('req/s', row.get('achieved/s'))} req/s, p99 {row.get('p99 ms')} ms")
print('  preempted -> ran next, per second:')
for (a, b), n in pre.most_common(8):
    print(f'    {n:7d}  {a} -> {b}')
print('  sleeps (voluntary switches), per second:')
for a, n in sleeps.most_common(5):
    print(f'    {n:7d}  {a}')
PY
rm -r "$OUT"
