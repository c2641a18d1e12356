//! Tokens: the opaque waiting token of a place, and the signed JWT access token of a session.
//!
//! **Waiting token** = base64url(version ‖ event id ‖ seq ‖ nonce ‖ MAC). The 128-bit nonce is
//! fresh randomness per place; the MAC (HMAC-SHA256, truncated to 128 bits) is keyed by a
//! secret derived from the signing key, so any node that shares `--signing-key` can route a
//! token to its event and reject a forgery without a store lookup.
//!
//! **Access token** = a JWT signed with Ed25519 (`EdDSA`), key id in the header, public key
//! at `/.well-known/jwks.json`. Its `sid` names the place (seq and nonce), so verification
//! can check that the session is still active.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use ed25519_dalek::SigningKey;
use hmac::{Hmac, Mac};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::{Millis, PlaceKey};

mod cache;
mod invite;
mod key_files;
mod user;

pub use invite::invite_code;
pub use key_files::{
    check_key_change, create_owner_dirs, key_fingerprint, load_key_for_store, load_or_generate_key,
    load_signing_keys, narrow_secret_file, write_private, write_private_new, KEY_FINGERPRINT_FILE,
};
pub use user::{verify_user_token, UserTokenError, USER_TOKEN_LEEWAY_MS};

const VERSION: u8 = 1;
const MAC_LEN: usize = 16;
/// Longest possible token: version, length byte, 64-byte event id, seq, nonce, MAC.
const MAX_RAW: usize = 2 + 64 + 8 + 16 + MAC_LEN;
/// Longest possible token text (base64 of [`MAX_RAW`] bytes, rounded up to whole quads).
const MAX_TEXT: usize = MAX_RAW.div_ceil(3) * 4;
const ISSUER: &str = "waitroom";

/// 128 unpredictable bits (nonces of places and sessions, proofs of work, node ids).
///
/// From the thread's CSPRNG (`rand`'s `ThreadRng`: ChaCha12, seeded from the operating
/// system's source and reseeded from it every 64 KiB of output), not a `getrandom` system
/// call each: every join makes a nonce, and that call was one of a join's ~3 system calls
/// (docs/PERFORMANCE.md, "A join's system calls").
pub fn random_u128() -> u128 {
    use rand::Rng;
    rand::rng().random()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed or forged token")]
pub struct InvalidToken;

/// Issues and checks waiting tokens.
#[derive(Clone)]
pub struct WaitingTokens {
    /// The MAC keyed once: HMAC's inner and outer pads hashed ahead, so each token costs
    /// two SHA-256 blocks instead of four (every join issues one, every poll checks one).
    keyed: Hmac<Sha256>,
    /// MACs of the older signing keys still configured (key rotation): tokens issued under
    /// them keep reaching their places. Tried only when the newest key's MAC does not match,
    /// so a current token costs nothing more.
    older: std::sync::Arc<[Hmac<Sha256>]>,
    /// Tokens that verified, so a gated request's cookie is checked once, not at every
    /// request (`cache`); shared by the clones, which hold the same keys.
    verified: std::sync::Arc<cache::VerifiedTokens>,
}

fn keyed_mac(key: &[u8; 32]) -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length")
}

impl WaitingTokens {
    pub fn new(key: [u8; 32]) -> Self {
        WaitingTokens {
            keyed: keyed_mac(&key),
            older: std::sync::Arc::new([]),
            verified: std::sync::Arc::new(cache::VerifiedTokens::new(cache::SLOTS)),
        }
    }

    /// Issues under `newest`; also accepts tokens issued under any of `older`.
    pub fn with_older(newest: [u8; 32], older: &[[u8; 32]]) -> Self {
        WaitingTokens {
            keyed: keyed_mac(&newest),
            older: older.iter().map(keyed_mac).collect(),
            verified: std::sync::Arc::new(cache::VerifiedTokens::new(cache::SLOTS)),
        }
    }

