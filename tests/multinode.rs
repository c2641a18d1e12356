//! Several real `waitroom` processes on one Redis, as users run them behind a load balancer:
//! any node serves any place, concurrent joins spread over the nodes stay exact, a node
//! killed with SIGKILL leaves its periodic work to the others, and a Redis outage turns
//! into fast 503s and then recovers by itself.
//!
//! Each test starts its own `redis-server` (tests/support/redis.rs) and nodes
//! (tests/support/binary.rs), and stops them all at the end, whatever happens.

mod support;

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::binary::{call, run_to_exit, serve_args, Nodes, Server};
use support::redis::{free_port, raw_command, RedisServer};

const ADMIN: &str = "multinode-admin";

async fn admin_put(node: &Server, event: &str, body: Value) {
    let (s, b) = call(
        Method::PUT,
        &node.url(&format!("/api/v1/admin/events/{event}")),
        Some(ADMIN),
        Some(body),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

async fn join(node: &Server, event: &str, user: Option<&str>) -> Value {
    let mut body = json!({"event_id": event});
    if let Some(u) = user {
        body["user_id"] = json!(u);
    }
    // With the server key, so a repeat join of a user gets its place back.
    let (s, b) = call(
        Method::POST,
        &node.url("/api/v1/queue/join"),
        Some(ADMIN),
        Some(body),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b
}

async fn status(node: &Server, token: &str) -> (StatusCode, Value) {
    call(
        Method::GET,
        &node.url(&format!("/api/v1/queue/status?token={token}")),
        None,
        None,
    )
    .await
}

async fn info(node: &Server, event: &str) -> Value {
    let (s, b) = call(
        Method::GET,
        &node.url(&format!("/api/v1/queue/info?event_id={event}")),
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    b
}

/// Polls `check` every 50 ms until it answers `Some`, for at most `within`.
async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn redis_cli(port: u16, cmd: &str) -> String {
    raw_command(port, cmd).unwrap()
}

/// A place made on one node is served by the others; concurrent joins spread over three
/// nodes never exceed capacity, give exact positions, and one place per user.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_share_one_exact_queue() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let nodes: Vec<Server> = (0..3).map(|_| c.start(&redis.url())).collect();
    admin_put(
        &nodes[0],
        "show",
        json!({"max_active": 4, "overbooking_ratio": 1.5}),
    )
    .await;

    // One place, three nodes: the same answer from each.
    let first = join(&nodes[1], "show", Some("first")).await;
    let token = first["waiting_token"].as_str().unwrap().to_string();
    for n in &nodes {
        let (s, b) = status(n, &token).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["status"], "admitted");
    }

    // 150 joins of 100 users (a third join twice), round-robin over the nodes, at once.
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let tasks: Vec<_> = (0..150)
        .map(|i| {
            let base = bases[i % 3].clone();
            tokio::spawn(async move {
                let user = format!("u{}", i % 100);
                let (s, b) = call(
                    Method::POST,
                    &format!("{base}/api/v1/queue/join"),
                    Some(ADMIN),
                    Some(json!({"event_id": "show", "user_id": user})),
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{b}");
                (user, b["waiting_token"].as_str().unwrap().to_string())
            })
        })
        .collect();
    let mut by_user = std::collections::HashMap::new();
    for t in tasks {
        let (user, token) = t.await.unwrap();
        let prev = by_user.insert(user.clone(), token.clone());
        assert!(
            prev.is_none_or(|p| p == token),
            "{user} got two different places"
        );
    }
    assert_eq!(by_user.len(), 100);

    // Capacity floor(4 × 1.5) = 6: "first" and five others admitted, the rest waiting with
    // positions exactly 1..=95, whichever node answers.
    let mut positions = Vec::new();
    let mut admitted = 0;
    for (i, token) in by_user.values().enumerate() {
        let (s, b) = status(&nodes[i % 3], token).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        match b["status"].as_str().unwrap() {
            "waiting" => positions.push(b["position"].as_u64().unwrap()),
            "admitted" => admitted += 1,
            other => panic!("unexpected {other}"),
        }
    }
    positions.sort_unstable();
    assert_eq!(admitted, 5);
    assert_eq!(positions, (1..=95).collect::<Vec<_>>());
    for n in &nodes {
        let i = info(n, "show").await;
        assert_eq!(
            (i["admitted"].as_u64(), i["queue_length"].as_u64()),
            (Some(6), Some(95)),
            "{i}"
        );
    }

    // Leaving on one node hands the slot on at once; the next in line sees it on another.
    let (s, _) = call(
        Method::POST,
        &nodes[2].url("/api/v1/queue/leave"),
        None,
        Some(json!({"token": token})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let i = info(&nodes[0], "show").await;
    assert_eq!(
        (i["admitted"].as_u64(), i["queue_length"].as_u64()),
        (Some(6), Some(94))
    );
}

/// The node holding an event's lease is killed with SIGKILL mid-load: the other node takes
/// the periodic work over within the lease time (3 s): paced admissions go on, and an idle
/// session ends and hands its slot on with no request touching the event at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_node_hands_its_periodic_work_over() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    // `a` starts first, so its scheduler takes the leases of the events it creates.
    let a = c.start(&redis.url());
    admin_put(
        &a,
        "paced",
        json!({"max_active": 100, "admit_per_minute": 120}),
    )
    .await;
    admin_put(
        &a,
        "idle",
        json!({"max_active": 1, "session_idle_sec": 2, "waiting_idle_sec": 600}),
    )
    .await;
    let lease = |ev: &str| redis_cli(redis.port, &format!("GET wr:{{{ev}}}:l"));
    eventually("a takes the leases", Duration::from_secs(5), || async {
        (!lease("paced").is_empty() && !lease("idle").is_empty()).then_some(())
    })
    .await;
    let held = (lease("paced"), lease("idle"));
    let b = c.start(&redis.url());

    // The paced event: a crowd joins through both nodes; ticks admit two a second.
    let mut tokens = Vec::new();
    for i in 0..40 {
        let v = join(if i % 2 == 0 { &a } else { &b }, "paced", None).await;
        tokens.push(v["waiting_token"].as_str().unwrap().to_string());
    }
    // The idle event: one session that will go idle, one place waiting behind it.
    let s1 = join(&b, "idle", Some("s1")).await;
    let t1 = s1["waiting_token"].as_str().unwrap();
    let (s, e) = call(
        Method::POST,
        &b.url("/api/v1/queue/enter"),
        None,
        Some(json!({"waiting_token": t1})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    join(&b, "idle", Some("s2")).await;

    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = info(&b, "paced").await["admitted"].as_u64().unwrap();
    assert!(before >= 1, "a was ticking");

    // Load on b throughout: status polls of the paced event, ~100 a second. (Polls, not
    // joins: a join may spend fresh rate budget, and this test wants to see the ticks.)
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (base, stop) = (b.base.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0usize, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = &tokens[ok % tokens.len()];
                let url = format!("{base}/api/v1/queue/status?token={t}");
                match reqwest::get(&url).await {
                    Ok(r) if r.status() == StatusCode::OK => ok += 1,
                    Ok(r) => failed.push(format!("{}", r.status())),
                    Err(e) => failed.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (ok, failed)
        })
    };

    // SIGKILL the lease holder mid-load.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    a.kill();

    // Paced admissions go on once b holds the lease (3 s at most, plus a tick or two).
    // Reading /queue/info spends no rate budget: only a tick admits here.
    let after = eventually("b admits at the pace", Duration::from_secs(8), || async {
        let n = info(&b, "paced").await["admitted"].as_u64().unwrap();
        (n >= before + 3).then_some(n)
    })
    .await;
    let took = killed_at.elapsed();
    eprintln!("paced admissions resumed {took:?} after the SIGKILL");
    assert!(after > before);
    assert!(took < Duration::from_secs(7), "took over after {took:?}");
    assert_ne!(lease("paced"), held.0, "b holds the lease now");

    // Nobody touches the idle event: its session lapses (2 s idle) and s2 is admitted, as
    // Redis itself shows (reading Redis directly runs no rule).
    eventually(
        "the idle session ends by itself",
        Duration::from_secs(8),
        || async {
            let active = redis_cli(redis.port, "ZCARD wr:{idle}:as");
            let admitted = redis_cli(redis.port, "ZCARD wr:{idle}:ad");
            (active.trim() == ":0" && admitted.trim() == ":1").then_some(())
        },
    )
    .await;
    assert_ne!(lease("idle"), held.1);

    // b kept serving all along.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    assert!(failed.is_empty(), "b failed requests: {failed:?}");
    assert!(ok > 50, "b served {ok} requests under load");
}

/// Redis stops answering (SIGSTOP), then dies (SIGKILL) and comes back on the same port
/// and files: requests answer 503 UNAVAILABLE with Retry-After within about two seconds,
/// `/readyz` says 503, and service resumes by itself each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_outage_answers_503_fast_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port(false);
    let redis = RedisServer::start_durable(port, dir.path());
    let c = Nodes::new(ADMIN);
    let node = c.start(&redis.url());
    admin_put(&node, "o", json!({"max_active": 1})).await;
    join(&node, "o", None).await;
    let mine = join(&node, "o", Some("me")).await;
    let token = mine["waiting_token"].as_str().unwrap().to_string();
    assert_eq!(mine["position"], 1);

    let expect_503 = |what: &'static str| {
        let node = &node;
        let token = token.clone();
        async move {
            // The node's replica of the event may answer a status poll for as long as its
            // last read of the change log is under 0.5 s old (API.md "Status on the Redis
            // store"); after that the poll needs Redis.
            let outage = Instant::now();
            let (resp, took) = loop {
                let started = Instant::now();
                let resp = reqwest::Client::new()
                    .get(node.url(&format!("/api/v1/queue/status?token={token}")))
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await
                    .unwrap();
                let took = started.elapsed();
                if resp.status() == StatusCode::OK && outage.elapsed() < Duration::from_secs(1) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                break (resp, took);
            };
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
            assert!(resp.headers().contains_key("retry-after"), "{what}");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "UNAVAILABLE", "{what}");
            assert!(took < Duration::from_millis(2500), "{what}: took {took:?}");
            let started = Instant::now();
            let (s, _) = call(Method::GET, &node.url("/readyz"), None, None).await;
            assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{what}: readyz");
            assert!(started.elapsed() < Duration::from_millis(2500));
            let (s, _) = call(Method::GET, &node.url("/healthz"), None, None).await;
            assert_eq!(s, StatusCode::OK, "{what}: the process itself is fine");
        }
    };
    let recovered = |what: &'static str| {
        let node = &node;
        let token = token.clone();
        async move {
            let b = eventually(what, Duration::from_secs(15), || async {
                let (s, b) = status(node, &token).await;
                (s == StatusCode::OK).then_some(b)
            })
            .await;
            assert_eq!(b["position"], 1, "{what}: the place survived");
            let (s, _) = call(Method::GET, &node.url("/readyz"), None, None).await;
            assert_eq!(s, StatusCode::OK, "{what}: ready again");
        }
    };

    // Frozen: connections stay open, nothing answers.
    redis.pause();
    expect_503("redis frozen").await;
    redis.resume();
    recovered("after SIGCONT").await;

    // Dead, then back on the same port from its append-only file.
    redis.kill();
    expect_503("redis dead").await;
    let redis = RedisServer::start_durable(port, dir.path());
    recovered("after a restart").await;
    let i = info(&node, "o").await;
    assert_eq!(i["queue_length"], 1);
    drop(redis);
    drop(node);
}

/// A node holding thousands of events exits on SIGTERM while Redis is frozen (SIGSTOP):
/// its scheduler stops at once, and the leases it
/// gives back at close go out together, all within one operation timeout. One after
/// another, each call waiting out its timeout, such a node did not exit for hours (with
/// Redis gone, minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holding_thousands_of_leases_exits_while_redis_is_frozen() {
    use futures_util::StreamExt as _;
    use waitroom::store::redis::{RedisOptions, RedisStore};
    use waitroom::store::Store as _;
    const EVENTS: usize = 2_000;
    let redis = RedisServer::start();
    let nodes = Nodes::new(ADMIN);
    let node = nodes.start(&redis.url());
    // Made straight in Redis (the node lists them, ticks them and takes their leases).
    let store = RedisStore::new(&redis.url(), RedisOptions::default()).unwrap();
    let now = waitroom::clock::Clock::system().now();
    futures_util::stream::iter(0..EVENTS)
        .for_each_concurrent(64, |i| {
            let store = &store;
            async move {
                let id = format!("e{i}");
                let patch = waitroom::core::EventPatch::default();
                store.put_event(&id, &patch, now).await.unwrap();
            }
        })
        .await;
    store.close().await.unwrap();
    let leases = || {
        let r = raw_command(
            redis.port,
            r#"EVAL "return #redis.call('keys','wr:*:l')" 0"#,
        );
        r.unwrap()
            .trim()
            .trim_start_matches(':')
            .parse::<usize>()
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while leases() < EVENTS {
        assert!(
            Instant::now() < deadline,
            "the node took {} leases",
            leases()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Frozen before the signal, so that the node meets it whatever it does first (ticks
    // in flight, the lease releases of its close).
    redis.pause();
    let terminated = tokio::task::spawn_blocking(move || node.terminate(Duration::from_secs(15)));
    // Within the drain, the background tasks' grace and the close's bounds.
    let status = terminated.await;
    redis.resume();
    assert_eq!(status.unwrap().code(), Some(0));
}

/// `rediss://`: a node reaches Redis over TLS, verifying its certificate against the
/// system's roots (here a test CA given through `SSL_CERT_FILE`), and refuses to start
/// when the certificate cannot be verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_reaches_redis_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ed25519",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=waitroom-test-ca",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "ed25519",
        "-nodes",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(d.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.crt",
        "-days",
        "2",
        "-extfile",
        "ext",
    ]);
    let tls_port = free_port(false).to_string();
    let path = |f: &str| d.join(f).to_str().unwrap().to_string();
    let (cert, key, ca) = (path("srv.crt"), path("srv.key"), path("ca.crt"));
    let _redis = RedisServer::start_with(
        free_port(false),
        &d.join("redis"),
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ],
    );
    let url = format!("rediss://localhost:{tls_port}");
    let c = Nodes::new(ADMIN);
    let args = |data: &str| {
        vec![
            "serve".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--store".into(),
            url.clone(),
            "--signing-key".into(),
            c.key.to_str().unwrap().into(),
            "--admin-token".into(),
            ADMIN.into(),
            "--no-demo".into(),
            "--data-dir".into(),
            c.dir.path().join(data).to_str().unwrap().into(),
        ]
    };

    // With only the system's roots, the test CA is unknown: the node says so and exits.
    let out = support::binary::command()
        .args(args("untrusting"))
        .env_remove("SSL_CERT_FILE")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");

    let a = args("trusting");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let node = Server::start(c.dir.path(), &a, &[("SSL_CERT_FILE", &ca)]);
    admin_put(&node, "tls", json!({"max_active": 1})).await;
    join(&node, "tls", None).await;
    let w = join(&node, "tls", Some("w")).await;
    let (s, b) = status(&node, w["waiting_token"].as_str().unwrap()).await;
    assert_eq!(
        (s, b["position"].as_u64()),
        (StatusCode::OK, Some(1)),
        "{b}"
    );
}

/// The value of one series of one event in a node's `/metrics`, if it is there.
async fn gauge(node: &Server, name: &str, event: &str) -> Option<f64> {
    let text = reqwest::get(node.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let needle = format!("{name}{{event=\"{event}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map(|v| v.trim().parse().unwrap())
}

/// A DELETE served by one node stops every node reporting the event's gauges (defect: only
/// the node that served it zeroed them; the others reported its last figures forever, since
/// a scrape refreshes only the events that still exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deletion_on_one_node_clears_the_gauges_on_every_node() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let a = c.start(&redis.url());
    let b = c.start(&redis.url());
    admin_put(&a, "gauged", json!({"max_active": 1})).await;
    for u in ["g1", "g2", "g3"] {
        join(&a, "gauged", Some(u)).await;
    }
    // b reports the event's figures once it has scraped them.
    assert_eq!(gauge(&b, "waitroom_waiting", "gauged").await, Some(2.0));
    assert_eq!(gauge(&b, "waitroom_admitted", "gauged").await, Some(1.0));

    let (s, body) = call(
        Method::DELETE,
        &a.url("/api/v1/admin/events/gauged"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    for node in [&b, &a] {
        eventually(
            "the deleted event's gauges cleared",
            Duration::from_secs(3),
            || async {
                let mut stale = Vec::new();
                for name in ["waitroom_waiting", "waitroom_admitted", "waitroom_capacity"] {
                    if gauge(node, name, "gauged").await.is_some_and(|v| v != 0.0) {
                        stale.push(name);
                    }
                }
                stale.is_empty().then_some(())
            },
        )
        .await;
    }
}

/// Pause and resume sent to two nodes while one of them deletes the event never bring it
/// back (defect: they read the event, then wrote it whole, so a DELETE in between was
/// undone and the event came back, paused, with default settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_and_resume_racing_a_delete_on_two_nodes_never_resurrect_the_event() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let nodes = [c.start(&redis.url()), c.start(&redis.url())];
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    for round in 0..40 {
        let id = format!("race-{round}");
        admin_put(&nodes[0], &id, json!({"max_active": 7})).await;
        let mut tasks = Vec::new();
        for t in 0..6usize {
            let (base, id) = (bases[t % 2].clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                for k in 0..3 {
                    let op = if (t + k) % 2 == 0 { "pause" } else { "resume" };
                    let (s, b) = call(
                        Method::POST,
                        &format!("{base}/api/v1/admin/events/{id}/{op}"),
                        Some(ADMIN),
                        None,
                    )
                    .await;
                    assert!(
                        s == StatusCode::OK
                            || (s == StatusCode::NOT_FOUND
                                && b["error"]["code"] == "EVENT_NOT_FOUND"),
                        "{op}: {s} {b}"
                    );
                }
            }));
        }
        let deleter = {
            let (base, id) = (bases[(round % 2) as usize].clone(), id.clone());
            tokio::spawn(async move {
                let (s, b) = call(
                    Method::DELETE,
                    &format!("{base}/api/v1/admin/events/{id}"),
                    Some(ADMIN),
                    None,
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{b}");
            })
        };
        for t in tasks {
            t.await.unwrap();
        }
        deleter.await.unwrap();
        for base in &bases {
            let (s, b) = call(
                Method::GET,
                &format!("{base}/api/v1/admin/events/{id}"),
                Some(ADMIN),
                None,
            )
            .await;
            assert_eq!(
                s,
                StatusCode::NOT_FOUND,
                "round {round}: the event came back: {b}"
            );
            assert_eq!(b["error"]["code"], "EVENT_NOT_FOUND");
        }
    }
    let (s, b) = call(
        Method::POST,
        &nodes[1].url("/api/v1/admin/events/never-made/pause"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    assert_eq!(b["error"]["code"], "EVENT_NOT_FOUND");
}

/// An ACL user without the notices' channel cannot subscribe: the node says so (other nodes'
/// changes would reach its live followers only through its replicas' polls, seconds late),
/// rather than retrying in silence.
#[tokio::test]
async fn a_relay_that_cannot_subscribe_is_reported() {
    let redis = RedisServer::start();
    let set = raw_command(
        redis.port,
        "ACL SETUSER nochan on >pw ~* resetchannels +@all",
    )
    .unwrap();
    assert!(set.starts_with("+OK"), "{set}");
    let nodes = Nodes::new("adm");
    let node = nodes.start(&format!("redis://nochan:pw@127.0.0.1:{}", redis.port));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !node.stderr().contains("notice relay cannot subscribe") {
        assert!(
            Instant::now() < deadline,
            "no warning; stderr: {}",
            node.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        node.stderr().to_lowercase().contains("noperm"),
        "{}",
        node.stderr()
    );
    node.kill();
}

/// A node's flags on `redis_url` with the signing keys `keys` (oldest first), then `extra`.
fn node_flags<'a>(
    redis_url: &'a str,
    keys: &[&'a std::path::Path],
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["--store", redis_url, "--admin-token", ADMIN];
    for k in keys {
        args.extend(["--signing-key", k.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    args
}

/// A node as [`node_flags`] has it, in `dir`, which must be refused at start: its stderr.
fn refused_node(
    dir: &std::path::Path,
    redis_url: &str,
    keys: &[&std::path::Path],
    extra: &[&str],
) -> String {
    let data = dir.join("data");
    let args = serve_args(&data, &node_flags(redis_url, keys, extra));
    let (status, err) = run_to_exit(dir, &args);
    assert!(!status.success(), "{status:?}: {err}");
    err
}

/// A node as [`node_flags`] has it, in `dir`, which must start.
fn started_node(
    dir: &std::path::Path,
    redis_url: &str,
    keys: &[&std::path::Path],
    extra: &[&str],
) -> Server {
    Server::serve(dir, &node_flags(redis_url, keys, extra))
}

/// A key of its own in a new directory (the directory, the key file).
fn other_key() -> (tempfile::TempDir, std::path::PathBuf) {
    let other = tempfile::tempdir().unwrap();
    waitroom::tokens::load_or_generate_key(None, other.path()).unwrap();
    let key = other.path().join("signing-key.pem");
    (other, key)
}

/// The fingerprint of the key in `file`, as the record in Redis holds it.
fn fingerprint(file: &std::path::Path) -> String {
    let keys = waitroom::tokens::load_signing_keys(&[file.to_path_buf()]).unwrap();
    waitroom::tokens::key_fingerprint(&keys[0])
}

/// The signing keys a Redis deployment's places come from are recorded in Redis: a node
/// started with none of them while places exist is refused (every waiting token would be
/// invalid on it), unless `--repair`; a rotation (old key kept) starts.
#[tokio::test]
async fn a_node_with_none_of_the_recorded_keys_is_refused() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start(&redis.url());
    admin_put(&node, "keys", json!({"max_active": 1})).await;
    join(&node, "keys", Some("a")).await;
    join(&node, "keys", Some("b")).await;
    node.kill();

    let (other, new_key) = other_key();
    let err = refused_node(other.path(), &redis.url(), &[&new_key], &[]);
    assert!(
        err.contains("the Redis store at") && err.contains("holds 2 places"),
        "{err}"
    );

    // The rotation's first step (the new key verifies, the old one still signs) starts.
    let rotated = started_node(other.path(), &redis.url(), &[&new_key, &c.key], &[]);
    rotated.kill();
}

/// A Redis holding places but no record of their keys (written by a version before keys
/// were recorded, or the record lost while no node ran) cannot check the first node to
/// start: it records that node's keys, and says so, naming them and the way back (defect:
/// a wrong key was recorded without a word, every waiting token then refused, and nodes
/// started later with the right key refused at start).
#[tokio::test]
async fn places_without_a_key_record_are_warned_about_when_a_key_is_recorded() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start(&redis.url());
    admin_put(&node, "unrecorded", json!({"max_active": 1})).await;
    join(&node, "unrecorded", Some("a")).await;
    join(&node, "unrecorded", Some("b")).await;
    node.kill();
    redis_cli(redis.port, "DEL wr:signing-keys");

    let (other, new_key) = other_key();
    let started = started_node(other.path(), &redis.url(), &[&new_key], &[]);
    let stderr = started.stderr();
    let warning = stderr
        .lines()
        .find(|l| l.contains("WARN") && l.contains("no record of the signing keys"))
        .unwrap_or_else(|| panic!("no warning: {stderr}"));
    assert!(
        warning.contains("places=2")
            && warning.contains(&fingerprint(&new_key))
            && warning.contains("--repair"),
        "{warning}"
    );
    assert_eq!(
        redis_cli(redis.port, "GET wr:signing-keys"),
        fingerprint(&new_key)
    );
    started.kill();
}

/// With no place in Redis, a node whose key is none of the recorded ones is refused all the
/// same: nodes running with the recorded key would refuse its tokens, and taking its key as
/// the record would get correctly configured nodes refused at their next restart. The
/// message names both fingerprints and the way out; `--repair` records the new key, and a
/// rotation from it starts without.
#[tokio::test]
async fn a_node_with_a_disjoint_key_is_refused_while_no_place_exists() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start(&redis.url());
    let record = || redis_cli(redis.port, "GET wr:signing-keys");
    let first = fingerprint(&c.key);
    assert_eq!(record(), first);

    let (other, new_key) = other_key();
    let second = fingerprint(&new_key);
    let err = refused_node(other.path(), &redis.url(), &[&new_key], &[]);
    assert!(
        err.contains(&first) && err.contains(&second) && err.contains("would refuse"),
        "{err}"
    );
    assert!(
        err.contains("same --signing-key") && err.contains("--repair"),
        "{err}"
    );
    assert!(!err.contains("places"), "no place to speak of: {err}");
    assert_eq!(record(), first, "the refused node left the record alone");
    // The node that was running keeps serving, and restarts with its key.
    admin_put(&node, "keys", json!({"max_active": 1})).await;
    node.kill();
    c.start(&redis.url()).kill();

    // Every node moving to the new key on purpose: the first one says so.
    let repaired = started_node(other.path(), &redis.url(), &[&new_key], &["--repair"]);
    assert_eq!(record(), second, "{}", repaired.stderr());
    repaired.kill();

    // A rotation away from the recorded key keeps one of them: no --repair needed.
    let rotated = started_node(other.path(), &redis.url(), &[&new_key, &c.key], &[]);
    assert_eq!(record(), format!("{second}\n{first}"));
    rotated.kill();
}

/// A running node writes its signing-key record back when Redis has lost it (a restart
/// without persistence, a flush), so that the next node to start is checked against it
/// rather than accepted with any key.
#[tokio::test]
async fn a_running_node_writes_its_lost_key_record_back() {
    let redis = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start(&redis.url());
    let first = fingerprint(&c.key);
    assert_eq!(redis_cli(redis.port, "GET wr:signing-keys"), first);
    assert!(redis_cli(redis.port, "FLUSHALL").starts_with("+OK"));
    eventually(
        "the record written back",
        Duration::from_secs(10),
        || async { (redis_cli(redis.port, "GET wr:signing-keys") == first).then_some(()) },
    )
    .await;
    let (other, new_key) = other_key();
    let err = refused_node(other.path(), &redis.url(), &[&new_key], &[]);
    assert!(err.contains(&first), "{err}");
    node.kill();
}

/// `--redis-wait-replicas 1` on a Redis without a replica: every change would answer 503
/// (its `WAIT` never reaches one), so the node says so at start and `/readyz` answers 503
/// (the reason logged), where it used to answer 200 and keep the node in a load balancer's
/// rotation. Once a replica is attached and in sync, the node is ready and changes go
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_for_redis_wait_replicas_is_not_ready() {
    let master = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start_with_env(&master.url(), &[("WAITROOM_REDIS_WAIT_REPLICAS", "1")]);
    let stderr = node.stderr();
    let warning = stderr
        .lines()
        .find(|l| l.contains("WARN") && l.contains("redis_wait_replicas"))
        .unwrap_or_else(|| panic!("no warning at start: {stderr}"));
    assert!(warning.contains("0 replica(s) online"), "{warning}");
    let (s, b) = call(Method::GET, &node.url("/readyz"), None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert_eq!(b["error"]["code"], "UNAVAILABLE", "{b}");
    // The reason is logged, as for the other readiness failures (the body keeps it out).
    let stderr = node.stderr();
    assert!(
        stderr.lines().any(|l| l.contains("WARN")
            && l.contains("store unavailable")
            && l.contains("0 replica(s) online")),
        "{stderr}"
    );
    let (s, _) = call(Method::GET, &node.url("/healthz"), None, None).await;
    assert_eq!(s, StatusCode::OK, "the process itself is fine");

    let dir = tempfile::tempdir().unwrap();
    let _replica = RedisServer::start_replica_of(master.port, dir.path());
    eventually(
        "ready once the replica is online",
        Duration::from_secs(15),
        || async {
            let (s, _) = call(Method::GET, &node.url("/readyz"), None, None).await;
            (s == StatusCode::OK).then_some(())
        },
    )
    .await;
    admin_put(&node, "r", json!({"max_active": 1})).await;
}

/// A Redis that answers pings but refuses writes fails every change with 503, so the node
/// is not ready (defect: `/readyz` sent `PING` and answered 200 while every join failed):
/// `min-replicas-to-write` unmet (`NOREPLICAS`), and over `maxmemory` under `noeviction`
/// (`OOM`). Ready again once Redis takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_writes_is_not_ready() {
    let master = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start(&master.url());
    admin_put(&node, "w", json!({"max_active": 1})).await;
    let ready = || async { call(Method::GET, &node.url("/readyz"), None, None).await };
    assert_eq!(ready().await.0, StatusCode::OK);
    for (refuse, accept) in [
        (
            "CONFIG SET min-replicas-to-write 1",
            "CONFIG SET min-replicas-to-write 0",
        ),
        ("CONFIG SET maxmemory 1", "CONFIG SET maxmemory 0"),
    ] {
        redis_cli(master.port, refuse);
        let (s, b) = call(
            Method::POST,
            &node.url("/api/v1/queue/join"),
            None,
            Some(json!({"event_id": "w"})),
        )
        .await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{refuse}: the join {b}");
        let (s, b) = ready().await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{refuse}: {b}");
        assert_eq!(b["error"]["code"], "UNAVAILABLE", "{b}");
        redis_cli(master.port, accept);
        assert_eq!(ready().await.0, StatusCode::OK, "after {accept}");
    }
}

/// A failure that repeats per request is logged a few times a second, not once per request
/// (defect: each of a crowd's requests during an outage wrote a `store unavailable` warning
/// and a `response failed` error, flooding the log): 200 probes of a node that is not ready
/// write at most the budget's lines of each kind per second, and a later line counts those
/// left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_that_repeats_per_request_is_logged_within_a_budget() {
    let master = RedisServer::start();
    let c = Nodes::new(ADMIN);
    let node = c.start_with_env(&master.url(), &[("WAITROOM_REDIS_WAIT_REPLICAS", "1")]);
    let started = Instant::now();
    let probes: Vec<_> = (0..200)
        .map(|_| {
            let url = node.url("/readyz");
            tokio::spawn(async move { call(Method::GET, &url, None, None).await.0 })
        })
        .collect();
    for p in probes {
        assert_eq!(p.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    }
    // Each second may begin a window of 5 lines per kind.
    let windows = started.elapsed().as_secs() as usize + 2;
    let stderr = node.stderr();
    let warned = stderr
        .lines()
        .filter(|l| l.contains("store unavailable") && l.contains("replica(s) online"))
        .count();
    let failed = stderr
        .lines()
        .filter(|l| l.contains("response failed"))
        .count();
    assert!(
        (1..=5 * windows).contains(&warned),
        "{warned} warnings in {windows} windows"
    );
    assert!(
        (1..=5 * windows).contains(&failed),
        "{failed} errors in {windows} windows"
    );
    // The next window's first line says how many were left out.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (s, _) = call(Method::GET, &node.url("/readyz"), None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let stderr = node.stderr();
    let told: u64 = stderr
        .lines()
        .filter(|l| l.contains("store unavailable") && l.contains("replica(s) online"))
        .filter_map(|l| l.split("suppressed=").nth(1))
        .map(|n| n.split(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(told as usize + warned, 200, "{stderr}");
}
