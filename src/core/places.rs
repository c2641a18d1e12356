//! How a place is stored inside [`super::EventQueue`]: the [`Place`] record, the
//! [`PlaceTable`] that holds them by join sequence, the [`UserIndex`] behind the
//! one-place-per-user rule, and the trivial [`SeqHasher`] for maps keyed by sequence number.
//! Split out of the state machine so that `queue.rs` reads as the rules alone.

use std::collections::{HashMap, VecDeque};

use super::{Millis, PlaceState};

#[derive(Debug, Clone)]
pub(super) struct Place {
    pub(super) nonce: u128,
    pub(super) user_id: Option<Box<str>>,
    /// The joiner proved it is `user_id` (a user token or the server key). A proven join
    /// ends an unproven place of the same user instead of adopting it: whoever made that
    /// one only knew the id.
    pub(super) proven: bool,
    pub(super) metadata: Option<Box<str>>,
    pub(super) joined_at: Millis,
    /// Last heartbeat: of the waiting page while waiting, of the session while active.
    pub(super) last_seen: Millis,
    pub(super) admitted_at: Millis,
    pub(super) entered_at: Millis,
    pub(super) state: PlaceState,
    /// Check time of this place's authoritative entry in the deadline heap; other entries
    /// for the same place are stale and skipped. Renewing a heartbeat only moves
    /// `last_seen`, so it costs O(1); the heap entry is re-filed when it comes due.
    pub(super) sched: Millis,
}

/// Sequence numbers are ours, never chosen by a client, so a trivial hash is safe and fast.
pub(super) type BuildSeqHasher = std::hash::BuildHasherDefault<SeqHasher>;

#[derive(Default)]
pub(super) struct SeqHasher(u64);

impl std::hash::Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        // Fibonacci hashing spreads consecutive numbers over the table's high bits.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Places by join sequence number: a deque indexed by `seq - base`. Sequence numbers are
/// dense and only grow, so a million places sit in one allocation of about 100 MB, with no
/// rehash pauses under the event lock (a hash map needed over twice that, and stalled for
/// hundreds of milliseconds each time it doubled). The slots of ended places are reclaimed
/// once every place before them has ended too.
#[derive(Debug, Clone, Default)]
pub(super) struct PlaceTable {
    base: u64,
    slots: VecDeque<Option<Place>>,
    len: usize,
}

impl PlaceTable {
    pub(super) fn slot_of(&self, seq: u64) -> Option<usize> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        (i < self.slots.len()).then_some(i)
    }

    pub(super) fn get(&self, seq: &u64) -> Option<&Place> {
        self.slot_of(*seq).and_then(|i| self.slots[i].as_ref())
    }

    pub(super) fn get_mut(&mut self, seq: &u64) -> Option<&mut Place> {
        self.slot_of(*seq).and_then(|i| self.slots[i].as_mut())
    }

    pub(super) fn insert(&mut self, seq: u64, place: Place) {
        if self.slots.is_empty() {
            self.base = seq;
        }
        while seq < self.base {
            self.slots.push_front(None);
            self.base -= 1;
        }
        let i = (seq - self.base) as usize;
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        if self.slots[i].replace(place).is_none() {
            self.len += 1;
        }
    }

    pub(super) fn remove(&mut self, seq: &u64) -> Option<Place> {
        let i = self.slot_of(*seq)?;
        let place = self.slots[i].take()?;
        self.len -= 1;
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(place)
    }

    pub(super) fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Place)> {
        let base = self.base;
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(i, p)| p.as_ref().map(|p| (base + i as u64, p)))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut Place)> {
        let base = self.base;
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(move |(i, p)| p.as_mut().map(|p| (base + i as u64, p)))
    }

    /// The sequence number of the first slot and the number of slots, for tests.
    #[cfg(test)]
    pub(super) fn window(&self) -> (u64, usize) {
        (self.base, self.slots.len())
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Place> {
        self.slots.iter().flatten()
    }
}

impl std::ops::Index<&u64> for PlaceTable {
    type Output = Place;
    fn index(&self, seq: &u64) -> &Place {
        self.get(seq).expect("a live place")
    }
}

/// Live places by user id, for the one-place-per-user rule. Keyed by a keyed 64-bit hash
/// of the id (SipHash with a random key, so clients cannot aim collisions), which keeps the
/// id stored once, in its place, instead of twice; a lookup confirms the id against the
/// place. The rare id whose hash another live id already holds goes to a small spill map
/// keyed by its full text.
#[derive(Debug, Clone, Default)]
pub(super) struct UserIndex {
    hasher: std::hash::RandomState,
    by_hash: HashMap<u64, u64, BuildSeqHasher>,
    spill: HashMap<Box<str>, u64>,
}

impl UserIndex {
    pub(super) fn hash(&self, user: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, user)
    }

    pub(super) fn get(&self, user: &str, places: &PlaceTable) -> Option<u64> {
        if let Some(&seq) = self.by_hash.get(&self.hash(user)) {
            if places.get(&seq).and_then(|p| p.user_id.as_deref()) == Some(user) {
                return Some(seq);
            }
        }
        self.spill.get(user).copied()
    }

    /// Files a user who holds no live place yet.
    pub(super) fn insert(&mut self, user: &str, seq: u64) {
        match self.by_hash.entry(self.hash(user)) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(seq);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.spill.insert(user.into(), seq);
            }
        }
    }

    pub(super) fn remove(&mut self, user: &str, seq: u64) {
        let h = self.hash(user);
        if self.by_hash.get(&h) == Some(&seq) {
            self.by_hash.remove(&h);
        } else if self.spill.get(user) == Some(&seq) {
            self.spill.remove(user);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.by_hash.len() + self.spill.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_index_spills_a_colliding_hash() {
        let place = |u: &str| Place {
            nonce: 0,
            user_id: Some(u.into()),
            proven: false,
            metadata: None,
            joined_at: 0,
            last_seen: 0,
            admitted_at: 0,
            entered_at: 0,
            state: PlaceState::Waiting,
            sched: 0,
        };
        let mut places = PlaceTable::default();
        places.insert(1, place("a"));
        places.insert(2, place("b"));
        let mut idx = UserIndex::default();
        idx.insert("a", 1);
        // Make "b" collide with "a": its hash slot is taken by a's place.
        let hb = idx.hash("b");
        idx.by_hash.insert(hb, 1);
        idx.insert("b", 2);
        assert_eq!(idx.spill.len(), 1);
        assert_eq!(
            idx.get("b", &places),
            Some(2),
            "found through the spill map"
        );
        assert_eq!(idx.get("a", &places), Some(1));
        idx.remove("b", 2);
        assert_eq!(idx.get("b", &places), None);
        assert_eq!(idx.get("c", &places), None);
    }
}