    fn mac(&self, body: &[u8]) -> [u8; MAC_LEN] {
        Self::mac_with(&self.keyed, body)
    }

    fn mac_with(keyed: &Hmac<Sha256>, body: &[u8]) -> [u8; MAC_LEN] {
        let mut m = keyed.clone();
        m.update(body);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    pub fn issue(&self, event_id: &str, key: PlaceKey) -> String {
        let mut raw = Vec::with_capacity(MAX_RAW);
        raw.push(VERSION);
        raw.push(event_id.len() as u8);
        raw.extend_from_slice(event_id.as_bytes());
        raw.extend_from_slice(&key.seq.to_be_bytes());
        raw.extend_from_slice(&key.nonce.to_be_bytes());
        let mac = self.mac(&raw);
        raw.extend_from_slice(&mac);
        B64.encode(raw)
    }

    /// The event and place a token names, if we issued it. A token verified before is
    /// answered from the cache of verified tokens (keyed by its exact text); anything else
    /// is verified, and kept only if it passes. For gated requests, whose few admitted
    /// sessions present the same cookie again and again; a status poll uses [`Self::verify`].
    pub fn parse(&self, token: &str) -> Result<(String, PlaceKey), InvalidToken> {
        if token.len() > MAX_TEXT {
            return Err(InvalidToken);
        }
        if let Some(hit) = self.verified.get(token) {
            return Ok(hit);
        }
        let (event_id, key) = self.verify(token)?;
        self.verified.insert(token, &event_id, key);
        Ok((event_id, key))
    }

    /// The place `token` names if we issued it for `event_id`: [`Self::parse`] for a gated
    /// request, whose cache hit compares the event id in place rather than copying it.
    pub fn place_for(&self, token: &str, event_id: &str) -> Option<PlaceKey> {
        let same_event = |e: &str, key| (e == event_id).then_some(key);
        if token.len() > MAX_TEXT {
            return None;
        }
        if let Some(hit) = self.verified.get_with(token, same_event) {
            return hit;
        }
        let (e, key) = self.verify(token).ok()?;
        self.verified.insert(token, &e, key);
        same_event(&e, key)
    }

    /// The event and place a token names, if we issued it: decoded on the stack and its MAC
    /// checked under each configured key, with no cache. The end-user API's polls come from
    /// a crowd far larger than the cache's slots, so there a lookup mostly misses and its
    /// keyed hash, lock and insert come on top of the MAC; and the MAC itself, two SHA-256
    /// blocks, takes the CPU's SHA instructions where it has them, cheaper than that hash.
    pub fn verify(&self, token: &str) -> Result<(String, PlaceKey), InvalidToken> {
        if token.len() > MAX_TEXT {
            return Err(InvalidToken);
        }
        let mut buf = [0u8; MAX_TEXT / 4 * 3];
        let n = B64
            .decode_slice(token.trim(), &mut buf)
            .map_err(|_| InvalidToken)?;
        let raw = &buf[..n];
        if raw.len() < 2 + 8 + 16 + MAC_LEN || raw[0] != VERSION {
            return Err(InvalidToken);
        }
        let id_len = raw[1] as usize;
        if raw.len() != 2 + id_len + 8 + 16 + MAC_LEN {
            return Err(InvalidToken);
        }
        let (body, mac) = raw.split_at(raw.len() - MAC_LEN);
        // Constant-time comparison so timing does not leak how much of a forgery matched.
        let matches = |expected: [u8; MAC_LEN]| {
            expected
                .iter()
                .zip(mac)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        };
        if !matches(self.mac(body)) && !self.older.iter().any(|k| matches(Self::mac_with(k, body)))
        {
            return Err(InvalidToken);
        }
        let event_id = std::str::from_utf8(&body[2..2 + id_len]).map_err(|_| InvalidToken)?;
        let rest = &body[2 + id_len..];
        let seq = u64::from_be_bytes(rest[..8].try_into().expect("length checked"));
        let nonce = u128::from_be_bytes(rest[8..24].try_into().expect("length checked"));
        Ok((event_id.to_string(), PlaceKey { seq, nonce }))
    }
}

/// The session id in access tokens: the place's seq and nonce.
pub fn session_id(key: PlaceKey) -> String {
    let mut raw = [0u8; 24];
    raw[..8].copy_from_slice(&key.seq.to_be_bytes());
    raw[8..].copy_from_slice(&key.nonce.to_be_bytes());
    B64.encode(raw)
}

pub fn parse_session_id(sid: &str) -> Option<PlaceKey> {
    let raw = B64.decode(sid).ok()?;
    if raw.len() != 24 {
        return None;
    }
    Some(PlaceKey {
        seq: u64::from_be_bytes(raw[..8].try_into().ok()?),
        nonce: u128::from_be_bytes(raw[8..].try_into().ok()?),
    })
}

/// Claims of an access token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AccessClaims {
    pub iss: String,
    pub aud: String,
    pub sub: String,
    pub sid: String,
    pub iat: u64,
    pub exp: u64,
    pub jti: String,
    /// `sub` is a user id the join proved (a user token or the site's server key). `false`
    /// for a bare `user_id`, which anyone knowing the id may send, and for anonymous
    /// places: a site must not take such a `sub` as its signed-in user. Absent from tokens
    /// signed before it existed: read as `false`.
    #[serde(default)]
    pub user_verified: bool,
}

