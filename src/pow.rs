//! Proof of work for joins: stateless challenges, and the check of a solution.
//!
//! An event with `pow_difficulty` N > 0 asks every join for work: the client finds a
//! `nonce` such that sha256(prefix ‖ nonce) starts with N zero bits. That costs an honest
//! browser a moment per join and a bot farm the same per join, which prices out floods.
//!
//! The **prefix** is `1:{event}:{bits}:{expires_at}:{random}:{mac}`: the event it is for,
//! the difficulty it asks, its expiry (Unix ms), 128 random bits and a MAC (HMAC-SHA256,
//! truncated to 128 bits) over everything before it, keyed by a secret derived from the
//! signing key. Any node that shares the signing key checks a prefix with no storage; the
//! only state is the single-use claim of a spent prefix (`Store::claim_once`, keyed by its
//! random part, kept until the expiry), so memory for spent challenges is bounded by their
//! lifetime.

use std::collections::HashMap;
use std::fmt::Write as _;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::core::config::MAX_POW_BITS;
use crate::core::Millis;

/// The only algorithm: named in every challenge so clients can check what they solve.
pub const ALGORITHM: &str = "sha256";
/// How long a challenge may be solved and spent: long enough for a slow phone at the
/// highest difficulty a sale would set, short enough that spent claims stay few.
pub const CHALLENGE_TTL_MS: Millis = 120_000;
/// Longest accepted `nonce`, in bytes: any solution fits in far fewer.
pub const MAX_NONCE_LEN: usize = 64;
/// Longest accepted `prefix`: ours are below 160 bytes.
const MAX_PREFIX_LEN: usize = 256;
const VERSION: &str = "1";
const MAC_LEN: usize = 16;

/// A challenge as the API answers it (inside the `POW_REQUIRED` / `POW_INVALID` error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Challenge {
    #[schema(value_type = String, example = "sha256")]
    pub algorithm: &'static str,
    pub prefix: String,
    pub difficulty_bits: u32,
    /// Seconds left to solve and spend it.
    pub expires_in: u64,
}

/// Why a solution was refused. The message is sent to the client: it says what to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PowError {
    #[error("the challenge was not issued by this server")]
    Forged,
    #[error("the challenge is for another event")]
    OtherEvent,
    #[error("the challenge has expired")]
    Expired,
    #[error("the challenge is easier than the event now asks")]
    TooEasy,
    #[error("the nonce does not solve the challenge")]
    WrongNonce,
    /// Told apart from a forgery: a client told its challenge was forged would only solve
    /// new ones with the same nonces.
    #[error("the nonce must be 1 to 64 bytes long")]
    NonceLength,
    #[error("the challenge was already used")]
    Reused,
}

/// A solution that passed every stateless check: what must still be claimed, once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    /// The challenge's random part: unique per challenge.
    pub claim_key: String,
    pub expires_at: Millis,
}

/// Issues challenges with one secret, and checks them with it or any older one.
#[derive(Clone)]
pub struct PowChallenges {
    /// Newest first: the first issues.
    keys: Vec<[u8; 32]>,
}

impl PowChallenges {
    pub fn new(key: [u8; 32]) -> Self {
        PowChallenges { keys: vec![key] }
    }

    /// Issues with `keys[0]`, accepts any of `keys` (a key rotation's older ones).
    pub fn with_older(keys: &[[u8; 32]]) -> Self {
        assert!(!keys.is_empty(), "at least one key");
        PowChallenges {
            keys: keys.to_vec(),
        }
    }

    fn mac(key: &[u8; 32], body: &str) -> String {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
        m.update(body.as_bytes());
        B64.encode(&m.finalize().into_bytes()[..MAC_LEN])
    }

    /// A fresh challenge of `bits` for `event_id`, valid for [`CHALLENGE_TTL_MS`].
    pub fn issue(&self, event_id: &str, bits: u32, now: Millis) -> Challenge {
        let expires_at = now + CHALLENGE_TTL_MS;
        let random = B64.encode(crate::tokens::random_u128().to_le_bytes());
        let body = format!("{VERSION}:{event_id}:{bits}:{expires_at}:{random}:");
        let mac = Self::mac(&self.keys[0], &body);
        Challenge {
            algorithm: ALGORITHM,
            prefix: body + &mac,
            difficulty_bits: bits,
            expires_in: CHALLENGE_TTL_MS / 1000,
        }
    }

