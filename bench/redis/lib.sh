# Sourced by the benchmarks in this folder: a private redis-server (no persistence) on a
# free loopback port, with its data, logs and an Ed25519 signing key in a temp dir. On
# exit every pid in PIDS (and NODE_PID, when set) is killed, Redis is shut down and the
# temp dir removed.
#
#   redis_start NAME   # sets WORK (/tmp/NAME.XXXXXX), PORT, REDIS_PID; R runs redis-cli

PIDS=()
CAP_DIR=""
NODE_PID=""
PORT=""
WORK=""

redis_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "$NODE_PID" ] && kill "$NODE_PID" 2>/dev/null || true
    [ -n "$PORT" ] && redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    if [ -n "$CAP_DIR" ]; then
        # A cgroup is removed once it holds no process: wait for Redis to be gone.
        for _ in $(seq 50); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
        rmdir "$CAP_DIR" 2>/dev/null || echo "redis_cap: could not remove $CAP_DIR" >&2
    fi
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

# redis_cap PERCENT: limits the private redis-server to PERCENT % of one core (a CPU cgroup:
# v1's cfs quota, or v2's cpu.max; needs root). Redis is single-threaded, so on a machine
# where the nodes and the load generator have cores to spare Redis is what bounds a hot
# event's throughput; on this 2-core machine the node and the generator would bound it
# first. With Redis capped, every phase of a run (the yardstick and the nodes) is bounded
# by the same Redis CPU, and their rates compare what each operation costs Redis, its
# system calls included. The period is 10 ms, so a capped Redis stalls at most ~10 ms.
redis_cap() {
    local pct=$1 period=10000
    if ! [[ "$pct" =~ ^[0-9]+$ ]] || [ "$pct" -lt 10 ] || [ "$pct" -gt 100 ]; then
        echo "redis_cap: the cap is a whole percent of one core, 10 to 100 (got '$pct')" >&2
        return 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "redis_cap: a CPU cgroup needs root" >&2
        return 1
    fi
    local quota=$((period * pct / 100))
    if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cgroup.procs ]; then
        CAP_DIR=/sys/fs/cgroup/cpu/waitroom-bench-redis.$$
        mkdir "$CAP_DIR"
        echo "$period" >"$CAP_DIR/cpu.cfs_period_us"
        echo "$quota" >"$CAP_DIR/cpu.cfs_quota_us"
    elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        CAP_DIR=/sys/fs/cgroup/waitroom-bench-redis.$$
        # Enables the cpu controller for the root's children (left enabled: it changes
        # nothing for a group without limits).
        grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
        mkdir "$CAP_DIR"
        echo "$quota $period" >"$CAP_DIR/cpu.max"
    else
        echo "redis_cap: no CPU cgroup controller here" >&2
        return 1
    fi
    # Writing the pid to cgroup.procs moves every thread of Redis. The group is removed at
    # exit, once Redis is shut down (`redis_cleanup`).
    echo "$REDIS_PID" >"$CAP_DIR/cgroup.procs"
}
