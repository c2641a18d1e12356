# fdatasync of small appends into a sparse file (as fjall preallocates its journals, with
# set_len) and into a file whose zeros were written first, while another thread writes and
# fsyncs 16 MiB files (as the store's flushes and compactions do).
#   python3 bench/fsync_overwrite.py DIR [SYNCS] [BYTES]   (DIR on the store's disk)
import os, time, sys, threading
d = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
rec = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
stop = False
def other():
    z = b'\1' * (1 << 20); i = 0
    while not stop:
        p = os.path.join(d, f'other{i%2}')
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        for _ in range(16): os.write(fd, z)
        os.fsync(fd); os.close(fd); i += 1
        time.sleep(0.5)
def run(kind):
    p = os.path.join(d, kind)
    if os.path.exists(p): os.unlink(p)
    fd = os.open(p, os.O_CREAT|os.O_RDWR, 0o600)
    size = 64 << 20
    if kind == 'sparse': os.ftruncate(fd, size)
    else:
        z = b'\0' * (1 << 20)
        for i in range(64): os.write(fd, z)
    os.fsync(fd); os.lseek(fd, 0, 0)
    buf = b'x' * rec; t = []
    for i in range(n):
        os.write(fd, buf)
        s = time.perf_counter(); os.fdatasync(fd); t.append(time.perf_counter() - s)
    t.sort(); os.close(fd); os.unlink(p)
    q = lambda f: t[min(len(t)-1, int(f*len(t)))]*1000
    print(f"{kind:8} n={n} rec={rec}B fdatasync ms p50 {q(.5):.2f} p90 {q(.9):.2f} p99 {q(.99):.2f} p99.9 {q(.999):.2f} max {t[-1]*1000:.2f} sum {sum(t):.2f}s", flush=True)
th = threading.Thread(target=other); th.start()
try:
    for k in ['sparse', 'zeroed'] * 3: run(k)
finally:
    stop = True; th.join()
    for i in range(2):
        try: os.unlink(os.path.join(d, f'other{i}'))
        except FileNotFoundError: pass
