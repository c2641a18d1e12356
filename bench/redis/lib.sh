# Sourced by the benchmarks in this folder: a private redis-server (no persistence) on a
# free loopback port, with its data, logs and an Ed25519 signing key in a temp dir. On
# exit every pid in PIDS (and NODE_PID, when set) is killed, Redis is shut down and the
# temp dir removed.
#
#   redis_start NAME   # sets WORK (/tmp/NAME.XXXXXX), PORT, REDIS_PID; R runs redis-cli

PIDS=()
NODE_PID=""
PORT=""
WORK=""

redis_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "$NODE_PID" ] && kill "$NODE_PID" 2>/dev/null || true
    [ -n "$PORT" ] && redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    [ -n "$WORK" ] && rm -rf "$WORK"
}

R() { redis-cli -p "$PORT" "$@"; }

redis_start() {
    WORK=$(mktemp -d "/tmp/$1.XXXXXX")
    trap redis_cleanup EXIT
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
        --daemonize yes --pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log"
    until R ping >/dev/null 2>&1; do sleep 0.05; done
    REDIS_PID=$(cat "$WORK/redis.pid")
    openssl genpkey -algorithm ed25519 -out "$WORK/key.pem" 2>/dev/null
}
