//! Heap allocations per request (issue 10, item 3: "fewer allocations per request, measure
//! them"): a counting global allocator around the system one, and the router driven
//! in-process with `oneshot` over the durable embedded store in `sync`, so the journal
//! writer's allocations count too (every thread of the process counts).
//!
//! `cargo test --release --test allocations -- --ignored --nocapture` prints allocations
//! and bytes per request for `/healthz`, join and status. It is a measurement, not a
//! budget, so it asserts nothing about the figures; `counting_sees_an_allocation` checks
//! that the counter counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request};
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::{system_now, Clock};
use waitroom::http::router;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::journal::Durability;
use waitroom::AppState;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ADMIN: &str = "alloc-admin-token";

fn counts() -> (u64, u64) {
    (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

#[test]
fn counting_sees_an_allocation() {
    let before = counts().0;
    let v = std::hint::black_box(vec![1u8; 100]);
    assert!(counts().0 > before);
    drop(v);
}

async fn send(router: &axum::Router, request: Request<Body>) -> Value {
    let res = router.clone().oneshot(request).await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

fn post(uri: &str, body: &Value, token: Option<&str>) -> Request<Body> {
    let mut b = Request::post(uri).header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    b.body(Body::from(body.to_string())).unwrap()
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn allocations_per_request() {
    const N: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Sync, system_now()).unwrap();
    let state = AppState::new(
        Arc::new(store),
        &SigningKey::from_bytes(&[7; 32]),
        ADMIN,
        Clock::manual(system_now()),
    )
    .unwrap();
    let app = router(state);
    let event =
        json!({"name": "alloc", "max_active": 1, "paused": true, "waiting_idle_sec": 2_592_000});
    let put = Request::put("/api/v1/admin/events/alloc")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .body(Body::from(event.to_string()))
        .unwrap();
    send(&app, put).await;
    let mut tokens = Vec::new();
    for i in 0..N {
        let body = json!({"event_id": "alloc", "user_id": format!("pre-{i}")});
        let v = send(&app, post("/api/v1/queue/join", &body, None)).await;
        tokens.push(v["waiting_token"].as_str().unwrap().to_string());
    }
    // Warm each path once (lazy statics, thread-local metric handles).
    send(&app, get("/healthz")).await;
    send(
        &app,
        get(&format!("/api/v1/queue/status?token={}", tokens[0])),
    )
    .await;

    let mut report = Vec::new();
    for kind in ["healthz", "join", "status"] {
        // Requests are built before counting: a client's work is not the server's.
        let requests: Vec<Request<Body>> = (0..N as usize)
            .map(|i| match kind {
                "healthz" => get("/healthz"),
                "join" => post(
                    "/api/v1/queue/join",
                    &json!({"event_id": "alloc", "user_id": format!("u-{i}")}),
                    None,
                ),
                _ => get(&format!("/api/v1/queue/status?token={}", tokens[i])),
            })
            .collect();
        let (a0, b0) = counts();
        for r in requests {
            let res = app.clone().oneshot(r).await.unwrap();
            assert!(res.status().is_success());
            let _ = axum::body::to_bytes(res.into_body(), usize::MAX).await;
        }
        let (a1, b1) = counts();
        report.push((
            kind,
            (a1 - a0) as f64 / N as f64,
            (b1 - b0) as f64 / N as f64,
        ));
    }
    println!("| request | allocations / request | bytes allocated / request |");
    println!("|---|---:|---:|");
    for (kind, a, b) in report {
        println!("| {kind} | {a:.1} | {b:.0} |");
    }
}
