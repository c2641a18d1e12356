#!/usr/bin/env python3
"""What one step of thousands of places costs Redis: a resume that admits N waiting places,
and a `clear` of N, each on an event of its own.

Starts its own redis-server and one waitroom node on free ports (temporary directories),
joins N places through the HTTP API (per-client limits off), then times the step as the
admin sees it and reads Redis's SLOWLOG for every script over 10 ms that the step and the
ticks after it ran. On Redis, a script admits at most 500 places and the scheduler's
ticks admit the rest; the figure to watch is the longest script, the time Redis (every
event on it) waited for one step.

    python3 bench/redis/big_step.py target/release/waitroom 4000,10000
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ADMIN = "bench-admin-token-0123456789abcdef"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, what):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, sizes = sys.argv[1], [int(n) for n in sys.argv[2].split(",")]
    tmp = tempfile.mkdtemp(prefix="big-step-")
    rport, wport = free_port(), free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no",
         "--dir", tmp, "--slowlog-log-slower-than", "10000", "--slowlog-max-len", "10000"],
        stdout=subprocess.DEVNULL)
    wait_port(rport, "redis-server")
    subprocess.run([binary, "keygen", tmp], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, WAITROOM_ADMIN_TOKEN=ADMIN)
    node = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{wport}", "--store", f"redis://127.0.0.1:{rport}",
         "--data-dir", f"{tmp}/node", "--signing-key", f"{tmp}/signing-key.pem",
         "--rate-limits", "off", "--no-demo"],
        env=env, stdout=open(f"{tmp}/node.log", "w"), stderr=subprocess.STDOUT)
    wait_port(wport, "waitroom")
    conn = http.client.HTTPConnection("127.0.0.1", wport)

    def call(method, path, body=None, admin=False):
        headers = {"content-type": "application/json"}
        if admin:
            headers["authorization"] = f"Bearer {ADMIN}"
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")

    def slowlog():
        out = subprocess.run(["redis-cli", "-p", str(rport), "--json", "SLOWLOG", "GET", "-1"],
                             capture_output=True, text=True, check=True).stdout
        return sorted((entry[2] for entry in json.loads(out)), reverse=True)

    try:
        print("N step http_status step_ms all_admitted_ms scripts_over_10ms longest_us")
        for n in sizes:
            for step in ["admit", "clear"]:
                ev = f"{step}-{n}"
                st, _ = call("PUT", f"/api/v1/admin/events/{ev}",
                             {"max_active": 1, "paused": True, "waiting_idle_sec": 86400}, True)
                assert st in (200, 201), st
                for _ in range(n):
                    st, body = call("POST", "/api/v1/queue/join", {"event_id": ev})
                    assert st == 200, body
                subprocess.run(["redis-cli", "-p", str(rport), "SLOWLOG", "RESET"],
                               check=True, stdout=subprocess.DEVNULL)
                started = time.monotonic()
                if step == "admit":
                    st, _ = call("PUT", f"/api/v1/admin/events/{ev}",
                                 {"max_active": n + 10, "paused": False}, True)
                else:
                    st, _ = call("POST", f"/api/v1/admin/events/{ev}/clear", None, True)
                took = time.monotonic() - started
                done = None
                if step == "admit":
                    for _ in range(1000):
                        _, e = call("GET", f"/api/v1/admin/events/{ev}", None, True)
                        if e.get("admitted") == n:
                            done = round((time.monotonic() - started) * 1000)
                            break
                        time.sleep(0.01)
                scripts = slowlog()
                print(n, step, st, round(took * 1000), done if done is not None else "-",
                      len(scripts), scripts[0] if scripts else "-", flush=True)
    finally:
        node.terminate()
        redis.terminate()
        node.wait()
        redis.wait()


if __name__ == "__main__":
    main()
