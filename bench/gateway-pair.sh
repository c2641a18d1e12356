#!/usr/bin/env bash
# Two gateway builds at the same moment, for a machine that is not quiet (docs/PERFORMANCE.md
# "Gateway, fourth pass"): both in front of one origin (an nginx answering a fixed body), each
# under its own wrk (-t1 -c32) run at the same time, so both meet the same contention; each
# server's CPU (user + system, from /proc) per request it answered. Passthrough `GET /`, then
# a gated `GET /checkout` with an admitted session's cookie, ROUNDS times each.
#
#   bench/gateway-pair.sh BEFORE-BIN AFTER-BIN        (env: DUR=6s ROUNDS=3)
set -euo pipefail
A=$1; B=$2; DUR=${DUR:-6s}; ROUNDS=${ROUNDS:-3}
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ORIGIN=$(fp); PA=$(fp); PB=$(fp)
mkdir -p "$tmp/origin"
cat >"$tmp/origin/nginx.conf" <<E2
daemon off; worker_processes 1; pid $tmp/origin/nginx.pid; error_log $tmp/origin/error.log;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
 client_body_temp_path $tmp/origin/body; proxy_temp_path $tmp/origin/proxy; fastcgi_temp_path $tmp/origin/fastcgi; uwsgi_temp_path $tmp/origin/uwsgi; scgi_temp_path $tmp/origin/scgi;
 server { listen 127.0.0.1:$ORIGIN; location / { default_type text/plain; return 200 'hello from the origin\n'; } } }
E2
"$(command -v nginx || echo /usr/sbin/nginx)" -p "$tmp/origin" -c "$tmp/origin/nginx.conf" & pids+=($!)
TOKEN=bench-admin-token-0123456789
start() { # BIN PORT NAME -> the server's pid in $tmp/NAME.pid, its session cookie in $tmp/NAME.cookie
    "$1" serve --listen "127.0.0.1:$2" --upstream "http://127.0.0.1:$ORIGIN" --data-dir "$tmp/$3" \
        --admin-token "$TOKEN" --no-demo --rate-limits off --durability relaxed --log-format json \
        >"$tmp/$3.log" 2>&1 &
    pids+=($!); echo $! >"$tmp/$3.pid"
    for _ in $(seq 100); do curl -fs -o /dev/null "http://127.0.0.1:$2/healthz" && break; sleep 0.1; done
    curl -fs -o /dev/null -X PUT -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
        -d '{"max_active": 100000, "paths": ["/checkout"]}' "http://127.0.0.1:$2/api/v1/admin/events/bench"
    for _ in $(seq 100); do
        c=$(curl -s -D - -o /dev/null "http://127.0.0.1:$2/checkout" | tr -d '\r' \
            | sed -n 's/^[Ss]et-[Cc]ookie: \([^;]*\).*/\1/p' | head -1)
        [ -n "$c" ] && break; sleep 0.05
    done
    [ -n "$c" ] || { echo "no session cookie from $1" >&2; exit 1; }
    echo "$c" >"$tmp/$3.cookie"
}
start "$A" "$PA" a; start "$B" "$PB" b
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ia=$(cat "$tmp/a.pid"); ib=$(cat "$tmp/b.pid"); tck=$(getconf CLK_TCK)
echo "both at once, wrk -t1 -c32 -d$DUR each; CPU µs per request (user + system)"
for path in / /checkout; do
    for r in $(seq "$ROUNDS"); do
        a0=$(cpu "$ia"); b0=$(cpu "$ib")
        wrk -t1 -c32 -d"$DUR" -H "Cookie: $(cat "$tmp/a.cookie")" "http://127.0.0.1:$PA$path" >"$tmp/wa" & wa=$!
        wrk -t1 -c32 -d"$DUR" -H "Cookie: $(cat "$tmp/b.cookie")" "http://127.0.0.1:$PB$path" >"$tmp/wb" & wb=$!
        wait "$wa" "$wb"
        a1=$(cpu "$ia"); b1=$(cpu "$ib")
        na=$(awk '/requests in/ {print $1}' "$tmp/wa"); nb=$(awk '/requests in/ {print $1}' "$tmp/wb")
        awk -v p="$path" -v r="$r" -v na="$na" -v nb="$nb" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v t="$tck" \
            'BEGIN { printf "%-9s r%d  %s: %d req, %.1f µs/req | %s: %d req, %.1f µs/req\n", p, r, "first", na, a / t * 1e6 / na, "second", nb, b / t * 1e6 / nb }'
    done
done
