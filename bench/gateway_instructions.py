#!/usr/bin/env python3
"""Instructions per proxied request in gateway mode, counted by callgrind: a figure the
machine's noise cannot move (docs/PERFORMANCE.md "Gateway mode").

    python3 bench/gateway_instructions.py --bin BIN [--bin BIN...] [--requests 2000]

For each binary: an origin (an nginx answering a fixed 22-byte body, as bench/gateway.sh
runs it), and waitroom in gateway mode in front of it under `valgrind --tool=callgrind`
(no instrumentation until the first phase). Two phases over one keep-alive connection:
`GET /` (a path no event gates: passthrough) and `GET /checkout` with an admitted
session's cookie (a gated path). Each phase is dumped on its own (`callgrind_control
--dump`); instructions per request are its total over its requests. Each request waits
for its answer before the next is sent: the work of one request on an idle server. The
origin's own work is not counted (it is another process).

`--nginx` counts nginx proxying the same origin the same way, as bench/gateway.sh's
`nginx proxy` runs it (keep-alive upstream, the same `proxy_set_header`s), in one process
(`master_process off; worker_processes 1`) under callgrind: `GET /`, then `GET /checkout`
with a cookie of the gated phase's length (nginx gates nothing: it is the same request's
bytes parsed and forwarded). A row `nginx` in the same table: the gap in instructions.
"""

import argparse
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# Shared with the request path's counter (this script's folder is on the import path).
from instructions import count_phases, start


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def origin(tmp):
    d = os.path.join(tmp, "origin")
    os.makedirs(d)
    port = free_port()
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(f"""daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_requests 1000000;
 client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
 uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
 server {{ listen 127.0.0.1:{port}; location / {{ default_type text/plain;
   return 200 'hello from the origin\\n'; }} }} }}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = subprocess.Popen([nginx, "-p", d, "-c", os.path.join(d, "nginx.conf")])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the origin did not start")


def measure(binary, requests, origin_port, tmp, out):
    data = tempfile.mkdtemp(prefix="gw-instr-", dir=tmp)
    admin = "instr-admin-token-0123456789"
    prefix = os.path.join(out, "callgrind.out")
    cmd = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no",
        f"--callgrind-out-file={prefix}",
        binary, "serve", "--listen", "127.0.0.1:0", "--no-demo", "--data-dir", data,
        "--durability", "relaxed", "--admin-token", admin, "--rate-limits", "off",
        "--upstream", f"http://127.0.0.1:{origin_port}",
    ]
    proc, conn = start(cmd)

    def get(path, headers=None, method="GET", body=None):
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        payload = r.read()
        return r, payload

    r, p = get("/api/v1/admin/events/bench", method="PUT",
               body='{"max_active": 100000, "paths": ["/checkout"]}',
               headers={"authorization": f"Bearer {admin}",
                        "content-type": "application/json"})
    if r.status >= 300:
        raise SystemExit(f"creating the event: {r.status} {p[:200]!r}")
    cookie = None
    for _ in range(200):
        r, _ = get("/checkout")
        c = r.getheader("set-cookie")
        if r.status == 200 and c:
            cookie = c.split(";", 1)[0]
            break
        time.sleep(0.05)
    if not cookie:
        raise SystemExit("no session cookie from the gateway")
    phases = [("pass", "/", {}), ("gated", "/checkout", {"cookie": cookie})]
    for _, path, headers in phases:  # warm each path outside the counts
        for _ in range(20):
            r, _ = get(path, headers)
            if r.status != 200:
                raise SystemExit(f"{path}: {r.status}")

    results = count_phases(
        proc.pid, prefix,
        [(name, lambda _, p=path, h=headers: get(p, h)) for name, path, headers in phases],
        requests)
    proc.terminate()
    proc.wait(timeout=60)
    results["cookie_len"] = len(cookie)
    return results


def measure_nginx(requests, origin_port, tmp, out, cookie_len):
    """nginx proxying the origin (bench/gateway.sh's `nginx proxy`), one process under
    callgrind; the same two phases, the second with a cookie of `cookie_len` bytes."""
    d = os.path.join(tmp, "proxy")
    os.makedirs(d)
    port = free_port()
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 1024; }}
http {{ access_log off; keepalive_requests 1000000;
 client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
 uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
 upstream site {{ server 127.0.0.1:{origin_port}; keepalive 128; keepalive_requests 1000000; }}
 server {{ listen 127.0.0.1:{port}; location / {{
   proxy_pass http://site; proxy_http_version 1.1; proxy_set_header Connection '';
   proxy_set_header Host $host; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
   proxy_set_header X-Forwarded-Proto $scheme; }} }} }}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    prefix = os.path.join(out, "callgrind.out")
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                             f"--callgrind-out-file={prefix}",
                             nginx, "-p", d, "-c", os.path.join(d, "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    conn = None
    for _ in range(600):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.connect()
            break
        except OSError:
            conn = None
            time.sleep(0.1)
    if conn is None:
        raise SystemExit("nginx under callgrind did not start")

    def get(path, headers):
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        r.read()
        return r

    # A cookie of the gated phase's length (`waitroom_bench=` and a token's characters).
    name = "waitroom_bench="
    cookie = name + "A" * max(cookie_len - len(name), 1)
    phases = [("pass", "/", {}), ("gated", "/checkout", {"cookie": cookie})]
    for _, path, headers in phases:
        for _ in range(20):
            if get(path, headers).status != 200:
                raise SystemExit(f"nginx {path}: not 200")

    results = count_phases(
        proc.pid, prefix,
        [(n, lambda _, p=path, h=headers: get(p, h)) for n, path, headers in phases],
        requests)
    conn.close()
    proc.terminate()
    proc.wait(timeout=60)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--out", default="target/gateway-instructions")
    ap.add_argument("--nginx", action="store_true",
                    help="also count nginx proxying the same origin (a row `nginx`)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gw-instr-")
    nginx, port = origin(tmp)
    try:
        print("| binary | passthrough `GET /` | gated + session `GET /checkout` |")
        print("|---|---:|---:|")
        cookie_len = None
        for i, b in enumerate(a.bin):
            out = os.path.join(a.out, str(i))
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            r = measure(b, a.requests, port, tmp, out)
            cookie_len = r.pop("cookie_len")
            print(f"| {b} | {r['pass']:,.0f} | {r['gated']:,.0f} |", flush=True)
        if a.nginx:
            out = os.path.join(a.out, "nginx")
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            r = measure_nginx(a.requests, port, tmp, out, cookie_len or 120)
            print(f"| nginx (proxy) | {r['pass']:,.0f} | {r['gated']:,.0f} "
                  "(same bytes, not gated) |", flush=True)
    finally:
        nginx.terminate()
        nginx.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
