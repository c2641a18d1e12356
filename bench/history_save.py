#!/usr/bin/env python3
"""The history file's save, measured by the server's resident memory around it.

    python3 bench/history_save.py BIN [BIN...] [--events 10000] [--samples 2000]

For each server binary: start it on a free port with a temporary data directory, create
EVENTS events, stop it, write a history file holding SAMPLES samples for each of them (as
many as `SAMPLES` steps of 10 s would leave), start it again and sample its resident memory
every 50 ms for 75 s, which covers one save (every minute). Prints the resident memory
before the save (the median of the samples) and its peak, in MiB. Standard library only.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

ADMIN = "history-save-admin-token-0123456789"
STEP_MS = 10_000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def history_file(ids, samples):
    """postcard's form of `Saved { rings: Vec<(String, Vec<Sample>)> }`, after the marker."""
    start = (int(time.time() * 1000) // STEP_MS - samples) * STEP_MS
    body = [b"wrhist01", varint(len(ids))]
    for id_ in ids:
        raw = id_.encode()
        body.append(varint(len(raw)) + raw + varint(samples))
        for i in range(samples):
            at = start + i * STEP_MS
            fields = (40_000 + i, 300, 4_700, 5_000, 1_200, 100_000 + 50 * i,
                      50_000 + 40 * i, 45_000 + 39 * i, 2_000 + i)
            body.append(varint(at) + b"".join(varint(f) for f in fields))
    return b"".join(body)


def start(binary, port, data):
    args = [binary, "--listen", f"127.0.0.1:{port}", "--data-dir", data, "--no-demo",
            "--rate-limits", "off"]
    env = dict(os.environ, WAITROOM_ADMIN_TOKEN=ADMIN, RUST_LOG="warn")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{binary} did not become ready")


def create_events(port, ids):
    # One keep-alive connection, requests written in batches of 64 and answers counted.
    with socket.create_connection(("127.0.0.1", port)) as s:
        f = s.makefile("rb")
        for k in range(0, len(ids), 64):
            batch = ids[k:k + 64]
            out = bytearray()
            for id_ in batch:
                body = json.dumps({"max_active": 2, "paused": True}).encode()
                out += (f"PUT /api/v1/admin/events/{id_} HTTP/1.1\r\nHost: x\r\n"
                        f"authorization: Bearer {ADMIN}\r\ncontent-type: application/json\r\n"
                        f"content-length: {len(body)}\r\n\r\n").encode() + body
            s.sendall(out)
            for _ in batch:
                status = int(f.readline().split()[1])
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                f.read(length)
                if status != 200:
                    raise SystemExit(f"creating an event answered {status}")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(binary, events, samples):
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as data:
        port = free_port()
        ids = [f"ev-{i:05d}" for i in range(events)]
        proc = start(binary, port, data)
        create_events(port, ids)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        with open(os.path.join(data, "history.bin"), "wb") as f:
            f.write(history_file(ids, samples))
        proc = start(binary, port, data)
        # The read-back's own peak comes first: the save's window starts 10 s in.
        t0 = time.time()
        rss = []
        while (t := time.time() - t0) < 75:
            if t > 10:
                rss.append(rss_mib(proc.pid))
            if os.environ.get("TRACE"):
                print(f"{t:.2f}\t{rss_mib(proc.pid):.0f}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        return statistics.median(rss), max(rss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=2_000)
    a = ap.parse_args()
    print(f"{a.events} events x {a.samples} samples each")
    print("binary\tmedian RSS MiB\tpeak RSS MiB\tpeak - median")
    for b in a.binaries:
        med, peak = measure(b, a.events, a.samples)
        print(f"{b}\t{med:.0f}\t{peak:.0f}\t{peak - med:.0f}")


if __name__ == "__main__":
    main()
