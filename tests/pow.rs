//! Proof of work on joins, attacked through the API: a join without work, with a wrong
//! nonce, an expired challenge, another event's challenge, a forged prefix or a replayed
//! solution is refused with a fresh challenge; a real solution joins, once. The replay is
//! also tried across two nodes sharing one Redis.

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::Clock;
use waitroom::core::Millis;
use waitroom::http::router;
use waitroom::pow::{digest, leading_zero_bits, solve};
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::redis::{RedisOptions, RedisStore};
use waitroom::store::Store;
use waitroom::AppState;

const ADMIN: &str = "test-admin-token";
const T0: Millis = 1_700_000_000_000;
const BITS: u64 = 8;

struct Node {
    router: Router,
    clock: Clock,
    /// The node's background tasks (its event catalog hears of changes through them).
    _tasks: waitroom::tasks::Tasks,
}

fn node(store: Arc<dyn Store>, key: u8, clock: Clock) -> Node {
    let state = AppState::new(
        store,
        &SigningKey::from_bytes(&[key; 32]),
        ADMIN,
        clock.clone(),
    )
    .unwrap();
    Node {
        _tasks: state.start_background(),
        router: router(state),
        clock,
    }
}

fn embedded() -> Node {
    node(Arc::new(EmbeddedStore::new()), 7, Clock::manual(T0))
}

impl Node {
    async fn send(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"));
        if body.is_some() {
            b = b.header(header::CONTENT_TYPE, "application/json");
        }
        let body = body.map_or(Body::empty(), |v| Body::from(v.to_string()));
        let res = self
            .router
            .clone()
            .oneshot(b.body(body).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn event(&self, id: &str, patch: Value) -> (StatusCode, Value) {
        self.send(
            Method::PUT,
            &format!("/api/v1/admin/events/{id}"),
            Some(patch),
        )
        .await
    }

    async fn join(&self, body: Value) -> (StatusCode, Value) {
        self.send(Method::POST, "/api/v1/queue/join", Some(body))
            .await
    }

    /// Asks for a challenge (a join without work) and answers it.
    async fn challenge(&self, event: &str) -> Value {
        let (status, body) = self.join(json!({ "event_id": event })).await;
        assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
        assert_eq!(body["error"]["code"], "POW_REQUIRED", "{body}");
        body["error"]["challenge"].clone()
    }
}

fn prefix(challenge: &Value) -> String {
    challenge["prefix"].as_str().unwrap().to_string()
}

fn joined(event: &str, prefix: &str, nonce: &str) -> Value {
    json!({ "event_id": event, "pow": { "prefix": prefix, "nonce": nonce } })
}

/// Asserts a `POW_INVALID` refusal naming `why`, with a fresh, different challenge.
#[track_caller]
fn refused(answer: (StatusCode, Value), old_prefix: &str, why: &str) {
    let (status, body) = answer;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["error"]["code"], "POW_INVALID", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(why), "{message:?} should say {why:?}");
    let fresh = &body["error"]["challenge"];
    assert_eq!(fresh["algorithm"], "sha256");
    assert_ne!(prefix(fresh), old_prefix, "a fresh challenge");
}

#[tokio::test]
async fn a_join_needs_work_and_a_solution_joins() {
    let n = embedded();
    let (status, cfg) = n.event("ev", json!({ "pow_difficulty": BITS })).await;
    assert_eq!(status, StatusCode::OK, "{cfg}");
    assert_eq!(cfg["pow_difficulty"], BITS, "admin reads show the setting");
    let (_, read) = n.send(Method::GET, "/api/v1/admin/events/ev", None).await;
    assert_eq!(read["pow_difficulty"], BITS, "{read}");
    let (status, bad) = n.event("ev", json!({ "pow_difficulty": 29 })).await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_REQUEST"))
    );

