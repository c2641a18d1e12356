//! Live updates across nodes: two `waitroom` processes on one Redis, a WebSocket open on one
//! node, and the change made on the other. The pushes must still arrive, through the Redis
//! backend's notice relay (pub/sub): the admission (`queue-ready`), position changes, a
//! pause (`event-state`), and the end of the place.
//!
//! Each test starts its own `redis-server` and nodes (tests/support), and stops them all at
//! the end.

mod support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use support::binary::Nodes;
use support::redis::RedisServer;

const ADMIN: &str = "live-multinode-admin";

use support::nodes_ws::{join, next, ok, token, ws_connect, Ws};

async fn until(ws: &mut Ws, within: Duration, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = next(ws, left).await.expect("the socket is open");
        if pred(&v) {
            return v;
        }
    }
}

#[tokio::test]
async fn pushes_reach_a_socket_on_another_node() {
    let redis = RedisServer::start();
    let nodes = Nodes::new(ADMIN);
    let a = nodes.start(&redis.url());
    let b = nodes.start(&redis.url());

    ok(
        Method::PUT,
        a.url("/api/v1/admin/events/ev"),
        Some(ADMIN),
        Some(json!({"max_active": 1, "ready_ttl_sec": 60, "waiting_idle_sec": 60})),
    )
    .await;
    let holder = join(&b, "ev", "holder").await;
    assert_eq!(holder["status"], "admitted", "{holder}");
    let x = token(&join(&a, "ev", "x").await);
    let y = token(&join(&a, "ev", "y").await);

    // Both sockets on node A.
    let mut ws_x = ws_connect(&a, &x).await;
    let mut ws_y = ws_connect(&a, &y).await;
    assert_eq!(
        next(&mut ws_x, Duration::from_secs(5)).await.unwrap()["position"],
        1
    );
    assert_eq!(
        next(&mut ws_y, Duration::from_secs(5)).await.unwrap()["position"],
        2
    );

    // A join on node B behind them: A's sockets hear that the line grew.
    join(&b, "ev", "z").await;
    until(&mut ws_y, Duration::from_secs(3), |v| {
        v["queue_length"] == 3
    })
    .await;

    // The holder leaves through node B, which admits x there: x's socket on node A gets
    // its queue-ready, and y moves up.
    let t = Instant::now();
    ok(
        Method::POST,
        b.url("/api/v1/queue/leave"),
        None,
        Some(json!({"token": token(&holder)})),
    )
    .await;
    let ready = until(&mut ws_x, Duration::from_secs(3), |v| {
        v["type"] == "queue-ready"
    })
    .await;
    let took = t.elapsed();
    eprintln!("queue-ready across nodes {took:?} after the slot freed");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(ready["enter_within_sec"].as_u64().unwrap() >= 59, "{ready}");
    until(&mut ws_y, Duration::from_secs(3), |v| v["position"] == 1).await;

    // An operator pauses on node B: y's socket on node A is told at once.
    ok(
        Method::POST,
        b.url("/api/v1/admin/events/ev/pause"),
        Some(ADMIN),
        None,
    )
    .await;
    let state = until(&mut ws_y, Duration::from_secs(3), |v| {
        v["type"] == "event-state"
    })
    .await;
    assert_eq!(state["paused"], true, "{state}");

    // An operator clears the line on node B: y's socket on node A says so and closes.
    ok(
        Method::POST,
        b.url("/api/v1/admin/events/ev/clear"),
        Some(ADMIN),
        None,
    )
    .await;
    let gone = until(&mut ws_y, Duration::from_secs(3), |v| {
        v["type"] != "queue-update"
    })
    .await;
    assert_eq!(gone, json!({"type": "queue-cleared"}));
    assert!(next(&mut ws_y, Duration::from_secs(3)).await.is_none());
}
