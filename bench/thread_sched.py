#!/usr/bin/env python3
# Used by bench/stall_trace.sh.
# Every INTERVAL s: per thread name, CPU ms and run-queue wait ms (schedstat) of PID's threads.
import os, sys, time
pid = int(sys.argv[1]); interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
def sample():
    out = {}
    try:
        tasks = os.listdir(f'/proc/{pid}/task')
    except FileNotFoundError:
        return None
    for t in tasks:
        try:
            name = open(f'/proc/{pid}/task/{t}/comm').read().strip()
            run, wait, _ = open(f'/proc/{pid}/task/{t}/schedstat').read().split()
        except (OSError, ValueError):
            continue
        out[(t, name)] = (int(run), int(wait))
    return out
prev = sample()
while prev is not None:
    time.sleep(interval)
    cur = sample()
    if cur is None: break
    agg = {}
    for k, v in cur.items():
        p = prev.get(k, v)
        a = agg.setdefault(k[1], [0, 0])
        a[0] += v[0] - p[0]; a[1] += v[1] - p[1]
    ts = time.strftime('%H:%M:%S', time.gmtime()) + ('%.3f' % (time.time() % 1))[1:]
    print(ts, ' '.join(f'{n}={r//1000000}/{w//1000000}' for n, (r, w) in sorted(agg.items()) if r or w), flush=True)
    prev = cur
