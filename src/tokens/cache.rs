//! A bounded cache of verified waiting tokens: a gated request carries its waiting token in
//! a cookie, and checking its MAC (two SHA-256 blocks, ~8,600 instructions here) was half of
//! what a gated request adds to a proxied one. The signing keys change only at a restart,
//! which builds a new cache, so a token once verified stays valid for the cache's life, and
//! a hit answers exactly what the verification did (waiting tokens carry no expiry: a place
//! ends in the store, which the caller still asks).
//!
//! Only tokens that verified are ever inserted, keyed by their exact text and compared in
//! full on a hit, so a forged token (however close to a cached one) misses and goes to the
//! MAC. The slot is chosen by the token's last eight bytes, which are its MAC's (random to
//! anyone without the signing key), mixed with a random key of the cache's: a SipHash of
//! the whole text cost ~300 instructions per gated request, and what it guarded against is
//! guarded by the MAC already. Nobody can aim a token at the slot of another's without
//! knowing that other's token (a forged token is looked up, never inserted); anyone can
//! fill every slot with tokens of their own, under either hash. The comparison takes the
//! same time however much of the text matches, so a hit's timing does not reveal how much
//! of a cached token a guess got right.
//!
//! Direct-mapped: a fixed number of slots, one entry each, a new entry replacing whatever
//! was there. Memory is bounded (slots × the longest token and event id) with no eviction
//! bookkeeping; one lock per slot, so lookups of different tokens do not contend.
//!
//! Only the gate uses it (`WaitingTokens::parse`). The end-user API's polls come from a
//! whole crowd, far more places than slots, and verify by the MAC (`WaitingTokens::verify`).

use parking_lot::Mutex;

use crate::core::PlaceKey;

/// Slots of the cache: at most this many verified tokens are kept (~80 bytes each inline,
/// plus the token's and event id's text, at most ~210 bytes: under 2.5 MB when full).
pub(super) const SLOTS: usize = 8192;

struct Entry {
    token: Box<str>,
    event_id: Box<str>,
    key: PlaceKey,
}

pub(super) struct VerifiedTokens {
    /// Mixed into the slot's choice: a random odd multiplier and a random offset.
    mix: (u64, u64),
    slots: Box<[Mutex<Option<Entry>>]>,
}

impl VerifiedTokens {
    pub(super) fn new(slots: usize) -> Self {
        VerifiedTokens {
            mix: {
                let r = super::random_u128();
                ((r as u64) | 1, (r >> 64) as u64)
            },
            slots: (0..slots.max(1)).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn slot(&self, token: &str) -> &Mutex<Option<Entry>> {
        let b = token.as_bytes();
        let mut tail = [0u8; 8];
        let n = b.len().min(8);
        tail[8 - n..].copy_from_slice(&b[b.len() - n..]);
        let x = (u64::from_le_bytes(tail) ^ b.len() as u64).wrapping_add(self.mix.1);
        let h = x.wrapping_mul(self.mix.0);
        // The slot is read from the product's top bits (a multiply-high reduction), the
        // only ones that depend on every bit of `x`: a bit of the product depends on the
        // bits of `x` at or below it, so bits 32..45 (`h >> 32` modulo the slots) ignored
        // the token's last two bytes.
        let i = ((u128::from(h) * self.slots.len() as u128) >> 64) as usize;
        &self.slots[i]
    }

    /// What the verification of exactly `token` answered, if it is still kept.
    pub(super) fn get(&self, token: &str) -> Option<(String, PlaceKey)> {
        let slot = self.slot(token).lock();
        let e = slot.as_ref()?;
        same(e.token.as_bytes(), token.as_bytes()).then(|| (e.event_id.to_string(), e.key))
    }

    /// `f` of what the verification of exactly `token` answered, if it is still kept, read
    /// in place (no copy of the event id).
    pub(super) fn get_with<R>(
        &self,
        token: &str,
        f: impl FnOnce(&str, PlaceKey) -> R,
    ) -> Option<R> {
        let slot = self.slot(token).lock();
        let e = slot.as_ref()?;
        same(e.token.as_bytes(), token.as_bytes()).then(|| f(&e.event_id, e.key))
    }

    /// Keeps what the verification of `token` answered. Call only for a token that verified.
    pub(super) fn insert(&self, token: &str, event_id: &str, key: PlaceKey) {
        let entry = Entry {
            token: token.into(),
            event_id: event_id.into(),
            key,
        };
        let old = self.slot(token).lock().replace(entry);
        // The replaced entry is freed outside the lock.
        drop(old);
    }

    /// How many tokens are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.lock().is_some()).count()
    }
}

/// Equal text, in a time that depends on the lengths only (a token's length is no secret:
/// it follows from its event id's). Eight bytes at a time: a byte at a time cost ~4
/// instructions per byte of every gated request's token.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().expect("eight bytes"));
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = wa
        .remainder()
        .iter()
        .zip(wb.remainder())
        .fold(0u64, |acc, (x, y)| acc | u64::from(x ^ y));
    wa.zip(wb)
        .fold(tail, |acc, (x, y)| acc | (word(x) ^ word(y)))
        == 0
}

