//! The sale around the queue over HTTP (`core::lifecycle`): the admin's announcement, the
//! end of the sale (`POST …/end` and `closes_at`), and what end users are answered after it
//! (`EVENT_CLOSED` and `TOKEN_NOT_FOUND` with `error.reason`). Handler level: one router on
//! the embedded store with a manual clock; and two nodes whose clocks differ, on one store
//! (embedded, or one Redis).

mod support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::Clock;
use waitroom::core::lifecycle::format_rfc3339;
use waitroom::core::Millis;
use waitroom::http::router;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::journal::Durability;
use waitroom::store::redis::{RedisOptions, RedisStore};
use waitroom::store::Store;
use waitroom::tasks::Tasks;
use waitroom::AppState;

const ADMIN: &str = "test-admin-token";
/// 2023-11-14T22:13:20Z.
const T0: Millis = 1_700_000_000_000;

struct App {
    router: Router,
    clock: Clock,
    store: Arc<dyn Store>,
    state: AppState,
    /// The node's background tasks: the catalog forgets a changed event on its notice.
    _tasks: Tasks,
}

fn app() -> App {
    node(Arc::new(EmbeddedStore::new()), Clock::manual(T0))
}

/// A node on `store` (which other nodes may share) with its own clock.
fn node(store: Arc<dyn Store>, clock: Clock) -> App {
    let state = AppState::new(
        store.clone(),
        &SigningKey::from_bytes(&[7; 32]),
        ADMIN,
        clock.clone(),
    )
    .unwrap();
    App {
        router: router(state.clone()),
        _tasks: state.start_background(),
        state,
        clock,
        store,
    }
}