    let c = n.challenge("ev").await;
    assert_eq!(c["algorithm"], "sha256");
    assert_eq!(c["difficulty_bits"], BITS);
    assert_eq!(c["expires_in"], 120);
    let p = prefix(&c);
    let nonce = solve(&p, BITS as u32);
    assert!(leading_zero_bits(&digest(&p, &nonce)) >= BITS as u32);
    let (status, body) = n.join(joined("ev", &p, &nonce)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let token = body["waiting_token"].as_str().unwrap().to_string();

    // Work is per join, not per request: polling a place needs none.
    let (status, _) = n
        .send(
            Method::GET,
            &format!("/api/v1/queue/status?token={token}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // An event without work asks none; a closed one says it is closed instead.
    n.event("free", json!({})).await;
    assert_eq!(
        n.join(json!({ "event_id": "free" })).await.0,
        StatusCode::OK
    );
    n.event("ev", json!({ "accept_joins": false })).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await; // the change notice
    let (status, body) = n.join(json!({ "event_id": "ev" })).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::CONFLICT, &json!("EVENT_CLOSED"))
    );
    // So does a sale that has ended (here by its closing time), with the end's reason:
    // no work is asked for a join that cannot be made.
    n.event(
        "over",
        json!({ "pow_difficulty": BITS, "closes_at": "2020-01-01T00:00:00Z" }),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (status, body) = n.join(json!({ "event_id": "over" })).await;
    assert_eq!(
        (status, &body["error"]["code"], &body["error"]["reason"]),
        (
            StatusCode::CONFLICT,
            &json!("EVENT_CLOSED"),
            &json!("closed")
        ),
        "{body}"
    );
}

#[tokio::test]
async fn a_wrong_nonce_is_refused() {
    let n = embedded();
    n.event("ev", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&n.challenge("ev").await);
    let wrong = (0..)
        .map(|i: u32| i.to_string())
        .find(|x| leading_zero_bits(&digest(&p, x)) < BITS as u32)
        .unwrap();
    refused(n.join(joined("ev", &p, &wrong)).await, &p, "does not solve");
    // A nonce of the wrong length is named as such, not as a forged challenge (the client
    // would go on solving new ones with the same nonces).
    for nonce in [String::new(), "1".repeat(65)] {
        refused(n.join(joined("ev", &p, &nonce)).await, &p, "1 to 64 bytes");
    }
}

#[tokio::test]
async fn an_expired_challenge_is_refused() {
    let n = embedded();
    n.event("ev", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&n.challenge("ev").await);
    let nonce = solve(&p, BITS as u32);
    n.clock.advance(120_000);
    refused(n.join(joined("ev", &p, &nonce)).await, &p, "expired");
}

#[tokio::test]
async fn another_events_challenge_is_refused() {
    let n = embedded();
    n.event("ev", json!({ "pow_difficulty": BITS })).await;
    n.event("cheap", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&n.challenge("cheap").await);
    let nonce = solve(&p, BITS as u32);
    refused(n.join(joined("ev", &p, &nonce)).await, &p, "another event");
}

#[tokio::test]
async fn a_forged_prefix_is_refused() {
    let n = embedded();
    n.event("ev", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&n.challenge("ev").await);
    // An easier difficulty, a later expiry, or a prefix made up from scratch.
    let easier = p.replacen(&format!(":{BITS}:"), ":1:", 1);
    let parts: Vec<&str> = p.split(':').collect();
    let later = p.replacen(parts[3], &(T0 + 3_600_000).to_string(), 1);
    for forged in [
        easier,
        later,
        "1:ev:8:9999999999999:AAAAAAAAAAAAAAAAAAAAAA:x".into(),
    ] {
        let nonce = solve(&forged, BITS as u32);
        refused(
            n.join(joined("ev", &forged, &nonce)).await,
            &forged,
            "not issued",
        );
    }
    // A challenge from a server with another signing key.
    let other = node(Arc::new(EmbeddedStore::new()), 9, Clock::manual(T0));
    other.event("ev", json!({ "pow_difficulty": BITS })).await;
    let foreign = prefix(&other.challenge("ev").await);
    let nonce = solve(&foreign, BITS as u32);
    refused(
        n.join(joined("ev", &foreign, &nonce)).await,
        &foreign,
        "not issued",
    );
    // A malformed `pow` object is bad input, not a refused solution; so is an array,
    // which serde would otherwise read as the object's fields in order (even a solving
    // one is not taken in that shape).
    for bad in [
        json!({ "prefix": 1 }),
        json!(["a", "b"]),
        json!([foreign, nonce]),
        json!("x"),
    ] {
        let (status, body) = n.join(json!({ "event_id": "ev", "pow": bad })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "INVALID_REQUEST", "{bad}: {body}");
    }
}

#[tokio::test]
async fn a_solution_is_spent_once() {
    let n = embedded();
    n.event("ev", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&n.challenge("ev").await);
    let nonce = solve(&p, BITS as u32);
    assert_eq!(n.join(joined("ev", &p, &nonce)).await.0, StatusCode::OK);
    refused(n.join(joined("ev", &p, &nonce)).await, &p, "already used");
    // Another nonce for the same prefix is the same challenge: spent too.
    let second = (nonce.parse::<u64>().unwrap() + 1..)
        .map(|i| i.to_string())
        .find(|x| leading_zero_bits(&digest(&p, x)) >= BITS as u32)
        .unwrap();
    refused(n.join(joined("ev", &p, &second)).await, &p, "already used");
}

#[tokio::test]
async fn a_solution_is_spent_once_across_nodes_on_redis() {
    let prefix_key = support::redis::unique_prefix();
    let redis = || -> Arc<dyn Store> {
        let options = RedisOptions {
            key_prefix: prefix_key.clone(),
            ..RedisOptions::default()
        };
        Arc::new(RedisStore::new(&support::redis::shared().url(), options).unwrap())
    };
    // Two nodes: their own store connections and catalogs, one Redis, one signing key.
    let now = waitroom::clock::system_now();
    let a = node(redis(), 7, Clock::manual(now));
    let b = node(redis(), 7, Clock::manual(now));
    a.event("ev", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&a.challenge("ev").await);
    let nonce = solve(&p, BITS as u32);
    let (first, second) = tokio::join!(
        a.join(joined("ev", &p, &nonce)),
        b.join(joined("ev", &p, &nonce))
    );
    let ok = [&first, &second]
        .iter()
        .filter(|r| r.0 == StatusCode::OK)
        .count();
    assert_eq!(ok, 1, "exactly one node takes it: {first:?} {second:?}");
    let refusal = if first.0 == StatusCode::OK {
        second
    } else {
        first
    };
    refused(refusal, &p, "already used");
    // And later, on the node that took it, still refused.
    refused(b.join(joined("ev", &p, &nonce)).await, &p, "already used");
}

#[tokio::test]
async fn a_challenge_easier_than_the_current_difficulty_is_refused() {
    let n = embedded();
    n.event("ev", json!({ "pow_difficulty": BITS })).await;
    let p = prefix(&n.challenge("ev").await);
    let nonce = solve(&p, BITS as u32);
    // The operator raises the difficulty under attack: older, easier work no longer counts.
    n.event("ev", json!({ "pow_difficulty": BITS + 2 })).await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await; // the change notice
    let (status, body) = n.join(joined("ev", &p, &nonce)).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["error"]["challenge"]["difficulty_bits"], BITS + 2);
    refused((status, body), &p, "easier");
}

#[tokio::test]
async fn difficulty_rises_with_the_join_rate_and_falls_back() {
    let n = embedded();
    let (status, cfg) = n
        .event("ev", json!({ "pow_difficulty": 4, "pow_auto_above": 10 }))
        .await;
    assert_eq!(status, StatusCode::OK, "{cfg}");
    assert_eq!(cfg["pow_auto_above"], 10);
    let calm = n.challenge("ev").await;
    assert_eq!(calm["difficulty_bits"], 4);
    // A burst of attempts (the clock stands still): one more bit per doubling beyond 10/s.
    let mut last = Value::Null;
    for _ in 0..24 {
        last = n.challenge("ev").await;
    }
    assert_eq!(last["difficulty_bits"], 6, "25 attempts/s: 10 → 20 → 40");
    // Work done on the calmer challenge still counts (the floor is the setting).
    let p = prefix(&calm);
    assert_eq!(
        n.join(joined("ev", &p, &solve(&p, 4))).await.0,
        StatusCode::OK
    );
    // A quiet moment later, the difficulty is back at the floor.
    n.clock.advance(3000);
    assert_eq!(n.challenge("ev").await["difficulty_bits"], 4);
}
