//! The sale's schedule and queueing methods, pure: the pre-queue before `opens_at`, its
//! auditable shuffle, and the lottery of the `random` method. The rules that use them are
//! in `queue_schedule.rs` (a child of `queue.rs`); the Redis scripts mirror them in
//! `src/store/redis/lua/rules.lua`.
//!
//! The shuffle is decided at join time, so that opening the sale costs nothing: each
//! pre-queue place has the key `sha256(shuffle_seed || seq as 8 bytes big-endian)`, and the
//! pre-queue is admitted in ascending key order. With a secret seed the keys are
//! independent and uniformly distributed, so the order is a uniformly random permutation
//! of the pre-queue, unknown to anyone until the seed is published after the opening;
//! anyone can then recompute it from the seed and the list of place ids (docs/API.md).
//! The seed is committed to in advance (`shuffle_commitment` = `sha256(seed)`), so it
//! cannot be chosen after seeing who joined.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::rank::RankIndex;
use super::Millis;

/// How an event lets people in (`queueing_method`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueingMethod {
    /// First come, first served (after the shuffled pre-queue, if any).
    #[default]
    Fifo,
    /// A lottery drawn at each admission: the admitted place is chosen uniformly among
    /// every waiting place.
    Random,
    /// Everyone is admitted at once, without capacity or rate cap.
    Passthrough,
    /// No queue: a join that would have to wait is refused (`EVENT_FULL`).
    Reject,
}

impl QueueingMethod {
    /// The number the Redis script keeps in its meta.
    pub fn number(self) -> u8 {
        match self {
            QueueingMethod::Fifo => 0,
            QueueingMethod::Random => 1,
            QueueingMethod::Passthrough => 2,
            QueueingMethod::Reject => 3,
        }
    }
}

/// The event's secret, random per event and stored with its settings, never shown by any
/// read. The published shuffle seed and the lottery key are derived from it, so that
/// publishing the first after the opening reveals nothing of the second.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct EventSecret(pub [u8; 32]);

impl std::fmt::Debug for EventSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSecret(..)")
    }
}

impl EventSecret {
    /// Fresh randomness from the OS. (Taken here rather than passed in by every caller:
    /// the settings are the one place it is needed, and tests pass their own through
    /// `EventPatch::fresh_secret`.)
    pub fn random() -> Self {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).expect("the OS random source is available");
        EventSecret(b)
    }

    /// The seed of the pre-queue's shuffle, published as `shuffle_seed` after the opening.
    pub fn shuffle_seed(&self) -> [u8; 32] {
        derive(b"waitroom shuffle seed", &self.0)
    }

    /// The key of the `random` method's draws; never published (a known key would let a
    /// bot time its join to be drawn).
    pub fn lottery_key(&self) -> [u8; 32] {
        derive(b"waitroom lottery key", &self.0)
    }
}

fn derive(label: &[u8], secret: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(label);
    h.update(secret);
    h.finalize().into()
}

impl Serialize for EventSecret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex(&self.0))
    }
}

impl<'de> Deserialize<'de> for EventSecret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        unhex(&s)
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .map(EventSecret)
            .ok_or_else(|| serde::de::Error::custom("a 32-byte secret in hex"))
    }
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    b.iter()
        .fold(String::with_capacity(b.len() * 2), |mut s, x| {
            write!(s, "{x:02x}").expect("writing to a string");
            s
        })
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `shuffle_commitment`: sha256 of the shuffle seed, in hex.
pub fn commitment(seed: &[u8; 32]) -> String {
    hex(&Sha256::digest(seed))
}

/// The shuffle key of a pre-queue place: `sha256(seed || seq as 8 bytes big-endian)`.
pub fn prequeue_key(seed: &[u8; 32], seq: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seed);
    h.update(seq.to_be_bytes());
    h.finalize().into()
}

/// The index (0-based, below `count`) of the `n`-th draw of the lottery: the first 48 bits
/// of `sha256(key || n as 8 bytes big-endian)` modulo `count`. 48 bits, because the Redis
/// script computes it with doubles, exact below 2^53; the modulo bias is below
/// `count / 2^48` (under 4·10⁻⁷ for a hundred million waiting).
pub fn draw(key: &[u8; 32], n: u64, count: u64) -> u64 {
    let mut h = Sha256::new();
    h.update(key);
    h.update(n.to_be_bytes());
    let d = h.finalize();
    let x = d[..6].iter().fold(0u64, |a, &b| (a << 8) | u64::from(b));
    x % count.max(1)
}