impl App {
    /// Waits until this node's catalog holds the event's settings as stored: a change is
    /// told to the catalog by the store's notice, a moment after the call answered.
    async fn settled(&self, event: &str) {
        let now = self.clock.now();
        let want = self.store.get_event(event, now).await.unwrap().config;
        for _ in 0..400 {
            if *self.state.events.config(event, now).await.unwrap() == want {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the catalog never learnt the change of {event}");
    }

    async fn send(
        &self,
        method: Method,
        uri: &str,
        admin: bool,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let bearer = admin.then_some(ADMIN);
        self.send_as(method, uri, bearer, body).await
    }

    /// A request with `bearer` as its `Authorization` token, if any.
    async fn send_as(
        &self,
        method: Method,
        uri: &str,
        bearer: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        send_to(self.router.clone(), method, uri, bearer, body).await
    }

    async fn admin(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let text = body.map(|b| b.to_string());
        self.send(
            method,
            &format!("/api/v1/admin{path}"),
            true,
            text.as_deref(),
        )
        .await
    }

    async fn join(&self, event: &str) -> (StatusCode, Value) {
        let body = json!({"event_id": event}).to_string();
        self.send(Method::POST, "/api/v1/queue/join", false, Some(&body))
            .await
    }

    async fn status(&self, token: &Value) -> (StatusCode, Value) {
        let uri = format!("/api/v1/queue/status?token={}", token.as_str().unwrap());
        self.send(Method::GET, &uri, false, None).await
    }

    /// Ends the sale of `event` by the admin call, with `reason`: its answer.
    async fn end(&self, event: &str, reason: &str) -> Value {
        let (s, ended) = self
            .admin(
                Method::POST,
                &format!("/events/{event}/end"),
                Some(json!({"reason": reason})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{ended}");
        ended
    }

    /// A join of `event` is refused as the sale ended, with `reason`.
    async fn assert_join_ended(&self, event: &str, reason: &str) {
        let refused = self.join(event).await;
        assert_err(&refused, StatusCode::CONFLICT, "EVENT_CLOSED");
        assert_eq!(refused.1["error"]["reason"], reason, "{}", refused.1);
    }

    /// The place of `token` is over as the sale ended, with `reason`.
    async fn assert_place_ended(&self, token: &Value, reason: &str) {
        let gone = self.status(token).await;
        assert_err(&gone, StatusCode::NOT_FOUND, "TOKEN_NOT_FOUND");
        assert_eq!(gone.1["error"]["reason"], reason, "{}", gone.1);
    }
}

/// A request to `router` with `bearer` as its `Authorization` token, if any (apart from an
/// [`App`], for requests sent from tasks of their own).
async fn send_to(
    router: Router,
    method: Method,
    uri: &str,
    bearer: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(token) = bearer {
        b = b.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let r = match body {
        Some(text) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(text.to_string())),
        None => b.body(Body::empty()),
    };
    let res = router.oneshot(r.unwrap()).await.unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[track_caller]
fn assert_err(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(got.1["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

async fn audit_actions(app: &App) -> Vec<String> {
    let (s, list) = app.admin(Method::GET, "/audit", None).await;
    assert_eq!(s, StatusCode::OK);
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_are_checked_shown_to_pollers_cleared_and_audited() {
    let app = app();
    app.admin(Method::PUT, "/events/ev", Some(json!({"max_active": 1})))
        .await;
    app.join("ev").await;
    let (_, w) = app.join("ev").await;
    let path = "/events/ev/announcement";
    // Only the admin.
    let (s, _) = app
        .send(
            Method::POST,
            &format!("/api/v1/admin{path}"),
            false,
            Some(r#"{"message":{"en":"x"}}"#),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let long = "가".repeat(501);
    for bad in [
        json!({}),
        json!({"message": "plain"}),
        json!({"message": {}}),
        json!({"message": {"ko": "  "}}),
        json!({"message": {"en": long}}),
        json!({"message": {"en": "bell\u{7}"}}),
        json!({"message": {"fr": "bonjour"}}),
        // Not read as `{"ko": …, "en": …}` field by field.
        json!({"message": ["공지", "notice"]}),
        json!({"message": {"en": "x"}, "extra": 1}),
    ] {
        let got = app.admin(Method::POST, path, Some(bad.clone())).await;
        assert_err(&got, StatusCode::BAD_REQUEST, "INVALID_REQUEST");
    }
    let (s, b) = app
        .send(
            Method::POST,
            &format!("/api/v1/admin{path}"),
            true,
            Some("{not json"),
        )
        .await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("INVALID_REQUEST"))
    );
    assert_err(
        &app.admin(
            Method::POST,
            "/events/nope/announcement",
            Some(json!({"message": {"en": "x"}})),
        )
        .await,
        StatusCode::NOT_FOUND,
        "EVENT_NOT_FOUND",
    );
    // Nothing announced yet: no field.
    let (_, st) = app.status(&w["waiting_token"]).await;
    assert!(st.get("announcement").is_none(), "{st}");

    app.clock.advance(1500);
    let markup = "<b>Gate 3</b> opens\nat 10:00";
    let (s, a) = app
        .admin(
            Method::POST,
            path,
            Some(json!({"message": {"ko": "3번 게이트", "en": markup}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    app.settled("ev").await;
    let want =
        json!({"message": {"ko": "3번 게이트", "en": markup}, "at": "2023-11-14T22:13:21.5Z"});
    assert_eq!(a, json!({"event_id": "ev", "announcement": want}));
    // To pollers, on the public event, and in the admin's settings; kept as plain text.
    let (s, st) = app.status(&w["waiting_token"]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(st["announcement"], want);
    let (_, public) = app
        .send(Method::GET, "/api/v1/events/ev", false, None)
        .await;
    assert_eq!(public["announcement"], want);
    let (_, info) = app
        .send(Method::GET, "/api/v1/queue/info?event_id=ev", false, None)
        .await;
    assert_eq!(info["announcement"], want, "{info}");
    let (_, admin) = app.admin(Method::GET, "/events/ev", None).await;
    assert_eq!(admin["announcement"], want, "{admin}");
    // A settings update keeps it.
    app.admin(Method::PUT, "/events/ev", Some(json!({"name": "Spring"})))
        .await;
    app.settled("ev").await;
    assert_eq!(
        app.status(&w["waiting_token"]).await.1["announcement"],
        want
    );

    let (s, cleared) = app.admin(Method::DELETE, path, None).await;
    app.settled("ev").await;
    assert_eq!(
        (s, cleared),
        (
            StatusCode::OK,
            json!({"event_id": "ev", "announcement": null})
        )
    );
    let (_, st) = app.status(&w["waiting_token"]).await;
    assert!(st.get("announcement").is_none(), "{st}");
    let actions = audit_actions(&app).await;
    assert_eq!(actions, ["announce", "update", "announce", "create"]);
    // Each announce entry says what it replaced: the clearing names the message it removed.
    let (_, audit) = app.admin(Method::GET, "/audit", None).await;
    assert_eq!(
        audit[0]["changes"],
        json!([{"field": "announcement", "old": want["message"], "new": null}])
    );
    assert_eq!(
        audit[2]["changes"],
        json!([{"field": "announcement", "old": null, "new": want["message"]}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_call_closes_joins_and_places_with_a_reason() {
    let app = app();
    app.admin(Method::PUT, "/events/ev", Some(json!({"max_active": 1})))
        .await;
    let (_, first) = app.join("ev").await;
    assert_eq!(first["status"], "admitted");
    let (_, w) = app.join("ev").await;
    for bad in [
        json!({}),
        json!({"reason": "bored"}),
        json!({"reason": "sold_out", "message": {"en": "x".repeat(501)}}),
        json!({"reason": "sold_out", "extra": true}),
        // Checked like an announcement's: a message given needs a text.
        json!({"reason": "sold_out", "message": {}}),
        json!({"reason": "sold_out", "message": {"en": "   "}}),
        json!({"reason": "sold_out", "message": {"ko": "", "en": ""}}),
        json!({"reason": "sold_out", "message": ["Sold out"]}),
    ] {
        let got = app.admin(Method::POST, "/events/ev/end", Some(bad)).await;
        assert_err(&got, StatusCode::BAD_REQUEST, "INVALID_REQUEST");
    }
    // Refused input changed nothing.
    assert_eq!(app.join("ev").await.0, StatusCode::OK);
    assert_err(
        &app.admin(
            Method::POST,
            "/events/nope/end",
            Some(json!({"reason": "closed"})),
        )
        .await,
        StatusCode::NOT_FOUND,
        "EVENT_NOT_FOUND",
    );

    let (s, ended) = app
        .admin(
            Method::POST,
            "/events/ev/end",
            Some(json!({"reason": "sold_out", "message": {"ko": "매진되었습니다", "en": "Sold out"}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{ended}");
    app.settled("ev").await;
    let want = json!({"reason": "sold_out", "message": {"ko": "매진되었습니다", "en": "Sold out"},
                      "at": "2023-11-14T22:13:20Z"});
    assert_eq!(
        ended,
        json!({"event_id": "ev", "ended": want, "waiting": 2})
    );

    app.assert_join_ended("ev", "sold_out").await;
    app.assert_place_ended(&w["waiting_token"], "sold_out")
        .await;
    // `heartbeat` and `enter` say why too (API.md: "`status`, `heartbeat`, `enter` and the
    // live endpoints").
    let body = json!({"waiting_token": w["waiting_token"]}).to_string();
    for path in ["/api/v1/queue/heartbeat", "/api/v1/queue/enter"] {
        let gone = app.send(Method::POST, path, false, Some(&body)).await;
        assert_err(&gone, StatusCode::NOT_FOUND, "TOKEN_NOT_FOUND");
        assert_eq!(gone.1["error"]["reason"], "sold_out", "{path}");
    }
    // The admitted place may still enter.
    let body = json!({"waiting_token": first["waiting_token"]}).to_string();
    let (s, _) = app
        .send(Method::POST, "/api/v1/queue/enter", false, Some(&body))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, info) = app
        .send(Method::GET, "/api/v1/queue/info?event_id=ev", false, None)
        .await;
    assert_eq!(info["ended"], want);
    let (_, admin) = app.admin(Method::GET, "/events/ev", None).await;
    assert_eq!(admin["ended"], want);
    assert_eq!(audit_actions(&app).await[0], "end");
    let (_, audit) = app.admin(Method::GET, "/audit", None).await;
    assert_eq!(
        audit[0]["changes"],
        json!([{"field": "ended", "old": null, "new": want}])
    );
    // Called again, the entry names the end it replaced.
    app.end("ev", "cancelled").await;
    let (_, audit) = app.admin(Method::GET, "/audit", None).await;
    assert_eq!(audit[0]["changes"][0]["old"], want);
    assert_eq!(audit[0]["changes"][0]["new"]["reason"], "cancelled");

    // An event that has not ended answers the same codes without a reason.
    app.admin(
        Method::PUT,
        "/events/open",
        Some(json!({"accept_joins": false})),
    )
    .await;
    let closed = app.join("open").await;
    assert_err(&closed, StatusCode::CONFLICT, "EVENT_CLOSED");
    assert!(closed.1["error"].get("reason").is_none(), "{}", closed.1);
    // The store sweeps the places in the background; a left place has no reason either.
    app.store.tick("ev", app.clock.now()).await.unwrap();
    assert_eq!(
        app.admin(Method::GET, "/events/ev", None).await.1["waiting"],
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_at_is_checked_and_ends_the_sale_on_time() {
    let app = app();
    for bad in [
        json!("tomorrow"),
        json!("2023-11-14"),
        json!(1700000000),
        json!("1969-01-01T00:00:00Z"),
        // Year 10000 in UTC: no answer could write it back.
        json!("9999-12-31T23:00:00-01:00"),
    ] {
        let got = app
            .admin(Method::PUT, "/events/ev", Some(json!({"closes_at": bad})))
            .await;
        assert_err(&got, StatusCode::BAD_REQUEST, "INVALID_REQUEST");
    }
    // Refused, nothing was made: the event is not there.
    let (s, _) = app
        .send(Method::GET, "/api/v1/events/ev", false, None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, put) = app
        .admin(
            Method::PUT,
            "/events/ev",
            Some(json!({"closes_at": "2023-11-15T07:13:30+09:00", "max_active": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{put}");
    // Answered in UTC.
    assert_eq!(put["closes_at"], "2023-11-14T22:13:30Z");
    let (_, public) = app
        .send(Method::GET, "/api/v1/events/ev", false, None)
        .await;
    assert_eq!(
        (&public["closes_at"], &public["ended"]),
        (&json!("2023-11-14T22:13:30Z"), &Value::Null)
    );
    app.join("ev").await;
    let (_, w) = app.join("ev").await;
    assert_eq!(w["status"], "waiting");
    app.clock.advance(10_000);
    app.assert_join_ended("ev", "closed").await;
    app.assert_place_ended(&w["waiting_token"], "closed").await;
    let (_, public) = app
        .send(Method::GET, "/api/v1/events/ev", false, None)
        .await;
    assert_eq!(
        public["ended"],
        json!({"reason": "closed", "message": null, "at": "2023-11-14T22:13:30Z"})
    );
    // Cleared, joins are taken again: once the sweep has removed the places the close
    // ended (until then the change is refused, so that none of them waits again).
    let mut put = Value::Null;
    for _ in 0..400 {
        let (s, body) = app
            .admin(Method::PUT, "/events/ev", Some(json!({"closes_at": null})))
            .await;
        if s == StatusCode::OK {
            put = body;
            break;
        }
        assert_err(
            &(s, body.clone()),
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
        );
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("closes_at"));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(put["closes_at"], Value::Null, "never reopened");
    let gone = app.status(&w["waiting_token"]).await;
    assert_err(&gone, StatusCode::NOT_FOUND, "TOKEN_NOT_FOUND");
    assert_eq!(app.join("ev").await.0, StatusCode::OK);
}

/// An end called after `closes_at` was reached keeps the moment the places ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_after_the_close_keeps_its_moment() {
    let app = app();
    let closes = json!({"closes_at": "2023-11-14T22:13:30Z"});
    assert_eq!(
        app.admin(Method::PUT, "/events/ev", Some(closes)).await.0,
        StatusCode::OK
    );
    // 2 s after the close.
    app.clock.advance(12_000);
    let ended = app.end("ev", "sold_out").await;
    assert_eq!(
        ended["ended"],
        json!({"reason": "sold_out", "message": null, "at": "2023-11-14T22:13:30Z"})
    );
}

/// The node's copy of the settings may not know of the end yet (its change notice is on
/// its way: on Redis from the node that ended the sale): the refusals still carry the
/// reason, from the end on. Here the notice never comes (no background tasks), and the
/// catalog read its copy just before the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reason_is_given_before_the_catalog_learns_of_the_end() {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let clock = Clock::manual(T0);
    let state = AppState::new(
        store.clone(),
        &SigningKey::from_bytes(&[7; 32]),
        ADMIN,
        clock.clone(),
    )
    .unwrap();
    let app = App {
        router: router(state.clone()),
        _tasks: Tasks::default(),
        state,
        clock,
        store,
    };
    app.admin(Method::PUT, "/events/ev", Some(json!({"max_active": 1})))
        .await;
    app.join("ev").await;
    let (_, w) = app.join("ev").await;
    assert_eq!(w["status"], "waiting");
    // The catalog holds the running sale's settings (a join reads them).
    assert!(app
        .state
        .events
        .config("ev", app.clock.now())
        .await
        .unwrap()
        .sale_ended(app.clock.now())
        .is_none());
    app.end("ev", "sold_out").await;
    app.assert_place_ended(&w["waiting_token"], "sold_out")
        .await;
    app.assert_join_ended("ev", "sold_out").await;
}

/// Two nodes on one store whose clocks read alike until the first one's moves `skew` ms
/// ahead (a node's scheduler ticks the events with its clock: so, not before the places
/// wait).
async fn skewed_nodes_see_one_end(ahead: App, behind: App, skew: Millis) {
    let t0 = behind.clock.now();
    assert_eq!(ahead.clock.now(), t0);
    let closes = t0 + skew / 2;
    let put = json!({"closes_at": format_rfc3339(closes), "max_active": 1});
    assert_eq!(
        behind.admin(Method::PUT, "/events/ev", Some(put)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        behind
            .admin(Method::PUT, "/events/ev2", Some(json!({"max_active": 1})))
            .await
            .0,
        StatusCode::OK
    );
    let mut waiting = Vec::new();
    for ev in ["ev", "ev2"] {
        behind.join(ev).await;
        let (_, w) = behind.join(ev).await;
        assert_eq!(w["status"], "waiting", "{w}");
        waiting.push(w);
    }
    ahead.clock.advance(skew);
    // The node ahead finds the sale over by closes_at: the store records that it ended.
    ahead
        .assert_place_ended(&waiting[0]["waiting_token"], "closed")
        .await;
    // The node behind, whose clock has not reached closes_at, answers as the store does
    // (the place is over, joins are refused), and so with the reason.
    behind
        .assert_place_ended(&waiting[0]["waiting_token"], "closed")
        .await;
    behind.assert_join_ended("ev", "closed").await;
    // An end called there keeps the moment the places ended, not its own clock's.
    let ended = behind.end("ev", "sold_out").await;
    assert_eq!(ended["ended"]["at"], format_rfc3339(closes), "{ended}");

    // An end by the call on the node ahead: that its `at` is ahead of the other node's
    // clock does not matter.
    ahead.end("ev2", "cancelled").await;
    behind
        .assert_place_ended(&waiting[1]["waiting_token"], "cancelled")
        .await;
    behind.assert_join_ended("ev2", "cancelled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_behind_gives_the_reason_of_an_end_seen_elsewhere() {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let ahead = node(store.clone(), Clock::manual(T0));
    let behind = node(store, Clock::manual(T0));
    skewed_nodes_see_one_end(ahead, behind, 20_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_clock_is_behind_gives_the_reason_of_an_end_seen_elsewhere_on_redis() {
    let prefix = support::redis::unique_prefix();
    let redis = || -> Arc<dyn Store> {
        let options = RedisOptions {
            key_prefix: prefix.clone(),
            ..RedisOptions::default()
        };
        Arc::new(RedisStore::new(&support::redis::shared().url(), options).unwrap())
    };
    // Whole seconds, as closes_at is written.
    let t0 = waitroom::clock::system_now() / 1000 * 1000;
    let ahead = node(redis(), Clock::manual(t0));
    let behind = node(redis(), Clock::manual(t0));
    skewed_nodes_see_one_end(ahead, behind, 20_000).await;
}

/// A session busy with its seats is not idle: `POST`, `GET` and `DELETE /session/holds` each
/// renew its idle deadline as a heartbeat does (API.md, "Seat holds and session extension"),
/// so calls closer together than `session_idle_sec` keep it however long they go on; once
/// they stop, it ends idle. (The clock starts at the real time: access tokens are checked
/// against it.)
async fn hold_calls_keep_the_session(app: App) {
    let put = json!({"max_active": 2, "session_idle_sec": 10, "session_max_sec": 600});
    assert_eq!(
        app.admin(Method::PUT, "/events/hs", Some(put)).await.0,
        StatusCode::OK
    );
    let items = json!({"items": ["A-1", "A-2"]});
    assert_eq!(
        app.admin(Method::PUT, "/events/hs/inventory", Some(items))
            .await
            .0,
        StatusCode::OK
    );
    let (_, w) = app.join("hs").await;
    let enter = json!({"waiting_token": w["waiting_token"]}).to_string();
    let (s, e) = app
        .send(Method::POST, "/api/v1/queue/enter", false, Some(&enter))
        .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let jwt = e["access_token"].as_str().unwrap();
    let holds = "/api/v1/session/holds";
    let one = json!({"items": ["A-1"]}).to_string();
    let calls = [
        (Method::POST, Some(one.as_str())),
        (Method::GET, None),
        (Method::DELETE, Some(one.as_str())),
        (Method::GET, None),
        (Method::POST, Some(one.as_str())),
        (Method::DELETE, None),
    ];
    for (i, (method, body)) in calls.into_iter().enumerate() {
        app.clock.advance(8_000);
        let (s, b) = app.send_as(method.clone(), holds, Some(jwt), body).await;
        assert_eq!(s, StatusCode::OK, "{method} {} s in: {b}", 8 * (i + 1));
    }
    app.clock.advance(10_000);
    let gone = app.send_as(Method::GET, holds, Some(jwt), None).await;
    assert_err(&gone, StatusCode::UNAUTHORIZED, "ACCESS_DENIED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_calls_keep_the_session_alive() {
    let clock = Clock::manual(waitroom::clock::system_now());
    hold_calls_keep_the_session(node(Arc::new(EmbeddedStore::new()), clock)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_calls_keep_the_session_alive_on_redis() {
    let options = RedisOptions {
        key_prefix: support::redis::unique_prefix(),
        ..RedisOptions::default()
    };
    let store = Arc::new(RedisStore::new(&support::redis::shared().url(), options).unwrap());
    let clock = Clock::manual(waitroom::clock::system_now());
    hold_calls_keep_the_session(node(store, clock)).await;
}

/// The end's `waiting` is the places the end itself ended, counted in the step that ends
/// them (API.md: "the places waiting just before the end"): joins racing the call either
/// got in before it, are counted and then answer the end's reason, or are refused after
/// it. Its audit entry counts the same. Many joins around the call, over several events,
/// so that a count read apart from the end would miss some.
async fn the_end_counts_the_places_it_ends(app: App) {
    const TRIALS: usize = 10;
    const JOINS: usize = 200;
    for trial in 0..TRIALS {
        let ev = format!("race{trial}");
        let put = json!({"max_active": 1});
        assert_eq!(
            app.admin(Method::PUT, &format!("/events/{ev}"), Some(put))
                .await
                .0,
            StatusCode::OK
        );
        // The one slot is taken: every later join waits.
        assert_eq!(app.join(&ev).await.1["status"], "admitted");
        let join = json!({"event_id": ev}).to_string();
        let mut joins = Vec::new();
        let mut end = None;
        for i in 0..JOINS {
            if i == JOINS / 2 {
                let (router, uri) = (app.router.clone(), format!("/api/v1/admin/events/{ev}/end"));
                end = Some(tokio::spawn(async move {
                    let body = json!({"reason": "sold_out"}).to_string();
                    send_to(router, Method::POST, &uri, Some(ADMIN), Some(&body)).await
                }));
            }
            let (router, join) = (app.router.clone(), join.clone());
            joins.push(tokio::spawn(async move {
                send_to(
                    router,
                    Method::POST,
                    "/api/v1/queue/join",
                    None,
                    Some(&join),
                )
                .await
            }));
        }
        let (s, ended) = end.unwrap().await.unwrap();
        assert_eq!(s, StatusCode::OK, "{ended}");
        let mut got_in = Vec::new();
        for j in joins {
            let (s, b) = j.await.unwrap();
            if s == StatusCode::OK {
                assert_eq!(b["status"], "waiting", "{b}");
                got_in.push(b["waiting_token"].clone());
            } else {
                assert_err(&(s, b.clone()), StatusCode::CONFLICT, "EVENT_CLOSED");
                assert_eq!(b["error"]["reason"], "sold_out", "{b}");
            }
        }
        for token in &got_in {
            app.assert_place_ended(token, "sold_out").await;
        }
        assert_eq!(
            ended["waiting"],
            got_in.len(),
            "trial {trial}: the end answered {} waiting, and ended {} joins that got in",
            ended["waiting"],
            got_in.len()
        );
        let (_, audit) = app.admin(Method::GET, "/audit", None).await;
        let entry = audit
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["action"] == "end" && e["event_id"] == ev.as_str())
            .unwrap();
        assert_eq!(entry["count"], got_in.len(), "trial {trial}: {entry}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_end_counts_the_joins_it_ends() {
    the_end_counts_the_places_it_ends(app()).await;
}

/// On the durable embedded store every step waits for its sync, so joins land between any
/// two steps of one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_end_counts_the_joins_it_ends_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), Durability::Sync, T0).unwrap();
    the_end_counts_the_places_it_ends(node(Arc::new(store), Clock::manual(T0))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_end_counts_the_joins_it_ends_on_redis() {
    let options = RedisOptions {
        key_prefix: support::redis::unique_prefix(),
        ..RedisOptions::default()
    };
    let store = Arc::new(RedisStore::new(&support::redis::shared().url(), options).unwrap());
    the_end_counts_the_places_it_ends(node(store, Clock::manual(T0))).await;
}

/// Shoppers opening the seat map at once share reads of the inventory: a burst of 24 made
/// 24 whole reads back to back (on Redis, one script each that held every event, whose
/// operations then timed out: `503`). Each still sees its own holds as `mine`, and a hold
/// made before a map was asked for is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_seat_maps_shares_inventory_reads() {
    use waitroom::store::fault::{Fault, FaultStore, Op};
    let faults = Arc::new(FaultStore::embedded());
    let clock = Clock::manual(waitroom::clock::system_now());
    let app = node(faults.clone(), clock);
    let put = json!({"max_active": 30, "session_max_sec": 600});
    assert_eq!(
        app.admin(Method::PUT, "/events/hall", Some(put)).await.0,
        StatusCode::OK
    );
    let ids: Vec<String> = (0..24).map(|i| format!("A-{i}")).collect();
    let items = json!({ "items": ids });
    let put = app
        .admin(Method::PUT, "/events/hall/inventory", Some(items))
        .await;
    assert_eq!(put.0, StatusCode::OK, "{}", put.1);
    let mut jwts = Vec::new();
    for i in 0..24 {
        let (_, w) = app.join("hall").await;
        let enter = json!({"waiting_token": w["waiting_token"]}).to_string();
        let (s, e) = app
            .send(Method::POST, "/api/v1/queue/enter", false, Some(&enter))
            .await;
        assert_eq!(s, StatusCode::OK, "{e}");
        let jwt = e["access_token"].as_str().unwrap().to_string();
        let hold = json!({ "items": [format!("A-{i}")] }).to_string();
        let (s, h) = app
            .send_as(
                Method::POST,
                "/api/v1/session/holds",
                Some(&jwt),
                Some(&hold),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{h}");
        jwts.push(jwt);
    }
    faults.inject(
        Op::Inventory,
        Fault::Delay(std::time::Duration::from_millis(200)),
    );
    faults.forget_calls();
    let maps: Vec<_> = jwts
        .iter()
        .map(|jwt| {
            let (router, jwt) = (app.router.clone(), jwt.clone());
            tokio::spawn(async move {
                send_to(
                    router,
                    Method::GET,
                    "/api/v1/session/holds",
                    Some(&jwt),
                    None,
                )
                .await
            })
        })
        .collect();
    for (i, m) in maps.into_iter().enumerate() {
        let (s, map) = m.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{map}");
        let mine: Vec<&Value> = map["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|it| it["state"] == "mine")
            .collect();
        assert_eq!(mine.len(), 1, "{map}");
        assert_eq!(mine[0]["id"], format!("A-{i}"));
        assert_eq!(map["holds"][0]["item"], format!("A-{i}"));
    }
    let reads = faults.calls(Op::Inventory);
    assert!(reads <= 3, "{reads} reads for 24 maps asked at once");
}
