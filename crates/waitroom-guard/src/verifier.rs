//! The verifier: waitroom's public keys, fetched from its JWKS and cached, and the checks of
//! one access token against them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};

/// The issuer waitroom writes into every access token.
pub const ISSUER: &str = "waitroom";
/// Longest token looked at; real ones are a few hundred bytes.
const MAX_TOKEN_LEN: usize = 4096;
/// Largest JWKS document read; a real one holds a handful of 150-byte keys.
const MAX_JWKS_BYTES: usize = 64 * 1024;
/// Longest a request whose `kid` the cache lacks waits for the next fetch the interval
/// allows; past it, it is refused at once.
const MAX_KEY_WAIT: Duration = Duration::from_secs(1);

/// The claims of a waitroom access token (docs/API.md "Access token").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessClaims {
    /// Always `waitroom`.
    pub iss: String,
    /// The event id.
    pub aud: String,
    /// The user id (or the place id of an anonymous place).
    pub sub: String,
    /// The session id: what `session/heartbeat` and `session/complete` end.
    pub sid: String,
    pub iat: u64,
    /// Seconds since the epoch after which the session is over.
    pub exp: u64,
    pub jti: String,
    /// `sub` is a user id the join proved (a user token or the site's server key); `false`
    /// for a bare user id, which anyone knowing it may have sent, and for anonymous places.
    /// Take `sub` as your signed-in user only when this is `true`.
    #[serde(default)]
    pub user_verified: bool,
}

impl AccessClaims {
    pub fn event_id(&self) -> &str {
        &self.aud
    }

    pub fn user_id(&self) -> &str {
        &self.sub
    }
}

/// Why a token was refused. The text is safe to show the client: it names the check that
/// failed, never key material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` token (nor the configured query parameter).
    Missing,
    /// Not a JWT, too long, or without the claims waitroom always writes.
    Malformed,
    /// Signed with another algorithm than EdDSA (`none`, or HS256 with the public key as a
    /// secret: the classic confusion attacks).
    Algorithm,
    /// The `kid` names no key of the JWKS, even after a fetch made since the request came.
    UnknownKey,
    /// The signature does not verify with the key its `kid` names.
    BadSignature,
    /// Issued by someone other than waitroom.
    WrongIssuer,
    /// Issued for another event.
    WrongEvent,
    /// Past its `exp`: the session is over.
    Expired,
    /// The JWKS could not be fetched and no key is cached: fail closed.
    KeysUnavailable,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "an access token is required (Authorization: Bearer)",
            Refusal::Malformed => "the access token is malformed",
            Refusal::Algorithm => "the access token is not signed with EdDSA",
            Refusal::UnknownKey => "the access token names an unknown signing key",
            Refusal::BadSignature => "the access token's signature is invalid",
            Refusal::WrongIssuer => "the access token was not issued by waitroom",
            Refusal::WrongEvent => "the access token is for another event",
            Refusal::Expired => "the access token has expired",
            Refusal::KeysUnavailable => "the waiting room's signing keys cannot be fetched",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Refusal {}

/// Where the JWKS document comes from.
pub trait JwksSource: Send + Sync + 'static {
    /// The JWKS document's bytes.
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send + '_>>;
}

/// The JWKS over plain HTTP (waitroom on loopback or a private network; for `https`,
/// implement [`JwksSource`] with the site's own TLS client).
pub struct HttpJwks {
    client: Client<HttpConnector, Empty<Bytes>>,
    url: http::Uri,
    timeout: Duration,
}

impl HttpJwks {
    pub fn new(url: http::Uri) -> Self {
        HttpJwks {
            client: Client::builder(TokioExecutor::new()).build_http(),
            url,
            timeout: Duration::from_secs(5),
        }
    }
}

impl JwksSource for HttpJwks {
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send + '_>> {
        Box::pin(async move {
            let get = async {
                let res = self
                    .client
                    .get(self.url.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                if !res.status().is_success() {
                    return Err(format!("the JWKS answered {}", res.status()));
                }
                let body = Limited::new(res.into_body(), MAX_JWKS_BYTES)
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(body.to_bytes())
            };
            tokio::time::timeout(self.timeout, get)
                .await
                .map_err(|_| "the JWKS did not answer in time".to_string())?
        })
    }
}

