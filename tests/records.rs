//! The admin records: an event's figures over time (`/events/{id}/history`, JSON and CSV)
//! and the audit list of admin changes (`/audit`), at the handler level (one router, a
//! manual clock) and on a real server (the client's address, the background sampler, and
//! both surviving a restart on the embedded store).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::Clock;
use waitroom::core::Millis;
use waitroom::history::STEP_MS;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::Store;
use waitroom::AppState;

const ADMIN: &str = "records-admin";
const T0: Millis = 1_700_000_000_000;

struct App {
    router: Router,
    state: AppState,
    clock: Clock,
}

fn app() -> App {
    let clock = Clock::manual(T0);
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let state = AppState::new(
        store,
        &SigningKey::from_bytes(&[3; 32]),
        ADMIN,
        clock.clone(),
    )
    .unwrap();
    App {
        router: waitroom::http::router(state.clone()),
        state,
        clock,
    }
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    text: String,
    json: Value,
}

async fn call(
    app: &App,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Resp {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    let resp = app.router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Resp {
        status,
        headers,
        text,
        json,
    }
}

async fn admin(app: &App, method: Method, uri: &str, body: Option<Value>) -> Value {
    let r = call(app, method, uri, Some(ADMIN), body).await;
    assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
    r.json
}

async fn audit(app: &App, query: &str) -> Vec<Value> {
    admin(
        app,
        Method::GET,
        &format!("/api/v1/admin/audit{query}"),
        None,
    )
    .await
    .as_array()
    .unwrap()
    .clone()
}

/// Samples every event now, as the background task does at each step.
async fn sample(app: &App) {
    let now = app.clock.now();
    let events = app.state.store.list_events(now).await.unwrap();
    app.state.history.record(&events, now - now % STEP_MS);
}

// ---- audit ------------------------------------------------------------------------------

/// Each mutating admin route adds exactly one entry, newest first, with its action, event
/// and what changed.
#[tokio::test]
async fn every_admin_change_is_one_entry_with_what_changed() {
    let app = app();
    let ev = "/api/v1/admin/events/sale";
    admin(&app, Method::PUT, ev, Some(json!({"max_active": 5}))).await;
    let e = audit(&app, "").await;
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0]["action"], "create");
    assert_eq!(e[0]["event_id"], "sale");
    assert_eq!(e[0]["at"], T0);
    let max = e[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "max_active")
        .unwrap();
    assert_eq!(max["old"], Value::Null);
    assert_eq!(max["new"], 5);

    app.clock.advance(1000);
    admin(
        &app,
        Method::PUT,
        ev,
        Some(json!({"max_active": 9, "name": "Sale"})),
    )
    .await;
    let e = audit(&app, "").await;
    assert_eq!(e.len(), 2);
    assert_eq!(e[0]["action"], "update", "newest first");
    assert_eq!(
        e[0]["changes"],
        json!([
            {"field": "max_active", "old": 5, "new": 9},
            {"field": "name", "old": "sale", "new": "Sale"}
        ]),
        "only what changed, old → new"
    );

    admin(&app, Method::POST, &format!("{ev}/pause"), None).await;
    admin(&app, Method::POST, &format!("{ev}/resume"), None).await;
    let r = call(
        &app,
        Method::POST,
        "/api/v1/queue/join",
        None,
        Some(json!({"event_id": "sale"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    admin(&app, Method::POST, &format!("{ev}/clear"), None).await;
    admin(
        &app,
        Method::POST,
        &format!("{ev}/invites"),
        Some(json!({"count": 3})),
    )
    .await;
    admin(&app, Method::DELETE, ev, None).await;

    let e = audit(&app, "").await;
    let actions: Vec<&str> = e.iter().map(|x| x["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        ["delete", "invites", "clear", "resume", "pause", "update", "create"]
    );
    assert!(e.iter().all(|x| x["event_id"] == "sale"));
    assert_eq!(e[1]["count"], 3, "how many codes were made");
    assert_eq!(
        e[2]["count"], 0,
        "how many places were cleared (the join entered at once)"
    );
    // Reads are not changes.
    admin(&app, Method::GET, "/api/v1/admin/events", None).await;
    admin(&app, Method::GET, "/api/v1/admin/stats", None).await;
    assert_eq!(audit(&app, "").await.len(), 7);
    // `limit` and `event`.
    assert_eq!(audit(&app, "?limit=2").await.len(), 2);
    admin(&app, Method::PUT, "/api/v1/admin/events/other", None).await;
    let other = audit(&app, "?event=other").await;
    assert_eq!(other.len(), 1);
    assert_eq!(other[0]["event_id"], "other");
    assert_eq!(audit(&app, "?event=sale&limit=3").await.len(), 3);
}

/// A secret replaced by another is an entry that says so, never with either value (defect:
/// both sides read `*_set: true`, so a rotated bypass key left `changes: []`, as a change
/// of nothing would).
#[tokio::test]
async fn a_replaced_secret_is_recorded_without_its_value() {
    let app = app();
    let ev = "/api/v1/admin/events/sale";
    let (one, two) = ("bypass-one-0123456789", "bypass-two-0123456789");
    let (k1, k2) = ("k".repeat(32), "q".repeat(32));
    let put = |bypass: &str, key: &str| json!({"paths": ["/pay"], "bypass_secret": bypass, "user_token_secret": key});
    admin(&app, Method::PUT, ev, Some(put(one, &k1))).await;
    admin(&app, Method::PUT, ev, Some(put(one, &k1))).await;
    assert_eq!(
        audit(&app, "").await[0]["changes"],
        json!([]),
        "the same secrets"
    );
    admin(&app, Method::PUT, ev, Some(put(two, &k2))).await;
    let e = audit(&app, "").await;
    assert_eq!(
        e[0]["changes"],
        json!([
            {"field": "user_token_secret", "old": "(a secret)", "new": "(another secret)"},
            {"field": "bypass_secret", "old": "(a secret)", "new": "(another secret)"}
        ])
    );
    let text = serde_json::to_string(&e).unwrap();
    for secret in [one, two, &k1, &k2] {
        assert!(!text.contains(secret), "{secret} in the audit");
    }
}

/// A refused change changed nothing, so it leaves no entry: bad input, an unknown event,
/// a bad count.
#[tokio::test]
async fn a_refused_change_leaves_no_entry() {
    let app = app();
    let ev = "/api/v1/admin/events/sale";
    admin(&app, Method::PUT, ev, None).await;
    let bad = [
        (Method::PUT, ev.to_string(), Some(json!({"max_active": 0}))),
        (
            Method::PUT,
            ev.to_string(),
            Some(json!({"no_such_field": 1})),
        ),
        (
            Method::PUT,
            "/api/v1/admin/events/bad%20id".to_string(),
            None,
        ),
        (
            Method::POST,
            "/api/v1/admin/events/ghost/pause".to_string(),
            None,
        ),
        (
            Method::POST,
            "/api/v1/admin/events/ghost/clear".to_string(),
            None,
        ),
        (
            Method::DELETE,
            "/api/v1/admin/events/ghost".to_string(),
            None,
        ),
        (
            Method::POST,
            format!("{ev}/invites"),
            Some(json!({"count": 0})),
        ),
    ];
    for (m, uri, body) in bad {
        let r = call(&app, m.clone(), &uri, Some(ADMIN), body).await;
        assert!(r.status.is_client_error(), "{m} {uri}: {}", r.text);
    }
    let e = audit(&app, "").await;
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0]["action"], "create");
}

/// The list keeps the newest 1000 (the API never answers more, and `limit` is bounded).
#[tokio::test]
async fn the_audit_list_is_bounded() {
    let app = app();
    let ev = "/api/v1/admin/events/sale";
    admin(&app, Method::PUT, ev, None).await;
    for i in 0..(waitroom::audit::KEEP + 4) {
        let action = if i % 2 == 0 { "pause" } else { "resume" };
        admin(&app, Method::POST, &format!("{ev}/{action}"), None).await;
    }
    let all = audit(&app, &format!("?limit={}", waitroom::audit::KEEP)).await;
    assert_eq!(all.len(), waitroom::audit::KEEP);
    assert!(
        all.iter().all(|e| e["action"] != "create"),
        "the oldest entry went first"
    );
    assert_eq!(
        app.state
            .store
            .audit_entries(usize::MAX)
            .await
            .unwrap()
            .len(),
        waitroom::audit::KEEP
    );
    let r = call(
        &app,
        Method::GET,
        "/api/v1/admin/audit?limit=1001",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = call(
        &app,
        Method::GET,
        "/api/v1/admin/audit?limit=0",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = call(
        &app,
        Method::GET,
        "/api/v1/admin/audit?event=a%20b",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // Empty parameters are the defaults: the newest 100, of every event.
    assert_eq!(audit(&app, "?limit=&event=").await.len(), 100);
}

/// Attack: the records are the admin's. Without the token, or with a wrong one, nothing
/// is shown, and nothing about the event leaks.
#[tokio::test]
async fn records_are_admin_only() {
    let app = app();
    admin(&app, Method::PUT, "/api/v1/admin/events/sale", None).await;
    sample(&app).await;
    for uri in [
        "/api/v1/admin/audit",
        "/api/v1/admin/events/sale/history",
        "/api/v1/admin/events/sale/history?format=csv",
        "/api/v1/admin/events/sale/history.csv",
        "/api/v1/admin/events/ghost/history",
    ] {
        for token in [None, Some("wrong"), Some("")] {
            let r = call(&app, Method::GET, uri, token, None).await;
            assert_eq!(
                r.status,
                StatusCode::UNAUTHORIZED,
                "{uri} {token:?}: {}",
                r.text
            );
            assert_eq!(r.json["error"]["code"], "UNAUTHORIZED");
            assert!(!r.text.contains("sale\""), "{}", r.text);
        }
    }
}

// ---- history ----------------------------------------------------------------------------

#[tokio::test]
async fn history_answers_json_and_csv_with_since_and_step() {
    let app = app();
    admin(
        &app,
        Method::PUT,
        "/api/v1/admin/events/sale",
        // Long timeouts: nobody here heartbeats, and no figure may change by expiry.
        Some(json!({"max_active": 1, "waiting_idle_sec": 3600, "ready_ttl_sec": 3600})),
    )
    .await;
    // Created but never sampled: an empty history, not an error.
    let h = admin(&app, Method::GET, "/api/v1/admin/events/sale/history", None).await;
    assert_eq!(h["samples"], json!([]));
    for i in 0..12 {
        if i < 3 {
            let r = call(
                &app,
                Method::POST,
                "/api/v1/queue/join",
                None,
                Some(json!({"event_id": "sale"})),
            )
            .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        }
        sample(&app).await;
        app.clock.advance(STEP_MS);
    }
    let h = admin(&app, Method::GET, "/api/v1/admin/events/sale/history", None).await;
    assert_eq!(h["event_id"], "sale");
    assert_eq!(h["step_sec"], 10);
    let s = h["samples"].as_array().unwrap();
    assert_eq!(s.len(), 12);
    assert_eq!(s[0]["at"], T0 - T0 % STEP_MS);
    assert_eq!(s[0]["waiting"], 0);
    assert_eq!(
        s[0]["active"].as_u64().unwrap() + s[0]["admitted"].as_u64().unwrap(),
        1
    );
    assert_eq!(s[11]["waiting"], 2);
    assert_eq!(s[11]["joins"], 3);
    assert_eq!(
        s[11]["admitted_last_minute"], 0,
        "the admission was over a minute ago"
    );
    assert!(s
        .windows(2)
        .all(|w| w[0]["at"].as_u64() < w[1]["at"].as_u64()));

    let since = s[5]["at"].as_u64().unwrap();
    let h = admin(
        &app,
        Method::GET,
        &format!("/api/v1/admin/events/sale/history?since={since}"),
        None,
    )
    .await;
    assert_eq!(h["samples"].as_array().unwrap().len(), 7);
    let h = admin(
        &app,
        Method::GET,
        "/api/v1/admin/events/sale/history?step=60",
        None,
    )
    .await;
    assert_eq!(h["step_sec"], 60);
    let per_min = h["samples"].as_array().unwrap();
    assert!((2..=3).contains(&per_min.len()), "{per_min:?}");

    // Empty parameters, as API.md writes the URL (and a form sends them), are defaults
    // (defect: `since: cannot parse integer from empty string`).
    for uri in [
        "/api/v1/admin/events/sale/history?format=csv",
        "/api/v1/admin/events/sale/history.csv",
        "/api/v1/admin/events/sale/history.csv?since=&step=",
        "/api/v1/admin/events/sale/history?since=&step=&format=csv",
    ] {
        let r = call(&app, Method::GET, uri, Some(ADMIN), None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.headers[header::CONTENT_TYPE], "text/csv; charset=utf-8");
        assert_eq!(
            r.headers[header::CONTENT_DISPOSITION],
            "attachment; filename=\"history-sale.csv\""
        );
        let lines: Vec<&str> = r.text.lines().collect();
        assert_eq!(lines.len(), 13);
        assert!(lines[0].starts_with("at,time_utc,waiting,admitted,active"));
        assert!(lines[12].split(',').nth(2) == Some("2"), "{}", lines[12]);
    }

    for (uri, code) in [
        ("/api/v1/admin/events/ghost/history", "EVENT_NOT_FOUND"),
        (
            "/api/v1/admin/events/sale/history?step=5",
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/sale/history?step=x",
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/sale/history?since=1.5",
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/sale/history?since=-1",
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/sale/history?format=xml",
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/sale/history.csv?format=json",
            "INVALID_REQUEST",
        ),
        (
            "/api/v1/admin/events/sale/history?nope=1",
            "INVALID_REQUEST",
        ),
    ] {
        let r = call(&app, Method::GET, uri, Some(ADMIN), None).await;
        assert!(r.status.is_client_error(), "{uri}: {}", r.text);
        assert_eq!(r.json["error"]["code"], code, "{uri}: {}", r.text);
    }

    // A deleted event's history goes with it (the background task forgets on the notice;
    // here the next sample does).
    admin(&app, Method::DELETE, "/api/v1/admin/events/sale", None).await;
    sample(&app).await;
    assert!(app.state.history.samples("sale", 0, 0).is_none());
}

/// The background task forgets a deleted event's history on the store's notice (without
/// waiting for its next sample).
#[tokio::test]
async fn the_history_of_a_deleted_event_is_dropped_on_its_notice() {
    let app = app();
    admin(&app, Method::PUT, "/api/v1/admin/events/sale", None).await;
    let _tasks = app.state.start_background();
    // The task samples once as it starts.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while app
        .state
        .history
        .samples("sale", 0, 0)
        .is_none_or(|s| s.is_empty())
    {
        assert!(
            std::time::Instant::now() < until,
            "the task sampled at its start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    admin(&app, Method::DELETE, "/api/v1/admin/events/sale", None).await;
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while app.state.history.samples("sale", 0, 0).is_some() {
        assert!(
            std::time::Instant::now() < until,
            "forgotten on the notice, well before the next 10 s sample"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---- a real server ----------------------------------------------------------------------

struct Node {
    base: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Node {
    async fn start(dir: &Path) -> Node {
        let settings = waitroom::config::Settings {
            data_dir: dir.to_path_buf(),
            admin_token: Some(ADMIN.into()),
            ..Default::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(waitroom::server::run(settings, listener, async move {
            let _ = rx.await;
        }));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        for _ in 0..400 {
            if let Ok(r) = http.get(format!("{base}/healthz")).send().await {
                if r.status().is_success() {
                    return Node {
                        base,
                        http,
                        stop,
                        done,
                    };
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the server did not come up");
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.done)
            .await
            .expect("the server stops")
            .unwrap()
            .expect("clean shutdown");
    }

    async fn admin(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method, format!("{}/api/v1/admin{path}", self.base))
            .bearer_auth(ADMIN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn samples(&self, id: &str) -> Vec<Value> {
        self.admin(reqwest::Method::GET, &format!("/events/{id}/history"), None)
            .await["samples"]
            .as_array()
            .unwrap()
            .clone()
    }
}

/// On a real server: the background task samples (within one step), the audit names the
/// client by its address, and after a restart on the same data dir both the history and
/// the audit list are still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_audit_survive_a_restart_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    node.admin(
        reqwest::Method::PUT,
        "/events/sale",
        Some(json!({"max_active": 3})),
    )
    .await;
    node.admin(reqwest::Method::POST, "/events/sale/pause", None)
        .await;
    let started = std::time::Instant::now();
    let before = loop {
        let s = node.samples("sale").await;
        if !s.is_empty() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no sample within a step"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(before[0]["capacity"], 3);
    let audit = node.admin(reqwest::Method::GET, "/audit", None).await;
    assert_eq!(audit[0]["action"], "pause");
    assert_eq!(
        audit[0]["client"], "127.0.0.1",
        "the client as the guard sees it"
    );
    node.stop().await;
    assert!(dir.path().join(waitroom::history::FILE).is_file());
    // Restart in a later step, so that the new node's first sample cannot pass for the old.
    let last = before.last().unwrap()["at"].as_u64().unwrap();
    while waitroom::clock::system_now() < last + STEP_MS {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let node = Node::start(dir.path()).await;
    let after = node.samples("sale").await;
    assert!(
        after.len() >= before.len() && after[0] == before[0],
        "the history was kept: {before:?} then {after:?}"
    );
    let audit = node.admin(reqwest::Method::GET, "/audit", None).await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["pause", "create"]);
    // Deleting the event drops its history.
    node.admin(reqwest::Method::DELETE, "/events/sale", None)
        .await;
    let r = node
        .http
        .get(format!("{}/api/v1/admin/events/sale/history", node.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::NOT_FOUND);
    node.stop().await;
}

/// Racing admin changes of one event (deletes, updates that may re-create, pauses) are
/// recorded in the order they took effect, each labelled by the state it found: walking
/// the list from the oldest, a `create` comes only when the event did not exist, an
/// `update` or a `pause` only when it did, and the last entry agrees with whether the event
/// exists now.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_changes_are_recorded_in_the_order_they_took_effect() {
    let app = app();
    for round in 0..100 {
        let id = format!("r{round}");
        let base = format!("/api/v1/admin/events/{id}");
        admin(&app, Method::PUT, &base, Some(json!({}))).await;
        let calls: Vec<_> = (0..9)
            .map(|i| {
                let router = app.router.clone();
                let (method, uri, body) = match i % 3 {
                    0 => (Method::DELETE, base.clone(), None),
                    1 => (Method::PUT, base.clone(), Some(json!({"max_active": 7}))),
                    _ => (Method::POST, format!("{base}/pause"), None),
                };
                tokio::spawn(async move {
                    let mut b = Request::builder()
                        .method(method)
                        .uri(uri)
                        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"));
                    let body = match body {
                        Some(v) => {
                            b = b.header(header::CONTENT_TYPE, "application/json");
                            Body::from(v.to_string())
                        }
                        None => Body::empty(),
                    };
                    router
                        .oneshot(b.body(body).unwrap())
                        .await
                        .unwrap()
                        .status()
                })
            })
            .collect();
        for c in calls {
            let status = c.await.unwrap();
            assert!(
                status == StatusCode::OK || status == StatusCode::NOT_FOUND,
                "{status}"
            );
        }
        let exists = call(&app, Method::GET, &base, Some(ADMIN), None)
            .await
            .status
            == StatusCode::OK;
        let entries = audit(&app, &format!("?event={id}")).await;
        let mut live = false;
        for e in entries.iter().rev() {
            let action = e["action"].as_str().unwrap();
            match action {
                "create" => {
                    assert!(!live, "{id}: a create over a live event: {entries:?}");
                    live = true;
                }
                "delete" => {
                    assert!(live, "{id}: a delete of no event: {entries:?}");
                    live = false;
                }
                _ => assert!(live, "{id}: {action} of no event: {entries:?}"),
            }
        }
        assert_eq!(live, exists, "{id}: {entries:?}");
    }
}
