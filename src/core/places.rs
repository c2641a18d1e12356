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

/// Slots per chunk of [`PlaceTable`]: 4,096 places of ~112 bytes, under half a megabyte.
const CHUNK: usize = 4096;

/// Places by join sequence number, indexed by `seq - base`. Sequence numbers are dense and
/// only grow, so there is no hashing and no rehash. The slots live in fixed-size chunks:
/// growing by one more chunk is one small allocation, never a copy of every place (a single
/// deque doubled at 2^k places and held the event's lock for milliseconds per 100k places).
/// A chunk's slots are freed once every place in it has ended (the chunk itself, a few
/// bytes, goes once every chunk before it is gone too).
#[derive(Debug, Clone, Default)]
pub(super) struct PlaceTable {
    /// Sequence number of the first slot of the first chunk: a multiple of `CHUNK`.
    base: u64,
    chunks: VecDeque<Chunk>,
    len: usize,
}

#[derive(Debug, Clone, Default)]
struct Chunk {
    /// Grows up to `CHUNK` slots as places arrive, so a small event holds a small chunk.
    slots: Vec<Option<Place>>,
    live: usize,
}

impl PlaceTable {
    /// The chunk and slot of `seq`, if it lies inside the table.
    fn slot_of(&self, seq: u64) -> Option<(usize, usize)> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        let (c, s) = (i / CHUNK, i % CHUNK);
        (c < self.chunks.len() && s < self.chunks[c].slots.len()).then_some((c, s))
    }

    pub(super) fn get(&self, seq: &u64) -> Option<&Place> {
        let (c, s) = self.slot_of(*seq)?;
        self.chunks[c].slots[s].as_ref()
    }

    pub(super) fn get_mut(&mut self, seq: &u64) -> Option<&mut Place> {
        let (c, s) = self.slot_of(*seq)?;
        self.chunks[c].slots[s].as_mut()
    }

    pub(super) fn insert(&mut self, seq: u64, place: Place) {
        if self.chunks.is_empty() {
            self.base = seq - seq % CHUNK as u64;
        }
        while seq < self.base {
            // Only a restore inserts out of order.
            self.chunks.push_front(Chunk {
                slots: std::iter::repeat_with(|| None).take(CHUNK).collect(),
                live: 0,
            });
            self.base -= CHUNK as u64;
        }
        let i = (seq - self.base) as usize;
        let (c, s) = (i / CHUNK, i % CHUNK);
        while self.chunks.len() <= c {
            let slots = match self.chunks.back_mut() {
                Some(last) => {
                    // The chunk left behind keeps its length (slots are numbered per
                    // chunk); one whose places all ended already is freed now, as `remove`
                    // frees the others (it keeps the last one, which joins were filling).
                    if last.live == 0 {
                        last.slots = Vec::new();
                    }
                    // Past its first chunk an event is large: the new chunk is made whole
                    // at once, not doubled up to it (a dozen reallocations, each a copy of
                    // the places so far and fresh pages to fault in, inside joins).
                    Vec::with_capacity(CHUNK)
                }
                None => Vec::new(),
            };
            self.chunks.push_back(Chunk { slots, live: 0 });
        }
        let chunk = &mut self.chunks[c];
        if s >= chunk.slots.len() {
            chunk.slots.resize_with(s + 1, || None);
        }
        if chunk.slots[s].replace(place).is_none() {
            chunk.live += 1;
            self.len += 1;
        }
    }

    pub(super) fn remove(&mut self, seq: &u64) -> Option<Place> {
        let (c, s) = self.slot_of(*seq)?;
        let place = self.chunks[c].slots[s].take()?;
        self.chunks[c].live -= 1;
        self.len -= 1;
        if self.chunks[c].live == 0 && c + 1 < self.chunks.len() {
            // A chunk whose places all ended, behind a live older one: its slots go now.
            // Reclaiming only from the front let one long-lived place (an extended session,
            // a lottery entrant polling for hours) keep every later chunk of the sale.
            self.chunks[c].slots = Vec::new();
        }
        while self.chunks.front().is_some_and(|f| f.live == 0) {
            self.chunks.pop_front();
            self.base += CHUNK as u64;
        }
        Some(place)
    }

    pub(super) fn reserve(&mut self, n: usize) {
        self.chunks.reserve(n.div_ceil(CHUNK));
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Every slot with its sequence number, counted per chunk (an emptied chunk has none).
    fn slots(&self) -> impl Iterator<Item = (u64, &Option<Place>)> {
        let base = self.base;
        self.chunks.iter().enumerate().flat_map(move |(c, chunk)| {
            let first = base + (c * CHUNK) as u64;
            chunk
                .slots
                .iter()
                .enumerate()
                .map(move |(s, p)| (first + s as u64, p))
        })
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Place)> {
        self.slots().filter_map(|(s, p)| p.as_ref().map(|p| (s, p)))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut Place)> {
        let base = self.base;
        self.chunks
            .iter_mut()
            .enumerate()
            .flat_map(move |(c, chunk)| {
                let first = base + (c * CHUNK) as u64;
                chunk
                    .slots
                    .iter_mut()
                    .enumerate()
                    .filter_map(move |(s, p)| p.as_mut().map(|p| (first + s as u64, p)))
            })
    }

    /// The sequence number of the first slot and the number of chunks, for tests.
    #[cfg(test)]
    pub(super) fn window(&self) -> (u64, usize) {
        (self.base, self.chunks.len())
    }

    #[cfg(test)]
    pub(super) const CHUNK: usize = CHUNK;

    pub(super) fn values(&self) -> impl Iterator<Item = &Place> {
        self.slots().filter_map(|(_, p)| p.as_ref())
    }
}

