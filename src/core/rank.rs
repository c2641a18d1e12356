//! Order statistics over join sequence numbers: a Fenwick tree that answers "how many
//! waiting places joined before this one" and "which is the k-th waiting place" in
//! O(log n), at four bytes per sequence number in its window.
//!
//! Sequence numbers only grow, so the tree covers a sliding window `[base, base + cap)`.
//! When a new number falls past the window the owner moves it (see
//! [`RankIndex::needs_rebuild`], [`RankIndex::rewindow`]); the window is twice the live
//! span, so moves are rare.
//!
//! **No step stops the world.** The numbers live in fixed chunks of [`CHUNK`] slots, each
//! chunk its own Fenwick tree, under a small Fenwick tree of the chunks' totals. A number
//! past the last chunk appends zeroed chunks (one 16 KiB allocation per 4,096 numbers,
//! never a copy of the others), and moving the window drops the chunks below its new base
//! (they hold no marks) and rebuilds the small tree: O(span / 4,096), a few hundred steps at
//! a million places. A single tree over the whole window had to double by copying it (2 MB
//! and its page faults at 2^19 + 1 places, under the event's lock) and slide by rewriting
//! every number of it.

#[derive(Debug, Clone)]
pub struct RankIndex {
    /// The lowest number the window accepts.
    base: u64,
    /// The window's size: it accepts `[base, base + cap)` (a power of two).
    cap: u64,
    /// The first number of `chunks[0]`: `base` rounded down to a multiple of [`CHUNK`].
    origin: u64,
    /// Chunk `j` covers `[origin + j·CHUNK, origin + (j + 1)·CHUNK)`, as a 1-indexed Fenwick
    /// tree whose node `i` is stored at `[i - 1]` (so node `CHUNK`, the last, is the total).
    chunks: Vec<Chunk>,
    /// 1-indexed Fenwick tree over the chunks' totals; `top.len() - 1` is a power of two
    /// ≥ `chunks.len()` so `kth` can descend bit by bit.
    top: Vec<u32>,
    len: u64,
}

const CHUNK_BITS: u32 = 12;
/// Numbers per chunk.
pub const CHUNK: usize = 1 << CHUNK_BITS;
const MIN_CAP: usize = 1024;

type Chunk = Box<[u32; CHUNK]>;

fn zero_chunk() -> Chunk {
    // `vec![0; n]` asks the allocator for zeroed memory: no separate pass of writes.
    vec![0u32; CHUNK]
        .into_boxed_slice()
        .try_into()
        .expect("CHUNK elements")
}

fn window_cap(span: u64, min: usize) -> u64 {
    (span.saturating_mul(2).max(min as u64)).next_power_of_two()
}

fn lowbit(i: usize) -> usize {
    i & i.wrapping_neg()
}

/// Turns one count per slot into Fenwick partial sums, in place (`tree[i - 1]` is node `i`).
fn fenwick_build(tree: &mut [u32]) {
    let n = tree.len();
    for i in 1..=n {
        let parent = i + lowbit(i);
        if parent <= n {
            tree[parent - 1] += tree[i - 1];
        }
    }
}

/// Sum of the first `n` slots.
fn fenwick_prefix(tree: &[u32], n: usize) -> u64 {
    let mut i = n;
    let mut sum = 0u64;
    while i > 0 {
        sum += u64::from(tree[i - 1]);
        i &= i - 1;
    }
    sum
}

/// The largest `pos` whose prefix sum is below `rem`, and `rem` less that sum. `tree.len()`
/// must be a power of two.
fn fenwick_descend(tree: &[u32], mut rem: u64) -> (usize, u64) {
    let mut pos = 0usize;
    let mut step = tree.len();
    while step > 0 {
        let next = pos + step;
        if next <= tree.len() && u64::from(tree[next - 1]) < rem {
            pos = next;
            rem -= u64::from(tree[next - 1]);
        }
        step >>= 1;
    }
    (pos, rem)
}

impl Default for RankIndex {
    fn default() -> Self {
        Self::new(0, MIN_CAP)
    }
}

impl RankIndex {
    pub fn new(base: u64, cap: usize) -> Self {
        RankIndex {
            base,
            cap: cap.max(MIN_CAP).next_power_of_two() as u64,
            origin: base & !(CHUNK as u64 - 1),
            chunks: Vec::new(),
            top: vec![0; 2],
            len: 0,
        }
    }

