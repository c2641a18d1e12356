#!/usr/bin/env bash
# Gateway mode's cost per request, for a machine that is not quiet (docs/PERFORMANCE.md
# "Gateway mode"). Throughput on a shared 2-core machine swings by a third from one run to
# the next; the CPU each server spends per request (user + system, from /proc, over the
# whole wrk run) and its context switches per request (perf stat) hardly do. One origin
# (an nginx answering a fixed body), nginx proxying it (as bench/gateway.sh configures it),
# and one waitroom gateway per binary given, measured in turn, ROUNDS times:
#
#   bench/gateway-cpu.sh BIN [BIN...]        (env: DUR=5s ROUNDS=3 CONN=64 WPATH=/)
#
# A BIN may be a script that sets the environment and `exec`s the binary (e.g.
# TOKIO_WORKER_THREADS=1). Needs wrk, nginx and perf.
set -euo pipefail
DUR=${DUR:-5s}; ROUNDS=${ROUNDS:-3}; CONN=${CONN:-64}
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
fp() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
nginx_conf() { local d="$tmp/$1"; mkdir -p "$d"; cat >"$d/nginx.conf" <<E2
daemon off; worker_processes $2; pid $d/nginx.pid; error_log $d/error.log;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
 client_body_temp_path $d/body; proxy_temp_path $d/proxy; fastcgi_temp_path $d/fastcgi; uwsgi_temp_path $d/uwsgi; scgi_temp_path $d/scgi;
 $3 }
E2
  "$(command -v nginx || echo /usr/sbin/nginx)" -p "$d" -c "$d/nginx.conf" & pids+=($!); }
ORIGIN=$(fp); PROXY=$(fp)
nginx_conf origin 1 "server { listen 127.0.0.1:$ORIGIN; location / { default_type text/plain; return 200 'hello from the origin\n'; } }"
nginx_conf proxy "$(nproc)" "upstream site { server 127.0.0.1:$ORIGIN; keepalive 128; keepalive_requests 1000000; }
 server { listen 127.0.0.1:$PROXY; location / { proxy_pass http://site; proxy_http_version 1.1; proxy_set_header Connection '';
 proxy_set_header Host \$host; proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto \$scheme; } }"
NGPID=${pids[-1]}
names=(); ports=(); wpids=()
for b in "$@"; do p=$(fp); mkdir -p "$tmp/w$p"
  $b serve --listen 127.0.0.1:$p --upstream http://127.0.0.1:$ORIGIN --data-dir $tmp/w$p --admin-token bench-admin-token-0123456789 --no-demo --rate-limits off --durability relaxed --log-format json >$tmp/w$p.log 2>&1 &
  pids+=($!); wpids+=($!); names+=("$b"); ports+=($p); done
sleep 1.5
for p in $ORIGIN $PROXY "${ports[@]}"; do for _ in $(seq 50); do curl -fs -o /dev/null http://127.0.0.1:$p/ && break; sleep 0.1; done; done
US_PER_TICK=$((1000000 / $(getconf CLK_TCK)))
ticks() { local t=0; for q in "$@"; do for c in $q $(pgrep -P $q || true); do t=$((t + $(awk -v f=${F:-14} '{print $f}' /proc/$c/stat))); done; done; echo $t; }
# r URL PID: req/s, CPU us per request, context switches per request
r() { local t0 t1 out n cs
  t0=$(ticks $2); s0=$(F=15 ticks $2)
  perf stat -x, -e context-switches,cpu-migrations -p $(echo $2 $(pgrep -P $2 || true) | tr ' ' ,) -o $tmp/perf.txt -- sleep ${DUR%s} >/dev/null 2>&1 &
  local pp=$!
  out=$(wrk -t2 -c$CONN -d$DUR "$1"); wait $pp || true
  t1=$(ticks $2); s1=$(F=15 ticks $2)
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  cs=$(awk -F, '/context-switches/ {print $1}' $tmp/perf.txt)
  awk -v rps="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")" -v n=$n -v dt=$((t1-t0)) -v ds=$((s1-s0)) -v cs=$cs -v us=$US_PER_TICK 'BEGIN { printf "%.0f rps %.1f+%.1f us/req (user+sys) %.2f cs/req", rps, dt*us/n, ds*us/n, cs/n }'; }
for i in $(seq $ROUNDS); do
  line="round $i load $(cut -d' ' -f1 /proc/loadavg): nginx $(r http://127.0.0.1:$PROXY/ $NGPID)"
  for k in "${!ports[@]}"; do line="$line | ${names[$k]} $(r http://127.0.0.1:${ports[$k]}${WPATH:-/} ${wpids[$k]})"; done
  echo "$line"
done
