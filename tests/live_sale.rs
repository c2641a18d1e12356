//! The sale's live messages (`core::lifecycle`): an announcement and the end of the sale
//! reach followers on every node (two `waitroom` processes on one Redis, the change made on
//! the other node), and `closes_at` ends followers on time with no call at all.

mod support;

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::binary::{call, Nodes};
use support::redis::RedisServer;

const ADMIN: &str = "live-sale-admin";

use support::nodes_ws::{join, next, ok, token, ws_connect, Ws};

/// The first message that is not a `queue-update`.
async fn next_other(ws: &mut Ws, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = next(ws, left).await.expect("the socket is open");
        if v["type"] != "queue-update" {
            return v;
        }
    }
}

#[tokio::test]
async fn announcements_and_the_end_reach_sockets_on_another_node() {
    let redis = RedisServer::start();
    let nodes = Nodes::new(ADMIN);
    let a = nodes.start(&redis.url());
    let b = nodes.start(&redis.url());
    let admin = |path: &str| b.url(&format!("/api/v1/admin/events/ev{path}"));
    ok(
        Method::PUT,
        admin(""),
        Some(ADMIN),
        Some(json!({"max_active": 1, "ready_ttl_sec": 60, "waiting_idle_sec": 60})),
    )
    .await;
    let holder = join(&b, "ev", "holder").await;
    assert_eq!(holder["status"], "admitted", "{holder}");
    let x = token(&join(&a, "ev", "x").await);
    let y = token(&join(&a, "ev", "y").await);
    let mut ws_x = ws_connect(&a, &x).await;
    let mut ws_y = ws_connect(&a, &y).await;
    for ws in [&mut ws_x, &mut ws_y] {
        let first = next(ws, Duration::from_secs(5)).await.unwrap();
        assert_eq!(first["type"], "queue-update", "{first}");
    }

    // Posted on node B: both sockets on node A hear it, as text (markup stays text).
    let message = json!({"ko": "<i>3번</i> 게이트로 오세요", "en": "Come to <i>gate 3</i>"});
    let posted = ok(
        Method::POST,
        admin("/announcement"),
        Some(ADMIN),
        Some(json!({ "message": message })),
    )
    .await;
    let at = posted["announcement"]["at"].clone();
    for ws in [&mut ws_x, &mut ws_y] {
        let got = next_other(ws, Duration::from_secs(3)).await;
        assert_eq!(
            got,
            json!({"type": "announcement", "message": message, "at": at})
        );
    }
    // A socket that connects later gets it on connect; a poller in `status`.
    let z = token(&join(&a, "ev", "z").await);
    let mut ws_z = ws_connect(&a, &z).await;
    let got = next_other(&mut ws_z, Duration::from_secs(3)).await;
    assert_eq!(got["type"], "announcement", "{got}");
    let (_, st) = call(
        Method::GET,
        &a.url(&format!("/api/v1/queue/status?token={z}")),
        None,
        None,
    )
    .await;
    assert_eq!(st["announcement"]["message"], message, "{st}");
    // Cleared: `message: null`.
    ok(Method::DELETE, admin("/announcement"), Some(ADMIN), None).await;
    for ws in [&mut ws_x, &mut ws_y, &mut ws_z] {
        let got = next_other(ws, Duration::from_secs(3)).await;
        assert_eq!(
            got,
            json!({"type": "announcement", "message": null, "at": null})
        );
    }

    // Ended on node B: every waiting socket on node A says why, and closes.
    let t = Instant::now();
    let end = json!({"reason": "sold_out", "message": {"ko": "매진", "en": "Sold out"}});
    ok(Method::POST, admin("/end"), Some(ADMIN), Some(end)).await;
    for ws in [&mut ws_x, &mut ws_y, &mut ws_z] {
        let got = next_other(ws, Duration::from_secs(3)).await;
        assert_eq!(
            got,
            json!({"type": "ended", "reason": "sold_out",
                   "message": {"ko": "매진", "en": "Sold out"}})
        );
        assert!(next(ws, Duration::from_secs(3)).await.is_none(), "closed");
    }
    eprintln!("ended across nodes within {:?}", t.elapsed());
    // Afterwards: the reason on both codes, on both nodes; the admitted place may enter.
    for node in [&a, &b] {
        let (st, v) = call(
            Method::GET,
            &node.url(&format!("/api/v1/queue/status?token={x}")),
            None,
            None,
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
        assert_eq!(
            (&v["error"]["code"], &v["error"]["reason"]),
            (&json!("TOKEN_NOT_FOUND"), &json!("sold_out"))
        );
        let (st, v) = call(
            Method::POST,
            &node.url("/api/v1/queue/join"),
            None,
            Some(json!({"event_id": "ev"})),
        )
        .await;
        assert_eq!(st, StatusCode::CONFLICT, "{v}");
        assert_eq!(v["error"]["reason"], "sold_out", "{v}");
    }
    let (st, _) = call(
        Method::POST,
        &a.url("/api/v1/queue/enter"),
        None,
        Some(json!({"waiting_token": token(&holder)})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    // The scheduler removed the places.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = ok(Method::GET, admin(""), Some(ADMIN), None).await;
        if v["waiting"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "still waiting: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `closes_at` with no call: the scheduler wakes for it and the socket is told.
#[tokio::test]
async fn closes_at_ends_sockets_on_time() {
    let redis = RedisServer::start();
    let nodes = Nodes::new(ADMIN);
    let a = nodes.start(&redis.url());
    let b = nodes.start(&redis.url());
    let closes = std::time::SystemTime::now() + Duration::from_secs(2);
    let ms = closes
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let closes_at = waitroom::core::lifecycle::format_rfc3339(ms);
    ok(
        Method::PUT,
        b.url("/api/v1/admin/events/ev"),
        Some(ADMIN),
        Some(json!({"max_active": 1, "ready_ttl_sec": 60, "closes_at": closes_at})),
    )
    .await;
    join(&b, "ev", "holder").await;
    let x = token(&join(&a, "ev", "x").await);
    let mut ws = ws_connect(&a, &x).await;
    let got = next_other(&mut ws, Duration::from_secs(6)).await;
    assert_eq!(
        got,
        json!({"type": "ended", "reason": "closed", "message": null})
    );
    let late = std::time::SystemTime::now()
        .duration_since(closes)
        .unwrap_or_default();
    eprintln!("ended {late:?} after closes_at");
    assert!(
        next(&mut ws, Duration::from_secs(3)).await.is_none(),
        "closed"
    );
}
