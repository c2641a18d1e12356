#!/usr/bin/env python3
"""A Redis node holding thousands of events: do admissions keep their pace, and does it stop?

    python3 bench/many_events.py BIN [BIN...] [--events 5000]

For each server binary, on a private redis-server (free ports, temporary directories):
1. two nodes on two databases of one Redis: `busy` holds EVENTS events of 3 waiting places
   each, `control` holds nothing else;
2. on each, an event with 5,000 waiting places and 5,000 free slots is resumed: how long
   until all are admitted (API.md: the rest of a step 500 a tick, 5 ms apart);
3. on each, `admit_per_minute: 600` over 300 waiting places, 10 s with no request: how many
   were admitted (about 110 expected);
4. the lines `took the periodic-work lease` each node logged;
5. the busy node gets SIGTERM and Redis is killed 1 s later: when does the node exit?
Standard library only; needs redis-server on the PATH.
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

ADMIN = "many-events-admin-token-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, binary, workdir, name, redis_url, key):
        self.port = free_port()
        self.log = os.path.join(workdir, f"{name}.log")
        data = os.path.join(workdir, name)
        os.makedirs(data, mode=0o700)
        args = [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", data,
                "--no-demo", "--rate-limits", "off", "--store", redis_url, "--signing-key", key]
        env = dict(os.environ, WAITROOM_ADMIN_TOKEN=ADMIN, RUST_LOG="info")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)
        for _ in range(300):
            try:
                urllib.request.urlopen(self.url("/readyz"), timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"node {name} did not become ready")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def call(self, method, path, body=None, admin=False):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url(path), method=method, data=data)
        req.add_header("content-type", "application/json")
        if admin:
            req.add_header("authorization", f"Bearer {ADMIN}")
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return json.loads(raw) if raw else None

    def lease_lines(self):
        with open(self.log, "rb") as f:
            return f.read().count(b"took the periodic-work lease")


async def pipelined(port, requests, conns=8, depth=32):
    """Sends `requests` (raw HTTP/1.1 bytes) over `conns` connections, `depth` at a time;
    answers the statuses that were not 200."""
    bad = []

    async def worker(mine):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for k in range(0, len(mine), depth):
            batch = mine[k:k + depth]
            w.write(b"".join(batch))
            await w.drain()
            for _ in batch:
                status = int((await r.readline()).split()[1])
                length = 0
                while (line := await r.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await r.readexactly(length)
                if status != 200:
                    bad.append(status)
        w.close()

    await asyncio.gather(*[worker(requests[i::conns]) for i in range(conns)])
    return bad


def request(method, path, body, admin):
    raw = json.dumps(body).encode()
    auth = f"authorization: Bearer {ADMIN}\r\n" if admin else ""
    head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"{auth}content-length: {len(raw)}\r\n\r\n")
    return head.encode() + raw


def fill(node, events, places):
    ids = [f"ev-{i:05d}" for i in range(events)]
    settings = {"max_active": 2, "paused": True, "waiting_idle_sec": 2_592_000}
    bad = asyncio.run(pipelined(node.port, [
        request("PUT", f"/api/v1/admin/events/{i}", settings, True) for i in ids]))
    bad += asyncio.run(pipelined(node.port, [
        request("POST", "/api/v1/queue/join", {"event_id": i}, False)
        for i in ids for _ in range(places)]))
    if bad:
        raise SystemExit(f"{len(bad)} requests refused while filling: {bad[:5]}")


def resume(node):
    """Seconds until 5,000 waiting places are all admitted after a resume."""
    node.call("PUT", "/api/v1/admin/events/resume-5000", {
        "max_active": 5000, "paused": True, "waiting_idle_sec": 600, "ready_ttl_sec": 600}, True)
    asyncio.run(pipelined(node.port, [
        request("POST", "/api/v1/queue/join", {"event_id": "resume-5000"}, False)
        for _ in range(5000)]))
    t0 = time.time()
    node.call("POST", "/api/v1/admin/events/resume-5000/resume", admin=True)
    while time.time() - t0 < 60:
        if node.call("GET", "/api/v1/queue/info?event_id=resume-5000")["admitted"] >= 5000:
            break
        time.sleep(0.02)
    took = time.time() - t0
    node.call("DELETE", "/api/v1/admin/events/resume-5000", admin=True)
    return took


def pace(node, secs=10.0):
    """Places admitted `secs` after a resume at `admit_per_minute: 600`, and the expected."""
    node.call("PUT", "/api/v1/admin/events/pace-600", {
        "max_active": 1000, "paused": True, "admit_per_minute": 600,
        "waiting_idle_sec": 600, "ready_ttl_sec": 600}, True)
    asyncio.run(pipelined(node.port, [
        request("POST", "/api/v1/queue/join", {"event_id": "pace-600"}, False)
        for _ in range(300)]))
    t0 = time.time()
    node.call("POST", "/api/v1/admin/events/pace-600/resume", admin=True)
    time.sleep(secs)
    admitted = node.call("GET", "/api/v1/queue/info?event_id=pace-600")["admitted"]
    dt = time.time() - t0
    node.call("DELETE", "/api/v1/admin/events/pace-600", admin=True)
    return admitted, 10 + 10 * dt


def run(binary, events):
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as work:
        rport = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", work],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            key = os.path.join(work, "keys")
            subprocess.run([binary, "keygen", key], check=True, stdout=subprocess.DEVNULL)
            key = os.path.join(key, "signing-key.pem")
            busy = Node(binary, work, "busy", f"redis://127.0.0.1:{rport}/0", key)
            control = Node(binary, work, "control", f"redis://127.0.0.1:{rport}/1", key)
            t = time.time()
            fill(busy, events, 3)
            print(f"{binary}: {events} events x 3 places made in {time.time() - t:.0f} s")
            for name, node in (("busy", busy), ("control", control)):
                took = resume(node)
                admitted, expected = pace(node)
                print(f"  {name}: resume of 5,000 all admitted after {took:.2f} s; "
                      f"admit_per_minute 600: {admitted} admitted in 10 s "
                      f"(about {expected:.0f} expected); "
                      f"lease-taken lines so far {node.lease_lines()}")
            control.proc.send_signal(signal.SIGTERM)
            control.proc.wait(30)
            busy.proc.send_signal(signal.SIGTERM)
            t = time.time()
            time.sleep(1)
            redis.kill()
            try:
                busy.proc.wait(60)
                print(f"  SIGTERM, Redis killed 1 s later: exited after {time.time() - t:.1f} s")
            except subprocess.TimeoutExpired:
                busy.proc.kill()
                print("  SIGTERM, Redis killed 1 s later: still running after 61 s (killed)")
        finally:
            redis.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--events", type=int, default=5000)
    a = ap.parse_args()
    for b in a.binaries:
        run(b, a.events)


if __name__ == "__main__":
    main()