/// One Ed25519 key and what signing and verification need of it.
struct KeyEntry {
    encoding: EncodingKey,
    decoding: DecodingKey,
    kid: String,
    public: [u8; 32],
    /// Secret for waiting-token MACs, derived from the private key so nodes that share the
    /// signing key agree on it with nothing else to distribute.
    waiting_secret: [u8; 32],
}

/// Signs and verifies access tokens with the configured Ed25519 keys (key rotation): the
/// newest signs, every one verifies the tokens that name its `kid`, the JWKS lists them all.
pub struct AccessTokens {
    /// Every key, oldest first; the last one signs.
    keys: Vec<KeyEntry>,
    /// Secrets for proof-of-work challenge MACs, one derived from each key, newest first:
    /// the newest issues, every one checks, so a challenge solved across a rotation's
    /// restart (or handed out by a node a rollout has not reached yet) still counts.
    pow_secrets: Vec<[u8; 32]>,
}

/// The proof-of-work MAC secret derived from one signing key.
fn pow_secret_of(key: &SigningKey) -> [u8; 32] {
    let mut p = Sha256::new();
    p.update(b"waitroom pow-challenge key v1");
    p.update(key.to_bytes());
    p.finalize().into()
}

impl AccessTokens {
    pub fn from_signing_key(key: &SigningKey) -> anyhow::Result<Self> {
        Self::from_signing_keys(std::slice::from_ref(key))
    }

    /// Several keys, oldest first: the last one signs new tokens (see API.md "Key rotation").
    pub fn from_signing_keys(keys: &[SigningKey]) -> anyhow::Result<Self> {
        if keys.is_empty() {
            anyhow::bail!("no signing key");
        }
        let mut entries: Vec<KeyEntry> = Vec::with_capacity(keys.len());
        for key in keys {
            let entry = KeyEntry::new(key)?;
            if entries.iter().any(|e| e.kid == entry.kid) {
                anyhow::bail!(
                    "the signing key with key id {} is given twice (keys must be distinct)",
                    entry.kid
                );
            }
            entries.push(entry);
        }
        Ok(AccessTokens {
            keys: entries,
            pow_secrets: keys.iter().rev().map(pow_secret_of).collect(),
        })
    }

    fn newest(&self) -> &KeyEntry {
        self.keys.last().expect("at least one key")
    }