#[cfg(test)]
mod tests {
    use super::super::{random_u128, WaitingTokens, MAX_TEXT};
    use super::PlaceKey;

    /// `same` (word by word) answers as a byte-by-byte comparison, whichever byte differs
    /// and whatever the length.
    #[test]
    fn same_compares_every_byte() {
        for len in 0..40 {
            let a: Vec<u8> = (0..len).map(|i| b'A' + (i % 26) as u8).collect();
            assert!(super::same(&a, &a.clone()), "{len}");
            for i in 0..len {
                let mut b = a.clone();
                b[i] ^= 0x20;
                assert!(!super::same(&a, &b), "{len} {i}");
            }
            assert!(!super::same(&a, &a[..len.saturating_sub(1)]) || len == 0);
        }
    }

    /// Each of the token's last eight bytes (its MAC's) moves the slot: tokens that differ
    /// in one of them alone are spread over the slots, not all kept in one.
    #[test]
    fn each_of_the_last_eight_bytes_moves_the_slot() {
        let cache = super::VerifiedTokens::new(super::SLOTS);
        let base = b"abcdefghijklmnopqrstuvwx".to_vec();
        for from_end in 1..=8 {
            let slots: std::collections::HashSet<*const _> = (b'A'..=b'Z')
                .map(|c| {
                    let mut t = base.clone();
                    let i = t.len() - from_end;
                    t[i] = c;
                    let t = String::from_utf8(t).unwrap();
                    std::ptr::from_ref(cache.slot(&t))
                })
                .collect();
            assert!(
                slots.len() > 1,
                "byte {from_end} from the end never moves it"
            );
        }
    }

    fn key() -> PlaceKey {
        PlaceKey {
            seq: 42,
            nonce: random_u128(),
        }
    }

    /// `place_for` (the gate's) answers what `parse` answers for the event asked and nothing
    /// for another, on a miss (the MAC) and a hit (the cache) alike; forgeries get nothing.
    #[test]
    fn place_for_answers_as_parse_for_its_event_only() {
        let (t, k) = (WaitingTokens::with_older([7; 32], &[[8; 32]]), key());
        for tok in [
            t.issue("ev-a", k),
            WaitingTokens::new([8; 32]).issue("ev-a", k),
        ] {
            for round in ["miss", "hit"] {
                assert_eq!(t.place_for(&tok, "ev-a"), Some(k), "{round}");
                for other in ["ev-b", "ev-", "ev-aa", ""] {
                    assert_eq!(t.place_for(&tok, other), None, "{round} {other:?}");
                }
            }
            assert_eq!(t.parse(&tok), Ok(("ev-a".to_string(), k)));
            for f in super::super::tests::one_char_forgeries(&tok) {
                assert_eq!(t.place_for(&f, "ev-a"), None, "{f} accepted");
            }
        }
        assert_eq!(t.place_for(&"A".repeat(MAX_TEXT + 1), "ev-a"), None);
    }
}
