//! User tokens: what a booking site signs to say who joins (`user_token` of a join), checked
//! against the keys the event trusts.

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::core::Millis;

/// Why a site-signed user token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UserTokenError {
    /// Garbled, badly signed, signed with a key the event does not trust, for another
    /// event, or without `sub`/`aud`/`exp`. The text says which, for the integrator.
    #[error("{0}")]
    Invalid(&'static str),
    #[error("expired")]
    Expired,
}

/// Tolerated clock difference between the booking site that signs user tokens and us.
pub const USER_TOKEN_LEEWAY_MS: Millis = 30_000;
/// Longest accepted user token; real ones are a few hundred bytes.
const MAX_USER_TOKEN_LEN: usize = 4096;

/// `exp` and `nbf` are NumericDates: seconds, which RFC 7519 allows to be fractional (the
/// library's own reading wants whole ones, so they are read and checked here).
#[derive(Deserialize)]
struct UserClaims {
    sub: String,
    #[serde(default)]
    exp: Option<f64>,
    /// Not before (seconds), when the site sets it.
    #[serde(default)]
    nbf: Option<f64>,
}

/// Checks a user token signed by a booking site: HS256 with `secret` or EdDSA with the
/// Ed25519 `public_key_pem` (whichever the token's header names, if the event trusts that
/// kind of key), `aud` = `event_id`, `exp` not passed at `now` (our clock, not the system's,
/// with [`USER_TOKEN_LEEWAY_MS`]). Answers the `sub`: the user id.
pub fn verify_user_token(
    token: &str,
    event_id: &str,
    secret: Option<&str>,
    public_key_pem: Option<&str>,
    now: Millis,
) -> Result<String, UserTokenError> {
    use jsonwebtoken::errors::ErrorKind;
    use UserTokenError::Invalid;
    if token.len() > MAX_USER_TOKEN_LEN {
        return Err(Invalid("too long"));
    }
    let header = jsonwebtoken::decode_header(token).map_err(|_| Invalid("malformed"))?;
    // RFC 7515 4.1.11: a token whose `crit` names extensions must be refused by whoever
    // does not understand them, and we understand none. The library does not read `crit`.
    if names_critical_extensions(token) {
        return Err(Invalid(
            "crit names header extensions this server does not support",
        ));
    }
    let key = match (header.alg, secret, public_key_pem) {
        (Algorithm::HS256, Some(s), _) => DecodingKey::from_secret(s.as_bytes()),
        (Algorithm::EdDSA, _, Some(pem)) => DecodingKey::from_ed_pem(pem.trim().as_bytes())
            .map_err(|_| Invalid("the event's public key is unusable"))?,
        _ => return Err(Invalid("not signed with a key this event trusts")),
    };
    let mut v = Validation::new(header.alg);
    v.set_audience(&[event_id]);
    // Expiry is checked below against our clock.
    v.validate_exp = false;
    v.set_required_spec_claims(&["sub", "aud"]);
    let claims = jsonwebtoken::decode::<UserClaims>(token, &key, &v)
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => Invalid("bad signature"),
            ErrorKind::InvalidAudience => Invalid("issued for another event (aud)"),
            ErrorKind::MissingRequiredClaim(_) => Invalid("sub, aud and exp are required"),
            _ => Invalid("malformed"),
        })?
        .claims;
    let (now, leeway) = (now as f64, USER_TOKEN_LEEWAY_MS as f64);
    let exp = claims.exp.ok_or(Invalid("sub, aud and exp are required"))?;
    if exp * 1000.0 + leeway <= now {
        return Err(UserTokenError::Expired);
    }
    // Like `exp`, on our clock and with the same leeway for clocks that disagree.
    if claims.nbf.is_some_and(|nbf| nbf * 1000.0 > now + leeway) {
        return Err(Invalid("not valid yet (nbf)"));
    }
    if claims.sub.is_empty() {
        return Err(Invalid("sub is empty"));
    }
    Ok(claims.sub)
}

/// Whether the token's header has a `crit` member (RFC 7515 4.1.11).
fn names_critical_extensions(token: &str) -> bool {
    use base64::Engine as _;
    let head = token.split('.').next().unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b).ok())
        .is_some_and(|h| h.contains_key("crit"))
}
