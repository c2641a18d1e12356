# The disk's sync floor: fdatasync of 1,500-byte appends into zeroed files (blocks already
# allocated, so no file-system commit is needed), by THREADS threads at once, each on its
# own file or all on one file, for SECONDS. One thread is the floor a `sync` join waits
# for; two or more show whether syncs in flight at the same time queue behind each other.
#   python3 bench/fsync_floor.py DIR [THREADS] [own|one] [SECONDS]   (DIR on the store's disk)
import os, sys, threading, time

d = sys.argv[1]
k = int(sys.argv[2]) if len(sys.argv) > 2 else 1
one = len(sys.argv) > 3 and sys.argv[3] == 'one'
secs = float(sys.argv[4]) if len(sys.argv) > 4 else 10
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
    fd = files[0 if one else i][0]
    # Threads on one file append to their own stretch of it.
    off = i * (64 << 20) // k if one else 0
    buf, t, end = b'x' * REC, [], time.time() + secs
    while time.time() < end:
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
print(f"threads={k} {'one file' if one else 'own files'}: {len(lat) / secs:.0f} syncs/s; "
      f"fdatasync ms p50 {q(.5):.2f} p90 {q(.9):.2f} p99 {q(.99):.2f} p99.9 {q(.999):.2f} "
      f"max {lat[-1] * 1000:.2f}")
