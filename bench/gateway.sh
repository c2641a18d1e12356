#!/usr/bin/env bash
# Gateway mode's throughput, side by side in one run (docs/PERFORMANCE.md "Gateway mode"):
# wrk against
#   1. the origin directly (an nginx answering a fixed body: the ceiling),
#   2. nginx proxying to that origin (keep-alive upstream, as docs/nginx.conf does),
#   3. waitroom in gateway mode on an ungated path (passthrough),
#   4. waitroom in gateway mode on a gated path with an admitted session's cookie,
#   5. nginx proxying with the same cookie (the same request bytes as 4: nginx gates
#      nothing, but parses and forwards the same header), the like-for-like reference of 4.
# Every server runs on loopback on free ports in a temp dir; nothing of the system's nginx
# is touched.
#
#   bench/gateway.sh [DURATION] [CONNECTIONS]     (defaults: 10s 64)
#   WAITROOM_BIN=path/to/waitroom bench/gateway.sh  (default: cargo build --release)
#   ROUNDS=6 bench/gateway.sh 10s 64   (default 1: the targets in turn, ROUNDS times over, then
#                                       the median of each ratio over the rounds)
#
# Two runs of the same target moments apart differ by up to ±10 % on a shared 2-core machine
# (nginx against nginx with a cookie, the same work, gave 0.89–1.10 in one afternoon), so a
# single round's ratio says little: the medians of several interleaved rounds are the figures.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DUR=${1:-10s}
CONN=${2:-64}
ROUNDS=${ROUNDS:-1}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a whole number, 1 or more" >&2; exit 1; }
THREADS=${WRK_THREADS:-2}
# nginx's workers: one per core, as `worker_processes auto` would; waitroom's runtime has a
# worker thread per core too.
WORKERS=${NGINX_WORKERS:-$(nproc)}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 1; }
[ -x "$NGINX" ] || { echo "nginx is not installed" >&2; exit 1; }

BIN=${WAITROOM_BIN:-}
if [ -z "$BIN" ]; then
    cargo build --release --quiet --bin waitroom
    BIN="${CARGO_TARGET_DIR:-target}/release/waitroom"
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
ORIGIN=$(free_port); PROXY=$(free_port); GATEWAY=$(free_port)

nginx_conf() { # NAME WORKERS SERVER-BLOCK
    local d="$tmp/$1"
    mkdir -p "$d"
    cat >"$d/nginx.conf" <<EOF
daemon off;
worker_processes $2;
pid $d/nginx.pid;
error_log $d/error.log;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $d/body; proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi; uwsgi_temp_path $d/uwsgi; scgi_temp_path $d/scgi;
    $3
}
EOF
    "$NGINX" -p "$d" -c "$d/nginx.conf" &
    pids+=($!)
}

nginx_conf origin 1 "server { listen 127.0.0.1:$ORIGIN; location / { default_type text/plain; return 200 'hello from the origin\n'; } }"
# nginx's upstream `keepalive_requests` (default 1000) would reopen each origin connection
# every 1000 requests, which the gateway's pool never does: raised so that both keep theirs.
nginx_conf proxy "$WORKERS" "upstream site { server 127.0.0.1:$ORIGIN; keepalive 128; keepalive_requests 1000000; }
    server { listen 127.0.0.1:$PROXY; location / {
        proxy_pass http://site; proxy_http_version 1.1; proxy_set_header Connection '';
        proxy_set_header Host \$host; proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto \$scheme; } }"

TOKEN=bench-admin-token-0123456789
"$BIN" serve --listen "127.0.0.1:$GATEWAY" --upstream "http://127.0.0.1:$ORIGIN" \
    --data-dir "$tmp/waitroom" --admin-token "$TOKEN" --no-demo --rate-limits off \
    --durability relaxed --log-format json >"$tmp/waitroom.log" 2>&1 &
pids+=($!)

