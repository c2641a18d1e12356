//! Identity and invite-only events, tried as an attacker would: taking someone's place
//! with their user id, forged, expired or misdirected user tokens, bare joins where a
//! user token is required, secrets read back, one invite code used by several people.
//! Through `router(state).oneshot(…)` with the embedded store and a manual clock.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::SigningKey;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::Clock;
use waitroom::core::Millis;
use waitroom::http::router;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::AppState;

const ADMIN: &str = "test-admin-token";
const T0: Millis = 1_700_000_000_000;
const SECRET: &str = "a-booking-site-secret-of-32-bytes-or-more";

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
    body: Value,
}

impl Resp {
    #[track_caller]
    fn ok(&self) -> &Value {
        assert_eq!(self.status, StatusCode::OK, "{}", self.text);
        &self.body
    }

    #[track_caller]
    fn err(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.body["error"]["code"], code, "{}", self.text);
        assert!(self.body.get("waiting_token").is_none(), "{}", self.text);
    }
}

fn app() -> Router {
    let key = SigningKey::from_bytes(&[7; 32]);
    let state = AppState::new(
        Arc::new(EmbeddedStore::new()),
        &key,
        ADMIN,
        Clock::manual(T0),
    )
    .unwrap();
    router(state)
}

async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
    auth: Option<&str>,
) -> Resp {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = auth {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string())),
        None => b.body(Body::empty()),
    }
    .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        text,
        body,
    }
}

async fn put_event(app: &Router, id: &str, settings: Value) -> Resp {
    let r = call(
        app,
        Method::PUT,
        &format!("/api/v1/admin/events/{id}"),
        Some(settings),
        Some(ADMIN),
    )
    .await;
    r.ok();
    r
}

