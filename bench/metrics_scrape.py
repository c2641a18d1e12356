#!/usr/bin/env python3
"""What a `/metrics` scrape of a node holding thousands of events does to the requests around it.

    python3 bench/metrics_scrape.py BIN_DIR [BIN_DIR...] [--events 2000] [--rate 8000]
    python3 bench/metrics_scrape.py BIN_DIR --path /api/v1/admin/events   # what the dashboard polls

For each BIN_DIR (holding `waitroom` and `waitroom-bench` of one build), on an embedded
server in `sync` (free port, temporary directory):
1. EVENTS events of 3 waiting places each are created (so `/metrics` has a few series each);
2. five scrapes, one after the other: seconds each, and the body's size;
3. an open-loop status run at RATE/s for 10 s (`waitroom-bench run --url`), without scrapes,
   then the same with a scrape every second from another thread: status p50/p99/max and the
   100 ms windows whose worst latency passed 20 ms, from the generator's own report.
`--path` reads another page instead of `/metrics` (with the admin token). Prometheus
scrapes every 15 s by default, often from two replicas; once a second makes the
effect of each scrape easy to see in a 10 s window.
Standard library only.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from many_events import ADMIN, pipelined, request  # noqa: E402  (same directory)
import asyncio  # noqa: E402

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bindir, workdir):
    port = free_port()
    data = os.path.join(workdir, "data")
    args = [os.path.join(bindir, "waitroom"), "serve", "--listen", f"127.0.0.1:{port}",
            "--data-dir", data, "--no-demo", "--rate-limits", "off", "--durability", "sync"]
    env = dict(os.environ, WAITROOM_ADMIN_TOKEN=ADMIN, RUST_LOG="warn")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(workdir, "server.log"), "wb"))
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not become ready")


def fill(port, events):
    ids = [f"ev-{i:05d}" for i in range(events)]
    settings = {"max_active": 2, "paused": True, "waiting_idle_sec": 2_592_000}
    bad = asyncio.run(pipelined(port, [
        request("PUT", f"/api/v1/admin/events/{i}", settings, True) for i in ids]))
    bad += asyncio.run(pipelined(port, [
        request("POST", "/api/v1/queue/join", {"event_id": i}, False)
        for i in ids for _ in range(3)]))
    if bad:
        raise SystemExit(f"{len(bad)} requests refused while filling: {bad[:5]}")


PATH = "/metrics"


def scrape(port):
    t0 = time.perf_counter()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{PATH}")
    req.add_header("authorization", f"Bearer {ADMIN}")
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def status_run(bindir, port, rate, scraping):
    stop = threading.Event()
    took = []

    def scraper():
        while not stop.wait(1.0):
            took.append(scrape(port)[0])

    if scraping:
        t = threading.Thread(target=scraper, daemon=True)
        t.start()
    out = subprocess.run(
        [os.path.join(bindir, "waitroom-bench"), "run", "--url", f"http://127.0.0.1:{port}",
         "--admin-token", ADMIN, "--scenario", "status", "--rate", str(rate),
         "--duration", "10", "--places", "2000", "--timeline", "20"],
        capture_output=True, text=True, check=True).stdout
    stop.set()
    return out, took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bins", nargs="+")
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--rate", type=int, default=8000)
    ap.add_argument("--path", default="/metrics")
    a = ap.parse_args()
    global PATH
    PATH = a.path
    for bindir in a.bins:
        with tempfile.TemporaryDirectory(prefix="metrics-scrape-") as workdir:
            proc, port = start(bindir, workdir)
            try:
                fill(port, a.events)
                scrape(port)  # the first builds every series once
                alone = [scrape(port) for _ in range(5)]
                print(f"== {bindir}: {a.events} events; {PATH} alone: "
                      + ", ".join(f"{s * 1000:.0f} ms" for s, _ in alone)
                      + f"; {alone[-1][1] / 1e6:.2f} MB", flush=True)
                for scraping in (False, True):
                    out, took = status_run(bindir, port, a.rate, scraping)
                    label = "with a scrape every second" if scraping else "no scrape"
                    print(f"-- status at {a.rate}/s, {label}"
                          + (": scrapes " + ", ".join(f"{s * 1000:.0f}" for s in took) + " ms"
                             if took else ""), flush=True)
                    print(out.rstrip(), flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
