#!/usr/bin/env python3
"""The cost of a small append into a region cached in large folios against one cached in
single pages (docs/PERFORMANCE.md, "Large folios under the journal's appends").

    python3 bench/folio_appends.py DIR      (DIR on the store's file system)

Writes a file's region first with 1 MiB writes (cached in large folios where the kernel
does that: Linux >= 6.16 on ext4) or with 4 KiB writes (single pages), then times 300-byte
`pwrite`s over it, as the journal's appends are. Each layout twice, alternating.
"""
import os
import sys
import time

d = sys.argv[1]


def run(chunk, n=20000, rec=300):
    p = os.path.join(d, f"folio-appends-{chunk}")
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    total = n * rec + (1 << 20)
    zeros = b"\0" * chunk
    for off in range(0, total, chunk):
        os.pwrite(fd, zeros, off)
    os.fsync(fd)
    buf = b"x" * rec
    t = time.perf_counter()
    for i in range(n):
        os.pwrite(fd, buf, i * rec)
    dt = time.perf_counter() - t
    os.close(fd)
    os.unlink(p)
    return dt / n * 1e6


for chunk in (1 << 20, 4096, 1 << 20, 4096):
    print(f"region written in {chunk:>7}-byte writes: {run(chunk):.2f} µs per 300-byte append")
