//! Crash tests of the durable embedded store through the real binary: many clients race
//! joins, leaves and entries; the process is killed with SIGKILL mid-stream and restarted
//! on the same data dir; every acknowledged change must be there, in order, and nothing
//! unacknowledged may be half-applied. A second round stops it with SIGTERM instead.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::binary::{call, Server};

const ADMIN: &str = "crash-admin";
const EVENT: &str = "sale";

fn start(dir: &std::path::Path, durability: &str) -> Server {
    let data = dir.join("data");
    Server::start(
        dir,
        &[
            "serve",
            "--durability",
            durability,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--admin-token",
            ADMIN,
            "--no-demo",
            // A race of many clients from one address: a load test.
            "--rate-limits",
            "off",
            "--max-connections-per-client",
            "100000",
        ],
        &[],
    )
}

/// What the clients were told, with when they asked and when they heard back.
#[derive(Default)]
struct Ledger {
    /// user → (token, sent, acked) for acknowledged joins.
    joins: HashMap<String, (String, Instant, Instant)>,
    /// Every user a join was sent for, acknowledged or not.
    sent: HashSet<String>,
    left: HashSet<String>,
    entered: HashSet<String>,
}

async fn request(
    client: &reqwest::Client,
    method: Method,
    url: String,
    body: Value,
) -> Option<(StatusCode, Value)> {
    let resp = client.request(method, url).json(&body).send().await.ok()?;
    let status = resp.status();
    let v = resp.json::<Value>().await.ok()?;
    Some((status, v))
}