/// Whether a place that joined at `joined_at` belongs to the pre-queue: it joined before
/// the opening. Derived, never stored: the settings say which places it holds (a change of
/// `opens_at` that would move a waiting place in or out of it is refused).
pub fn in_prequeue(opens_at: Option<Millis>, joined_at: Millis) -> bool {
    opens_at.is_some_and(|t| joined_at < t)
}

/// Bits of the key that choose a bucket: 4,096 buckets (under 100 kB, made only when an
/// event has a pre-queue); a million places make buckets of about 250, a few microseconds
/// to insert into.
const BUCKET_BITS: u32 = 12;

/// The pre-queue places still waiting, in shuffle order, with O(log n) rank, k-th and
/// removal: a Fenwick tree of bucket sizes over the keys' first 16 bits, each bucket a
/// sorted vector. Keys are uniform, so buckets stay small whatever the joiners do: they choose neither the seed nor their sequence number.
/// Entries compare by the keys' first 128 bits, then by seq: two keys sharing 128 bits
/// is a 2^-128 event, which the documented order (by the whole key) would settle the same
/// way in every case that ever happens.
#[derive(Debug, Clone, Default)]
pub struct PreQueue {
    buckets: Vec<Vec<(u128, u64)>>,
    counts: Option<RankIndex>,
    len: u64,
}

fn head128(key: &[u8; 32]) -> u128 {
    u128::from_be_bytes(key[..16].try_into().expect("16 bytes"))
}

impl PreQueue {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn bucket_of(k: u128) -> usize {
        (k >> (128 - BUCKET_BITS)) as usize
    }

    pub fn insert(&mut self, key: &[u8; 32], seq: u64) {
        let counts = self
            .counts
            .get_or_insert_with(|| RankIndex::new(0, 1 << BUCKET_BITS));
        if self.buckets.is_empty() {
            self.buckets = vec![Vec::new(); 1 << BUCKET_BITS];
        }
        let k = head128(key);
        let b = Self::bucket_of(k);
        let v = &mut self.buckets[b];
        let i = v.partition_point(|e| *e < (k, seq));
        v.insert(i, (k, seq));
        counts.insert(b as u64);
        self.len += 1;
    }

    /// Removes the place; false if it is not there.
    pub fn remove(&mut self, key: &[u8; 32], seq: u64) -> bool {
        let k = head128(key);
        let b = Self::bucket_of(k);
        let Some(v) = self.buckets.get_mut(b) else {
            return false;
        };
        let Ok(i) = v.binary_search(&(k, seq)) else {
            return false;
        };
        v.remove(i);
        self.counts
            .as_mut()
            .expect("made with the buckets")
            .remove(b as u64);
        self.len -= 1;
        true
    }

    /// The 1-based rank of the place in shuffle order.
    pub fn rank(&self, key: &[u8; 32], seq: u64) -> Option<u64> {
        let k = head128(key);
        let b = Self::bucket_of(k);
        let i = self.buckets.get(b)?.binary_search(&(k, seq)).ok()?;
        let below = self.counts.as_ref()?.count_below(b as u64);
        Some(below + i as u64 + 1)
    }

    /// The seq of the `k`-th place (1-based) in shuffle order.
    pub fn kth(&self, k: u64) -> Option<u64> {
        let counts = self.counts.as_ref()?;
        let b = counts.kth(k)?;
        let i = k - counts.count_below(b) - 1;
        self.buckets[b as usize].get(i as usize).map(|e| e.1)
    }
}

/// RFC 3339 to milliseconds since the epoch; `None` if it is not RFC 3339 or lies before
/// 1970 or after 9999.
/// The bound is on the instant, in UTC: `9999-12-31T23:00:00-01:00` is in year 10000,
/// which no answer could write back.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    use time::format_description::well_known::Rfc3339;
    let t = time::OffsetDateTime::parse(s, &Rfc3339).ok()?;
    // Checked before the cut to milliseconds: a fraction of a millisecond before 1970 is
    // before 1970 too, though the division (toward zero) would make it the epoch itself.
    let ns = u128::try_from(t.unix_timestamp_nanos()).ok()?;
    u64::try_from(ns / 1_000_000)
        .ok()
        .filter(|&ms| ms <= MAX_TIME)
}