/// A JWKS source that is a function: for a process that has the keys at hand (waitroom's
/// own demo site), and for tests.
pub struct FnJwks<F>(pub F);

impl<F: Fn() -> Bytes + Send + Sync + 'static> JwksSource for FnJwks<F> {
    fn fetch(&self) -> Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send + '_>> {
        let bytes = (self.0)();
        Box::pin(async move { Ok(bytes) })
    }
}

/// How the verifier keeps the keys fresh.
#[derive(Debug, Clone)]
pub struct Refresh {
    /// Keys older than this are fetched again on the next request (a failure keeps the old
    /// ones).
    pub max_age: Duration,
    /// At most one fetch per this long, failed or not: a flood of tokens with made-up
    /// `kid`s makes one fetch per interval, not one per token. A token whose `kid` the cache
    /// lacks, coming before the interval allows the next fetch, waits for that fetch (at
    /// most a second, plus the fetch itself; refused at once when the next fetch is further
    /// off) and is checked against its answer: waitroom
    /// signs with a new key the moment it restarts with it, and the guard may have fetched,
    /// or failed to, just before.
    pub min_interval: Duration,
}

impl Default for Refresh {
    fn default() -> Self {
        Refresh {
            max_age: Duration::from_secs(300),
            // Short, since it is how long the first tokens of a rotated-in key may wait; a
            // JWKS of a few keys once a second is nothing to waitroom.
            min_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    crv: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    x: Option<String>,
}

#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, DecodingKey>,
    fetched_at: Option<Instant>,
    last_attempt: Option<Instant>,
}

struct Inner {
    source: Box<dyn JwksSource>,
    refresh: Refresh,
    leeway_sec: u64,
    keys: RwLock<Keys>,
    /// One fetch at a time; requests that waited on it look again before fetching.
    fetching: tokio::sync::Mutex<()>,
    fetches: std::sync::atomic::AtomicU64,
}

/// Checks access tokens against waitroom's keys. Cheap to clone (shared cache).
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

impl Verifier {
    /// Keys from the JWKS at `url` (e.g. `http://127.0.0.1:8080/.well-known/jwks.json`).
    pub fn from_url(url: http::Uri) -> Self {
        Self::new(HttpJwks::new(url))
    }

    pub fn new(source: impl JwksSource) -> Self {
        Verifier {
            inner: Arc::new(Inner {
                source: Box::new(source),
                refresh: Refresh::default(),
                leeway_sec: 0,
                keys: RwLock::new(Keys::default()),
                fetching: tokio::sync::Mutex::new(()),
                fetches: Default::default(),
            }),
        }
    }

    /// Changes how keys are refreshed (before first use).
    pub fn with_refresh(self, refresh: Refresh) -> Self {
        self.rebuild(|i| i.refresh = refresh)
    }

    /// Seconds of clock difference tolerated on `exp` (default 0: the session's end is the
    /// end). Only for an origin whose clock is known to lag waitroom's.
    pub fn with_leeway_sec(self, leeway: u64) -> Self {
        self.rebuild(|i| i.leeway_sec = leeway)
    }

    fn rebuild(self, f: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::try_unwrap(self.inner)
            .unwrap_or_else(|_| panic!("configure the verifier before sharing it"));
        f(&mut inner);
        Verifier {
            inner: Arc::new(inner),
        }
    }

