//! Races against a real server: hundreds of simultaneous joins (many of the same user),
//! then leaves, entries and completions racing more joins, over real HTTP connections.
//! After each race the queue must still keep its promises: one place per user, admitted +
//! active never above capacity (watched *during* the race by an admin poller, and counted
//! after it), waiting positions exactly 1..N without gaps or duplicates, `queue_length` = N,
//! and every free slot handed to a waiting place.
//!
//! The server runs in-process through `waitroom::server::run` on a port-0 listener, the way
//! an embedding program would start it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{oneshot, Barrier};
use tokio::task::JoinSet;
use waitroom::config::Settings;

const ADMIN: &str = "race-admin";
const EVENT: &str = "race";
/// floor(20 × 1.5).
const CAPACITY: u64 = 30;

struct TestServer {
    base: String,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    async fn start() -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            data_dir: dir.path().to_path_buf(),
            admin_token: Some(ADMIN.into()),
            demo: false,
            // Hundreds of clients from one address: a load test, as `--rate-limits off`.
            rate_limits: waitroom::config::RateLimitSettings {
                enabled: false,
                ..Default::default()
            },
            connections: waitroom::config::ConnectionSettings {
                max_connections_per_client: 100_000,
                ..Default::default()
            },
            ..Settings::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let done = tokio::spawn(waitroom::server::run(settings, listener, async move {
            let _ = rx.await;
        }));
        TestServer {
            base,
            stop: Some(tx),
            done,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.done)
            .await
            .expect("server stops")
            .unwrap()
            .expect("clean shutdown");
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn json_of(resp: reqwest::Response) -> (StatusCode, Value) {
    let st = resp.status();
    let text = resp.text().await.unwrap();
    (st, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A place as the test knows it.
#[derive(Clone, Debug)]
struct Place {
    user: Option<String>,
    token: String,
}

/// Joins `user` (or anonymously) and answers the place.
async fn join(c: &Client, base: &str, user: Option<String>) -> Place {
    let mut body = json!({ "event_id": EVENT });
    if let Some(u) = &user {
        body["user_id"] = json!(u);
    }
    // With the server key: these races are about one place per proven user.
    let resp = c
        .post(format!("{base}/api/v1/queue/join"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (st, v) = json_of(resp).await;
    assert_eq!(st, StatusCode::OK, "join {user:?}: {v}");
    Place {
        user,
        token: v["waiting_token"].as_str().unwrap().to_string(),
    }
}

async fn admin_figures(c: &Client, base: &str) -> Value {
    let resp = c
        .get(format!("{base}/api/v1/admin/events/{EVENT}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let (st, v) = json_of(resp).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v
}

/// Polls the admin figures until told to stop; answers how many polls it made. Panics (and
/// so fails the test when joined) if admitted + active ever exceeds capacity.
fn spawn_capacity_watch(
    base: String,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let c = client();
        let (mut polls, mut peak) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            let f = admin_figures(&c, &base).await;
            let used = f["admitted"].as_u64().unwrap() + f["active"].as_u64().unwrap();
            assert!(used <= CAPACITY, "over-admission during the race: {f}");
            peak = peak.max(used);
            polls += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (polls, peak)
    })
}

/// Statuses of `places`, fetched concurrently, keyed by token.
async fn statuses(c: &Client, base: &str, places: &[Place]) -> HashMap<String, Value> {
    let mut set = JoinSet::new();
    for p in places {
        let (c, url, token) = (
            c.clone(),
            format!("{base}/api/v1/queue/status?token={}", p.token),
            p.token.clone(),
        );
        set.spawn(async move {
            let (st, v) = json_of(c.get(url).send().await.unwrap()).await;
            assert_eq!(st, StatusCode::OK, "status of a live place: {v}");
            (token, v)
        });
    }
    let mut out = HashMap::new();
    while let Some(r) = set.join_next().await {
        let (t, v) = r.unwrap();
        out.insert(t, v);
    }
    out
}

/// Checks the settled queue against the places the test believes live; answers the
/// tokens by state.
async fn check_settled(c: &Client, base: &str, live: &[Place]) -> BTreeMap<String, Vec<String>> {
    let st = statuses(c, base, live).await;
    let mut by_state: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (t, v) in &st {
        by_state
            .entry(v["status"].as_str().unwrap().to_string())
            .or_default()
            .push(t.clone());
    }
    let count = |s: &str| by_state.get(s).map_or(0, Vec::len) as u64;
    let (waiting, admitted, active) = (count("waiting"), count("admitted"), count("active"));
    assert_eq!(
        waiting + admitted + active,
        live.len() as u64,
        "{by_state:?}"
    );
    assert!(
        admitted + active <= CAPACITY,
        "over capacity: {admitted} + {active}"
    );
    if waiting > 0 {
        assert_eq!(admitted + active, CAPACITY, "a free slot was not handed on");
    }

    let mut positions: Vec<u64> = st
        .values()
        .filter(|v| v["status"] == "waiting")
        .map(|v| {
            assert_eq!(v["queue_length"].as_u64(), Some(waiting), "{v}");
            v["position"].as_u64().unwrap()
        })
        .collect();
    positions.sort_unstable();
    assert_eq!(
        positions,
        (1..=waiting).collect::<Vec<_>>(),
        "positions 1..N"
    );

    let f = admin_figures(c, base).await;
    assert_eq!(
        (
            f["waiting"].as_u64(),
            f["admitted"].as_u64(),
            f["active"].as_u64()
        ),
        (Some(waiting), Some(admitted), Some(active)),
        "{f}"
    );
    by_state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_joins_leaves_and_completions_keep_every_promise() {
    let srv = TestServer::start().await;
    let c = client();
    let resp = c
        .put(srv.url(&format!("/api/v1/admin/events/{EVENT}")))
        .bearer_auth(ADMIN)
        .json(&json!({
            "max_active": 20, "overbooking_ratio": 1.5, "ready_ttl_sec": 600,
            "session_idle_sec": 600, "session_max_sec": 3600, "waiting_idle_sec": 600
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // Race 1: 600 joins at once: 200 users joining 2 or 3 times each, 100 anonymous.
    let watching = Arc::new(AtomicBool::new(false));
    let watch = spawn_capacity_watch(srv.base.clone(), watching.clone());
    let mut users: Vec<Option<String>> = Vec::new();
    for u in 0..200 {
        for _ in 0..(2 + u % 2) {
            users.push(Some(format!("user-{u}")));
        }
    }
    users.extend(std::iter::repeat_n(None, 100));
    assert_eq!(users.len(), 600);
    let barrier = Arc::new(Barrier::new(users.len()));
    let mut set = JoinSet::new();
    for u in users {
        let (c, base, barrier) = (c.clone(), srv.base.clone(), barrier.clone());
        set.spawn(async move {
            barrier.wait().await;
            join(&c, &base, u).await
        });
    }
    let mut joined = Vec::new();
    while let Some(r) = set.join_next().await {
        joined.push(r.unwrap());
    }

    // One place per user: every join of a user answered the same token.
    let mut per_user: HashMap<String, HashSet<String>> = HashMap::new();
    let mut live: Vec<Place> = Vec::new();
    let mut seen = HashSet::new();
    for p in &joined {
        if let Some(u) = &p.user {
            per_user
                .entry(u.clone())
                .or_default()
                .insert(p.token.clone());
        }
        if seen.insert(p.token.clone()) {
            live.push(p.clone());
        }
    }
    assert_eq!(per_user.len(), 200);
    for (u, tokens) in &per_user {
        assert_eq!(tokens.len(), 1, "{u} got {} places", tokens.len());
    }
    assert_eq!(live.len(), 300, "200 users + 100 anonymous places");
    let by_state = check_settled(&c, &srv.base, &live).await;
    assert_eq!(by_state["admitted"].len() as u64, CAPACITY);
    assert_eq!(by_state["waiting"].len(), 270);

    // Race 2: the admitted enter (half of them also complete), a quarter of the waiting
    // leave, 100 new users join, and 50 waiting users join again, all at once.
    let admitted: HashSet<&String> = by_state["admitted"].iter().collect();
    let waiting: Vec<&Place> = live
        .iter()
        .filter(|p| !admitted.contains(&p.token))
        .collect();
    let leavers: Vec<Place> = waiting.iter().step_by(4).map(|p| (*p).clone()).collect();
    let leaving: HashSet<&String> = leavers.iter().map(|p| &p.token).collect();
    let rejoiners: Vec<Place> = waiting
        .iter()
        .filter(|p| p.user.is_some() && !leaving.contains(&p.token))
        .take(50)
        .map(|p| (*p).clone())
        .collect();
    assert_eq!(rejoiners.len(), 50);
    let enterers: Vec<Place> = live
        .iter()
        .filter(|p| admitted.contains(&p.token))
        .cloned()
        .collect();

    let completed = Arc::new(AtomicU64::new(0));
    let total = enterers.len() + leavers.len() + 100 + rejoiners.len();
    let barrier = Arc::new(Barrier::new(total));
    let mut set: JoinSet<Option<(Place, Option<String>)>> = JoinSet::new();
    for (i, p) in enterers.iter().cloned().enumerate() {
        // Even indices complete, as `gone` below expects.
        let (c, base, barrier, completed) = (
            c.clone(),
            srv.base.clone(),
            barrier.clone(),
            completed.clone(),
        );
        set.spawn(async move {
            barrier.wait().await;
            let resp = c
                .post(format!("{base}/api/v1/queue/enter"))
                .json(&json!({ "waiting_token": p.token }))
                .send()
                .await
                .unwrap();
            let (st, v) = json_of(resp).await;
            assert_eq!(st, StatusCode::OK, "enter: {v}");
            if i % 2 == 0 {
                let access = v["access_token"].as_str().unwrap();
                let resp = c
                    .post(format!("{base}/api/v1/session/complete"))
                    .bearer_auth(access)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                completed.fetch_add(1, Ordering::Relaxed);
            }
            None
        });
    }
    for p in leavers.iter().cloned() {
        let (c, base, barrier) = (c.clone(), srv.base.clone(), barrier.clone());
        set.spawn(async move {
            barrier.wait().await;
            let resp = c
                .post(format!("{base}/api/v1/queue/leave"))
                .json(&json!({ "token": p.token }))
                .send()
                .await
                .unwrap();
            let (st, v) = json_of(resp).await;
            assert_eq!((st, &v["removed"]), (StatusCode::OK, &json!(true)));
            None
        });
    }
    for u in 200..300 {
        let (c, base, barrier) = (c.clone(), srv.base.clone(), barrier.clone());
        set.spawn(async move {
            barrier.wait().await;
            Some((join(&c, &base, Some(format!("user-{u}"))).await, None))
        });
    }
    for p in rejoiners.iter().cloned() {
        let (c, base, barrier) = (c.clone(), srv.base.clone(), barrier.clone());
        set.spawn(async move {
            barrier.wait().await;
            let again = join(&c, &base, p.user.clone()).await;
            // Tagged with the token it had, to check it is the same place.
            Some((again, Some(p.token)))
        });
    }
    let mut new_places = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Some((p, before)) = r.unwrap() {
            match before {
                Some(t) => assert_eq!(p.token, t, "a rejoin made a second place"),
                None => new_places.push(p),
            }
        }
    }
    assert_eq!(completed.load(Ordering::Relaxed), 15);

    // The live set now: everyone but the leavers and the completed, plus the newcomers.
    let gone: HashSet<&String> = leavers
        .iter()
        .chain(enterers.iter().step_by(2))
        .map(|p| &p.token)
        .collect();
    let mut live2: Vec<Place> = live
        .iter()
        .filter(|p| !gone.contains(&p.token))
        .cloned()
        .collect();
    live2.extend(new_places);
    assert_eq!(live2.len(), 300 - 15 - leavers.len() + 100);

    let by_state = check_settled(&c, &srv.base, &live2).await;
    assert_eq!(by_state["active"].len(), 15);
    assert_eq!(
        by_state["admitted"].len(),
        15,
        "the 15 freed slots were handed on"
    );

    watching.store(true, Ordering::Relaxed);
    let (polls, peak) = watch.await.expect("capacity held during the races");
    assert!(polls >= 3, "the watch ran ({polls} polls)");
    assert_eq!(peak, CAPACITY);
    srv.shutdown().await;
}