    /// Rebuilds the window from `base` so that it holds at least `span` numbers, marking
    /// `seqs` (each ≥ `base`). O(numbers up to the highest mark).
    pub fn rebuild(base: u64, span: u64, seqs: impl Iterator<Item = u64>) -> Self {
        let mut r = RankIndex::new(base, MIN_CAP);
        r.cap = window_cap(span, MIN_CAP);
        for s in seqs {
            debug_assert!(s >= base, "a mark below the window");
            let (j, i) = r.slot(s);
            r.reach(j);
            r.chunks[j][i] += 1;
            r.len += 1;
        }
        for c in &mut r.chunks {
            fenwick_build(&mut c[..]);
        }
        r.rebuild_top();
        r
    }

    /// Moves the window to start at `base` and hold at least `span` numbers, keeping every
    /// mark (each must be ≥ `base`). O(span / CHUNK): the chunks wholly below the new base
    /// are dropped (they hold no marks), zeroed ones are put in front when the base goes
    /// down, and only the tree of the chunks' totals is rebuilt.
    pub fn rewindow(&mut self, base: u64, span: u64) {
        let origin = base & !(CHUNK as u64 - 1);
        if origin > self.origin {
            let gone = (((origin - self.origin) >> CHUNK_BITS) as usize).min(self.chunks.len());
            debug_assert!(
                self.chunks[..gone].iter().all(|c| c[CHUNK - 1] == 0),
                "a mark below the new window"
            );
            self.chunks.drain(..gone);
        } else if origin < self.origin && !self.chunks.is_empty() {
            let add = ((self.origin - origin) >> CHUNK_BITS) as usize;
            self.chunks
                .splice(0..0, std::iter::repeat_with(zero_chunk).take(add));
        }
        self.origin = origin;
        self.base = base;
        self.cap = window_cap(span, MIN_CAP);
        self.rebuild_top();
        debug_assert_eq!(
            self.count_below(base + self.cap),
            self.len,
            "a mark fell outside the new window"
        );
    }

    /// The window's size (numbers from `base`).
    fn cap(&self) -> u64 {
        self.cap
    }

    /// Chunk and slot in it of `seq` (≥ `origin`).
    fn slot(&self, seq: u64) -> (usize, usize) {
        let off = seq - self.origin;
        (
            (off >> CHUNK_BITS) as usize,
            (off & (CHUNK as u64 - 1)) as usize,
        )
    }

    /// Appends zeroed chunks up to chunk `j`; the tree of totals grows (by rebuilding it, a
    /// few hundred numbers) when it has no room for them.
    fn reach(&mut self, j: usize) {
        if j < self.chunks.len() {
            return;
        }
        self.chunks.resize_with(j + 1, zero_chunk);
        if self.chunks.len() > self.top.len() - 1 {
            self.rebuild_top();
        }
    }

    fn rebuild_top(&mut self) {
        let n = self.chunks.len().max(1).next_power_of_two();
        let mut top = vec![0u32; n];
        for (t, c) in top.iter_mut().zip(&self.chunks) {
            *t = c[CHUNK - 1];
        }
        fenwick_build(&mut top);
        // Stored 1-indexed with an unused slot 0, as `update` walks it.
        self.top = std::iter::once(0).chain(top).collect();
    }

