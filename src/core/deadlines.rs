//! The deadlines of an event's places: a binary min-heap of `(when, seq)` stored in fixed
//! chunks of [`CHUNK`] entries, so that growing never copies it.
//!
//! A `BinaryHeap` keeps one vector and doubles it when full: every join pushes a deadline,
//! so at 2^19 places of one event a join copied 8 MB (16 MB at 2^20) under the event's
//! lock, and every request to the event waited behind it. Here a full heap gets one more
//! chunk of 64 KiB; the heap's index arithmetic is unchanged, each access goes through the
//! chunk table (one more load, in cache for the top levels that every operation walks).

use super::Millis;

const CHUNK_BITS: u32 = 12;
/// Entries per chunk.
pub const CHUNK: usize = 1 << CHUNK_BITS;
const MASK: usize = CHUNK - 1;

type Entry = (Millis, u64);
type Chunk = Box<[Entry; CHUNK]>;

fn new_chunk() -> Chunk {
    vec![(0, 0); CHUNK]
        .into_boxed_slice()
        .try_into()
        .expect("CHUNK entries")
}

#[derive(Debug, Clone, Default)]
pub struct DeadlineHeap {
    chunks: Vec<Chunk>,
    len: usize,
}

impl DeadlineHeap {
    fn get(&self, i: usize) -> Entry {
        self.chunks[i >> CHUNK_BITS][i & MASK]
    }

    fn set(&mut self, i: usize, e: Entry) {
        self.chunks[i >> CHUNK_BITS][i & MASK] = e;
    }

    /// The earliest entry.
    pub fn peek(&self) -> Option<Entry> {
        (self.len > 0).then(|| self.get(0))
    }

    pub fn push(&mut self, e: Entry) {
        if self.len == self.chunks.len() * CHUNK {
            self.chunks.push(new_chunk());
        }
        let i = self.len;
        self.len += 1;
        self.set(i, e);
        self.sift_up(i);
    }

    /// Takes the earliest entry out.
    pub fn pop(&mut self) -> Option<Entry> {
        let top = self.peek()?;
        self.len -= 1;
        if self.len > 0 {
            let last = self.get(self.len);
            self.set(0, last);
            self.sift_down(0);
        }
        // One spare chunk stays, so a heap that goes back and forth over a chunk's edge
        // does not allocate and free it every time.
        if self.chunks.len() * CHUNK >= self.len + 2 * CHUNK {
            self.chunks.pop();
        }
        Some(top)
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }

    /// A heap of `entries` in O(n).
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> Self {
        let mut h = DeadlineHeap::default();
        for e in entries {
            if h.len == h.chunks.len() * CHUNK {
                h.chunks.push(new_chunk());
            }
            h.len += 1;
            h.set(h.len - 1, e);
        }
        for i in (0..h.len / 2).rev() {
            h.sift_down(i);
        }
        h
    }

    fn sift_up(&mut self, mut i: usize) {
        let e = self.get(i);
        while i > 0 {
            let parent = (i - 1) / 2;
            let p = self.get(parent);
            if p <= e {
                break;
            }
            self.set(i, p);
            i = parent;
        }
        self.set(i, e);
    }

    fn sift_down(&mut self, mut i: usize) {
        let e = self.get(i);
        loop {
            let left = 2 * i + 1;
            if left >= self.len {
                break;
            }
            let mut child = left;
            let mut c = self.get(left);
            if left + 1 < self.len {
                let r = self.get(left + 1);
                if r < c {
                    child = left + 1;
                    c = r;
                }
            }
            if e <= c {
                break;
            }
            self.set(i, c);
            i = child;
        }
        self.set(i, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    proptest! {
        // Each case pushes thousands of entries to cross chunk edges: fewer cases suffice.
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Pushes and pops in any mix, across chunk edges both ways, answer what the
        /// standard heap answers.
        #[test]
        fn pops_in_the_order_of_a_binary_heap(
            start in proptest::collection::vec((0u64..1000, 0u64..1_000_000), 0..2 * CHUNK + 100),
            ops in proptest::collection::vec((0u8..3, 0u64..1000, 0u64..1_000_000, 0usize..CHUNK + 100), 1..30),
        ) {
            let mut h = DeadlineHeap::from_entries(start.iter().copied());
            let mut std: BinaryHeap<Reverse<Entry>> = start.iter().copied().map(Reverse).collect();
            for (op, when, seq, n) in ops {
                match op {
                    0 => for k in 0..n as u64 {
                        h.push((when + k % 7, seq + k));
                        std.push(Reverse((when + k % 7, seq + k)));
                    },
                    1 => for _ in 0..n {
                        prop_assert_eq!(h.pop(), std.pop().map(|r| r.0));
                    },
                    _ => {
                        h.push((when, seq));
                        std.push(Reverse((when, seq)));
                    }
                }
                prop_assert_eq!(h.len, std.len());
                prop_assert_eq!(h.peek(), std.peek().map(|r| r.0));
                prop_assert!(h.chunks.len() * CHUNK <= h.len + 2 * CHUNK);
            }
            while let Some(e) = h.pop() {
                prop_assert_eq!(Some(e), std.pop().map(|r| r.0));
            }
            prop_assert!(std.is_empty());
            prop_assert!(h.chunks.len() <= 1);
        }
    }

    /// Growing to past 2^20 entries appends chunks and never moves one: a `BinaryHeap`
    /// copied its whole vector at every power of two.
    #[test]
    fn growing_never_moves_a_chunk() {
        let mut h = DeadlineHeap::default();
        for s in 0..3 * CHUNK as u64 {
            h.push((1_000 + s, s));
        }
        let first: Vec<*const Entry> = h.chunks.iter().map(|c| c.as_ptr()).collect();
        for s in 3 * CHUNK as u64..(1 << 20) + 5 {
            h.push((1_000 + s, s));
        }
        let now: Vec<*const Entry> = h.chunks[..first.len()].iter().map(|c| c.as_ptr()).collect();
        assert_eq!(first, now, "a chunk was copied while the heap grew");
        assert_eq!(h.chunks.len(), ((1 << 20) + 5usize).div_ceil(CHUNK));
        assert_eq!(h.peek(), Some((1_000, 0)));
        for s in 0..10 {
            assert_eq!(h.pop(), Some((1_000 + s, s)));
        }
    }
}
