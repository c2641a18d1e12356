//! The audit's log line, in a test binary of its own: it listens through a subscriber set
//! for this thread only, and tracing caches per log call whether anyone listens, a cache
//! that tests running beside it in the same process (starting servers, each with its own
//! logging) disturb.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::Clock;
use waitroom::core::Millis;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::Store;
use waitroom::AppState;

const ADMIN: &str = "records-admin";
const T0: Millis = 1_700_000_000_000;

fn app() -> Router {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let state = AppState::new(
        store,
        &SigningKey::from_bytes(&[3; 32]),
        ADMIN,
        Clock::manual(T0),
    )
    .unwrap();
    waitroom::http::router(state)
}

async fn call(app: &Router, method: Method, uri: &str, body: Value) -> StatusCode {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

/// The log line: target `waitroom::audit`, with the action, the event and what changed.
#[tokio::test]
async fn every_change_is_a_structured_log_line() {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // Other tests of this binary may have met the audit's log call first, with no
    // subscriber anywhere, and cached "never" for it: ask again now that one listens.
    tracing::callsite::rebuild_interest_cache();

    let app = app();
    let uri = "/api/v1/admin/events/sale";
    assert_eq!(
        call(&app, Method::PUT, uri, json!({"max_active": 4})).await,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, Method::PUT, uri, json!({"max_active": 6})).await,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, Method::PUT, uri, json!({"max_active": -1})).await,
        StatusCode::BAD_REQUEST
    );

    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "waitroom::audit")
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    let f = &lines[1]["fields"];
    assert_eq!(f["action"], "update");
    assert_eq!(f["event_id"], "sale");
    assert_eq!(f["changes"], "max_active: 4 -> 6");
    assert_eq!(f["client"], "unknown", "no socket in a handler test");
}