impl std::ops::Index<&u64> for PlaceTable {
    type Output = Place;
    fn index(&self, seq: &u64) -> &Place {
        self.get(seq).expect("a live place")
    }
}

/// Shards of [`ShardedMap`]. A growth step rehashes one shard: 1/64 of the entries.
const SHARDS: usize = 64;

/// A map keyed by `u64` (sequence numbers, or keyed hashes of user ids) split into
/// `SHARDS` hash maps by the key's Fibonacci hash. A single map doubled in one step and
/// rehashed every entry under the event's lock (about 20 ms at 900k entries); the shards
/// grow one at a time, each step 64 times smaller, for the same memory.
#[derive(Debug, Clone)]
pub(super) struct ShardedMap<V> {
    /// Empty until the first insert, so an idle event costs one empty `Vec`.
    shards: Vec<HashMap<u64, V, BuildSeqHasher>>,
    len: usize,
}

impl<V> Default for ShardedMap<V> {
    fn default() -> Self {
        ShardedMap {
            shards: Vec::new(),
            len: 0,
        }
    }
}

impl<V> ShardedMap<V> {
    /// Six bits from the middle of the Fibonacci hash. The shard maps use the same hash
    /// (`SeqHasher`) twice: its low bits pick a bucket, its top seven bits are the tag each
    /// bucket keeps so a probe compares keys only where the tag matches. The shard must take
    /// neither: taken from the top bits (as it was), every key of a shard shared six of the
    /// tag's seven bits, so a probe compared the key in half the buckets of its group, each
    /// a cache miss in a large event (docs/PERFORMANCE.md, "The shards' tags").
    fn shard(key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % SHARDS
    }

    pub(super) fn get(&self, key: &u64) -> Option<&V> {
        self.shards.get(Self::shard(*key))?.get(key)
    }

    pub(super) fn contains_key(&self, key: &u64) -> bool {
        self.get(key).is_some()
    }