    /// Waiting tokens issued under the newest key, and accepted under every configured one.
    pub fn waiting_tokens(&self) -> WaitingTokens {
        let older: Vec<[u8; 32]> = self
            .keys
            .iter()
            .rev()
            .skip(1)
            .map(|k| k.waiting_secret)
            .collect();
        WaitingTokens::with_older(self.newest().waiting_secret, &older)
    }

    /// The secrets of proof-of-work challenges, newest (the issuing one) first (see
    /// `crate::pow`).
    pub fn pow_secrets(&self) -> &[[u8; 32]] {
        &self.pow_secrets
    }

    /// The key id of the key that signs new tokens.
    pub fn kid(&self) -> &str {
        &self.newest().kid
    }

    /// The key ids of every configured key, oldest first.
    pub fn kids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.kid.as_str()).collect()
    }

    /// Signs a token for the active session of `key`, valid until `expires_at`.
    pub fn sign(
        &self,
        event_id: &str,
        subject: &str,
        user_verified: bool,
        key: PlaceKey,
        now: Millis,
        expires_at: Millis,
    ) -> String {
        let claims = AccessClaims {
            iss: ISSUER.into(),
            aud: event_id.into(),
            sub: subject.into(),
            sid: session_id(key),
            iat: now / 1000,
            exp: expires_at / 1000,
            jti: format!("{:032x}", random_u128()),
            user_verified,
        };
        let key = self.newest();
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(key.kid.clone());
        jsonwebtoken::encode(&header, &claims, &key.encoding)
            .expect("Ed25519 signing does not fail")
    }

    /// Checks signature (by the configured key its `kid` names), issuer and expiry (no
    /// leeway: an expired session is over). The audience is left to the caller, which knows
    /// whether an event was asked for.
    pub fn verify(&self, token: &str) -> Result<AccessClaims, InvalidToken> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| InvalidToken)?;
        // A token without a `kid`, or naming a key no longer configured, is refused: that
        // is how removing a key retires the tokens it signed.
        let kid = header.kid.ok_or(InvalidToken)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == kid)
            .ok_or(InvalidToken)?;
        let mut v = Validation::new(Algorithm::EdDSA);
        v.set_issuer(&[ISSUER]);
        v.validate_aud = false;
        v.leeway = 0;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<AccessClaims>(token, &key.decoding, &v)
            .map_err(|_| InvalidToken)?
            .claims;
        // The library compares whole seconds and passes a token through its `exp` second;
        // from `exp` on it is over (RFC 7519 4.1.4).
        (claims.exp.saturating_mul(1000) > crate::clock::system_now())
            .then_some(claims)
            .ok_or(InvalidToken)
    }

    /// The JWKS document of `/.well-known/jwks.json`: every configured key, newest first
    /// (the one that signs new tokens leads).
    pub fn jwks(&self) -> Jwks {
        Jwks {
            keys: self
                .keys
                .iter()
                .rev()
                .map(|k| Jwk {
                    kty: "OKP",
                    crv: "Ed25519",
                    alg: "EdDSA",
                    use_: "sig",
                    kid: k.kid.clone(),
                    x: B64.encode(k.public),
                })
                .collect(),
        }
    }
}

impl KeyEntry {
    fn new(key: &SigningKey) -> anyhow::Result<Self> {
        let pem = key
            .to_pkcs8_pem(Default::default())
            .map_err(|e| anyhow::anyhow!("encoding the signing key: {e}"))?;
        let encoding = EncodingKey::from_ed_pem(pem.as_bytes())?;
        let public = key.verifying_key().to_bytes();
        let decoding = DecodingKey::from_ed_der(&public);
        let kid = hex_prefix(&Sha256::digest(public), 8);
        let mut h = Sha256::new();
        h.update(b"waitroom waiting-token key v1");
        h.update(key.to_bytes());
        Ok(KeyEntry {
            encoding,
            decoding,
            kid,
            public,
            waiting_secret: h.finalize().into(),
        })
    }
}

