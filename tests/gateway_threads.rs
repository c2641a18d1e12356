//! Gateway mode's serving threads (src/server/threads.rs): one per worker of the runtime,
//! each with its own listening socket and timers. In a binary of its own, as it counts the
//! process's threads by name (another server in the same process would be counted too);
//! its tests take turns ([`ONE_AT_A_TIME`]) for the same reason.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[allow(dead_code)]
#[path = "support/redis.rs"]
mod redis;

/// Held by each test while its server runs: the thread counts are the process's.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts the server on a free port and waits until it answers `/healthz`; the sender
/// stops it, the handle gives its result.
async fn start(
    settings: waitroom::config::Settings,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(waitroom::server::run(settings, l, async {
        let _ = stopped.await;
    }));
    let c = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (addr, stop, server)
}

/// An origin answering `/` at once and `/slow` after half a second.
async fn origin() -> SocketAddr {
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "slow"
            }),
        )
        .fallback(|| async { "ok" });
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

/// Names of the serving threads (`waitroom-serve-N`).
const SERVING: &str = "waitroom-serve";

/// The process's threads whose name starts with `prefix` (Linux's `/proc`).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// Sends one request on `sock` and answers the status line and body of its answer.
async fn ask(sock: &mut TcpStream, path: &str) -> String {
    let head = format!("GET {path} HTTP/1.1\r\nhost: shop.example\r\n\r\n");
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    // Both answers are a few bytes with a content-length: read until the body is there.
    while !(got.ends_with(b"ok") || got.ends_with(b"slow")) {
        let n = sock.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Reads until the server closes the connection, within `limit`.
async fn closed_within(mut sock: TcpStream, limit: Duration) {
    let mut buf = [0u8; 256];
    let r = tokio::time::timeout(limit, async {
        while let Ok(n) = sock.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    })
    .await;
    assert!(r.is_ok(), "the connection was still open after {limit:?}");
}

/// Two workers, two serving threads; connections spread over them (every thread accepts
/// some) are all proxied, the
/// idle ones are closed by their thread's timer, a shutdown lets the requests in flight on
/// every thread finish, then stops accepting, and the threads are gone once `run` is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_serving_thread_proxies_times_out_and_drains() {
    let _turn = ONE_AT_A_TIME.lock().await;
    assert_eq!(threads_named(SERVING), 0);
    let o = origin().await;
    let dir = tempfile::tempdir().unwrap();
    let settings = waitroom::config::Settings {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("data"),
        admin_token: Some("threads-admin-token-0123456789".to_string().into()),
        demo: false,
        upstream: Some(waitroom::gateway::Upstream::parse(&format!("http://{o}")).unwrap()),
        connections: waitroom::config::ConnectionSettings {
            header_timeout: Duration::from_secs(1),
            ..Default::default()
        },
        ..Default::default()
    };
    let (addr, stop, server) = start(settings).await;
    let c = reqwest::Client::new();
    // A thread takes its name as it starts, which on a loaded machine can come a moment
    // after the server answers: wait for the count to settle, then require exactly two.
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads_named(SERVING) != 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(threads_named(SERVING), 2, "one serving thread per worker");

    // 16 client connections (from 16 ports: the kernel spreads them over both sockets),
    // each proxied, then left idle: every one is closed after the header timeout.
    let mut idle = Vec::new();
    for _ in 0..16 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let answer = ask(&mut s, "/").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        idle.push(s);
    }
    // Every serving thread accepted some of them (the healthz probes and the 16), as the
    // per-thread counter on `/metrics` shows.
    let metrics = c
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let accepted: Vec<f64> = (0..2)
        .map(|i| {
            let series = format!("waitroom_gateway_thread_connections_total{{thread=\"{i}\"}}");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
                .unwrap_or(0.0)
        })
        .collect();
    assert!(
        accepted.iter().all(|&n| n > 0.0),
        "every serving thread accepts some connections: {accepted:?}"
    );
    assert!(accepted.iter().sum::<f64>() >= 17.0, "{accepted:?}");
    let started = Instant::now();
    futures_util::future::join_all(
        idle.into_iter()
            .map(|s| closed_within(s, Duration::from_secs(5))),
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(500));

    // 16 requests in flight when the shutdown comes: all answered, then no new connection.
    let mut slow = Vec::new();
    for _ in 0..16 {
        let s = TcpStream::connect(addr).await.unwrap();
        slow.push(tokio::spawn(async move {
            let mut s = s;
            ask(&mut s, "/slow").await
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    stop.send(()).unwrap();
    for s in slow {
        let answer = s.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("run ends after the drain")
        .unwrap()
        .expect("a clean shutdown");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "nothing listens any more"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while threads_named(SERVING) > 0 {
        assert!(
            Instant::now() < deadline,
            "the serving threads are still there"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// On a Redis store gateway mode is served on the shared runtime, with no serving thread:
/// the store's connection tasks would otherwise be driven by whichever serving thread
/// spawned them (see `server::threads::for_store`). Requests are proxied all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_store_gateway_mode_has_no_serving_threads() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let redis = redis::RedisServer::start();
    let o = origin().await;
    let dir = tempfile::tempdir().unwrap();
    waitroom::tokens::load_or_generate_key(None, dir.path()).unwrap();
    let settings = waitroom::config::Settings {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("data"),
        store: waitroom::config::StoreBackend::parse(&redis.url()).unwrap(),
        signing_keys: vec![dir.path().join("signing-key.pem")],
        admin_token: Some("threads-admin-token-0123456789".to_string().into()),
        demo: false,
        upstream: Some(waitroom::gateway::Upstream::parse(&format!("http://{o}")).unwrap()),
        ..Default::default()
    };
    let (addr, stop, server) = start(settings).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let answer = ask(&mut s, "/").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(threads_named(SERVING), 0, "no serving thread on Redis");
    drop(s);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("run ends")
        .unwrap()
        .expect("a clean shutdown");
}
