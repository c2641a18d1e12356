#!/usr/bin/env python3
"""Instructions per request, counted by callgrind: a figure the machine's noise cannot move.

    cargo build --release --bins
    python3 bench/instructions.py [--bin target/release/waitroom] [--requests 2000]
    python3 bench/instructions.py --ceiling target/release/waitroom-bench [--requests 2000]

Starts the server under `valgrind --tool=callgrind` (no instrumentation until the first
request phase), creates a paused event, then runs one phase per request kind over one
keep-alive connection: `GET /healthz`, `POST /api/v1/queue/join`, `GET .../status`. Between
phases it asks callgrind to dump its counters (`callgrind_control --dump`), so each dump
holds exactly one phase; instructions per request are the phase's total over its requests.
Background tasks (scheduler, gauges) run during each phase too; they are idle for a paused
event and cost far under 1 % of a phase. The dumps are kept under target/instructions/ for
`callgrind_annotate`.

Each request waits for its answer before the next is sent, so this counts the work of one
request on an idle server (no batching across requests, no contention).

The status phase polls `--status-tokens K` distinct places in turn (default: as many as
requests, each polled once, as a crowd larger than any cache polls; `1`: the same place
every time, as one client polling, the warm-up having polled it once already).

`--ceiling BENCH` counts the ceiling instead: `BENCH reference-serve --serve-loop server`
(the bare axum `/healthz` of `waitroom-bench`, through the server's own serving loop), with
the `healthz` phase only; the difference from the server's `healthz` is what the server's
route stack adds.
"""

