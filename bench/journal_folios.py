#!/usr/bin/env python3
"""Which cached pages of a file sit in large folios (docs/PERFORMANCE.md, "Large folios
under the journal's appends"). Needs root: the kernel hides page frame numbers otherwise.

    python3 bench/journal_folios.py FILE        e.g. DATA_DIR/store/N.jnl of a running server

Maps FILE, asks mincore which pages are cached, touches only those (which maps the folio
already cached and caches nothing new), and reads each one's flags from /proc/kpageflags:
KPF_COMPOUND_HEAD (bit 15) or KPF_COMPOUND_TAIL (16) means a page of a large folio. Prints
the totals and, per MiB of the file, "large/single" cached pages.
"""
import ctypes
import mmap
import os
import struct
import sys

path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
# A private mapping reads the page cache's folios until written; it is never written here.
m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
libc = ctypes.CDLL(None, use_errno=True)
pages = (size + 4095) // 4096
cached = (ctypes.c_ubyte * pages)()
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
if libc.mincore(ctypes.c_void_p(base), ctypes.c_size_t(size), cached) != 0:
    sys.exit(f"mincore: errno {ctypes.get_errno()}")
pagemap = open("/proc/self/pagemap", "rb")
flags = open("/proc/kpageflags", "rb")
large = single = 0
per_mib = {}
for i in range(pages):
    if not cached[i] & 1:
        continue
    _ = m[i * 4096]
    pagemap.seek((base // 4096 + i) * 8)
    entry = struct.unpack("Q", pagemap.read(8))[0]
    pfn = entry & ((1 << 55) - 1)
    if not entry >> 63 or pfn == 0:
        continue  # not mapped, or frame numbers hidden (not root)
    flags.seek(pfn * 8)
    f = struct.unpack("Q", flags.read(8))[0]
    bucket = per_mib.setdefault(i * 4096 >> 20, [0, 0])
    if f >> 15 & 1 or f >> 16 & 1:
        large += 1
        bucket[0] += 1
    else:
        single += 1
        bucket[1] += 1
print(f"{path}: {large + single} cached pages seen, {large} in large folios, {single} single")
print(" ".join(f"{k}:{v[0]}/{v[1]}" for k, v in sorted(per_mib.items())))
