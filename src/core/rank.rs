//! Order statistics over join sequence numbers: a Fenwick tree that answers "how many
//! waiting places joined before this one" and "which is the k-th waiting place" in
//! O(log n), at four bytes per sequence number in its window.
//!
//! Sequence numbers only grow, so the tree covers a sliding window `[base, base + cap)`.
//! When a new number falls past the window the owner rebuilds it from the live set (see
//! [`RankIndex::needs_rebuild`]); the window is twice the live span, so rebuilds are
//! amortised O(1) per join.

#[derive(Debug, Clone)]
pub struct RankIndex {
    base: u64,
    /// 1-indexed Fenwick array; `tree.len() - 1` is a power of two so `kth` can descend bit
    /// by bit.
    tree: Vec<u32>,
    len: u64,
}

const MIN_CAP: usize = 1024;

impl Default for RankIndex {
    fn default() -> Self {
        Self::new(0, MIN_CAP)
    }
}

impl RankIndex {
    pub fn new(base: u64, cap: usize) -> Self {
        let cap = cap.max(MIN_CAP).next_power_of_two();
        RankIndex {
            base,
            tree: vec![0; cap + 1],
            len: 0,
        }
    }

    /// Rebuilds the window from `base` so that it holds at least `span` numbers, marking
    /// `seqs` (each ≥ `base`). O(cap).
    pub fn rebuild(base: u64, span: u64, seqs: impl Iterator<Item = u64>) -> Self {
        let cap = (span.saturating_mul(2) as usize)
            .max(MIN_CAP)
            .next_power_of_two();
        let mut tree = vec![0u32; cap + 1];
        let mut len = 0;
        for s in seqs {
            tree[(s - base) as usize + 1] += 1;
            len += 1;
        }
        // Linear-time Fenwick construction: push each node's sum to its parent.
        for i in 1..=cap {
            let parent = i + (i & i.wrapping_neg());
            if parent <= cap {
                tree[parent] += tree[i];
            }
        }
        RankIndex { base, tree, len }
    }

    /// Moves the window to start at `base` and hold at least `span` numbers, keeping every
    /// mark (each must be ≥ `base`). O(cap) in sequential passes over the tree alone: a
    /// rebuild from the live set walked every place of the event (tens of milliseconds at
    /// a million places, under the event's lock), this touches four bytes per number.
    pub fn rewindow(&mut self, base: u64, span: u64) {
        let cap = (span.saturating_mul(2) as usize)
            .max(MIN_CAP)
            .next_power_of_two();
        let old_cap = self.cap();
        if base == self.base && cap >= old_cap {
            // Only growing: a node at or below the old top covers the same numbers as
            // before, and of the nodes above it only those at powers of two reach down
            // into the old window (to its start), so they hold every mark. One copy of the
            // old tree; the new half stays untouched (zeroed pages) until used.
            let mut tree = vec![0u32; cap + 1];
            tree[..=old_cap].copy_from_slice(&self.tree);
            let mut top = old_cap * 2;
            while top <= cap {
                tree[top] = self.len as u32;
                top *= 2;
            }
            self.tree = tree;
            return;
        }
        // Back from partial sums to one count per number: `rebuild`'s pass run backwards
        // (a node's own sum is complete when it is subtracted from its parent's).
        for i in (1..=old_cap).rev() {
            let parent = i + (i & i.wrapping_neg());
            if parent <= old_cap {
                self.tree[parent] -= self.tree[i];
            }
        }
        let mut tree = vec![0u32; cap + 1];
        let from = self.base.max(base);
        let to = (self.base + old_cap as u64).min(base + cap as u64);
        if from < to {
            let old = (from - self.base) as usize + 1;
            let new = (from - base) as usize + 1;
            let n = (to - from) as usize;
            tree[new..new + n].copy_from_slice(&self.tree[old..old + n]);
        }
        for i in 1..=cap {
            let parent = i + (i & i.wrapping_neg());
            if parent <= cap {
                tree[parent] += tree[i];
            }
        }
        self.tree = tree;
        self.base = base;
        debug_assert_eq!(
            self.count_below(base + cap as u64),
            self.len,
            "a mark fell outside the new window"
        );
    }

    fn cap(&self) -> usize {
        self.tree.len() - 1
    }

    /// True when `seq` lies outside the window and the owner must rebuild first.
    pub fn needs_rebuild(&self, seq: u64) -> bool {
        seq < self.base || seq - self.base >= self.cap() as u64
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn update(&mut self, seq: u64, add: bool) {
        debug_assert!(!self.needs_rebuild(seq));
        let mut i = (seq - self.base) as usize + 1;
        while i < self.tree.len() {
            if add {
                self.tree[i] += 1;
            } else {
                self.tree[i] -= 1;
            }
            i += i & i.wrapping_neg();
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
        if seq <= self.base {
            return 0;
        }
        let mut i = ((seq - self.base) as usize).min(self.cap());
        let mut sum = 0u64;
        while i > 0 {
            sum += u64::from(self.tree[i]);
            i &= i - 1;
        }
        sum
    }

    /// The `k`-th smallest marked sequence number (1-based), if there are that many.
    pub fn kth(&self, k: u64) -> Option<u64> {
        if k == 0 || k > self.len {
            return None;
        }
        let mut pos = 0usize;
        let mut rem = k;
        let mut step = self.cap();
        while step > 0 {
            let next = pos + step;
            if next <= self.cap() && u64::from(self.tree[next]) < rem {
                pos = next;
                rem -= u64::from(self.tree[next]);
            }
            step >>= 1;
        }
        Some(self.base + pos as u64)
    }

    pub fn base(&self) -> u64 {
        self.base
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