/// A JSON Web Key Set (RFC 7517): the public keys that verify access tokens.
#[derive(Debug, Clone, Serialize)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// One public key (RFC 8037: an Ed25519 key is an `OKP` key whose `x` is the raw public
/// key, base64url without padding).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Jwk {
    #[schema(value_type = String, example = "OKP")]
    pub kty: &'static str,
    #[schema(value_type = String, example = "Ed25519")]
    pub crv: &'static str,
    #[schema(value_type = String, example = "EdDSA")]
    pub alg: &'static str,
    #[serde(rename = "use")]
    #[schema(value_type = String, example = "sig")]
    pub use_: &'static str,
    /// Matches the `kid` header of the tokens it verifies.
    pub kid: String,
    pub x: String,
}

fn hex_prefix(bytes: &[u8], n: usize) -> String {
    bytes[..n].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether an access token signed at `now` for a session ending at `ends_at` would be
/// refused at once: its `exp` is `ends_at` in whole seconds, rounded down, and a token is
/// refused from the second of its `exp` on.
pub fn expired_on_issue(now: crate::core::Millis, ends_at: crate::core::Millis) -> bool {
    ends_at / 1000 <= now / 1000
}

/// The `expires_in` of an access token signed at `now` for a session ending at `ends_at`:
/// the seconds until its `exp` (`ends_at` in whole seconds, rounded down), rounded up as
/// the status's countdowns are, so that a token still valid never says 0 (which a client
/// reads as expired). Past [`expired_on_issue`] it is at least 1.
pub fn expires_in(now: crate::core::Millis, ends_at: crate::core::Millis) -> u64 {
    (ends_at / 1000).saturating_sub(now / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `waitroom keygen` (and the first start) writes the key through a temporary file: one
    /// already there with a wider mode (left by another user or tool) must not lend its mode
    /// to the key, whose file is the signing secret.
    #[cfg(unix)]
    #[test]
    fn a_generated_key_is_private_even_over_a_stale_temporary_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("signing-key.tmp");
        std::fs::write(&stale, b"left over").unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o644)).unwrap();
        let key = load_or_generate_key(None, dir.path()).unwrap();
        let file = dir.path().join("signing-key.pem");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the key file is {mode:o}");
        // A second run (keygen again) keeps the key rather than replacing it.
        let again = load_or_generate_key(None, dir.path()).unwrap();
        assert_eq!(again.to_bytes(), key.to_bytes());
    }

    /// Generators racing on one directory (`waitroom keygen` run twice at once) all succeed
    /// and all end with the one key that stays in the file: none removes another's
    /// temporary file, none replaces a key another already reported.
    #[test]
    fn racing_generators_agree_on_one_key() {
        for _ in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let keys: Vec<_> = std::thread::scope(|s| {
                let runs: Vec<_> = (0..12)
                    .map(|_| s.spawn(|| load_or_generate_key(None, dir.path())))
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().unwrap().unwrap())
                    .collect()
            });
            let kept = load_or_generate_key(None, dir.path()).unwrap();
            for k in &keys {
                assert_eq!(k.to_bytes(), kept.to_bytes());
            }
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, ["signing-key.pem"], "no temporary file left behind");
        }
    }

    fn key() -> PlaceKey {
        PlaceKey {
            seq: 42,
            nonce: random_u128(),
        }
    }

    #[test]
    fn waiting_token_round_trip_and_forgery() {
        let t = WaitingTokens::new([7; 32]);
        let k = key();
        let tok = t.issue("concert-a", k);
        assert_eq!(t.parse(&tok), Ok(("concert-a".to_string(), k)));
        // Any flipped character breaks the MAC (or the encoding).
        let mut bytes = tok.clone().into_bytes();
        for i in [0, bytes.len() / 2, bytes.len() - 2] {
            let orig = bytes[i];
            bytes[i] = if orig == b'A' { b'B' } else { b'A' };
            assert!(t.parse(std::str::from_utf8(&bytes).unwrap()).is_err());
            bytes[i] = orig;
        }
        assert!(WaitingTokens::new([8; 32]).parse(&tok).is_err());
        for junk in ["", "x", "!!!!", &"A".repeat(10_000)] {
            assert!(t.parse(junk).is_err());
        }
    }

    /// Every variant of `tok` with one character changed to another of the base64url
    /// alphabet (same length, mostly the same prefix as the cached good token).
    pub(super) fn one_char_forgeries(tok: &str) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..tok.len() {
            for c in [b'A', b'z', b'0', b'-', b'_'] {
                let mut b = tok.as_bytes().to_vec();
                if b[i] != c {
                    b[i] = c;
                    out.push(String::from_utf8(b).unwrap());
                }
            }
        }
        out
    }

    /// A cached good token lends nothing to a forgery: with the cache reduced to one slot,
    /// every token shares the good one's slot, and each variant with one character changed
    /// is still refused (and not cached), while the good token keeps its place in the
    /// cache and is answered from it.
    #[test]
    fn a_forgery_is_refused_after_the_good_token_was_cached() {
        let mut t = WaitingTokens::new([7; 32]);
        t.verified = std::sync::Arc::new(cache::VerifiedTokens::new(1));
        let k = key();
        let tok = t.issue("concert-a", k);
        assert_eq!(t.parse(&tok), Ok(("concert-a".to_string(), k)));
        assert_eq!(t.verified.len(), 1, "the good token is cached");
        assert_eq!(
            t.verified.get(&tok),
            Some(("concert-a".to_string(), k)),
            "and answered from the cache"
        );
        let forged = one_char_forgeries(&tok);
        assert!(forged.len() > 100);
        for f in &forged {
            // Some changes of the last character touch only its unused low bits, which
            // the decoder refuses too: every variant is a different text, so all must fail.
            assert_eq!(t.parse(f), Err(InvalidToken), "{f} accepted");
            assert_eq!(t.verified.get(f), None, "a failure was cached");
        }
        // A prefix or an extension of the good token is another token.
        assert!(t.parse(&tok[..tok.len() - 1]).is_err());
        assert!(t.parse(&format!("{tok}A")).is_err());
        assert_eq!(t.verified.get(&tok), Some(("concert-a".to_string(), k)));
        // Another key's cache never saw it: the MAC decides there.
        assert!(WaitingTokens::new([8; 32]).parse(&tok).is_err());
    }

    /// `verify` (the API's, no cache) answers exactly what `parse` (the gate's, cached)
    /// answers, for good tokens (the longest event id, older keys, surrounding blanks),
    /// forgeries and junk, and never fills the cache.
    #[test]
    fn verify_answers_as_parse_without_the_cache() {
        let older = WaitingTokens::new([8; 32]);
        let t = WaitingTokens::with_older([7; 32], &[[8; 32]]);
        let longest = "e".repeat(64);
        let good: Vec<String> = vec![
            t.issue("concert-a", key()),
            t.issue(&longest, key()),
            older.issue("concert-b", key()),
            WaitingTokens::new([9; 32]).issue("concert-c", key()), // an unknown key
        ];
        let mut inputs: Vec<String> = Vec::new();
        for tok in &good {
            inputs.push(tok.clone());
            inputs.push(format!(" {tok}\n"));
            inputs.push(format!("{tok}{}", " ".repeat(MAX_TEXT - tok.len() + 1)));
            inputs.extend(one_char_forgeries(tok));
            inputs.push(tok[..tok.len() - 1].to_string());
            inputs.push(format!("{tok}A"));
        }
        inputs.extend(
            [
                "",
                "x",
                "!!!!",
                "AAAA",
                &"A".repeat(MAX_TEXT),
                &"A".repeat(10_000),
            ]
            .map(String::from),
        );
        let mut accepted = 0;
        for input in &inputs {
            let (v, p) = (t.verify(input), t.parse(input));
            assert_eq!(v, p, "{input:?}");
            accepted += usize::from(v.is_ok());
        }
        assert_eq!(t.verify(&good[1]).unwrap().0, longest);
        assert_eq!(
            accepted,
            3 * 2,
            "the good tokens of known keys, bare and blank-padded"
        );
        let fresh = WaitingTokens::new([7; 32]);
        assert!(fresh.verify(&good[0]).is_ok());
        assert_eq!(fresh.verified.len(), 0, "verify keeps nothing");
    }

    /// The cache keeps at most its number of slots however many tokens verify, and a token
    /// pushed out is verified again rather than refused.
    #[test]
    fn the_verified_token_cache_is_bounded() {
        let mut t = WaitingTokens::new([7; 32]);
        t.verified = std::sync::Arc::new(cache::VerifiedTokens::new(16));
        let tokens: Vec<(String, PlaceKey)> = (0..200)
            .map(|i| {
                let k = PlaceKey {
                    seq: i,
                    nonce: random_u128(),
                };
                (t.issue(&format!("ev-{i}"), k), k)
            })
            .collect();
        for (i, (tok, k)) in tokens.iter().enumerate() {
            assert_eq!(t.parse(tok), Ok((format!("ev-{i}"), *k)));
            assert!(t.verified.len() <= 16);
        }
        assert!(t.verified.len() > 1, "the cache is used");
        for (i, (tok, k)) in tokens.iter().enumerate() {
            assert_eq!(t.parse(tok), Ok((format!("ev-{i}"), *k)));
        }
        assert!(t.verified.len() <= 16);
    }

    #[test]
    fn access_token_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let sk = load_or_generate_key(None, dir.path()).unwrap();
        let again = load_or_generate_key(None, dir.path()).unwrap();
        assert_eq!(
            sk.to_bytes(),
            again.to_bytes(),
            "the generated key is reused"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("signing-key.pem"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let a = AccessTokens::from_signing_key(&sk).unwrap();
        let now = 1_700_000_000_000;
        let k = key();
        let jwt = a.sign("ev", "u1", true, k, now, now + 600_000);
        // The clock here is real, so sign far in the future to stay valid.
        let far = crate::clock::system_now() + 600_000;
        let jwt_valid = a.sign("ev", "u1", true, k, far - 1000, far);
        assert!(a.verify(&jwt).is_err(), "expired tokens are refused");
        let ending = crate::clock::system_now() / 1000 * 1000;
        assert!(
            a.verify(&a.sign("ev", "u1", true, k, ending, ending))
                .is_err(),
            "in exp's second"
        );
        let c = a.verify(&jwt_valid).unwrap();
        assert_eq!((c.aud.as_str(), c.sub.as_str()), ("ev", "u1"));
        assert_eq!(parse_session_id(&c.sid), Some(k));
        let other = AccessTokens::from_signing_key(&SigningKey::from_bytes(&[3; 32])).unwrap();
        assert!(other.verify(&jwt_valid).is_err());
        assert_eq!(a.jwks().keys[0].kid, a.kid());
    }

    /// Rotation: the newest key signs and issues, every key verifies and parses what it
    /// made, and a key dropped from the set retires its tokens.
    #[test]
    fn several_keys_sign_with_the_newest_and_verify_with_all() {
        let (old, new) = (
            SigningKey::from_bytes(&[1; 32]),
            SigningKey::from_bytes(&[2; 32]),
        );
        let before = AccessTokens::from_signing_key(&old).unwrap();
        let both = AccessTokens::from_signing_keys(&[old.clone(), new.clone()]).unwrap();
        let after = AccessTokens::from_signing_key(&new).unwrap();
        let far = crate::clock::system_now() + 600_000;
        let k = key();
        let old_jwt = before.sign("ev", "u", true, k, far - 1000, far);
        let new_jwt = both.sign("ev", "u", true, k, far - 1000, far);
        assert_eq!(both.kid(), after.kid());
        assert_eq!(both.kids(), vec![before.kid(), after.kid()]);
        let jwks: Vec<String> = both.jwks().keys.into_iter().map(|k| k.kid).collect();
        assert_eq!(
            jwks,
            vec![after.kid().to_string(), before.kid().to_string()]
        );
        assert!(both.verify(&old_jwt).is_ok());
        assert!(both.verify(&new_jwt).is_ok());
        assert!(after.verify(&new_jwt).is_ok());
        assert!(
            after.verify(&old_jwt).is_err(),
            "a removed key's tokens are refused"
        );
        assert!(before.verify(&new_jwt).is_err());
        // Waiting tokens: issued under the newest, parsed under any configured key.
        let old_wait = before.waiting_tokens().issue("ev", k);
        let new_wait = both.waiting_tokens().issue("ev", k);
        assert_eq!(new_wait, after.waiting_tokens().issue("ev", k));
        assert!(both.waiting_tokens().parse(&old_wait).is_ok());
        assert!(after.waiting_tokens().parse(&old_wait).is_err());
        assert!(before.waiting_tokens().parse(&new_wait).is_err());
        // The order decides, not age: the first phase of a rolling rotation lists the new
        // key first, so every node verifies it before any signs with it.
        let staged = AccessTokens::from_signing_keys(&[new.clone(), old.clone()]).unwrap();
        assert_eq!(staged.kid(), before.kid());
        assert!(staged.verify(&new_jwt).is_ok());
        assert!(before
            .verify(&staged.sign("ev", "u", true, k, far - 1000, far))
            .is_ok());
        assert!(AccessTokens::from_signing_keys(&[old.clone(), old]).is_err());
        assert!(AccessTokens::from_signing_keys(&[]).is_err());
    }

    /// The store's record of keys: adding a key or dropping one of several is a rotation;
    /// replacing every key while places exist is refused (unless repairing).
    #[test]
    fn the_key_record_allows_rotation_but_not_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).unwrap();
        let write = |name: &str, seed: u8| {
            let pem = SigningKey::from_bytes(&[seed; 32])
                .to_pkcs8_pem(Default::default())
                .unwrap();
            let p = keys.join(name);
            std::fs::write(&p, pem.as_bytes()).unwrap();
            p
        };
        let a = write("a.pem", 1);
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        assert_eq!(
            load_key_for_store(std::slice::from_ref(&a), &data, 0, false)
                .unwrap()
                .len(),
            1
        );
        let b = write("b.pem", 2);
        let both = load_key_for_store(std::slice::from_ref(&keys), &data, 5, false).unwrap();
        assert_eq!(
            both.iter().map(key_fingerprint).collect::<Vec<_>>(),
            vec![
                key_fingerprint(&SigningKey::from_bytes(&[1; 32])),
                key_fingerprint(&SigningKey::from_bytes(&[2; 32])),
            ]
        );
        // Files keep the order they are given in (a directory's files go in name order).
        let fps = |keys: Vec<SigningKey>| keys.iter().map(key_fingerprint).collect::<Vec<_>>();
        let reversed = load_signing_keys(&[b.clone(), a.clone()]).unwrap();
        assert_eq!(
            fps(reversed),
            vec![fps(both.clone())[1].clone(), fps(both)[0].clone()]
        );
        load_key_for_store(std::slice::from_ref(&b), &data, 5, false).unwrap();
        let c = write("c.pem", 3);
        let err = load_key_for_store(std::slice::from_ref(&c), &data, 5, false).unwrap_err();
        assert!(err.to_string().contains("fingerprint"), "{err}");
        load_key_for_store(&[c], &data, 5, true).unwrap();
        assert!(load_key_for_store(&[a.clone(), a], &data, 0, false).is_err());
    }
}
