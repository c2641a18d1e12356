//! The layer in front of a small axum site, with the JWKS served over real HTTP by a second
//! small server whose keys a test can change and whose fetches it counts. Each attack is a
//! token a real attacker could send; each must be refused with waitroom's JSON error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::{Extension, Router};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use ed25519_dalek::SigningKey;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tower::ServiceExt as _;
use waitroom_guard::{AccessClaims, GuardLayer, Refresh, Verifier};

/// A waitroom stand-in: serves the JWKS of the keys it holds and counts the fetches.
#[derive(Clone, Default)]
struct Keys {
    keys: Arc<Mutex<Vec<(String, SigningKey)>>>,
    fetches: Arc<AtomicU64>,
    /// When set, the JWKS answers 500 (waitroom down or failing).
    failing: Arc<std::sync::atomic::AtomicBool>,
    /// Milliseconds the JWKS takes to answer (waitroom slow).
    delay_ms: Arc<AtomicU64>,
}

impl Keys {
    fn add(&self, kid: &str, seed: u8) -> SigningKey {
        let k = SigningKey::from_bytes(&[seed; 32]);
        self.keys.lock().unwrap().push((kid.into(), k.clone()));
        k
    }

    fn jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .keys
            .lock()
            .unwrap()
            .iter()
            .map(|(kid, k)| {
                json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": kid,
                       "x": B64.encode(k.verifying_key().to_bytes())})
            })
            .collect();
        json!({ "keys": keys })
    }

    /// Serves `/.well-known/jwks.json` on a free port; answers the URL.
    async fn serve(&self) -> String {
        let me = self.clone();
        let app = Router::new().route(
            "/.well-known/jwks.json",
            get(move || {
                let me = me.clone();
                async move {
                    me.fetches.fetch_add(1, Ordering::SeqCst);
                    let delay = me.delay_ms.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    if me.failing.load(Ordering::SeqCst) {
                        return Err(StatusCode::INTERNAL_SERVER_ERROR);
                    }
                    Ok(axum::Json(me.jwks()))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/.well-known/jwks.json")
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(event: &str, exp: u64) -> Value {
    json!({"iss": "waitroom", "aud": event, "sub": "u-1", "sid": "s-1", "iat": now(),
           "exp": exp, "jti": "j-1"})
}

fn sign_with(key: &SigningKey, kid: &str, claims: &Value) -> String {
    let pem = key.to_pkcs8_pem(Default::default()).unwrap();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(
        &header,
        claims,
        &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// The protected site: answers the claims it was handed, through the extractor and the
/// request extension alike.
fn site(verifier: Verifier) -> Router {
    Router::new()
        .route(
            "/book",
            get(
                |claims: AccessClaims, Extension(ext): Extension<AccessClaims>| async move {
                    assert_eq!(claims, ext);
                    format!("{} {}", claims.event_id(), claims.user_id())
                },
            ),
        )
        .layer(GuardLayer::new(verifier).event("concert"))
        .route("/open", get(|c: AccessClaims| async move { c.sub }))
}

async fn call(app: &Router, path: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let body = axum::body::to_bytes(res.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// `n` requests with `token` at once: every one passes.
async fn all_pass(app: &Router, token: &str, n: usize) {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let (app, token) = (app.clone(), token.to_string());
            tokio::spawn(async move { call(&app, "/book", Some(&token)).await.0 })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap(), StatusCode::OK);
    }
}

/// A refusal: 401 with `ACCESS_DENIED`, whose message names `what`.
fn assert_denied((status, body): (StatusCode, String), what: &str) {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "ACCESS_DENIED", "{body}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(what), "`{msg}` should name {what}");
}

async fn setup() -> (Keys, SigningKey, Router, Verifier) {
    let keys = Keys::default();
    let good = keys.add("k1", 1);
    let url = keys.serve().await;
    let verifier = Verifier::from_url(url.parse().unwrap());
    (keys, good, site(verifier.clone()), verifier)
}

#[tokio::test]
async fn a_valid_token_reaches_the_handler_with_its_claims() {
    let (keys, good, app, _) = setup().await;
    let token = sign_with(&good, "k1", &claims("concert", now() + 600));
    assert_eq!(
        call(&app, "/book", Some(&token)).await,
        (StatusCode::OK, "concert u-1".into())
    );
    // The keys are cached: a second request fetches nothing.
    call(&app, "/book", Some(&token)).await;
    assert_eq!(keys.fetches.load(Ordering::SeqCst), 1);
    // A route outside the layer that asks for the claims fails closed.
    assert_denied(call(&app, "/open", Some(&token)).await, "required");
}

#[tokio::test]
async fn forged_and_tampered_tokens_are_refused() {
    let (_keys, _good, app, _) = setup().await;
    // Signed by another key under the real key's id.
    let forger = SigningKey::from_bytes(&[9; 32]);
    let forged = sign_with(&forger, "k1", &claims("concert", now() + 600));
    assert_denied(call(&app, "/book", Some(&forged)).await, "signature");
    // A real signature over other claims: the user id swapped in the payload.
    let real = sign_with(
        &SigningKey::from_bytes(&[1; 32]),
        "k1",
        &claims("concert", now() + 600),
    );
    let parts: Vec<&str> = real.split('.').collect();
    let mut c = claims("concert", now() + 600);
    c["sub"] = json!("admin");
    let swapped = format!("{}.{}.{}", parts[0], B64.encode(c.to_string()), parts[2]);
    assert_denied(call(&app, "/book", Some(&swapped)).await, "signature");
    for junk in ["", "x", "a.b.c", &"A".repeat(10_000)] {
        let (status, _) = call(&app, "/book", Some(junk)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{junk:.20}");
    }
    assert_denied(call(&app, "/book", None).await, "required");
}

#[tokio::test]
async fn wrong_event_wrong_issuer_and_expired_tokens_are_refused() {
    let (_keys, good, app, _) = setup().await;
    let other = sign_with(&good, "k1", &claims("other-event", now() + 600));
    assert_denied(call(&app, "/book", Some(&other)).await, "another event");
    let expired = sign_with(&good, "k1", &claims("concert", now() - 1));
    assert_denied(call(&app, "/book", Some(&expired)).await, "expired");
    // From `exp` itself on, not from the second after it.
    let ending = sign_with(&good, "k1", &claims("concert", now()));
    assert_denied(call(&app, "/book", Some(&ending)).await, "expired");
    let mut c = claims("concert", now() + 600);
    c["iss"] = json!("someone-else");
    let foreign = sign_with(&good, "k1", &c);
    assert_denied(
        call(&app, "/book", Some(&foreign)).await,
        "not issued by waitroom",
    );
    // Without `sub` (or any claim waitroom always writes) the token is not one of ours.
    let mut c = claims("concert", now() + 600);
    c.as_object_mut().unwrap().remove("sub");
    let bare = sign_with(&good, "k1", &c);
    assert_denied(call(&app, "/book", Some(&bare)).await, "malformed");
}

#[tokio::test]
async fn alg_none_and_hs256_with_the_public_key_are_refused() {
    let (_keys, good, app, _) = setup().await;
    let body = B64.encode(claims("concert", now() + 600).to_string());
    for header in [
        json!({"alg": "none", "kid": "k1", "typ": "JWT"}),
        json!({"alg": "None", "kid": "k1"}),
    ] {
        let t = format!("{}.{body}.", B64.encode(header.to_string()));
        assert_denied(call(&app, "/book", Some(&t)).await, "malformed");
    }
    // HS256 keyed with the public key (raw bytes, and as the JWKS shows it): the attacker
    // knows it, so a verifier that let the header pick the algorithm would accept this.
    let public = good.verifying_key().to_bytes();
    for secret in [public.to_vec(), B64.encode(public).into_bytes()] {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let t = jsonwebtoken::encode(
            &header,
            &claims("concert", now() + 600),
            &EncodingKey::from_secret(&secret),
        )
        .unwrap();
        assert_denied(call(&app, "/book", Some(&t)).await, "EdDSA");
    }
}

/// A site whose verifier fetches at most once per `min_interval`, from a JWKS of one key
/// (`k1`), after one token of that key (answered too) went through: one fetch so far.
async fn one_key_verified(min_interval: Duration) -> (Keys, Router, Verifier, String) {
    let keys = Keys::default();
    keys.add("k1", 1);
    let url = keys.serve().await;
    let verifier = Verifier::from_url(url.parse().unwrap()).with_refresh(Refresh {
        max_age: Duration::from_secs(300),
        min_interval,
    });
    let app = site(verifier.clone());
    let first = sign_with(
        &SigningKey::from_bytes(&[1; 32]),
        "k1",
        &claims("concert", now() + 600),
    );
    assert_eq!(call(&app, "/book", Some(&first)).await.0, StatusCode::OK);
    (keys, app, verifier, first)
}

#[tokio::test]
async fn an_unknown_kid_refreshes_the_keys_once_per_interval() {
    let (keys, app, verifier, first) = one_key_verified(Duration::from_millis(500)).await;
    assert_eq!(keys.fetches.load(Ordering::SeqCst), 1);

    // A flood of made-up key ids, all at once: refused, and at most one more fetch.
    let mut flood = Vec::new();
    for i in 0..200u32 {
        let t = sign_with(
            &SigningKey::from_bytes(&[2; 32]),
            &format!("bogus-{i}"),
            &claims("concert", now() + 600),
        );
        let app = app.clone();
        flood.push(tokio::spawn(
            async move { call(&app, "/book", Some(&t)).await },
        ));
    }
    for f in flood {
        assert_denied(f.await.unwrap(), "unknown signing key");
    }
    let after_flood = keys.fetches.load(Ordering::SeqCst);
    assert!(after_flood <= 2, "{after_flood} fetches for one flood");

    // waitroom rotates a key in: a token under it verifies once the interval allows a
    // refresh, without a restart of the site.
    let next = keys.add("k2", 2);
    let rotated = sign_with(&next, "k2", &claims("concert", now() + 600));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(call(&app, "/book", Some(&rotated)).await.0, StatusCode::OK);
    assert_eq!(keys.fetches.load(Ordering::SeqCst), after_flood + 1);
    assert_eq!(verifier.fetches(), after_flood + 1);
    // And the old key's tokens still verify from the same cache.
    assert_eq!(call(&app, "/book", Some(&first)).await.0, StatusCode::OK);

    // A key removed from the JWKS: its tokens are refused after the next refresh.
    keys.keys.lock().unwrap().retain(|(kid, _)| kid != "k1");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let bogus = sign_with(
        &SigningKey::from_bytes(&[2; 32]),
        "k3",
        &claims("concert", now() + 600),
    );
    assert_denied(call(&app, "/book", Some(&bogus)).await, "unknown");
    assert_denied(call(&app, "/book", Some(&first)).await, "unknown");
}

/// waitroom restarted with a new signing key just after the guard fetched the JWKS (which
/// listed only the old one): the first tokens naming the new key wait for the next fetch
/// the interval allows (default 1 s) and are accepted, all of them served by that one fetch.
#[tokio::test]
async fn a_rotated_in_key_verifies_right_after_a_fetch_without_it() {
    let (keys, good, app, verifier) = setup().await;
    let old = sign_with(&good, "k1", &claims("concert", now() + 600));
    assert_eq!(call(&app, "/book", Some(&old)).await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let next = keys.add("k2", 2);
    let rotated = sign_with(&next, "k2", &claims("concert", now() + 600));
    let started = std::time::Instant::now();
    all_pass(&app, &rotated, 50).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(keys.fetches.load(Ordering::SeqCst), 2);
    assert_eq!(verifier.fetches(), 2);
    assert_eq!(
        call(&app, "/book", Some(&rotated)).await,
        (StatusCode::OK, "concert u-1".into())
    );
}

/// The guard's fetch failed (waitroom restarting with its new key, the JWKS answering
/// 500); a moment later waitroom is back and signs with the new key: its tokens are
/// accepted, the failed attempt holding the next fetch back by at most the interval.
#[tokio::test]
async fn a_rotated_in_key_verifies_right_after_a_failed_fetch() {
    let (keys, good, app, _) = setup().await;
    let old = sign_with(&good, "k1", &claims("concert", now() + 600));
    assert_eq!(call(&app, "/book", Some(&old)).await.0, StatusCode::OK);
    // Past the interval, waitroom goes down and a token the cache lacks makes a fetch.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    keys.failing.store(true, Ordering::SeqCst);
    let made_up = sign_with(
        &SigningKey::from_bytes(&[3; 32]),
        "made-up",
        &claims("concert", now() + 600),
    );
    assert_denied(
        call(&app, "/book", Some(&made_up)).await,
        "unknown signing key",
    );
    assert_eq!(keys.fetches.load(Ordering::SeqCst), 2, "the failed fetch");
    // The cached key still verifies meanwhile.
    assert_eq!(call(&app, "/book", Some(&old)).await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(200)).await;
    keys.failing.store(false, Ordering::SeqCst);
    let next = keys.add("k2", 2);
    let rotated = sign_with(&next, "k2", &claims("concert", now() + 600));
    let started = std::time::Instant::now();
    assert_eq!(call(&app, "/book", Some(&rotated)).await.0, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(keys.fetches.load(Ordering::SeqCst), 3);

    // The same from a cold start: the first fetch failed and nothing is cached.
    keys.failing.store(true, Ordering::SeqCst);
    let cold = Verifier::from_url(keys.serve().await.parse().unwrap());
    let cold_app = site(cold.clone());
    let (status, body) = call(&cold_app, "/book", Some(&rotated)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    keys.failing.store(false, Ordering::SeqCst);
    assert_eq!(
        call(&cold_app, "/book", Some(&rotated)).await.0,
        StatusCode::OK
    );
    assert_eq!(cold.fetches(), 2);
}

/// Made-up key ids sent without pause, many at a time, with the default settings: each
/// waits for the next fetch the interval allows and is refused after it, and there is
/// at most one fetch per interval however many wait.
#[tokio::test]
async fn made_up_kids_cost_one_fetch_per_interval_however_many_wait() {
    let (keys, good, app, verifier) = setup().await;
    let old = sign_with(&good, "k1", &claims("concert", now() + 600));
    // Taken before the first fetch, so the count it allows below is never too small.
    let started = std::time::Instant::now();
    assert_eq!(call(&app, "/book", Some(&old)).await.0, StatusCode::OK);
    let forger = SigningKey::from_bytes(&[4; 32]);
    let mut flood = Vec::new();
    for wave in 0..25u32 {
        for i in 0..20u32 {
            let t = sign_with(
                &forger,
                &format!("made-up-{wave}-{i}"),
                &claims("concert", now() + 600),
            );
            let app = app.clone();
            flood.push(tokio::spawn(async move {
                let sent = std::time::Instant::now();
                let answer = call(&app, "/book", Some(&t)).await;
                (answer, sent.elapsed())
            }));
        }
        if wave == 12 {
            // A real token meanwhile: its key is cached, it waits for nothing.
            let sent = std::time::Instant::now();
            assert_eq!(call(&app, "/book", Some(&old)).await.0, StatusCode::OK);
            assert!(
                sent.elapsed() < Duration::from_millis(500),
                "{:?}",
                sent.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for f in flood {
        let (answer, took) = f.await.unwrap();
        assert_denied(answer, "unknown signing key");
        // The rest of the interval (1 s) and one quick fetch.
        assert!(took < Duration::from_millis(2500), "{took:?}");
    }
    // Sent over 2.5 s: fetches 1, 2 and 3 s after the first one, and never two within 1 s.
    let extra = keys.fetches.load(Ordering::SeqCst) - 1;
    let allowed = started.elapsed().as_secs();
    assert!((1..=allowed).contains(&extra), "{extra} fetches");
    assert_eq!(verifier.fetches(), extra + 1);
}

#[tokio::test]
async fn no_reachable_jwks_fails_closed() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let verifier = Verifier::from_url(format!("http://{addr}/jwks").parse().unwrap());
    let app = site(verifier);
    let t = sign_with(
        &SigningKey::from_bytes(&[1; 32]),
        "k1",
        &claims("concert", now() + 600),
    );
    let (status, body) = call(&app, "/book", Some(&t)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("\"UNAVAILABLE\""), "{body}");
}

#[tokio::test]
async fn stale_keys_keep_verifying_while_the_jwks_fails() {
    let keys = Keys::default();
    let good = keys.add("k1", 1);
    let url = keys.serve().await;
    let verifier = Verifier::from_url(url.parse().unwrap()).with_refresh(Refresh {
        max_age: Duration::from_millis(200),
        min_interval: Duration::from_millis(0),
    });
    let app = site(verifier);
    let token = sign_with(&good, "k1", &claims("concert", now() + 600));
    assert_eq!(call(&app, "/book", Some(&token)).await.0, StatusCode::OK);
    keys.failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The keys are stale and the refresh fails: the cached key still verifies.
    assert_eq!(call(&app, "/book", Some(&token)).await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        keys.fetches.load(Ordering::SeqCst),
        2,
        "a refresh was tried"
    );
    // A hanging waitroom does not hold a request whose key is cached: it is answered at
    // once while the refresh waits.
    keys.failing.store(false, Ordering::SeqCst);
    keys.delay_ms.store(3_000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    assert_eq!(call(&app, "/book", Some(&token)).await.0, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Nor the requests that come while that refresh hangs.
    let started = std::time::Instant::now();
    all_pass(&app, &token, 20).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_query_parameter_is_read_only_when_configured() {
    let (_keys, good, _app, verifier) = setup().await;
    let token = sign_with(&good, "k1", &claims("concert", now() + 600));
    let handler = get(|c: AccessClaims| async move { c.sub });
    let plain = Router::new()
        .route("/book", handler.clone())
        .layer(GuardLayer::new(verifier.clone()).event("concert"));
    let with_query = Router::new().route("/book", handler).layer(
        GuardLayer::new(verifier)
            .event("concert")
            .query_param("waitroom_token"),
    );
    let uri = format!("/book?x=1&waitroom_token={token}");
    assert_denied(call(&plain, &uri, None).await, "required");
    assert_eq!(
        call(&with_query, &uri, None).await,
        (StatusCode::OK, "u-1".into())
    );
    // The header wins over the query: a bad header is not rescued by a good query token.
    assert_denied(call(&with_query, &uri, Some("junk")).await, "malformed");
}

/// A site whose JWKS answers in 300 ms, with a token of its key.
async fn slow_jwks() -> (Keys, Router, String) {
    let keys = Keys::default();
    let good = keys.add("k1", 1);
    keys.delay_ms.store(300, Ordering::SeqCst);
    let url = keys.serve().await;
    let app = site(Verifier::from_url(url.parse().unwrap()));
    let token = sign_with(&good, "k1", &claims("concert", now() + 600));
    (keys, app, token)
}

/// Requests that arrive while the keys are being fetched (a cold start, a slow waitroom)
/// wait for that fetch instead of answering from the empty cache.
#[tokio::test]
async fn requests_during_a_fetch_wait_for_it() {
    let (keys, app, token) = slow_jwks().await;
    all_pass(&app, &token, 50).await;
    assert_eq!(keys.fetches.load(Ordering::SeqCst), 1);
}

/// A request given up while its fetch is under way (the client gone) does not cancel the
/// fetch: the next request finds the keys, rather than waiting out the interval.
#[tokio::test]
async fn a_fetch_outlives_the_request_that_started_it() {
    let (keys, app, token) = slow_jwks().await;
    let gone = tokio::time::timeout(Duration::from_millis(50), call(&app, "/book", Some(&token)));
    assert!(gone.await.is_err(), "the first request is given up");
    tokio::time::sleep(Duration::from_millis(500)).await;
    keys.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(call(&app, "/book", Some(&token)).await.0, StatusCode::OK);
    assert_eq!(
        keys.fetches.load(Ordering::SeqCst),
        1,
        "the first fetch counted"
    );
}

/// Another scheme in `Authorization` (a staging site's Basic) does not hide the token:
/// a Bearer line after it is read, and without one the query parameter is.
#[tokio::test]
async fn another_authorization_scheme_does_not_hide_the_token() {
    let (_keys, good, _app, verifier) = setup().await;
    let token = sign_with(&good, "k1", &claims("concert", now() + 600));
    let app = Router::new()
        .route("/book", get(|c: AccessClaims| async move { c.sub }))
        .layer(
            GuardLayer::new(verifier)
                .event("concert")
                .query_param("waitroom_token"),
        );
    let send = |uri: String, auth: Vec<String>| {
        let app = app.clone();
        async move {
            let mut req = Request::get(uri);
            for a in auth {
                req = req.header("authorization", a);
            }
            app.oneshot(req.body(Body::empty()).unwrap())
                .await
                .unwrap()
                .status()
        }
    };
    let basic = "Basic dXNlcjpwYXNz".to_string();
    assert_eq!(
        send(format!("/book?waitroom_token={token}"), vec![basic.clone()]).await,
        StatusCode::OK
    );
    assert_eq!(
        send("/book".into(), vec![basic, format!("Bearer {token}")]).await,
        StatusCode::OK
    );
}

/// Requests that wake together for a slow JWKS (a fetch longer than the interval) share
/// its answer: each had spawned a fetch of its own, run one after the other as each found
/// the interval passed again (8 requests: 8 fetches, the last answered after 13 s).
#[tokio::test]
async fn requests_waiting_on_a_slow_jwks_share_one_fetch() {
    let (keys, good, app, verifier) = setup().await;
    let old = sign_with(&good, "k1", &claims("concert", now() + 600));
    assert_eq!(call(&app, "/book", Some(&old)).await.0, StatusCode::OK);
    let before = verifier.fetches();
    keys.delay_ms.store(1500, Ordering::SeqCst);
    let next = keys.add("k2", 2);
    let rotated = sign_with(&next, "k2", &claims("concert", now() + 600));
    let all: Vec<_> = (0..8)
        .map(|_| {
            let (app, t) = (app.clone(), rotated.clone());
            tokio::spawn(async move { call(&app, "/book", Some(&t)).await.0 })
        })
        .collect();
    for f in all {
        assert_eq!(f.await.unwrap(), StatusCode::OK);
    }
    // One fetch for the rotated-in key; a second at most, begun by a request that found
    // the interval passed before the first had started.
    let fetched = verifier.fetches() - before;
    assert!((1..=2).contains(&fetched), "{fetched} fetches");
}

/// With a long interval configured, a token whose `kid` the cache lacks, when the next
/// fetch is more than a second off, is refused at once and fetches nothing: no request
/// holds its connection for the interval (10 s here), and a flood of made-up `kid`s holds
/// none.
#[tokio::test]
async fn an_unknown_kid_waits_no_longer_than_a_second() {
    let (keys, app, _, _) = one_key_verified(Duration::from_secs(10)).await;
    let fetched = keys.fetches.load(Ordering::SeqCst);
    let made_up = sign_with(
        &SigningKey::from_bytes(&[2; 32]),
        "made-up",
        &claims("concert", now() + 600),
    );
    let asked = std::time::Instant::now();
    assert_denied(
        call(&app, "/book", Some(&made_up)).await,
        "unknown signing key",
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(keys.fetches.load(Ordering::SeqCst), fetched, "no fetch");
}

/// A layer that was not told which event's tokens it takes is never built (defect: it took
/// any event's token, so a token of a quiet event with no line, handed out at once, passed
/// a busy event's site).
#[tokio::test]
#[should_panic(expected = "needs the event whose tokens it takes")]
async fn a_layer_without_its_event_is_not_built() {
    let (_keys, _good, _app, verifier) = setup().await;
    let _ = Router::<()>::new()
        .route("/book", get(|| async { "booked" }))
        .layer(GuardLayer::new(verifier));
}

/// Another event's token is refused by a layer for one event, and taken only by a layer
/// told explicitly to take any event's (whose handler reads the event from the claims).
#[tokio::test]
async fn another_events_token_passes_only_a_layer_for_any_event() {
    let (_keys, good, app, verifier) = setup().await;
    let other = sign_with(&good, "k1", &claims("free-webinar", now() + 600));
    assert_denied(call(&app, "/book", Some(&other)).await, "event");
    let any = Router::new()
        .route(
            "/book",
            get(|c: AccessClaims| async move { c.event_id().to_string() }),
        )
        .layer(GuardLayer::new(verifier).any_event());
    assert_eq!(
        call(&any, "/book", Some(&other)).await,
        (StatusCode::OK, "free-webinar".into())
    );
}
