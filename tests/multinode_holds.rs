//! Seat holds across real nodes on one Redis: 64 clients race for 100 seats through two
//! `waitroom` processes at once. No seat is ever held by two sessions, and none is sold
//! twice: the holds are one Lua transition each, whichever node sends them.

mod support;

use std::collections::{HashMap, HashSet};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::binary::{call, Nodes, Server};
use support::redis::RedisServer;

const ADMIN: &str = "multinode-admin";
const CLIENTS: usize = 64;
const SEATS: usize = 100;
const ATTEMPTS: usize = 12;

async fn ok(node: &Server, method: Method, path: &str, token: &str, body: Option<Value>) -> Value {
    let (s, b) = call(method, &node.url(path), Some(token), body).await;
    assert_eq!(s, StatusCode::OK, "{path}: {b}");
    b
}

/// A client's session: its access token and its place (as the admin's inventory names it).
async fn session(node: &Server, i: usize) -> (String, u64) {
    let (s, j) = call(
        Method::POST,
        &node.url("/api/v1/queue/join"),
        None,
        Some(json!({"event_id": "race", "user_id": format!("u{i}")})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{j}");
    let (s, e) = call(
        Method::POST,
        &node.url("/api/v1/queue/enter"),
        None,
        Some(json!({"waiting_token": j["waiting_token"]})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let key = waitroom::tokens::parse_session_id(e["session_id"].as_str().unwrap()).unwrap();
    (e["access_token"].as_str().unwrap().to_string(), key.seq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_racing_for_seats_on_two_nodes_never_share_one() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let nodes: Vec<Server> = (0..2).map(|_| c.start(&redis.url())).collect();
    let settings = json!({"max_active": CLIENTS, "max_holds_per_session": 4});
    ok(
        &nodes[0],
        Method::PUT,
        "/api/v1/admin/events/race",
        ADMIN,
        Some(settings),
    )
    .await;
    let seats: Vec<String> = (1..=SEATS).map(|i| format!("A-{i}")).collect();
    ok(
        &nodes[1],
        Method::PUT,
        "/api/v1/admin/events/race/inventory",
        ADMIN,
        Some(json!({"items": seats})),
    )
    .await;
    let mut sessions = Vec::new();
    for i in 0..CLIENTS {
        sessions.push(session(&nodes[i % 2], i).await);
    }
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();

    // Every client at once: pairs of seats from overlapping stretches of the hall, each
    // attempt through the other node, until it holds 4 or has tried 12 times.
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, (jwt, _))| {
            let (jwt, bases) = (jwt.clone(), bases.clone());
            tokio::spawn(async move {
                let mut won: Vec<Value> = Vec::new();
                let mut conflicts = 0;
                for k in 0..ATTEMPTS {
                    let a = (i * 3 + k * 7) % SEATS + 1;
                    let b = (i * 3 + k * 7 + 1) % SEATS + 1;
                    let url = format!("{}/api/v1/session/holds", bases[(i + k) % 2]);
                    let body = json!({"items": [format!("A-{a}"), format!("A-{b}")]});
                    let (s, r) = call(Method::POST, &url, Some(&jwt), Some(body)).await;
                    match s {
                        StatusCode::OK => won.push(r),
                        StatusCode::CONFLICT if r["error"]["code"] == "HOLD_CONFLICT" => {
                            conflicts += 1
                        }
                        StatusCode::CONFLICT if r["error"]["code"] == "TOO_MANY_HOLDS" => break,
                        other => panic!("hold answered {other}: {r}"),
                    }
                }
                (won, conflicts)
            })
        })
        .collect();
    // Nobody releases in this phase, so a seat in the answers of two clients would be a
    // double hold.
    let mut holder: HashMap<String, usize> = HashMap::new();
    let mut conflicts = 0;
    let mut double_holds = 0;
    for (i, t) in tasks.into_iter().enumerate() {
        let (won, c) = t.await.unwrap();
        conflicts += c;
        for answer in won {
            for h in answer["holds"].as_array().unwrap() {
                let item = h["item"].as_str().unwrap().to_string();
                if *holder.entry(item).or_insert(i) != i {
                    double_holds += 1;
                }
            }
        }
    }
    assert_eq!(double_holds, 0, "seats held by two sessions");
    assert!(
        conflicts > 0,
        "the clients never contended: the test proves nothing"
    );
    let inv = ok(
        &nodes[0],
        Method::GET,
        "/api/v1/admin/events/race/inventory",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(inv["held"], holder.len(), "{inv}");

    // Everyone buys at once, half through each node: each seat is sold to its one holder.
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, (jwt, _))| {
            let url = format!("{}/api/v1/session/complete", bases[i % 2]);
            let jwt = jwt.clone();
            tokio::spawn(async move { call(Method::POST, &url, Some(&jwt), None).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().0, StatusCode::OK);
    }
    let inv = ok(
        &nodes[1],
        Method::GET,
        "/api/v1/admin/events/race/inventory",
        ADMIN,
        None,
    )
    .await;
    let seq_of: Vec<u64> = sessions.iter().map(|s| s.1).collect();
    let mut sold = HashSet::new();
    for item in inv["items"].as_array().unwrap() {
        let id = item["id"].as_str().unwrap();
        if item["state"] == "sold" {
            assert!(sold.insert(id.to_string()), "{id} sold twice");
            let buyer = item["place"].as_u64().unwrap();
            assert_eq!(Some(&buyer), holder.get(id).map(|&i| &seq_of[i]), "{id}");
        } else {
            assert_eq!(item["state"], "available", "{item}");
            assert!(!holder.contains_key(id), "{id} was held but not sold");
        }
    }
    assert_eq!(
        (inv["sold"].as_u64(), inv["held"].as_u64()),
        (Some(sold.len() as u64), Some(0))
    );
    println!(
        "{CLIENTS} clients, {SEATS} seats, two nodes: {} seats held and sold, {conflicts} \
         HOLD_CONFLICT refusals, 0 double holds, 0 double sales",
        sold.len()
    );
}