    pub(super) fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if self.shards.is_empty() {
            self.shards.resize_with(SHARDS, HashMap::default);
        }
        let old = self.shards[Self::shard(key)].insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub(super) fn remove(&mut self, key: &u64) -> Option<V> {
        let old = self.shards.get_mut(Self::shard(*key))?.remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub(super) fn len(&self) -> usize {
        self.len
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
    by_hash: ShardedMap<u64>,
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
        let h = self.hash(user);
        if self.by_hash.contains_key(&h) {
            self.spill.insert(user.into(), seq);
        } else {
            self.by_hash.insert(h, seq);
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
    use proptest::prelude::*;

    proptest! {
        /// The shards answer as one map would, for dense and for scattered keys.
        #[test]
        fn sharded_map_matches_a_map(ops in proptest::collection::vec(
            (prop_oneof![0u64..200, any::<u64>()], any::<bool>(), any::<u32>()), 1..300)) {
            let mut m = ShardedMap::default();
            let mut reference = HashMap::new();
            for (k, ins, v) in ops {
                if ins {
                    prop_assert_eq!(m.insert(k, v), reference.insert(k, v));
                } else {
                    prop_assert_eq!(m.remove(&k), reference.remove(&k));
                }
                prop_assert_eq!(m.len(), reference.len());
                prop_assert_eq!(m.get(&k), reference.get(&k));
            }
            for (k, v) in &reference {
                prop_assert_eq!(m.get(k), Some(v));
            }
        }
    }

    /// A shard's keys spread over all of the tags its map keeps per bucket (the hash's
    /// top seven bits) and over its buckets (the low bits): the shard is picked from
    /// neither, for dense sequence numbers and for keyed hashes of user ids alike.
    #[test]
    fn a_shards_keys_keep_their_tags_and_buckets_apart() {
        use std::hash::{BuildHasher, Hasher};
        let hash = |k: u64| {
            let mut h = BuildSeqHasher::default().build_hasher();
            h.write_u64(k);
            h.finish()
        };
        let ids = std::hash::RandomState::new();
        let dense = 0..20_000u64;
        let hashed = (0..20_000u64).map(|i| ids.hash_one(format!("user-{i}")));
        for keys in [dense.collect::<Vec<_>>(), hashed.collect()] {
            let mut tags = vec![std::collections::HashSet::new(); SHARDS];
            let mut buckets = vec![std::collections::HashSet::new(); SHARDS];
            for k in keys {
                let s = ShardedMap::<()>::shard(k);
                tags[s].insert(hash(k) >> 57);
                buckets[s].insert(hash(k) & 1023);
            }
            for s in 0..SHARDS {
                assert!(
                    tags[s].len() > 100,
                    "shard {s}: {} tags of 128",
                    tags[s].len()
                );
                assert!(
                    buckets[s].len() > 200,
                    "shard {s}: {} buckets",
                    buckets[s].len()
                );
            }
        }
    }

    /// The first chunk grows with a small event; every later one is allocated whole when
    /// it starts, so a large event's joins do not reallocate (and copy) the chunks they fill.
    #[test]
    fn chunks_past_the_first_start_whole() {
        let mut places = PlaceTable::default();
        for seq in 0..3 {
            places.insert(seq, place("u"));
        }
        assert!(
            places.chunks[0].slots.capacity() < CHUNK,
            "a small event stays small"
        );
        let cap = |p: &PlaceTable, c: usize| {
            let v = &p.chunks[c].slots;
            (v.capacity(), v.as_ptr())
        };
        places.insert(CHUNK as u64, place("v"));
        let (first, at) = cap(&places, 1);
        assert_eq!(first, CHUNK);
        for seq in CHUNK as u64 + 1..2 * CHUNK as u64 {
            places.insert(seq, place("w"));
        }
        assert_eq!(cap(&places, 1), (CHUNK, at), "filled in place, never moved");
        assert_eq!(places.len(), 3 + CHUNK);
    }

    /// One long-lived place does not keep the chunks after it: a chunk whose places all
    /// ended gives its slots back at once, and the table still finds and lists the rest by
    /// their own sequence numbers.
    #[test]
    fn a_chunk_of_ended_places_is_freed_behind_a_live_one() {
        let mut places = PlaceTable::default();
        let n = 3 * CHUNK as u64 + 5;
        for seq in 0..n {
            places.insert(seq, place("u"));
        }
        for seq in 1..2 * CHUNK as u64 {
            places.remove(&seq).unwrap();
        }
        assert_eq!(places.window(), (0, 4), "the first chunk holds seq 0");
        assert_eq!(
            places.chunks[1].slots.capacity(),
            0,
            "the ended chunk is freed"
        );
        assert!(places.get(&(CHUNK as u64 + 7)).is_none());
        assert!(places.get(&0).is_some() && places.get(&(2 * CHUNK as u64)).is_some());
        let seqs: Vec<u64> = places.iter().map(|(s, _)| s).collect();
        let want: Vec<u64> = std::iter::once(0).chain(2 * CHUNK as u64..n).collect();
        assert_eq!(seqs, want);
        let seqs: Vec<u64> = places.iter_mut().map(|(s, _)| s).collect();
        assert_eq!(seqs, want);
        assert_eq!(places.len(), want.len());
        // A restore may still put a place back into the freed chunk.
        places.insert(CHUNK as u64 + 3, place("r"));
        assert!(places.get(&(CHUNK as u64 + 3)).is_some());
        assert_eq!(places.iter().nth(1).map(|(s, _)| s), Some(CHUNK as u64 + 3));
        // Once the old place ends, the front goes too.
        places.remove(&0).unwrap();
        places.remove(&(CHUNK as u64 + 3)).unwrap();
        assert_eq!(places.window(), (2 * CHUNK as u64, 2));

        // A slow sale: the last chunk's places all end before the next join opens a new
        // chunk; behind a live place, that chunk is freed when the new one starts.
        let mut slow = PlaceTable::default();
        slow.insert(0, place("kept"));
        for seq in CHUNK as u64..2 * CHUNK as u64 {
            slow.insert(seq, place("u"));
            slow.remove(&seq).unwrap();
        }
        assert!(
            slow.chunks[1].slots.capacity() >= CHUNK,
            "the last chunk is kept"
        );
        slow.insert(2 * CHUNK as u64, place("v"));
        assert_eq!(
            slow.chunks[1].slots.capacity(),
            0,
            "freed when the next starts"
        );
        let seqs: Vec<u64> = slow.iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, [0, 2 * CHUNK as u64]);
    }

    fn place(u: &str) -> Place {
        Place {
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
        }
    }

    #[test]
    fn user_index_spills_a_colliding_hash() {
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