    /// True when `seq` lies outside the window and the owner must move it first.
    pub fn needs_rebuild(&self, seq: u64) -> bool {
        seq < self.base || seq - self.base >= self.cap()
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn update(&mut self, seq: u64, add: bool) {
        debug_assert!(!self.needs_rebuild(seq));
        let (j, local) = self.slot(seq);
        self.reach(j);
        let chunk = &mut self.chunks[j];
        let mut i = local + 1;
        while i <= CHUNK {
            if add {
                chunk[i - 1] += 1;
            } else {
                chunk[i - 1] -= 1;
            }
            i += lowbit(i);
        }
        let mut i = j + 1;
        while i < self.top.len() {
            if add {
                self.top[i] += 1;
            } else {
                self.top[i] -= 1;
            }
            i += lowbit(i);
        }
        if add {
            self.len += 1;
        } else {
            self.len -= 1;
        }
    }

    /// Marks `seq` as waiting. The caller guarantees it is inside the window and unmarked.
    pub fn insert(&mut self, seq: u64) {
        self.update(seq, true);
    }

    /// Unmarks `seq`. The caller guarantees it is marked.
    pub fn remove(&mut self, seq: u64) {
        self.update(seq, false);
    }

    /// Number of marked sequence numbers strictly below `seq`.
    pub fn count_below(&self, seq: u64) -> u64 {
        if seq <= self.origin {
            return 0;
        }
        let (j, local) = self.slot(seq);
        if j >= self.chunks.len() {
            return self.len;
        }
        fenwick_prefix(&self.top[1..], j) + fenwick_prefix(&self.chunks[j][..], local)
    }

    /// The `k`-th smallest marked sequence number (1-based), if there are that many.
    pub fn kth(&self, k: u64) -> Option<u64> {
        if k == 0 || k > self.len {
            return None;
        }
        let (j, rem) = fenwick_descend(&self.top[1..], k);
        let (i, _) = fenwick_descend(&self.chunks[j][..], rem);
        Some(self.origin + ((j as u64) << CHUNK_BITS) + i as u64)
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    /// Chunks held: the window's memory is this many times 16 KiB.
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn matches_a_sorted_set(ops in proptest::collection::vec((0u64..3000, any::<bool>()), 1..400)) {
            let mut r = RankIndex::new(0, 4096);
            let mut set = BTreeSet::new();
            for (s, ins) in ops {
                if ins && set.insert(s) { r.insert(s) }
                if !ins && set.remove(&s) { r.remove(s) }
                prop_assert_eq!(r.len(), set.len() as u64);
            }
            for probe in [0u64, 1, 17, 999, 2999, 3000] {
                prop_assert_eq!(r.count_below(probe), set.range(..probe).count() as u64);
            }
            for (i, s) in set.iter().enumerate() {
                prop_assert_eq!(r.kth(i as u64 + 1), Some(*s));
            }
            let rebuilt = RankIndex::rebuild(0, 3000, set.iter().copied());
            for (i, s) in set.iter().enumerate() {
                prop_assert_eq!(rebuilt.kth(i as u64 + 1), Some(*s));
                prop_assert_eq!(rebuilt.count_below(*s), i as u64);
            }
        }
    }

    proptest! {
        /// Moving the window (up, down, wider) keeps every mark, as a rebuild would.
        #[test]
        fn rewindow_keeps_the_marks(
            marks in proptest::collection::btree_set(0u64..5000, 0..300),
            base_cut in 0u64..5000,
            extra in 0u64..20_000,
        ) {
            let mut r = RankIndex::rebuild(0, 5000, marks.iter().copied());
            let base = marks.first().copied().unwrap_or(base_cut).min(base_cut);
            let top = marks.last().copied().unwrap_or(base) + 1;
            r.rewindow(base, top - base + extra);
            prop_assert_eq!(r.base(), base);
            prop_assert_eq!(r.len(), marks.len() as u64);
            prop_assert!(!r.needs_rebuild(top - 1 + extra));
            for (i, s) in marks.iter().enumerate() {
                prop_assert_eq!(r.kth(i as u64 + 1), Some(*s));
                prop_assert_eq!(r.count_below(*s), i as u64);
            }
            // Growing in place (same base), as a window of a queue that keeps its head does.
            let mut g = RankIndex::rebuild(0, 5000, marks.iter().copied());
            g.rewindow(0, 5000 + extra * 8);
            prop_assert!(!g.needs_rebuild(5000 + extra * 8 - 1));
            for (i, s) in marks.iter().enumerate() {
                prop_assert_eq!(g.kth(i as u64 + 1), Some(*s));
                prop_assert_eq!(g.count_below(*s), i as u64);
            }
            prop_assert_eq!(g.count_below(u64::MAX), marks.len() as u64);
            // And back down below the old base.
            if base >= 100 {
                r.rewindow(base - 100, top - base + 100);
                for (i, s) in marks.iter().enumerate() {
                    prop_assert_eq!(r.kth(i as u64 + 1), Some(*s));
                }
            }
        }
    }

    /// What the queue does before a join (`Queue::insert_waiting`): move the window to the
    /// head when the number falls past it.
    fn insert_like_the_queue(r: &mut RankIndex, seq: u64) {
        if r.needs_rebuild(seq) {
            let base = r.kth(1).unwrap_or(seq).min(seq);
            r.rewindow(base, seq - base + 1);
        }
        r.insert(seq);
    }

    proptest! {
        /// Marks spread over many chunks, joined in order and removed anywhere (the head
        /// more often, as admissions do), with the window moving as the queue moves it.
        #[test]
        fn chunks_match_a_sorted_set(
            ops in proptest::collection::vec((1u64..3 * CHUNK as u64, 0u8..4, any::<u64>()), 1..300),
        ) {
            let mut r = RankIndex::default();
            let mut set = BTreeSet::new();
            let mut next = 0u64;
            for (gap, op, pick) in ops {
                next += gap;
                insert_like_the_queue(&mut r, next);
                set.insert(next);
                let victim = match op {
                    0 => set.first().copied(),
                    1 => set.iter().nth((pick % set.len() as u64) as usize).copied(),
                    _ => None,
                };
                if let Some(v) = victim {
                    set.remove(&v);
                    r.remove(v);
                }
                prop_assert_eq!(r.len(), set.len() as u64);
                prop_assert!(r.chunks() <= (r.cap() as usize).div_ceil(CHUNK) + 1);
            }
            for (i, s) in set.iter().enumerate() {
                prop_assert_eq!(r.kth(i as u64 + 1), Some(*s));
                prop_assert_eq!(r.count_below(*s), i as u64);
                prop_assert_eq!(r.count_below(*s + 1), i as u64 + 1);
            }
            prop_assert_eq!(r.kth(set.len() as u64 + 1), None);
            prop_assert_eq!(r.count_below(u64::MAX), set.len() as u64);
        }
    }

    /// Growing to past a million numbers with the queue's head at 0 appends chunks and never
    /// moves one: the doubling of a single tree copied all of it at 2^k + 1.
    #[test]
    fn growing_never_moves_a_chunk() {
        let mut r = RankIndex::default();
        let first: Vec<*const u32> = {
            for s in 0..3 * CHUNK as u64 {
                insert_like_the_queue(&mut r, s);
            }
            r.chunks.iter().map(|c| c.as_ptr()).collect()
        };
        for s in 3 * CHUNK as u64..(1 << 20) + 5 {
            insert_like_the_queue(&mut r, s);
        }
        let now: Vec<*const u32> = r.chunks[..first.len()].iter().map(|c| c.as_ptr()).collect();
        assert_eq!(first, now, "a chunk was copied while the window grew");
        assert_eq!(r.base(), 0);
        assert_eq!(r.chunks(), ((1 << 20) + 5usize).div_ceil(CHUNK));
        for k in [1u64, 4096, 4097, 524_289, 1 << 20, (1 << 20) + 5] {
            assert_eq!(r.kth(k), Some(k - 1));
            assert_eq!(r.count_below(k - 1), k - 1);
        }
    }

    /// A long sale (one waiting place at a time, each joining after the last left) keeps a
    /// few chunks: the ones below the head are dropped when the window moves.
    #[test]
    fn sliding_drops_the_chunks_below_the_head() {
        let mut r = RankIndex::default();
        let mut prev = None;
        for s in 0..50 * CHUNK as u64 {
            insert_like_the_queue(&mut r, s);
            if let Some(p) = prev {
                r.remove(p);
            }
            prev = Some(s);
            assert!(r.chunks() <= 2, "{} chunks at {s}", r.chunks());
        }
        assert!(r.base() > 40 * CHUNK as u64);
        assert_eq!(r.kth(1), prev);
        assert_eq!(r.count_below(u64::MAX), 1);
    }

    #[test]
    fn window_with_offset() {
        let r = RankIndex::rebuild(5000, 10, [5000, 5003, 5009].into_iter());
        assert_eq!(r.count_below(5004), 2);
        assert_eq!(r.kth(3), Some(5009));
        assert!(r.needs_rebuild(4999));
        assert!(!r.needs_rebuild(5000 + 1023));
        assert!(r.needs_rebuild(5000 + 1024));
    }
}
