# The disk's sync floor: fdatasync of 1,500-byte appends into zeroed files (blocks already
# allocated, so no file-system commit is needed), by THREADS threads at once, each on its
# own file or all on one file, for SECONDS. One thread is the floor a `sync` join waits
# for; two or more show whether syncs in flight at the same time queue behind each other.
#   python3 bench/fsync_floor.py DIR [THREADS] [own|one] [SECONDS] [plain|stat|quiet]
# (DIR on the store's disk). MODE `stat` does an `fstat` of the file before each append, as
# the journal writer did once per sync until 2026-11-28: on Linux >= 6.13 (multigrain
# timestamps) a change time that was read makes the next append dirty the inode, and the
# `fdatasync` then writes it too. `quiet` asks what the writer asks now, without a `stat`:
# the size by `lseek` to the end and the file's existence by `access`.
import os, sys, threading, time

d = sys.argv[1]
k = int(sys.argv[2]) if len(sys.argv) > 2 else 1
one = len(sys.argv) > 3 and sys.argv[3] == 'one'
secs = float(sys.argv[4]) if len(sys.argv) > 4 else 10
mode = sys.argv[5] if len(sys.argv) > 5 else 'plain'
if mode not in ('plain', 'stat', 'quiet'):
    sys.exit(f'unknown mode {mode!r}: plain, stat or quiet')
REC = 1500


def zeroed(i):
    p = os.path.join(d, f'fsync-floor-{i}')
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    z = b'\0' * (1 << 20)
    for _ in range(64):
        os.write(fd, z)
    os.fsync(fd)
    return fd, p


files = [zeroed(0)] if one else [zeroed(i) for i in range(k)]
lat, lock = [], threading.Lock()


def run(i):
    fd, path = files[0 if one else i]
    # Threads on one file append to their own stretch of it.
    off = i * (64 << 20) // k if one else 0
    buf, t, end = b'x' * REC, [], time.time() + secs
    while time.time() < end:
        if mode == 'stat':
            os.fstat(fd)
        elif mode == 'quiet':
            os.lseek(fd, 0, os.SEEK_END)
            os.access(path, os.F_OK)
        os.pwrite(fd, buf, off)
        off += REC
        s = time.perf_counter()
        os.fdatasync(fd)
        t.append(time.perf_counter() - s)
    with lock:
        lat.extend(t)


threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for fd, p in files:
    os.close(fd)
    os.unlink(p)
lat.sort()
q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1000
print(f"threads={k} {'one file' if one else 'own files'} {mode}: {len(lat) / secs:.0f} syncs/s; "
      f"fdatasync ms p50 {q(.5):.2f} p90 {q(.9):.2f} p99 {q(.99):.2f} p99.9 {q(.999):.2f} "
      f"max {lat[-1] * 1000:.2f}")
