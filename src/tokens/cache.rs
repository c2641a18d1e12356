//! A bounded cache of verified waiting tokens: a gated request carries its waiting token in
//! a cookie, and checking its MAC (two SHA-256 blocks, ~8,600 instructions here) was half of
//! what a gated request adds to a proxied one. The signing keys change only at a restart,
//! which builds a new cache, so a token once verified stays valid for the cache's life, and
//! a hit answers exactly what the verification did (waiting tokens carry no expiry: a place
//! ends in the store, which the caller still asks).
//!
//! Only tokens that verified are ever inserted, keyed by their exact text and compared in
//! full on a hit, so a forged token (however close to a cached one) misses and goes to the
//! MAC. The slot is chosen by a randomly keyed hash, so nobody can aim tokens at another's
//! slot; the comparison takes the same time however much of the text matches, so a hit's
//! timing does not reveal how much of a cached token a guess got right.
//!
//! Direct-mapped: a fixed number of slots, one entry each, a new entry replacing whatever
//! was there. Memory is bounded (slots × the longest token and event id) with no eviction
//! bookkeeping; one lock per slot, so lookups of different tokens do not contend.
//!
//! Only the gate uses it (`WaitingTokens::parse`). The end-user API's polls come from a
//! whole crowd, far more places than slots, and verify by the MAC (`WaitingTokens::verify`).

use std::hash::{BuildHasher, RandomState};

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
    hasher: RandomState,
    slots: Box<[Mutex<Option<Entry>>]>,
}

impl VerifiedTokens {
    pub(super) fn new(slots: usize) -> Self {
        VerifiedTokens {
            hasher: RandomState::new(),
            slots: (0..slots.max(1)).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn slot(&self, token: &str) -> &Mutex<Option<Entry>> {
        let i = self.hasher.hash_one(token) as usize % self.slots.len();
        &self.slots[i]
    }

    /// What the verification of exactly `token` answered, if it is still kept.
    pub(super) fn get(&self, token: &str) -> Option<(String, PlaceKey)> {
        let slot = self.slot(token).lock();
        let e = slot.as_ref()?;
        same(e.token.as_bytes(), token.as_bytes()).then(|| (e.event_id.to_string(), e.key))
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
/// it follows from its event id's).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
