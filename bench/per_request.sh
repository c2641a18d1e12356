#!/bin/bash
# Kernel-side costs per request of one `waitroom-bench run` phase: CPU, context switches,
# syscalls (futex, fdatasync, write, epoll_wait), per thread group (all threads, and the
# journal thread alone), and requests per fdatasync (the `sync` batch size). Counted by
# `perf stat --per-thread` over 5 s in the middle of a 10 s phase, so the figures do not
# depend on how fast the machine is (unlike req/s); the idle CPU of the machine over those
# 5 s is printed too (whether the cores sit idle while batches sync).
#
#   bench/per_request.sh B sync join                 # closed loop, 64 connections
#   bench/per_request.sh B sync join --rate 4000     # open loop
#   bench/per_request.sh B relaxed join
#
# B is a directory holding `waitroom` and `waitroom-bench` (a release build copied out of
# target/). Needs perf with tracepoints (root, or perf_event_paranoid <= 1).
set -euo pipefail
B=$1; MODE=$2; SC=$3; shift 3
# shellcheck source=bench/phase.sh
. "$(dirname "$0")/phase.sh"
start_phase "$B" "$MODE" "$SC" "$@"
sleep 4
read -r _ _ _ _ i1 w1 _ < /proc/stat
perf stat --per-thread -x, -e task-clock,context-switches,raw_syscalls:sys_enter,\
syscalls:sys_enter_futex,syscalls:sys_enter_fdatasync,syscalls:sys_enter_write,\
syscalls:sys_enter_epoll_wait -p "$SP" -- sleep 5 2> "$OUT/perf"
read -r _ _ _ _ i2 w2 _ < /proc/stat
wait $BP
python3 - "$OUT" "$B $MODE $SC $*" $(( (i2 - i1) + (w2 - w1) )) "$(getconf CLK_TCK)" <<'PY'
import collections, sys
out, label, idle, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [l.split('|')[1:-1] for l in open(out + '/bench') if l.startswith('| ')]
head = [c.strip() for c in rows[0]]
row = dict(zip(head, (c.strip() for c in rows[-1])))
rate = float(row.get('achieved/s', row.get('req/s', '0')).replace(',', ''))
reqs = rate * 5
every, journal = collections.defaultdict(float), collections.defaultdict(float)
for l in open(out + '/perf'):
    f = l.strip().split(',')
    if len(f) < 4 or 'not' in f[1]:
        continue
    ev = f[3].replace('syscalls:sys_enter_', '').replace('raw_syscalls:sys_enter', 'syscalls')
    v = float(f[1]) * (1000 if ev == 'task-clock' else 1)  # task-clock: ms -> µs
    every[ev] += v
    if 'journa' in f[0]:
        journal[ev] += v
print(f"{label}: {rate:,.0f} req/s, p99 {row.get('p99 ms')} ms, cpu other {row.get('cpu other')}, "
      f"idle {idle / tck / 5:.2f} cores")
fmt = lambda d, n: ' '.join(f"{k}={v / n:.3f}" for k, v in d.items())
print('  per request, all threads:', fmt(every, reqs), '(task-clock in µs)')
if journal:
    print('  per request, journal thread:', fmt(journal, reqs))
if every.get('fdatasync'):
    print(f"  requests per fdatasync: {reqs / every['fdatasync']:.1f}; journal thread per "
          f"fdatasync: {fmt(journal, every['fdatasync'])}")
PY
rm -r "$OUT"