/// Makes one invite code for `event` through the admin API.
/// Makes `count` invites of the event at `uri` with these `Accept` lines; the answer must be
/// CSV.
async fn invites_accepting(
    app: &Router,
    uri: &str,
    accept: &[&str],
    count: u32,
) -> axum::response::Response {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(header::CONTENT_TYPE, "application/json");
    for line in accept {
        req = req.header(header::ACCEPT, *line);
    }
    let req = req
        .body(Body::from(json!({"count": count}).to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    res
}

/// `n` new codes of `event`.
async fn invites(app: &Router, event: &str, n: usize) -> Vec<String> {
    let made = call(
        app,
        Method::POST,
        &format!("/api/v1/admin/events/{event}/invites"),
        Some(json!({ "count": n })),
        Some(ADMIN),
    )
    .await;
    made.ok()["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect()
}

async fn one_invite(app: &Router, event: &str) -> String {
    invites(app, event, 1).await.remove(0)
}

async fn join(app: &Router, body: Value) -> Resp {
    call(app, Method::POST, "/api/v1/queue/join", Some(body), None).await
}

async fn status(app: &Router, token: &str) -> Resp {
    call(
        app,
        Method::GET,
        &format!("/api/v1/queue/status?token={token}"),
        None,
        None,
    )
    .await
}

/// An HS256 user token as a booking site mints it.
fn hs256(secret: &str, sub: &str, aud: &str, exp_ms: Millis) -> String {
    let claims = json!({"sub": sub, "aud": aud, "exp": exp_ms / 1000});
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

fn ed25519(key: &SigningKey, sub: &str, aud: &str, exp_ms: Millis) -> String {
    let pem = key.to_pkcs8_pem(Default::default()).unwrap();
    let claims = json!({"sub": sub, "aud": aud, "exp": exp_ms / 1000});
    jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &claims,
        &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// The hijack of the issue: whoever knows a user's id joins with it. Without proof they
/// get `409 ALREADY_JOINED` and no token, and the victim's place is untouched.
#[tokio::test]
async fn a_known_user_id_does_not_hand_over_the_place() {
    let app = app();
    put_event(&app, "show", json!({"max_active": 1})).await;
    join(&app, json!({"event_id": "show"})).await.ok();
    // Alice's place, joined for her by the site's backend with the server key.
    let by_site = || {
        call(
            &app,
            Method::POST,
            "/api/v1/queue/join",
            Some(json!({"event_id": "show", "user_id": "alice"})),
            Some(ADMIN),
        )
    };
    let victim = by_site().await;
    let token = victim.ok()["waiting_token"].as_str().unwrap().to_string();
    let attack = join(&app, json!({"event_id": "show", "user_id": "alice"})).await;
    attack.err(StatusCode::CONFLICT, "ALREADY_JOINED");
    assert!(!attack.text.contains(&token));
    let s = status(&app, &token).await;
    assert_eq!(s.ok()["position"], 1);
    // The site's backend, holding the server key, may get the place back for its user.
    let site = by_site().await;
    assert_eq!(site.ok()["waiting_token"], token.as_str());
    // A wrong server key is refused outright, not treated as "no proof"; so is one that
    // is not text (defect: `Bearer café` joined as if no key had been sent).
    for guess in ["guess", "café", "\u{fffd}"] {
        let wrong = call(
            &app,
            Method::POST,
            "/api/v1/queue/join",
            Some(json!({"event_id": "show", "user_id": "alice"})),
            Some(guess),
        )
        .await;
        wrong.err(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    }
}

/// Squatting: a bare `user_id` join takes Alice's id before she comes. When she joins with
/// a user token she must not be handed the squatter's place (whose token the squatter
/// holds and could end or enter with): that place ends and she gets her own.
#[tokio::test]
async fn a_proven_join_does_not_adopt_a_place_squatted_by_a_bare_user_id() {
    let app = app();
    put_event(&app, "show", json!({"user_token_secret": SECRET})).await;
    let squat = join(&app, json!({"event_id": "show", "user_id": "alice"})).await;
    let squat_token = squat.ok()["waiting_token"].as_str().unwrap().to_string();
    let t = hs256(SECRET, "alice", "show", T0 + 600_000);
    let mine = join(&app, json!({"event_id": "show", "user_token": t})).await;
    let my_token = mine.ok()["waiting_token"].as_str().unwrap().to_string();
    assert_ne!(
        my_token, squat_token,
        "Alice was handed the squatter's place"
    );
    // The squatter's token no longer works, and leaving with it leaves Alice's place alone.
    status(&app, &squat_token)
        .await
        .err(StatusCode::NOT_FOUND, "TOKEN_NOT_FOUND");
    let left = call(
        &app,
        Method::POST,
        "/api/v1/queue/leave",
        Some(json!({"token": squat_token})),
        None,
    )
    .await;
    assert_eq!(left.status, StatusCode::OK, "{}", left.text);
    status(&app, &my_token).await.ok();
    // Alice's place is proven now: she gets it back, the squatter gets nothing.
    let again = join(&app, json!({"event_id": "show", "user_token": t})).await;
    assert_eq!(again.ok()["waiting_token"], my_token.as_str());
    join(&app, json!({"event_id": "show", "user_id": "alice"}))
        .await
        .err(StatusCode::CONFLICT, "ALREADY_JOINED");
}

/// A signed user gets its own place back; forged, expired, misdirected, garbled and
/// foreign-key tokens are refused with 401 and a code saying which.
#[tokio::test]
async fn user_tokens_prove_the_user_and_nothing_else_does() {
    let app = app();
    let site_key = SigningKey::from_bytes(&[9; 32]);
    let public = site_key
        .verifying_key()
        .to_public_key_pem(Default::default())
        .unwrap();
    put_event(
        &app,
        "show",
        json!({"user_token_secret": SECRET, "user_token_public_key": public}),
    )
    .await;
    let later = T0 + 600_000;
    let t = hs256(SECRET, "alice", "show", later);
    let first = join(&app, json!({"event_id": "show", "user_token": t})).await;
    let token = first.ok()["waiting_token"].clone();
    // The same signed user gets the same place (and token) back, also with an Ed25519 token.
    let again = join(
        &app,
        json!({"event_id": "show", "user_token": t, "user_id": "alice"}),
    )
    .await;
    assert_eq!(again.ok()["waiting_token"], token);
    let ed = ed25519(&site_key, "alice", "show", later);
    let third = join(&app, json!({"event_id": "show", "user_token": ed})).await;
    assert_eq!(third.ok()["waiting_token"], token);
    // But not to whoever only names alice.
    join(&app, json!({"event_id": "show", "user_id": "alice"}))
        .await
        .err(StatusCode::CONFLICT, "ALREADY_JOINED");

    let refused = [
        (
            hs256(
                "another-secret-that-is-also-32-bytes-long",
                "alice",
                "show",
                later,
            ),
            "USER_TOKEN_INVALID",
        ),
        (
            hs256(SECRET, "alice", "other-show", later),
            "USER_TOKEN_INVALID",
        ),
        (
            hs256(SECRET, "alice", "show", T0 - 60_000),
            "USER_TOKEN_EXPIRED",
        ),
        (
            ed25519(&SigningKey::from_bytes(&[3; 32]), "alice", "show", later),
            "USER_TOKEN_INVALID",
        ),
        ("not.a.jwt".to_string(), "USER_TOKEN_INVALID"),
        (format!("{t}x"), "USER_TOKEN_INVALID"),
    ];
    for (bad, code) in refused {
        join(&app, json!({"event_id": "show", "user_token": bad}))
            .await
            .err(StatusCode::UNAUTHORIZED, code);
    }
    // `alg: none` and a token without `sub` are garbage too.
    let none = format!(
        "{}.{}.",
        b64(r#"{"alg":"none","typ":"JWT"}"#),
        b64(&json!({"sub": "alice", "aud": "show", "exp": later / 1000}).to_string())
    );
    join(&app, json!({"event_id": "show", "user_token": none}))
        .await
        .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_INVALID");
    let no_sub = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &json!({"aud": "show", "exp": later / 1000}),
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    join(&app, json!({"event_id": "show", "user_token": no_sub}))
        .await
        .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_INVALID");
    // An empty `sub` names nobody; a token whose `nbf` is still ahead is not valid yet
    // (the site minted it for later), measured on the server's clock like `exp`.
    let signed = |claims: Value| {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    };
    for claims in [
        json!({"sub": "", "aud": "show", "exp": later / 1000}),
        json!({"sub": "carol", "aud": "show", "exp": later / 1000, "nbf": (T0 + 600_000) / 1000}),
    ] {
        join(
            &app,
            json!({"event_id": "show", "user_token": signed(claims.clone())}),
        )
        .await
        .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_INVALID");
    }
    let now_valid =
        signed(json!({"sub": "carol", "aud": "show", "exp": later / 1000, "nbf": T0 / 1000}));
    join(&app, json!({"event_id": "show", "user_token": now_valid}))
        .await
        .ok();
    // NumericDates may be fractional (RFC 7519 2): read as the seconds they say.
    let fractional = signed(
        json!({"sub": "dave", "aud": "show", "exp": later as f64 / 1000.0 + 0.5, "nbf": T0 as f64 / 1000.0 - 0.5}),
    );
    join(&app, json!({"event_id": "show", "user_token": fractional}))
        .await
        .ok();
    let past = signed(json!({"sub": "dave", "aud": "show", "exp": T0 as f64 / 1000.0 - 60.5}));
    join(&app, json!({"event_id": "show", "user_token": past}))
        .await
        .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_EXPIRED");
    // A header extension marked critical that we do not know must be refused (RFC 7515
    // 4.1.11); the library ignores `crit`.
    let critical = format!(
        "{}.{}",
        b64(r#"{"alg":"HS256","typ":"JWT","crit":["exp-ext"],"exp-ext":1}"#),
        b64(&json!({"sub": "erin", "aud": "show", "exp": later / 1000}).to_string())
    );
    let mac = {
        use hmac::Mac;
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        m.update(critical.as_bytes());
        b64_bytes(&m.finalize().into_bytes())
    };
    join(
        &app,
        json!({"event_id": "show", "user_token": format!("{critical}.{mac}")}),
    )
    .await
    .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_INVALID");
    // A token for alice with a body naming bob is a contradiction.
    join(
        &app,
        json!({"event_id": "show", "user_token": t, "user_id": "bob"}),
    )
    .await
    .err(StatusCode::BAD_REQUEST, "INVALID_REQUEST");
    // An event without keys trusts no user token.
    put_event(&app, "plain", json!({})).await;
    join(
        &app,
        json!({"event_id": "plain", "user_token": hs256(SECRET, "a", "plain", later)}),
    )
    .await
    .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_INVALID");
}

/// Whoever joins with a bare `user_id` gets a signed access token whose `sub` is that id:
/// the token must say the id was not proven, or a site taking `sub` as its signed-in user
/// acts for whoever typed the id. A user token or the server key proves it.
#[tokio::test]
async fn an_access_token_says_whether_its_user_was_proven() {
    let app = app();
    put_event(&app, "show", json!({"user_token_secret": SECRET})).await;
    let later = T0 + 600_000;
    let proven_token = hs256(SECRET, "bob", "show", later);
    let cases = [
        (
            json!({"event_id": "show", "user_id": "alice"}),
            None,
            false,
            "alice",
        ),
        (
            json!({"event_id": "show", "user_token": proven_token}),
            None,
            true,
            "bob",
        ),
        (
            json!({"event_id": "show", "user_id": "carol"}),
            Some(ADMIN),
            true,
            "carol",
        ),
        (json!({"event_id": "show"}), None, false, ""),
    ];
    for (body, auth, verified, user) in cases {
        let joined = call(&app, Method::POST, "/api/v1/queue/join", Some(body), auth).await;
        let wt = joined.ok()["waiting_token"].as_str().unwrap().to_string();
        let entered = call(
            &app,
            Method::POST,
            "/api/v1/queue/enter",
            Some(json!({"waiting_token": wt})),
            None,
        )
        .await;
        let jwt = entered.ok()["access_token"].as_str().unwrap().to_string();
        let payload = jwt.split('.').nth(1).unwrap();
        use base64::Engine as _;
        let claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["user_verified"], verified, "{user}: {claims}");
        if !user.is_empty() {
            assert_eq!(claims["sub"], user);
        }
        // (`/queue/verify`, which says the same, checks expiry by the system clock: this
        // app's is manual; tests/http_api.rs asks it.)
    }
}

fn b64(s: &str) -> String {
    b64_bytes(s.as_bytes())
}

fn b64_bytes(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

#[tokio::test]
async fn require_user_token_refuses_bare_joins() {
    let app = app();
    put_event(
        &app,
        "strict",
        json!({"user_token_secret": SECRET, "require_user_token": true}),
    )
    .await;
    for body in [
        json!({"event_id": "strict"}),
        json!({"event_id": "strict", "user_id": "alice"}),
    ] {
        join(&app, body)
            .await
            .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_REQUIRED");
    }
    let t = hs256(SECRET, "alice", "strict", T0 + 60_000);
    join(&app, json!({"event_id": "strict", "user_token": t}))
        .await
        .ok();
    // The site's server key stands in for a user token.
    call(
        &app,
        Method::POST,
        "/api/v1/queue/join",
        Some(json!({"event_id": "strict", "user_id": "bob"})),
        Some(ADMIN),
    )
    .await
    .ok();
    // Requiring tokens without a key to check them is refused.
    let r = call(
        &app,
        Method::PUT,
        "/api/v1/admin/events/nokey",
        Some(json!({"require_user_token": true})),
        Some(ADMIN),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
}

/// After the end of the sale a join is refused as closed, with the end's reason, whatever
/// its user token says (defect: a missing, expired or other event's token was refused on
/// the token, and the waiting page told the visitor to ask for a new link instead of
/// showing that the sale is over).
#[tokio::test]
async fn after_the_end_a_join_is_closed_whatever_its_user_token() {
    let app = app();
    put_event(
        &app,
        "strict",
        json!({"user_token_secret": SECRET, "require_user_token": true}),
    )
    .await;
    put_event(&app, "open", json!({"user_token_secret": SECRET})).await;
    put_event(&app, "other", json!({"user_token_secret": SECRET})).await;
    // Before the end these are the token's refusals.
    join(&app, json!({"event_id": "strict", "user_id": "bob"}))
        .await
        .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_REQUIRED");
    for ev in ["strict", "open"] {
        let r = call(
            &app,
            Method::POST,
            &format!("/api/v1/admin/events/{ev}/end"),
            Some(json!({"reason": "sold_out"})),
            Some(ADMIN),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let expired = |ev: &str| hs256(SECRET, "bob", ev, T0 - 120_000);
    for body in [
        json!({"event_id": "strict", "user_id": "bob"}),
        json!({"event_id": "strict", "user_token": expired("strict")}),
        json!({"event_id": "strict", "user_token": hs256(SECRET, "bob", "other", T0 + 60_000)}),
        json!({"event_id": "open", "user_token": expired("open")}),
    ] {
        let r = join(&app, body.clone()).await;
        r.err(StatusCode::CONFLICT, "EVENT_CLOSED");
        assert_eq!(r.body["error"]["reason"], "sold_out", "{body}: {}", r.text);
    }
    // An event still selling refuses the token as before.
    join(
        &app,
        json!({"event_id": "other", "user_token": expired("other")}),
    )
    .await
    .err(StatusCode::UNAUTHORIZED, "USER_TOKEN_EXPIRED");
}

/// The HS256 secret is stored but no read shows it.
#[tokio::test]
async fn no_read_shows_the_user_token_secret() {
    let app = app();
    let put = put_event(&app, "show", json!({"user_token_secret": SECRET})).await;
    assert_eq!(put.body["user_token_secret_set"], true);
    let paused = call(
        &app,
        Method::POST,
        "/api/v1/admin/events/show/pause",
        None,
        Some(ADMIN),
    )
    .await;
    let mut texts = vec![put.text, paused.text];
    for (uri, auth) in [
        ("/api/v1/admin/events/show", Some(ADMIN)),
        ("/api/v1/admin/events", Some(ADMIN)),
        ("/api/v1/admin/stats", Some(ADMIN)),
        ("/api/v1/events", None),
        ("/api/v1/events/show", None),
        ("/api/v1/queue/info?event_id=show", None),
    ] {
        let r = call(&app, Method::GET, uri, None, auth).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        texts.push(r.text);
    }
    for t in texts {
        assert!(!t.contains(SECRET), "the secret leaked: {t}");
        assert!(!t.contains("\"user_token_secret\""), "{t}");
    }
    // It is still in force.
    join(
        &app,
        json!({"event_id": "show", "user_token": hs256(SECRET, "a", "show", T0 + 60_000)}),
    )
    .await
    .ok();
}

#[tokio::test]
async fn invite_codes_are_made_and_each_seats_one_person() {
    let app = app();
    put_event(&app, "vip", json!({"access": "invite", "max_active": 1})).await;
    let uri = "/api/v1/admin/events/vip/invites";
    call(&app, Method::POST, uri, Some(json!({"count": 2})), None)
        .await
        .err(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    for bad in [
        json!({"count": 0}),
        json!({"count": 10_001}),
        json!({"n": 2}),
    ] {
        call(&app, Method::POST, uri, Some(bad), Some(ADMIN))
            .await
            .err(StatusCode::BAD_REQUEST, "INVALID_REQUEST");
    }
    call(
        &app,
        Method::POST,
        "/api/v1/admin/events/nope/invites",
        Some(json!({"count": 1})),
        Some(ADMIN),
    )
    .await
    .err(StatusCode::NOT_FOUND, "EVENT_NOT_FOUND");
    let codes = invites(&app, "vip", 3).await;
    assert_eq!(codes.len(), 3);
    for c in &codes {
        assert_eq!(c.len(), 16, "{c}");
        assert!(c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }
    assert!(codes[0] != codes[1] && codes[1] != codes[2] && codes[0] != codes[2]);

    // The CSV download, by Accept header or by query.
    let res = invites_accepting(&app, uri, &["text/csv"], 2).await;
    let csv = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    let lines: Vec<&str> = std::str::from_utf8(&csv).unwrap().lines().collect();
    assert_eq!((lines.len(), lines[0]), (3, "code"));
    // Several `Accept` lines are one list: `text/csv` on the second line asks for CSV.
    invites_accepting(&app, uri, &["text/plain", "text/csv"], 1).await;
    let by_query = call(
        &app,
        Method::POST,
        &format!("{uri}?format=csv"),
        Some(json!({"count": 1})),
        Some(ADMIN),
    )
    .await;
    assert!(by_query.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    // A CSV code works like any other.
    join(
        &app,
        json!({"event_id": "vip", "user_id": "carol", "invite": lines[1]}),
    )
    .await
    .ok();

    join(&app, json!({"event_id": "vip", "user_id": "alice"}))
        .await
        .err(StatusCode::FORBIDDEN, "INVITE_REQUIRED");
    join(
        &app,
        json!({"event_id": "vip", "user_id": "alice", "invite": "made-up"}),
    )
    .await
    .err(StatusCode::FORBIDDEN, "INVITE_INVALID");
    // Alice, joined by the site's backend (proven): the code is bound to her.
    let alice_by_site = || {
        call(
            &app,
            Method::POST,
            "/api/v1/queue/join",
            Some(json!({"event_id": "vip", "user_id": "alice", "invite": codes[0]})),
            Some(ADMIN),
        )
    };
    let alice = alice_by_site().await;
    let token = alice.ok()["waiting_token"].clone();
    join(
        &app,
        json!({"event_id": "vip", "user_id": "bob", "invite": codes[0]}),
    )
    .await
    .err(StatusCode::FORBIDDEN, "INVITE_INVALID");
    join(&app, json!({"event_id": "vip", "invite": codes[0]}))
        .await
        .err(StatusCode::FORBIDDEN, "INVITE_INVALID");
    // Her id alone does not make a caller Alice.
    join(
        &app,
        json!({"event_id": "vip", "user_id": "alice", "invite": codes[0]}),
    )
    .await
    .err(StatusCode::FORBIDDEN, "INVITE_INVALID");
    // Alice again with her code, proven: her place back.
    let back = alice_by_site().await;
    assert_eq!(back.ok()["waiting_token"], token);
}

/// An invite code used with a bare (unproven) `user_id` is bound to that place, not to the
/// id: once the place ends, nobody (whoever claims the id) is seated with it again.
#[tokio::test]
async fn an_invite_used_with_a_bare_user_id_seats_one_person() {
    let app = app();
    put_event(&app, "vip", json!({"access": "invite"})).await;
    let code = one_invite(&app, "vip").await;
    let body = json!({"event_id": "vip", "user_id": "alice", "invite": code});
    let first = join(&app, body.clone()).await;
    let token = first.ok()["waiting_token"].as_str().unwrap().to_string();
    let left = call(
        &app,
        Method::POST,
        "/api/v1/queue/leave",
        Some(json!({"token": token})),
        None,
    )
    .await;
    assert_eq!(left.body["removed"], true, "{}", left.text);
    for _ in 0..3 {
        join(&app, body.clone())
            .await
            .err(StatusCode::FORBIDDEN, "INVITE_INVALID");
    }
}

/// Many people racing with one code through the API: exactly one is seated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_joins_with_one_code_seat_one_person() {
    let app = app();
    put_event(&app, "vip", json!({"access": "invite"})).await;
    let code = one_invite(&app, "vip").await;
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (app, code) = (app.clone(), code.clone());
            tokio::spawn(async move {
                join(
                    &app,
                    json!({"event_id": "vip", "user_id": format!("u{i}"), "invite": code}),
                )
                .await
                .status
            })
        })
        .collect();
    let mut seated = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => seated += 1,
            s => assert_eq!(s, StatusCode::FORBIDDEN),
        }
    }
    assert_eq!(seated, 1);
}

/// `GET /admin/events/{id}/invites` gives every code back with its state: unused, bound to
/// the proven user who joined with it, or bound to the place an anonymous join made. In
/// code order, a page at a time, as JSON or CSV.
#[tokio::test]
async fn invite_codes_are_listed_back_with_their_state() {
    let app = app();
    put_event(&app, "vip", json!({"access": "invite"})).await;
    let uri = "/api/v1/admin/events/vip/invites";
    let codes = invites(&app, "vip", 3).await;
    // Alice proven (joined by the site's backend), an anonymous join, one left unused.
    call(
        &app,
        Method::POST,
        "/api/v1/queue/join",
        Some(json!({"event_id": "vip", "user_id": "alice", "invite": codes[0]})),
        Some(ADMIN),
    )
    .await
    .ok();
    join(&app, json!({"event_id": "vip", "invite": codes[1]}))
        .await
        .ok();

    let mut want: Vec<(String, &str, Option<&str>)> = vec![
        (codes[0].clone(), "bound", Some("alice")),
        (codes[1].clone(), "bound", None),
        (codes[2].clone(), "unused", None),
    ];
    want.sort();
    let listed = call(&app, Method::GET, uri, None, Some(ADMIN)).await;
    assert_eq!(listed.headers[header::CACHE_CONTROL], "no-store");
    let rows = listed.ok()["invites"].as_array().unwrap().clone();
    let got: Vec<(String, &str, Option<&str>)> = rows
        .iter()
        .map(|r| {
            (
                r["code"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap(),
                r.get("user_id").map(|u| u.as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(got, want, "{}", listed.text);
    assert_eq!(listed.body["next_after"], Value::Null, "{}", listed.text);

    // The CSV, by query or by `Accept`, as the `POST` negotiates it.
    let csv_want: Vec<String> = std::iter::once("code,state,user_id".to_string())
        .chain(
            want.iter()
                .map(|(c, s, u)| format!("{c},{s},{}", u.unwrap_or(""))),
        )
        .collect();
    let by_query = call(
        &app,
        Method::GET,
        &format!("{uri}?format=csv"),
        None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(by_query.status, StatusCode::OK, "{}", by_query.text);
    assert!(by_query.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    assert_eq!(by_query.text.lines().collect::<Vec<_>>(), csv_want);
    let req = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(header::ACCEPT, "text/plain")
        .header(header::ACCEPT, "text/csv")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[header::CACHE_CONTROL], "no-store");
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(
        std::str::from_utf8(&bytes)
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        csv_want
    );

    // A page at a time: `next_after` (JSON) or `Link` (CSV) leads to the next one.
    let first = call(
        &app,
        Method::GET,
        &format!("{uri}?limit=2"),
        None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(first.ok()["invites"].as_array().unwrap().len(), 2);
    assert_eq!(first.body["next_after"], want[1].0.as_str());
    let rest = call(
        &app,
        Method::GET,
        &format!("{uri}?limit=2&after={}", want[1].0),
        None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(rest.ok()["invites"][0]["code"], want[2].0.as_str());
    assert_eq!(rest.body["invites"].as_array().unwrap().len(), 1);
    assert_eq!(rest.body["next_after"], Value::Null);
    let csv_page = call(
        &app,
        Method::GET,
        &format!("{uri}?format=csv&limit=2"),
        None,
        Some(ADMIN),
    )
    .await;
    assert_eq!(csv_page.text.lines().count(), 3, "{}", csv_page.text);
    assert_eq!(
        csv_page.headers[header::LINK],
        format!(
            "<{uri}?format=csv&after={}&limit=2>; rel=\"next\"",
            want[1].0
        )
        .as_str()
    );

    // Refusals: no admin token, an unknown event, a bad limit or format.
    call(&app, Method::GET, uri, None, None)
        .await
        .err(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    call(
        &app,
        Method::GET,
        "/api/v1/admin/events/nope/invites",
        None,
        Some(ADMIN),
    )
    .await
    .err(StatusCode::NOT_FOUND, "EVENT_NOT_FOUND");
    for q in ["limit=0", "limit=10001", "format=xml"] {
        call(&app, Method::GET, &format!("{uri}?{q}"), None, Some(ADMIN))
            .await
            .err(StatusCode::BAD_REQUEST, "INVALID_REQUEST");
    }
}