import argparse
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def totals(path):
    with open(path) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def start(cmd):
    """Starts the server command; answers the process and a connection to where it listens."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    addr = None
    for line in proc.stdout:
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            addr = m.group(1)
            break
    if not addr:
        raise SystemExit("the server did not start")
    host, port = addr.rsplit(":", 1)
    return proc, http.client.HTTPConnection(host, int(port), timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/waitroom"))
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--out", default=os.path.join(ROOT, "target/instructions"))
    ap.add_argument("--durability", default="sync")
    ap.add_argument("--status-tokens", type=int, default=0, metavar="K",
                    help="distinct places the status phase polls in turn (default: --requests)")
    ap.add_argument("--ceiling", metavar="BENCH",
                    help="count the ceiling of this waitroom-bench binary (healthz only)")
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    data = tempfile.mkdtemp(prefix="waitroom-instr-")
    admin = "instr-admin-token-0123456789"
    prefix = os.path.join(a.out, "callgrind.out")
    cmd = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no",
        f"--callgrind-out-file={prefix}",
    ]
    if a.ceiling:
        cmd += [a.ceiling, "reference-serve", "--serve-loop", "server"]
    else:
        cmd += [
            a.bin, "serve", "--listen", "127.0.0.1:0", "--no-demo", "--data-dir", data,
            "--durability", a.durability, "--admin-token", admin,
            "--joins-per-minute", "100000000", "--polls-per-second", "1000000",
        ]
    proc, conn = start(cmd)

    def call(method, path, body=None, token=None):
        headers = {"content-type": "application/json"} if body is not None else {}
        if token:
            headers["authorization"] = f"Bearer {token}"
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers=headers)
        r = conn.getresponse()
        payload = r.read()
        if r.status >= 300:
            raise SystemExit(f"{method} {path}: {r.status} {payload[:200]!r}")
        return json.loads(payload) if payload else None

    if a.ceiling:
        call("GET", "/healthz")  # warm, outside the counts
        count(a, proc, prefix, data, [("healthz", lambda i: call("GET", "/healthz"))])
        return
    event = "instr"
    call("PUT", f"/api/v1/admin/events/{event}",
         {"name": "instr", "max_active": 1, "paused": True, "waiting_idle_sec": 2592000},
         token=admin)
    status_tokens = min(a.status_tokens or a.requests, a.requests)
    # Places for the status phase, joined before counting starts.
    tokens = [call("POST", "/api/v1/queue/join",
                   {"event_id": event, "user_id": f"pre-{i}"})["waiting_token"]
              for i in range(a.requests)]
    # Warm every path once (first-use allocations, lazy statics) outside the counts.
    call("GET", "/healthz")
    call("GET", f"/api/v1/queue/status?token={tokens[0]}")
    call("POST", "/api/v1/queue/join", {"event_id": event, "user_id": "warm"})

    phases = [
        ("healthz", lambda i: call("GET", "/healthz")),
        ("join", lambda i: call("POST", "/api/v1/queue/join",
                                {"event_id": event, "user_id": f"u-{i}"})),
        ("status", lambda i: call("GET",
                                  f"/api/v1/queue/status?token={tokens[i % status_tokens]}")),
    ]
    results = count(a, proc, prefix, data, phases)
    sha = sha256_share(a, "status")
    if sha is not None:
        # Valgrind's CPU has no SHA extensions, so sha2 runs its portable code here; on a
        # CPU with them (x86 SHA-NI, ARMv8 SHA2) the MAC's two blocks cost a small part.
        print(f"status: of which SHA-256 compression in software (the MAC): {sha:,.0f} "
              "instructions per request", file=sys.stderr)
    h = results["healthz"]
    print(f"| healthz | join | status | join/healthz | status/healthz |\n|---:|---:|---:|---:|---:|\n"
          f"| {results['healthz']:,.0f} | {results['join']:,.0f} | {results['status']:,.0f} | "
          f"{results['join'] / h:.2f} | {results['status'] / h:.2f} |")


def sha256_share(a, phase):
    """Instructions per request of `phase` inside sha2's block function, or None."""
    def head(path):
        with open(path, errors="replace") as f:
            return f.read(4000)
    dumps = [p for p in glob.glob(os.path.join(a.out, "callgrind.out.*"))
             if f"Trigger: dump {phase}\n" in head(p)]
    if not dumps or not shutil.which("callgrind_annotate"):
        return None
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", dumps[-1]],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "=>" not in line and "sha2::sha256::compress256 [" in line:
            return int(line.split()[0].replace(",", "")) / a.requests
    return 0.0


def count_phases(pid, prefix, phases, requests, report=None):
    """Runs each phase's `f` `requests` times in the callgrind-run process `pid` (dumps
    named `prefix*`) with counting on, one dump per phase; answers each phase's
    instructions per request. `report(name, per_request, seconds, dump)` after each."""
    def ctl(*args):
        subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    ctl("--instr=on")
    ctl("--zero")
    results = {}
    for name, f in phases:
        before = set(glob.glob(prefix + "*"))
        started = time.time()
        for i in range(requests):
            f(i)
        ctl("--dump=" + name)
        # The dump is written asynchronously; wait for the new file.
        for _ in range(600):
            new = set(glob.glob(prefix + "*")) - before
            if new:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        path = sorted(new)[-1]
        results[name] = totals(path) / requests
        if report:
            report(name, results[name], time.time() - started, path)
    return results


def count(a, proc, prefix, data, phases):
    """Runs each phase `a.requests` times with callgrind counting, one dump per phase, then
    stops the server; answers the instructions per request of each phase."""
    def report(name, per_request, seconds, path):
        print(f"{name}: {per_request:,.0f} instructions per request "
              f"({seconds:.1f} s, dump {os.path.basename(path)})", file=sys.stderr)

    results = count_phases(proc.pid, prefix, phases, a.requests, report)
    proc.terminate()
    proc.wait(timeout=60)
    shutil.rmtree(data, ignore_errors=True)
    print(json.dumps({"requests": a.requests,
                      "server": "ceiling" if a.ceiling else a.bin,
                      "durability": a.durability,
                      "instructions_per_request": results}))
    return results


if __name__ == "__main__":
    main()