    /// Checks everything but single use: issued by us (MAC), for this event, not expired,
    /// at least `min_bits` hard, and solved by `nonce`. Cheap checks first, so a forgery
    /// costs one MAC and no store call.
    pub fn check(
        &self,
        event_id: &str,
        min_bits: u32,
        prefix: &str,
        nonce: &str,
        now: Millis,
    ) -> Result<Solved, PowError> {
        if nonce.is_empty() || nonce.len() > MAX_NONCE_LEN {
            return Err(PowError::NonceLength);
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(PowError::Forged);
        }
        let Some((body, mac)) = prefix.rsplit_once(':') else {
            return Err(PowError::Forged);
        };
        // The MAC covers the trailing ':'.
        let body = &prefix[..body.len() + 1];
        // Constant-time comparison so timing does not leak how much of a forgery matched.
        let matches = |key: &[u8; 32]| {
            let expected = Self::mac(key, body);
            let diff = expected.len() ^ mac.len()
                | expected
                    .bytes()
                    .zip(mac.bytes())
                    .fold(0, |acc, (a, b)| acc | usize::from(a ^ b));
            diff == 0
        };
        if !self.keys.iter().any(matches) {
            return Err(PowError::Forged);
        }
        let parts: Vec<&str> = body.trim_end_matches(':').split(':').collect();
        let [VERSION, event, bits, expires_at, random] = parts[..] else {
            return Err(PowError::Forged);
        };
        let (Ok(bits), Ok(expires_at)) = (bits.parse::<u32>(), expires_at.parse::<Millis>()) else {
            return Err(PowError::Forged);
        };
        if event != event_id {
            return Err(PowError::OtherEvent);
        }
        if expires_at <= now {
            return Err(PowError::Expired);
        }
        if bits < min_bits {
            return Err(PowError::TooEasy);
        }
        if leading_zero_bits(&digest(prefix, nonce)) < bits {
            return Err(PowError::WrongNonce);
        }
        Ok(Solved {
            claim_key: random.to_string(),
            expires_at,
        })
    }
}

/// This node's rate of join attempts per event, for difficulty that rises with load. Per
/// node on purpose: it costs no store call, and with N nodes behind a balancer each sees
/// about 1/N of the load, so a threshold is per node (documented so).
#[derive(Default)]
pub struct JoinRates {
    events: Mutex<HashMap<String, Window>>,
}

/// Attempts in the current and the previous whole second.
#[derive(Default)]
struct Window {
    second: u64,
    current: u64,
    previous: u64,
}

impl JoinRates {
    /// Counts one attempt at `now`; answers attempts per second over the last 1000 ms (the
    /// previous second weighted by how much of it is still inside that span).
    pub fn hit(&self, event_id: &str, now: Millis) -> u64 {
        let sec = now / 1000;
        let mut events = self.events.lock();
        // Only events that exist reach this (the catalog checked), so the map stays small.
        let w = match events.get_mut(event_id) {
            Some(w) => w,
            None => events.entry(event_id.to_string()).or_default(),
        };
        if w.second != sec {
            w.previous = if w.second + 1 == sec { w.current } else { 0 };
            w.current = 0;
            w.second = sec;
        }
        w.current += 1;
        w.current + w.previous * (1000 - now % 1000) / 1000
    }
}

/// The difficulty of new challenges: `base`, plus one bit per doubling of `rate` beyond
/// `above`, at most [`MAX_POW_BITS`].
pub fn difficulty(base: u32, rate: u64, above: Option<u32>) -> u32 {
    let Some(above) = above else { return base };
    let (mut bits, mut limit) = (base, u64::from(above));
    while rate > limit && u64::from(bits) < MAX_POW_BITS {
        bits += 1;
        limit *= 2;
    }
    bits
}

/// sha256(prefix ‖ nonce).
pub fn digest(prefix: &str, nonce: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(prefix.as_bytes());
    h.update(nonce.as_bytes());
    h.finalize().into()
}

/// How many zero bits `hash` starts with.
pub fn leading_zero_bits(hash: &[u8]) -> u32 {
    let mut n = 0;
    for b in hash {
        if *b == 0 {
            n += 8;
        } else {
            return n + b.leading_zeros();
        }
    }
    n
}

