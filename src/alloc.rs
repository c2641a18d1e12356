//! The binaries' allocator: mimalloc, asked the way its plain `malloc` is asked whenever
//! that gives the alignment a layout needs.
//!
//! `mimalloc::MiMalloc` sends every allocation through `mi_malloc_aligned`, whatever its
//! alignment. That path first tries a free block of the size's bin that happens to sit at
//! the alignment; when the size is over 1 KiB (hyper's read buffers, reserved afresh at
//! every request on each side of a proxied request), or its bin's page has no free block
//! at hand, it falls to a generic path (the size's bin looked up, a check of natural
//! alignment, an over-allocation routine) before allocating as `mi_malloc` would: about
//! 190 instructions more per such allocation, ~4 per proxied request, plus the aligned
//! wrapper's checks on every other one. Every layout of the request paths has an alignment
//! of 16 or less, which `mi_malloc` gives any block of 16 bytes or more (its blocks of
//! that size are 16-aligned; smaller ones are aligned to their size's power of two at
//! least 8), so those go straight to `mi_malloc`, `mi_zalloc` and `mi_realloc`, the rule
//! Rust's own `System` allocator follows for `malloc`. Larger alignments, or an
//! alignment larger than the size, still take the aligned calls.
//!
//! Set as the `#[global_allocator]` in the binaries only (src/main.rs, bench/*.rs), never
//! in the library: a test binary keeps the allocator it chooses (tests/allocations.rs).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The largest alignment `mi_malloc` gives every block of at least that many bytes
/// (mimalloc's `MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// mimalloc, through its plain calls where they align enough (see the module's doc).
pub struct MiMalloc;

/// Whether `mi_malloc` of `size` bytes is aligned to `align`.
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every pointer returned comes from mimalloc with at least the layout's size and
// alignment (`plain`), and `mi_free` / `mi_realloc*` accept any of mimalloc's blocks,
// however they were allocated.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align(), layout.size()) {
            mi::mi_malloc(layout.size()) as *mut u8
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain(layout.align(), layout.size()) {
            mi::mi_zalloc(layout.size()) as *mut u8
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void);
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain(layout.align(), new_size) {
            mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`; children
/// inherit it). The queue's tables grow with every join, and mimalloc asks for huge pages
/// on its arenas: each first touch of a 2 MiB page then zeroes all of it inside one
/// request, a stall of a worker that showed as joins' p99 (4.4 ms against 2.0 ms without,
/// and 5 % fewer `sync` joins a second; docs/PERFORMANCE.md, "Huge pages"). Redis advises
/// the same for the same reason. The setting is read at each page fault, so calling this
/// at the top of `main` covers every table; pages already faulted in stay as they are.
/// Best effort: a kernel without THP or the call (not Linux) leaves things as they were.
pub fn small_pages_only() {
    #[cfg(target_os = "linux")]
    // SAFETY: `prctl` with `PR_SET_THP_DISABLE` takes plain integers and touches no memory
    // of ours.
    unsafe {
        // The kernel reads the arguments as `unsigned long` (and refuses non-zero unused ones).
        let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size up to 5 KiB (all of mimalloc's small bins and some beyond) at every
    /// alignment up to 64 (plain and aligned calls alike) comes back aligned, writable
    /// over its whole size, zeroed when asked, and keeps its bytes through a realloc that
    /// grows and one that shrinks it.
    #[test]
    fn every_block_has_its_layouts_alignment() {
        let a = MiMalloc;
        for align in [1usize, 2, 4, 8, 16, 32, 64] {
            for size in (1..=5 * 1024).chain([16 << 10, 100 << 10]) {
                let layout = Layout::from_size_align(size, align).unwrap();
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    std::ptr::write_bytes(p, 0xa5, size);
                    let grown = size * 2 + 8;
                    let q = a.realloc(p, layout, grown);
                    assert_eq!(q as usize % align, 0, "grown {grown}, align {align}");
                    assert!((0..size).all(|i| *q.add(i) == 0xa5));
                    let shrunk = size.div_ceil(2);
                    let grown_layout = Layout::from_size_align(grown, align).unwrap();
                    let r = a.realloc(q, grown_layout, shrunk);
                    assert_eq!(r as usize % align, 0, "shrunk {shrunk}, align {align}");
                    assert!((0..shrunk).all(|i| *r.add(i) == 0xa5));
                    a.dealloc(r, Layout::from_size_align(shrunk, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed {size}, align {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }

    /// Many blocks of each layout live at once (several pages of each bin, so blocks other
    /// than a page's first ones are checked), freed in a scattered order and allocated again
    /// (blocks from the free list, not only fresh ones), and reallocated across the plain /
    /// aligned boundary in both directions, including the huge sizes past 64 KiB.
    #[test]
    fn many_live_blocks_are_aligned() {
        let a = MiMalloc;
        let sizes: Vec<usize> = (1..=80)
            .chain([96, 100, 127, 128, 200, 1000, 1024, 1025, 4096, 5000])
            .chain([(64 << 10) + 1, 300 << 10])
            .collect();
        for align in [1usize, 2, 4, 8, 16, 32, 64, 4096] {
            for &size in &sizes {
                let n = if size > 8 << 10 { 8 } else { 600 };
                let layout = Layout::from_size_align(size, align).unwrap();
                let check = |p: *mut u8, what: &str, s: usize| {
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{what}: size {s}, align {align}");
                };
                unsafe {
                    let mut live: Vec<*mut u8> = (0..n)
                        .map(|i| {
                            let p = if i % 2 == 0 {
                                a.alloc(layout)
                            } else {
                                a.alloc_zeroed(layout)
                            };
                            check(p, "alloc", size);
                            p.write_bytes(i as u8, size);
                            p
                        })
                        .collect();
                    // Free every third block, then allocate into the holes.
                    for i in (0..n).step_by(3) {
                        a.dealloc(live[i], layout);
                        live[i] = a.alloc(layout);
                        check(live[i], "reuse", size);
                        live[i].write_bytes(i as u8, size);
                    }
                    // Shrink each to below the alignment and back, keeping the others live.
                    for (i, p) in live.iter_mut().enumerate() {
                        let small = (i % 20) + 1;
                        let keep = small.min(size);
                        let q = a.realloc(*p, layout, small);
                        check(q, "shrink", small);
                        assert!((0..keep).all(|k| *q.add(k) == i as u8));
                        let small_layout = Layout::from_size_align(small, align).unwrap();
                        let r = a.realloc(q, small_layout, size);
                        check(r, "regrow", size);
                        assert!((0..keep).all(|k| *r.add(k) == i as u8));
                        *p = r;
                    }
                    for p in live {
                        a.dealloc(p, layout);
                    }
                }
            }
        }
    }
}