wait_up() { for _ in $(seq 100); do curl -fs -o /dev/null "$1" && return 0; sleep 0.1; done; echo "$1 did not start" >&2; exit 1; }
wait_up "http://127.0.0.1:$ORIGIN/"
wait_up "http://127.0.0.1:$PROXY/"
wait_up "http://127.0.0.1:$GATEWAY/healthz"

# A gated event with room for everyone, and one admitted session's cookie.
curl -fs -o /dev/null -X PUT -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    -d '{"max_active": 100000, "paths": ["/checkout"]}' "http://127.0.0.1:$GATEWAY/api/v1/admin/events/bench"
for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Original-URI: /checkout' "http://127.0.0.1:$GATEWAY/api/v1/gate")
    [ "$code" = 401 ] && break
    sleep 0.05
done
COOKIE=$(curl -s -D - -o /dev/null "http://127.0.0.1:$GATEWAY/checkout" | tr -d '\r' \
    | sed -n 's/^[Ss]et-[Cc]ookie: \([^;]*\).*/\1/p' | head -1)
[ -n "$COOKIE" ] || { echo "no session cookie from the gateway" >&2; exit 1; }

run() { # LABEL URL HEADER KEY (an empty HEADER sends none; KEY names the rate's file)
    local out
    if [ -n "${3:-}" ]; then
        out=$(wrk -t"$THREADS" -c"$CONN" -d"$DUR" --latency -H "$3" "$2")
    else
        out=$(wrk -t"$THREADS" -c"$CONN" -d"$DUR" --latency "$2")
    fi
    local rps p99 errs
    rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
    printf '| %-34s | %10s | %8s | %s\n' "$1" "$rps" "$p99" "${errs:-}"
    echo "$rps" >"$tmp/rps.$4"
}

echo "wrk -t$THREADS -c$CONN -d$DUR, nginx workers: $WORKERS, cores: $(nproc), rounds: $ROUNDS"
: >"$tmp/ratios"
for round in $(seq "$ROUNDS"); do
    [ "$ROUNDS" = 1 ] || echo "round $round"
    echo "| target                             | requests/s | p99      | errors"
    echo "|------------------------------------|------------|----------|-------"
    run "origin directly" "http://127.0.0.1:$ORIGIN/" "" origin
    run "nginx proxy" "http://127.0.0.1:$PROXY/" "" nginx
    run "waitroom gateway, ungated path" "http://127.0.0.1:$GATEWAY/" "" pass
    run "waitroom gateway, gated + session" "http://127.0.0.1:$GATEWAY/checkout" "Cookie: $COOKIE" gated
    run "nginx proxy, the same cookie" "http://127.0.0.1:$PROXY/checkout" "Cookie: $COOKIE" nginxc
    # The round's ratios, printed, and kept unrounded for the medians.
    awk -v n="$(cat "$tmp/rps.nginx")" -v c="$(cat "$tmp/rps.nginxc")" -v p="$(cat "$tmp/rps.pass")" \
        -v g="$(cat "$tmp/rps.gated")" -v keep="$tmp/ratios" 'BEGIN {
        printf "gateway / nginx: ungated %.2f, gated %.2f (gated / nginx with the same cookie %.2f)\n", p / n, g / n, g / c
        printf "%.6f %.6f %.6f %.6f\n", p / n, g / n, g / c, c / n >>keep }'
done
if [ "$ROUNDS" != 1 ]; then
    # Column K of the rounds' ratios: median, min and max.
    ratio_stat() { cut -d' ' -f"$1" "$tmp/ratios" | sort -n | awk '{ v[NR] = $1 } END {
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "median %.2f (%.2f–%.2f)", m, v[1], v[NR] }'; }
    echo "over $ROUNDS rounds: ungated / nginx $(ratio_stat 1); gated / nginx $(ratio_stat 2);" \
        "gated / nginx with the same cookie $(ratio_stat 3); nginx with the cookie / nginx $(ratio_stat 4)"
fi
