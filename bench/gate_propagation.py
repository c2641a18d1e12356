#!/usr/bin/env python3
"""How long a new gate rule made through one node is not yet in force on another node over
one Redis: two nodes of BINARY on a fresh redis-server (needs `redis-server` on the PATH),
EVENTS events created first, then 20 times an event with a new gated path made through
node A, and node B's `GET /api/v1/gate` asked for that path in a tight loop until it
answers 401 (gated). Prints the open window after A's answer, in ms.

    python3 bench/gate_propagation.py target/release/waitroom 500
"""
import http.client
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ADMIN = "adm-0123456789"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    binary, events = sys.argv[1], int(sys.argv[2])
    d = tempfile.mkdtemp(prefix="gate-propagation-")
    rp = free_port()
    procs = [subprocess.Popen(["redis-server", "--port", str(rp), "--dir", d, "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)]
    time.sleep(0.5)
    subprocess.run([binary, "keygen", d + "/k"], check=True, stdout=subprocess.DEVNULL)

    def node(n):
        p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--data-dir",
                              f"{d}/n{n}", "--admin-token", ADMIN, "--no-demo",
                              "--rate-limits", "off", "--store", f"redis://127.0.0.1:{rp}",
                              "--signing-key", d + "/k/signing-key.pem"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        for line in p.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
                return int(m[1])
        raise SystemExit("the node did not start")

    try:
        a = http.client.HTTPConnection("127.0.0.1", node(1))
        b = http.client.HTTPConnection("127.0.0.1", node(2))
        headers = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}

        def put(ev, body):
            a.request("PUT", f"/api/v1/admin/events/{ev}", body=json.dumps(body), headers=headers)
            r = a.getresponse()
            r.read()
            assert r.status == 200, r.status

        def gate(path):
            b.request("GET", "/api/v1/gate", headers={"x-original-uri": path})
            r = b.getresponse()
            r.read()
            return r.status

        for i in range(events):
            put(f"bg{i}", {"paths": [f"/bg{i}"]})
        time.sleep(2)
        windows = []
        for k in range(20):
            path = f"/new{k}/x"
            assert gate(path) == 204
            put(f"new{k}", {"paths": [f"/new{k}"], "max_active": 1})
            t0 = time.perf_counter()
            for _ in range(1_000_000):
                if gate(path) == 401:
                    break
            else:
                raise SystemExit("never gated")
            windows.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.2)
        print(f"events={events}: open on node B after A answered (ms): median "
              f"{statistics.median(windows):.1f}, max {max(windows):.1f}")
    finally:
        for p in procs:
            p.terminate()


if __name__ == "__main__":
    main()