    /// How many times the JWKS was fetched (for monitoring and tests).
    pub fn fetches(&self) -> u64 {
        self.inner
            .fetches
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Checks `token`: EdDSA signature by the JWKS key its `kid` names, issuer `waitroom`,
    /// not expired, and when `event` is given, issued for that event.
    pub async fn verify(&self, token: &str, event: Option<&str>) -> Result<AccessClaims, Refusal> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(Refusal::Malformed);
        }
        // `alg: none` and unknown algorithms fail to parse here; HS256 and the rest parse
        // and are refused by name before any key is looked at.
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Malformed)?;
        if header.alg != Algorithm::EdDSA {
            return Err(Refusal::Algorithm);
        }
        let kid = header.kid.ok_or(Refusal::Malformed)?;
        let key = self.key(&kid).await?;
        let mut v = Validation::new(Algorithm::EdDSA);
        v.set_issuer(&[ISSUER]);
        match event {
            Some(e) => v.set_audience(&[e]),
            None => v.validate_aud = false,
        }
        v.leeway = self.inner.leeway_sec;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<AccessClaims>(token, &key, &v)
            .map(|d| d.claims)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => Refusal::Expired,
                ErrorKind::InvalidAudience => Refusal::WrongEvent,
                ErrorKind::InvalidIssuer => Refusal::WrongIssuer,
                ErrorKind::InvalidSignature => Refusal::BadSignature,
                ErrorKind::InvalidAlgorithm => Refusal::Algorithm,
                _ => Refusal::Malformed,
            })?;
        // The library compares whole seconds and passes a token through its `exp` second;
        // from `exp` (plus the leeway) on it is over (RFC 7519 4.1.4).
        let end_ms = claims
            .exp
            .saturating_add(self.inner.leeway_sec)
            .saturating_mul(1000);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if end_ms <= now_ms {
            return Err(Refusal::Expired);
        }
        Ok(claims)
    }

    /// The key `kid` names: from the cache while it is fresh, else after a fetch, which an
    /// unknown `kid` also triggers (a rotated-in key) at most once per `min_interval`. A
    /// request that finds a fetch under way waits for it, whatever the interval says: its
    /// answer may hold the key (at a cold start, or just after a rotation). A request whose
    /// key the cache lacks, when the interval allows no fetch yet, waits for the next one
    /// (if it is at most [`MAX_KEY_WAIT`] off; else it is refused at once) rather than being
    /// refused: else the first tokens of a rotated-in key would be refused for up to the
    /// interval whenever the guard had fetched, or failed to, just before (waitroom signs
    /// with a new key the moment it restarts with it).
    async fn key(&self, kid: &str) -> Result<DecodingKey, Refusal> {
        // A fetch that starts from here on reads the JWKS as it is since the token was
        // signed: its answer is final. One that started before may predate a rotation.
        let came = Instant::now();
        loop {
            if let Some(k) = self.cached(kid, true) {
                return Ok(k);
            }
            let in_flight = self.inner.fetching.try_lock().is_err();
            if in_flight {
                // A key known already, only old, is answered at once: only a request whose
                // key the cache lacks waits for the fetch (a slow waitroom must not stall
                // the site).
                if let Some(k) = self.cached(kid, false) {
                    return Ok(k);
                }
                drop(self.inner.fetching.lock().await);
                if let Some(k) = self.cached(kid, true) {
                    return Ok(k);
                }
                // That fetch began after the request came: its answer is final, however
                // long it took (past the interval, another would be due).
                if self.tried_since(came) {
                    return self.stale(kid);
                }
            }
            let Some(wait) = self.until_due() else {
                break;
            };
            // Not due. A key known already, only old, is answered from the cache at once,
            // so a waitroom outage costs a map lookup per request.
            if let Some(k) = self.cached(kid, false) {
                return Ok(k);
            }
            // The cache lacks the key, and a fetch was tried since the request came: that
            // fetch's answer is final. It may still be under way (begun after the look
            // above): wait for it.
            if self.tried_since(came) {
                drop(self.inner.fetching.lock().await);
                return self.stale(kid);
            }
            // Wait for the next fetch the interval allows. Made-up `kid`s wait too, so a
            // flood of them still makes one fetch per interval, which all the requests
            // waiting then share (the next turn finds it under way, or done since they came).
            // Not past `MAX_KEY_WAIT`: with a long interval configured, a request would hold
            // its connection that long (and a flood of made-up `kid`s, that many).
            if wait > MAX_KEY_WAIT {
                return self.stale(kid);
            }
            tokio::time::sleep(wait).await;
        }
        // The fetch runs as a task of its own, holding the lock: a request given up while
        // it waits (the client gone, a timeout) does not cancel it, which had spent the
        // interval's one attempt on nothing.
        let me = self.clone();
        let asked = Instant::now();
        let fetched = tokio::spawn(async move {
            let _one = me.inner.fetching.lock().await;
            // Someone else may have fetched while this one waited for the lock: its answer
            // serves this request too, even if it took longer than the interval (else the
            // requests that woke together would each fetch in turn, one after the other).
            if me.due() && !me.tried_since(asked) {
                me.fetch().await;
            }
        });
        // A key known already, only old, is answered at once and the refresh goes on
        // behind it: a slow or hanging waitroom must not hold a request whose key is here.
        if let Some(k) = self.cached(kid, false) {
            return Ok(k);
        }
        let _ = fetched.await;
        self.stale(kid)
    }

    /// Whether the rate limit allows a fetch now.
    fn due(&self) -> bool {
        self.until_due().is_none()
    }

    /// How long until the rate limit allows a fetch; `None`: it does now.
    fn until_due(&self) -> Option<Duration> {
        let keys = self.inner.keys.read().expect("not poisoned");
        let elapsed = keys.last_attempt?.elapsed();
        let left = self.inner.refresh.min_interval.saturating_sub(elapsed);
        (!left.is_zero()).then_some(left)
    }

    /// Whether a fetch was tried (begun) at `since` or later.
    fn tried_since(&self, since: Instant) -> bool {
        let keys = self.inner.keys.read().expect("not poisoned");
        keys.last_attempt.is_some_and(|t| t >= since)
    }

    /// The key from the cache however old: when a refresh failed or was not due, waitroom
    /// being briefly unreachable must not lock everyone out.
    fn stale(&self, kid: &str) -> Result<DecodingKey, Refusal> {
        if let Some(k) = self.cached(kid, false) {
            return Ok(k);
        }
        let keys = self.inner.keys.read().expect("not poisoned");
        if keys.fetched_at.is_none() {
            Err(Refusal::KeysUnavailable)
        } else {
            Err(Refusal::UnknownKey)
        }
    }

    fn cached(&self, kid: &str, fresh_only: bool) -> Option<DecodingKey> {
        let keys = self.inner.keys.read().expect("not poisoned");
        let fresh = keys
            .fetched_at
            .is_some_and(|t| t.elapsed() < self.inner.refresh.max_age);
        if fresh_only && !fresh {
            return None;
        }
        keys.by_kid.get(kid).cloned()
    }

    async fn fetch(&self) {
        self.inner
            .fetches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = Instant::now();
        self.inner.keys.write().expect("not poisoned").last_attempt = Some(now);
        let parsed = self.inner.source.fetch().await.and_then(|b| parse_jwks(&b));
        match parsed {
            Ok(by_kid) => {
                let mut keys = self.inner.keys.write().expect("not poisoned");
                keys.by_kid = by_kid;
                keys.fetched_at = Some(now);
            }
            Err(e) => tracing::warn!(error = %e, "waitroom-guard: fetching the JWKS failed"),
        }
    }
}

/// The Ed25519 keys of a JWKS document; other kinds of key are skipped.
fn parse_jwks(bytes: &[u8]) -> Result<HashMap<String, DecodingKey>, String> {
    let set: JwkSet = serde_json::from_slice(bytes).map_err(|e| format!("bad JWKS: {e}"))?;
    let mut out = HashMap::new();
    for k in set.keys {
        if k.kty != "OKP" || k.crv != "Ed25519" {
            continue;
        }
        let (Some(kid), Some(x)) = (k.kid, k.x) else {
            continue;
        };
        let key = DecodingKey::from_ed_components(&x).map_err(|e| format!("bad key {kid}: {e}"))?;
        out.insert(kid, key);
    }
    Ok(out)
}