/// Runs `clients` racing tasks against `base` until `stop` is set; each joins fresh users,
/// and now and then leaves or enters one of its own places.
async fn race(
    base: String,
    ledger: Arc<Mutex<Ledger>>,
    clients: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (client, base, ledger, stop) =
            (client.clone(), base.clone(), ledger.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine: Vec<(String, String)> = Vec::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                if i % 5 == 0 && !mine.is_empty() {
                    let (user, token) = mine.swap_remove(i % mine.len());
                    let r = request(
                        &client,
                        Method::POST,
                        format!("{base}/api/v1/queue/leave"),
                        json!({"token": token}),
                    )
                    .await;
                    if let Some((StatusCode::OK, v)) = r {
                        assert_eq!(v["removed"], true, "a live place of ours was already gone");
                        ledger.lock().left.insert(user);
                    }
                    continue;
                }
                if i % 7 == 0 && !mine.is_empty() {
                    let (user, token) = mine[i % mine.len()].clone();
                    let r = request(
                        &client,
                        Method::POST,
                        format!("{base}/api/v1/queue/enter"),
                        json!({"waiting_token": token}),
                    )
                    .await;
                    if let Some((StatusCode::OK, _)) = r {
                        ledger.lock().entered.insert(user);
                    }
                    continue;
                }
                let user = format!("c{c}-u{i}");
                ledger.lock().sent.insert(user.clone());
                let sent = Instant::now();
                let r = request(
                    &client,
                    Method::POST,
                    format!("{base}/api/v1/queue/join"),
                    json!({"event_id": EVENT, "user_id": user}),
                )
                .await;
                if let Some((StatusCode::OK, v)) = r {
                    let token = v["waiting_token"].as_str().unwrap().to_string();
                    ledger
                        .lock()
                        .joins
                        .insert(user.clone(), (token.clone(), sent, Instant::now()));
                    mine.push((user, token));
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Checks the restarted server against the ledger.
async fn verify(s: &Server, ledger: &Ledger) {
    let mut positions: Vec<(u64, Instant, Instant)> = Vec::new();
    for (user, (token, sent, acked)) in &ledger.joins {
        let (st, v) = call(
            Method::GET,
            &s.url(&format!("/api/v1/queue/status?token={token}")),
            None,
            None,
        )
        .await;
        if ledger.left.contains(user) {
            assert_eq!(
                st,
                StatusCode::NOT_FOUND,
                "{user} left (acknowledged) but is back: {v}"
            );
            assert_eq!(v["error"]["code"], "TOKEN_NOT_FOUND");
            continue;
        }
        // Leaves that were sent but not acknowledged may or may not have happened.
        if st == StatusCode::NOT_FOUND {
            assert_eq!(v["error"]["code"], "TOKEN_NOT_FOUND", "{user}: {v}");
            continue;
        }
        assert_eq!(st, StatusCode::OK, "acknowledged join of {user} lost: {v}");
        if ledger.entered.contains(user) {
            assert_eq!(
                v["status"], "active",
                "acknowledged entry of {user} lost: {v}"
            );
        }
        if v["status"] == "waiting" {
            positions.push((v["position"].as_u64().unwrap(), *sent, *acked));
        }
    }
    // In order: a join acknowledged before another was sent stands ahead of it. So for
    // every place `a`, each place `b` ahead of it was sent before `a` was acknowledged.
    positions.sort_by_key(|p| p.0);
    for (i, a) in positions.iter().enumerate() {
        for b in &positions[..i] {
            assert!(
                b.1 <= a.2,
                "a join acknowledged earlier stands behind one sent after that"
            );
        }
    }
    // Nothing half-applied: the queue head lists each user once, only users we sent, and
    // the figures agree with it.
    let (st, head) = call(
        Method::GET,
        &s.url(&format!("/api/v1/admin/events/{EVENT}/queue?limit=1000")),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let rows = head.as_array().unwrap();
    let mut seen = HashSet::new();
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["position"].as_u64(), Some(i as u64 + 1));
        let u = r["user_id"].as_str().unwrap().to_string();
        assert!(
            ledger.sent.contains(&u),
            "a place for a user nobody sent: {u}"
        );
        assert!(!ledger.left.contains(&u), "{u} left but is still in line");
        assert!(seen.insert(u), "a user holds two places");
    }
    let (_, ev) = call(
        Method::GET,
        &s.url(&format!("/api/v1/admin/events/{EVENT}")),
        Some(ADMIN),
        None,
    )
    .await;
    if rows.len() < 1000 {
        assert_eq!(ev["waiting"].as_u64(), Some(rows.len() as u64), "{ev}");
    }
    let held = ev["admitted"].as_u64().unwrap() + ev["active"].as_u64().unwrap();
    assert!(held <= 30, "over capacity after restart: {ev}");
}

async fn round(kill: bool, durability: &str) {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), durability);
    let (st, _) = call(
        Method::PUT,
        &s.url(&format!("/api/v1/admin/events/{EVENT}")),
        Some(ADMIN),
        Some(
            json!({"max_active": 30, "waiting_idle_sec": 3600, "ready_ttl_sec": 3600,
                    "session_idle_sec": 3600, "session_max_sec": 7200}),
        ),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racing = tokio::spawn(race(s.base.clone(), ledger.clone(), 48, stop.clone()));
    // Let the race run, then stop the server in the middle of it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if kill {
        s.kill();
    } else {
        let status = s.terminate(Duration::from_secs(10));
        assert!(status.success(), "SIGTERM must exit 0, got {status:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    racing.await.unwrap();
    let ledger = std::mem::take(&mut *ledger.lock());
    assert!(
        ledger.joins.len() > 100,
        "the race acknowledged only {} joins",
        ledger.joins.len()
    );
    assert!(!ledger.left.is_empty() && !ledger.entered.is_empty());
    let s2 = start(dir.path(), durability);
    verify(&s2, &ledger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_mid_stream_loses_nothing_acknowledged() {
    round(true, "sync").await;
}

/// `relaxed` answers before the fsync but only once the change is with the OS, so killing
/// the process (not the machine) loses nothing acknowledged either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relaxed_sigkill_mid_stream_loses_nothing_acknowledged() {
    round(true, "relaxed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_mid_stream_flushes_and_exits_zero() {
    round(false, "sync").await;
}