/// The last instant [`parse_rfc3339`] takes and [`format_rfc3339`] writes: the end of year
/// 9999, in milliseconds.
pub const MAX_TIME: Millis = 253_402_300_799_999;

/// Milliseconds since the epoch as RFC 3339 in UTC (`2026-11-23T01:00:00Z`, with
/// milliseconds only when there are some). A time past [`MAX_TIME`] (stored before it was
/// refused on input) is written as `MAX_TIME`, so that reading such an event answers
/// rather than fails, and its settings can still be changed.
pub fn format_rfc3339(ms: Millis) -> String {
    use time::format_description::well_known::Rfc3339;
    let t =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms.min(MAX_TIME)) * 1_000_000)
            .expect("0 to MAX_TIME is in range");
    t.format(&Rfc3339).expect("formats")
}

/// `opens_at` in the stored settings: RFC 3339 text, read into milliseconds.
pub(super) mod opt_rfc3339 {
    use super::{format_rfc3339, parse_rfc3339, Millis};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Millis>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(ms) => s.serialize_str(&format_rfc3339(*ms)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Millis>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| parse_rfc3339(&s).ok_or_else(|| serde::de::Error::custom("RFC 3339")))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_reads_offsets_and_writes_utc() {
        let ms = parse_rfc3339("2026-11-23T10:00:00+09:00").unwrap();
        assert_eq!(format_rfc3339(ms), "2026-11-23T01:00:00Z");
        assert_eq!(parse_rfc3339("2026-11-23T01:00:00.250Z"), Some(ms + 250));
        for bad in ["2026-11-23", "tomorrow", "1960-01-01T00:00:00Z", ""] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    /// 1970 is the first year taken, to the nanosecond: the least fraction before its
    /// first instant is refused, not cut to it.
    #[test]
    fn rfc3339_starts_at_the_epoch_exactly() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("1970-01-01T01:00:00.000000001+01:00"),
            Some(0)
        );
        for bad in [
            "1969-12-31T23:59:59.9999Z",
            "1969-12-31T23:59:59.999999999Z",
            "1970-01-01T00:59:59.9999+01:00",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    /// Year 10000 once the offset is applied is refused; a time past the bound that was
    /// stored before is written as the bound instead of failing the answer.
    #[test]
    fn rfc3339_stays_within_year_9999() {
        assert_eq!(parse_rfc3339("9999-12-31T23:59:59.999Z"), Some(MAX_TIME));
        for bad in ["9999-12-31T23:00:00-01:00", "9999-12-31T23:59:59-00:01"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(
            format_rfc3339(MAX_TIME + 3_600_000),
            "9999-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn prequeue_ranks_follow_the_keys() {
        let seed = [7u8; 32];
        let mut pq = PreQueue::default();
        for seq in 1..=5000 {
            pq.insert(&prequeue_key(&seed, seq), seq);
        }
        let mut order: Vec<u64> = (1..=5000).collect();
        order.sort_by_key(|&s| prequeue_key(&seed, s));
        for (i, &s) in order.iter().enumerate() {
            assert_eq!(pq.rank(&prequeue_key(&seed, s), s), Some(i as u64 + 1));
            assert_eq!(pq.kth(i as u64 + 1), Some(s));
        }
        assert!(pq.remove(&prequeue_key(&seed, order[0]), order[0]));
        assert!(!pq.remove(&prequeue_key(&seed, order[0]), order[0]));
        assert_eq!(pq.kth(1), Some(order[1]));
        assert_eq!(pq.len(), 4999);
    }

    #[test]
    fn the_secret_stays_out_of_debug_output() {
        assert_eq!(format!("{:?}", EventSecret([1; 32])), "EventSecret(..)");
        let s = EventSecret([0xab; 32]);
        assert_ne!(s.shuffle_seed(), s.lottery_key());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<EventSecret>(&json).unwrap(), s);
    }
}
