#!/usr/bin/env python3
"""Server CPU per request, by category, from a `perf script` dump (docs/PERFORMANCE.md,
"Where the time goes").

    target/release/waitroom-bench run --scenario join --duration 9 &   # note its req/s
    perf record -e cpu-clock -F 499 --call-graph dwarf,8192 -p <server pid> -o join.data -- sleep 4
    perf script -i join.data > join.script
    python3 bench/perf_classify.py join.script <req/s> 4 499

Arguments: the dump, the request rate during the recording, the recording's seconds, the
sampling frequency. Each sample is walked from its leaf upward and counted in the first
category whose pattern matches a frame's function path (generic arguments stripped), so
a `malloc` called from hyper counts as malloc, and a wake-up inside a TCP send counts as
a wake-up.
"""
import sys,re,collections
path,rps,secs,hz=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])
def base(name):
    name=name.strip()
    if name.startswith('<'):
        m=re.match(r'<([^ ]+?)(<| as |>)',name)
        return m.group(1) if m else name
    return re.split(r'[<(]',name,1)[0]
rules=[
 ("disk: fdatasync + journal file writes (kernel)", r'^(fdatasync|ext4_|blk_|__blk|virtio|virtqueue|iowrite|vp_notify|submit_bio|file_write_and_wait|__filemap_fdatawrite|do_fsync|__x64_sys_fdatasync|jbd2|generic_perform_write|ext4)'),
 ("malloc/free (incl. glibc arena-lock futexes)", r'^(malloc|_int_malloc|_int_free|cfree|free|realloc|_int_realloc|calloc|__libc_calloc|malloc_consolidate|__lll_lock|unlink_chunk|sysmalloc|__GI___libc_malloc|__GI___libc_free|__GI___lll_lock|tcache|__libc_malloc|__libc_free|alloc_perturb|_int_memalign|__rustc::__rust_alloc|__rustc::__rust_dealloc|__rustc::__rust_realloc)'),
 ("journal hand-off: std mpsc channel (futex wakes)", r'^std::sync::mpmc'),
 ("TCP send/recv on loopback (kernel)", r'^(tcp_|sock_|__tcp|inet_|ip_|__ip|__dev_queue_xmit|net_rx|__netif|do_writev|vfs_writev|__GI___writev|__libc_recv|__sys_recvfrom|skb_|__skb|loopback|__sys_sendto|sk_|release_sock|lock_sock)'),
 ("thread park/wake, epoll, scheduling", r'^(futex|__x64_sys_futex|do_futex|try_to_wake_up|wake_up|__wake_up|schedule|__schedule|finish_task_switch|epoll|do_epoll|ep_|eventfd|do_sched_yield|__x64_sys_sched_yield|irqentry_exit|exit_to_user_mode|syscall_exit|tokio::runtime::park|tokio::runtime::scheduler|parking_lot|std::thread::park|tokio::runtime::driver|tokio::runtime::io|__GI___sched_yield|sched_yield)'),
 ("metrics (histogram + counters with labels)", r'^(metrics|metrics_util|metrics_exporter_prometheus)::|AtomicBucket|^waitroom::telemetry|^waitroom::http::ops::track_metrics|^waitroom::http::edge::finish'),
 ("JSON (serde_json)", r'^serde_json::|^serde::|^serde_core::'),
 ("tokens: HMAC-SHA256, getrandom, base64", r'^(sha2|hmac|getrandom|base64|waitroom::tokens|crng_|get_random|__GI___getrandom|chacha|__x64_sys_getrandom)'),
 ("queue rules + store (core, embedded, hash maps)", r'^(waitroom::core|waitroom::store::embedded|hashbrown|core::hash::sip|std::collections::hash|waitroom::store::notices_of)'),
 ("journal thread: fjall batch + encoding", r'^(fjall|lsm_tree|postcard|waitroom::store::journal|crossbeam_skiplist|byteview|std::collections::btree|alloc::collections::btree)'),
 ("HTTP stack + runtime (hyper, axum, tower, tokio)", r'^(hyper|axum|tower|http|tokio|mio|bytes|tower_http|httparse|futures|waitroom::http)'),
]
comp=[(n,re.compile(p)) for n,p in rules]
cats=collections.Counter(); tot=0
for s in open(path).read().split('\n\n'):
    lines=[l.strip() for l in s.strip().split('\n') if l.strip()]
    if not lines: continue
    comm=lines[0].split()[0]
    st=[base(re.sub(r'^[0-9a-f]+ ','',l).rsplit(' (',1)[0].split('+0x')[0]) for l in lines[1:]]
    tot+=1
    found=None
    for f in st:
        for n,r in comp:
            if r.search(f): found=n; break
        if found: break
    if not found and comm.startswith('waitroom-journa'): found="journal thread: fjall batch + encoding"
    cats[found or 'other']+=1
req=rps*secs
print(f"samples {tot}; cores {tot/hz/secs:.2f}; µs of server CPU per request {tot/hz/req*1e6:.1f}")
for k,v in cats.most_common():
    print(f"  {v/hz/req*1e6:6.1f} µs  {100*v/tot:5.1f}%  {k}")