/// The reference solver: counts up in decimal until the digest has `bits` zero bits.
/// About 2^bits hashes on average; for tests, tools and the documentation's example.
pub fn solve(prefix: &str, bits: u32) -> String {
    let mut nonce = String::new();
    for i in 0u64.. {
        nonce.clear();
        let _ = write!(nonce, "{i}");
        if leading_zero_bits(&digest(prefix, &nonce)) >= bits {
            break;
        }
    }
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_700_000_000_000;

    #[test]
    fn known_vectors() {
        // sha256("abc") = ba7816bf…: the first byte 0xba has no leading zero bit.
        assert_eq!(leading_zero_bits(&digest("ab", "c")), 0);
        assert_eq!(
            digest("", "abc")[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "the digest is plain SHA-256 of prefix then nonce"
        );
        assert_eq!(leading_zero_bits(&[0, 0, 0x0f, 0xff]), 20);
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0x01]), 7);
        assert_eq!(leading_zero_bits(&[0; 4]), 32);
        // A fixed prefix, solved by an independent implementation (Python's hashlib):
        // sha256("waitroom-test:130") = 00c442db…, sha256("waitroom-test:14729") = 000e3a8f….
        assert_eq!(solve("waitroom-test:", 8), "130");
        assert_eq!(digest("waitroom-test:", "130")[..2], [0x00, 0xc4]);
        assert_eq!(solve("waitroom-test:", 12), "14729");
        assert_eq!(leading_zero_bits(&digest("waitroom-test:", "14729")), 12);
    }

    #[test]
    fn difficulty_rises_one_bit_per_doubling_and_the_rate_decays() {
        assert_eq!(difficulty(4, 1_000_000, None), 4);
        assert_eq!(difficulty(4, 10, Some(10)), 4);
        assert_eq!(difficulty(4, 11, Some(10)), 5);
        assert_eq!(difficulty(4, 20, Some(10)), 5);
        assert_eq!(difficulty(4, 21, Some(10)), 6);
        assert_eq!(difficulty(0, 81, Some(10)), 4, "also from no work at all");
        assert_eq!(difficulty(20, u64::MAX, Some(1)), 28, "capped");
        let r = JoinRates::default();
        for i in 1..=30 {
            assert_eq!(r.hit("ev", NOW + 999), i);
        }
        assert_eq!(r.hit("other", NOW), 1, "per event");
        // Half a second later, half of the last second still counts.
        assert_eq!(r.hit("ev", NOW + 1500), 1 + 15);
        assert_eq!(r.hit("ev", NOW + 3000), 1, "gone after a quiet second");
    }

    #[test]
    fn a_solution_passes_and_every_flaw_is_named() {
        let p = PowChallenges::new([7; 32]);
        let c = p.issue("ev", 8, NOW);
        assert_eq!(
            (c.algorithm, c.difficulty_bits, c.expires_in),
            ("sha256", 8, 120)
        );
        let nonce = solve(&c.prefix, 8);
        let ok = p.check("ev", 8, &c.prefix, &nonce, NOW + 1000).unwrap();
        assert_eq!(ok.expires_at, NOW + CHALLENGE_TTL_MS);
        assert_eq!(ok.claim_key.len(), 22);

        let check = |p: &PowChallenges, ev, min, prefix: &str, nonce: &str, now| {
            p.check(ev, min, prefix, nonce, now).unwrap_err()
        };
        assert_eq!(
            check(&p, "other", 8, &c.prefix, &nonce, NOW),
            PowError::OtherEvent
        );
        assert_eq!(
            check(&p, "ev", 8, &c.prefix, &nonce, NOW + CHALLENGE_TTL_MS),
            PowError::Expired
        );
        assert_eq!(
            check(&p, "ev", 9, &c.prefix, &nonce, NOW),
            PowError::TooEasy
        );
        let wrong = (0..)
            .map(|i: u32| format!("x{i}"))
            .find(|n| leading_zero_bits(&digest(&c.prefix, n)) < 8)
            .unwrap();
        assert_eq!(
            check(&p, "ev", 8, &c.prefix, &wrong, NOW),
            PowError::WrongNonce
        );
        // Another key, an edited difficulty or expiry, junk: all forgeries.
        let other = PowChallenges::new([8; 32]);
        assert_eq!(
            check(&other, "ev", 8, &c.prefix, &nonce, NOW),
            PowError::Forged
        );
        // After a rotation (a newer key issuing, this one older) it still counts, and so
        // does one the newer key issued; a key neither holds does not.
        let rotated = PowChallenges::with_older(&[[8; 32], [7; 32]]);
        assert!(rotated.check("ev", 8, &c.prefix, &nonce, NOW).is_ok());
        let c2 = rotated.issue("ev", 8, NOW);
        let n2 = solve(&c2.prefix, 8);
        assert!(rotated.check("ev", 8, &c2.prefix, &n2, NOW).is_ok());
        assert_eq!(check(&p, "ev", 8, &c2.prefix, &n2, NOW), PowError::Forged);
        assert_eq!(
            check(
                &PowChallenges::with_older(&[[9; 32], [8; 32]]),
                "ev",
                8,
                &c.prefix,
                &nonce,
                NOW
            ),
            PowError::Forged
        );
        let easier = c.prefix.replacen(":8:", ":1:", 1);
        let n1 = solve(&easier, 1);
        assert_eq!(check(&p, "ev", 1, &easier, &n1, NOW), PowError::Forged);
        for junk in ["", ":", "1:ev:8:0:x:", &"a".repeat(300)] {
            assert_eq!(check(&p, "ev", 8, junk, "1", NOW), PowError::Forged);
        }
        assert_eq!(
            check(&p, "ev", 8, &c.prefix, "", NOW),
            PowError::NonceLength
        );
        assert_eq!(
            check(&p, "ev", 8, &c.prefix, &"1".repeat(65), NOW),
            PowError::NonceLength
        );
    }
}
