//! End-to-end tests of the `waitroom` binary, run the way a user runs it: a child process
//! with flags, environment and a config file, talked to over HTTP, stopped with SIGTERM.
//!
//! The server picks a free port (`--listen 127.0.0.1:0`) and reports it on stdout as
//! `listening on http://ADDR`; when it generates an admin token it prints
//! `admin token: T` first. Both lines are part of the command-line contract.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

mod support;

use support::binary::{call, run_to_exit, Server};
const ADMIN: &str = "e2e-admin-token";

async fn get(url: &str) -> (StatusCode, Value) {
    call(Method::GET, url, None, None).await
}

async fn post(url: &str, body: Value) -> (StatusCode, Value) {
    call(Method::POST, url, None, Some(body)).await
}

async fn kid(s: &Server) -> String {
    let (st, jwks) = get(&s.url("/.well-known/jwks.json")).await;
    assert_eq!(st, StatusCode::OK);
    jwks["keys"][0]["kid"].as_str().unwrap().to_string()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// [`Server::serve`] in `dir` with the test's admin token and `extra` flags.
fn serve(dir: &Path, extra: &[&str]) -> Server {
    Server::serve(dir, &[&["--admin-token", ADMIN], extra].concat())
}

#[tokio::test]
async fn a_whole_journey_over_http_then_sigterm() {
    let dir = tempdir();
    let s = serve(dir.path(), &[]);
    assert!(s.base.starts_with("http://127.0.0.1:"), "{}", s.base);
    assert_eq!(
        s.printed_admin_token(),
        None,
        "a configured token is not printed"
    );

    let (st, _) = get(&s.url("/healthz")).await;
    assert_eq!(st, StatusCode::OK);

    let ev = json!({"name": "Show", "max_active": 1, "ready_ttl_sec": 60});
    let admin_event = s.url("/api/v1/admin/events/show");
    let (st, body) = call(Method::PUT, &admin_event, None, Some(ev.clone())).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "UNAUTHORIZED");
    let (st, body) = call(Method::PUT, &admin_event, Some("wrong"), Some(ev.clone())).await;
    assert_eq!(
        (st, &body["error"]["code"]),
        (StatusCode::UNAUTHORIZED, &json!("UNAUTHORIZED"))
    );
    let (st, body) = call(Method::PUT, &admin_event, Some(ADMIN), Some(ev)).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["max_active"], 1);

    // Alice gets straight in; Bob waits behind her slot.
    let join = s.url("/api/v1/queue/join");
    let (st, alice) = post(&join, json!({"event_id": "show", "user_id": "alice"})).await;
    assert_eq!(st, StatusCode::OK, "{alice}");
    assert_eq!(alice["status"], "admitted");
    assert_eq!(alice["ready_for_entry"], true);
    let (_, bob) = post(&join, json!({"event_id": "show", "user_id": "bob"})).await;
    assert_eq!(bob["status"], "waiting");
    assert_eq!(
        (bob["position"].as_u64(), bob["queue_length"].as_u64()),
        (Some(1), Some(1))
    );
    let alice_t = alice["waiting_token"].as_str().unwrap().to_string();
    let bob_t = bob["waiting_token"].as_str().unwrap().to_string();

    let (st, status) = get(&s.url(&format!("/api/v1/queue/status?token={bob_t}"))).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (status["status"].as_str(), status["position"].as_u64()),
        (Some("waiting"), Some(1))
    );

    let enter = s.url("/api/v1/queue/enter");
    let (st, body) = post(&enter, json!({"waiting_token": bob_t})).await;
    assert_eq!(
        (st, &body["error"]["code"]),
        (StatusCode::FORBIDDEN, &json!("NOT_READY"))
    );
    let (st, granted) = post(&enter, json!({"waiting_token": alice_t})).await;
    assert_eq!(st, StatusCode::OK, "{granted}");
    assert_eq!(granted["admission"], "granted");
    let access = granted["access_token"].as_str().unwrap().to_string();

    let verify = s.url("/api/v1/queue/verify");
    let (st, v) = call(Method::POST, &verify, Some(&access), None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["valid"].as_bool(),
            v["event_id"].as_str(),
            v["user_id"].as_str()
        ),
        (Some(true), Some("show"), Some("alice"))
    );

    let (st, done) = call(
        Method::POST,
        &s.url("/api/v1/session/complete"),
        Some(&access),
        None,
    )
    .await;
    assert_eq!((st, &done["completed"]), (StatusCode::OK, &json!(true)));
    let (st, v) = call(Method::POST, &verify, Some(&access), None).await;
    assert_eq!(
        (st, &v["error"]["code"]),
        (StatusCode::UNAUTHORIZED, &json!("ACCESS_DENIED"))
    );

    // Alice's slot went to Bob at once.
    let (_, status) = get(&s.url(&format!("/api/v1/queue/status?token={bob_t}"))).await;
    assert_eq!(status["status"], "admitted", "{status}");
    let leave = s.url(&format!("/api/v1/queue/leave?token={bob_t}"));
    let (st, removed) = call(Method::DELETE, &leave, None, None).await;
    assert_eq!((st, &removed["removed"]), (StatusCode::OK, &json!(true)));
    let (_, removed) = call(Method::DELETE, &leave, None, None).await;
    assert_eq!(removed["removed"], false);

    let (st, fig) = call(Method::GET, &admin_event, Some(ADMIN), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (
            fig["completed"].as_u64(),
            fig["left"].as_u64(),
            fig["waiting"].as_u64()
        ),
        (Some(1), Some(1), Some(0)),
        "{fig}"
    );

    let started = Instant::now();
    let status = s.terminate(Duration::from_secs(8));
    assert_eq!(status.code(), Some(0), "clean exit on SIGTERM");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "prompt exit: {:?}",
        started.elapsed()
    );
}

/// SIGHUP and SIGINT stop the server as SIGTERM does, with exit 0, keeping what it
/// acknowledged (defect: SIGHUP's default action killed it on the spot, exit 129).
#[tokio::test]
async fn sighup_and_sigint_stop_gracefully() {
    for sig in ["HUP", "INT"] {
        let dir = tempdir();
        let s = serve(dir.path(), &[]);
        let (st, _) = call(
            Method::PUT,
            &s.url("/api/v1/admin/events/ev"),
            Some(ADMIN),
            Some(json!({"max_active": 1})),
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let status = s.signal(sig, Duration::from_secs(8));
        assert_eq!(status.code(), Some(0), "SIG{sig}: {status:?}");
        let s = serve(dir.path(), &[]);
        let (st, _) = get(&s.url("/api/v1/events/ev")).await;
        assert_eq!(st, StatusCode::OK, "SIG{sig}: the event was kept");
    }
    // Started under `nohup` (SIGHUP ignored), it keeps serving through a hangup.
    let dir = tempdir();
    let data = dir.path().join("data");
    let args = support::binary::serve_args(&data, &["--admin-token", ADMIN]);
    let nohup = |cmd: &mut std::process::Command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: `signal` is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                Ok(())
            });
        }
    };
    let s = Server::start_adjusted(dir.path(), &args, &[], nohup);
    let pid = s.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (st, _) = get(&s.url("/healthz")).await;
    assert_eq!(st, StatusCode::OK, "a hangup under nohup stopped it");
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
}

#[tokio::test]
async fn bare_waitroom_serves_the_demo_with_a_generated_admin_token() {
    let dir = tempdir();
    // No arguments at all: the settings come from the environment and the defaults
    // (the data dir is ./waitroom-data under the working directory).
    let s = Server::start(dir.path(), &[], &[("WAITROOM_LISTEN", "127.0.0.1:0")]);
    let token = s.printed_admin_token().expect("`admin token: T` printed");
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));

    let (st, info) = get(&s.url("/api/v1/queue/info?event_id=demo")).await;
    assert_eq!(st, StatusCode::OK, "{info}");
    assert_eq!(info["name"], "Demo concert");
    assert_eq!(info["capacity"], 3);
    let (st, events) = call(
        Method::GET,
        &s.url("/api/v1/admin/events"),
        Some(&token),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["event_id"] == "demo"),
        "{events}"
    );
    assert!(dir.path().join("waitroom-data/signing-key.pem").is_file());
    // The server turns transparent huge pages off for itself (`alloc::small_pages_only`):
    // the kernel reports it per process.
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id()));
    if let Some(thp) = status
        .iter()
        .flat_map(|s| s.lines())
        .find(|l| l.starts_with("THP_enabled:"))
    {
        assert_eq!(thp.split_whitespace().nth(1), Some("0"), "{thp}");
    }

    // The simulated crowd fills the demo queue within a few seconds, so a newcomer waits.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, info) = get(&s.url("/api/v1/queue/info?event_id=demo")).await;
        if info["queue_length"].as_u64().unwrap_or(0) >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "no demo crowd: {info}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, me) = post(&s.url("/api/v1/queue/join"), json!({"event_id": "demo"})).await;
    assert_eq!(me["status"], "waiting", "{me}");

    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
}

/// The demo event's figures, from the admin API.
async fn demo_figures(s: &Server) -> Value {
    let (st, v) = call(
        Method::GET,
        &s.url("/api/v1/admin/events/demo"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    v
}

/// Stopped and started again on the same data dir, the demo finds the previous run's bots
/// holding its slots. The new crowd takes their places over and drives them on, so a
/// newcomer's place moves within seconds, not when the old places time out.
#[tokio::test]
async fn the_demo_queue_moves_at_once_after_a_restart() {
    let dir = tempdir();
    let s = serve(dir.path(), &["--demo"]);
    // Timeouts far beyond the test's length (kept across the restart: the operator's
    // settings of the demo event win), so that only a take-over frees the old slots.
    let (st, v) = call(
        Method::PUT,
        &s.url("/api/v1/admin/events/demo"),
        Some(ADMIN),
        Some(json!({"ready_ttl_sec": 600, "session_idle_sec": 600,
                    "session_max_sec": 600, "waiting_idle_sec": 600})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let f = demo_figures(&s).await;
        let busy = f["admitted"].as_u64().unwrap() + f["active"].as_u64().unwrap();
        if busy == 3 && f["waiting"].as_u64().unwrap() >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "no demo crowd: {f}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));

    let s = serve(dir.path(), &["--demo"]);
    let (st, me) = post(&s.url("/api/v1/queue/join"), json!({"event_id": "demo"})).await;
    assert_eq!(st, StatusCode::OK, "{me}");
    let token = me["waiting_token"].as_str().unwrap().to_string();
    let start = me["position"].as_u64();
    let status = s.url(&format!("/api/v1/queue/status?token={token}"));
    // A bot takes 3 to 9 s per slot: the line moves within a few of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (st, now) = get(&status).await;
        assert_eq!(st, StatusCode::OK, "{now}");
        if now["status"] != "waiting" || now["position"].as_u64() < start {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the line stood still at {start:?}: {now}; {}",
            demo_figures(&s).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
}

#[tokio::test]
async fn a_config_file_is_read_and_env_and_flags_override_it() {
    let dir = tempdir();
    let data = dir.path().join("from-file");
    let file = dir.path().join("waitroom.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = {:?}\nadmin_token = \"file-token\"\ndemo = false\nlog_format = \"json\"\n",
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let cfg = file.to_str().unwrap();

    // The file alone.
    let s = Server::start(dir.path(), &["serve", "--config", cfg], &[]);
    let events = s.url("/api/v1/admin/events");
    let (st, _) = call(Method::GET, &events, Some("file-token"), None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, body) = get(&s.url("/api/v1/queue/info?event_id=demo")).await;
    assert_eq!(
        (st, &body["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("EVENT_NOT_FOUND")),
        "demo = false"
    );
    assert!(
        data.join("signing-key.pem").is_file(),
        "data_dir from the file"
    );
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));

    // The environment over the file, a flag over both.
    let s = Server::start(
        dir.path(),
        &["--config", cfg, "--demo"],
        &[
            ("WAITROOM_ADMIN_TOKEN", "env-token"),
            ("WAITROOM_DEMO", "false"),
        ],
    );
    let events = s.url("/api/v1/admin/events");
    let (st, _) = call(Method::GET, &events, Some("file-token"), None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = call(Method::GET, &events, Some("env-token"), None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = get(&s.url("/api/v1/queue/info?event_id=demo")).await;
    assert_eq!(
        st,
        StatusCode::OK,
        "--demo wins over WAITROOM_DEMO and the file"
    );
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
}

#[test]
fn bad_command_lines_and_settings_fail_with_a_message() {
    let dir = tempdir();
    let d = dir.path();
    let (st, err) = run_to_exit(d, &["--bogus"]);
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("--bogus"), "{err}");

    let (st, err) = run_to_exit(d, &["serve", "--store", "mysql://db"]);
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("store") && err.contains("mysql://db"), "{err}");

    let (st, err) = run_to_exit(d, &["--listen", "no-port-here"]);
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("listen"), "{err}");

    let (st, err) = run_to_exit(d, &["--config", "/nonexistent/waitroom.toml"]);
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("/nonexistent/waitroom.toml"), "{err}");

    // A Redis that cannot be reached stops the node at startup (a port nobody listens on).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let (st, err) = run_to_exit(d, &["--listen", "127.0.0.1:0", "--store", &url]);
    assert_eq!(st.code(), Some(1));
    assert!(err.contains("cannot connect to Redis"), "{err}");

    let (st, err) = run_to_exit(
        d,
        &[
            "--listen",
            "127.0.0.1:0",
            "--signing-key",
            "/nonexistent/key.pem",
        ],
    );
    assert_eq!(st.code(), Some(1));
    assert!(err.contains("signing key"), "{err}");
}

#[tokio::test]
async fn the_generated_signing_key_is_private_and_survives_restarts() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--admin-token",
        ADMIN,
    ];
    let s = Server::start(dir.path(), &args, &[]);
    let first = kid(&s).await;
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));

    let key = data.join("signing-key.pem");
    let pem = std::fs::read_to_string(&key).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "PKCS#8 PEM");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "owner-only");
    }

    let s = Server::start(dir.path(), &args, &[]);
    assert_eq!(kid(&s).await, first, "same key after a restart");
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
    assert_eq!(std::fs::read_to_string(&key).unwrap(), pem, "not rewritten");
}

/// The server's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A WebSocket client that floods pings and never reads holds a bounded write buffer on
/// the server (defect: a pong was queued for each ping, without bound: 400 MB of pings
/// held 700 MB until the client went away).
#[tokio::test]
async fn a_websocket_that_floods_pings_and_never_reads_holds_little_memory() {
    use std::io::Write as _;
    let dir = tempdir();
    let s = serve(dir.path(), &["--rate-limits", "off"]);
    let (st, body) = call(
        Method::PUT,
        &s.url("/api/v1/admin/events/pings"),
        Some(ADMIN),
        Some(json!({"max_active": 1, "waiting_idle_sec": 600})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let join_url = s.url("/api/v1/queue/join");
    let join = || {
        call(
            Method::POST,
            &join_url,
            None,
            Some(json!({"event_id": "pings"})),
        )
    };
    join().await;
    let (_, waiting) = join().await;
    let token = waiting["waiting_token"].as_str().unwrap().to_string();
    let addr: std::net::SocketAddr = s
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let pid = s.child.id();

    let flood = std::thread::spawn(move || {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        sock.connect(&addr.into()).unwrap();
        let mut tcp: std::net::TcpStream = sock.into();
        // A server that stops reading fails the test rather than hanging it.
        tcp.set_write_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        write!(
            tcp,
            "GET /api/v1/queue/ws?token={token} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        // A masked ping with a 125-byte payload (mask 0: the payload as it is).
        let mut ping = vec![0x89, 0x80 | 125, 0, 0, 0, 0];
        ping.extend([b'p'; 125]);
        let batch: Vec<u8> = ping
            .iter()
            .copied()
            .cycle()
            .take(ping.len() * 1000)
            .collect();
        let mut sent = 0usize;
        // 48 MiB of pings (well under a second), never reading the answers: done long
        // before the server's first message to the stream, which a full buffer refuses.
        while sent < 48 << 20 {
            if tcp.write_all(&batch).is_err() {
                break;
            }
            sent += batch.len();
        }
        (tcp, sent)
    });
    let before = rss_kib(pid);
    let (_tcp, sent) = flood.join().unwrap();
    assert!(
        sent >= 48 << 20,
        "the server read the pings ({sent} bytes sent)"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(
        grown < 32 * 1024,
        "{grown} KiB more held after {} MiB of pings",
        sent >> 20
    );
}

/// Output streams that are pipes whose readers went away (a log shipper that restarted,
/// `| grep -m1`): writes to them fail with EPIPE, as Rust ignores SIGPIPE. stdout's reader
/// is gone before anything is printed (the generated admin token, then `listening on`),
/// stderr's once the server has logged that it serves; requests that log (admin changes,
/// joins, a refusal) are still answered, and SIGTERM still exits 0.
#[tokio::test]
async fn output_pipes_whose_readers_went_away_change_nothing() {
    use std::io::BufRead as _;
    use std::process::Stdio;
    let dir = tempdir();
    let data = dir.path().join("data");
    // No admin token: the generated one is printed.
    let args = support::binary::serve_args(&data, &["--log-format", "json"]);
    let mut child = support::binary::command()
        .args(&args)
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    drop(child.stdout.take());
    let stderr = child.stderr.take().unwrap();
    // The address, from the log line written just before `listening on`; then the reader
    // goes away (its end of the pipe closes with it).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(stderr).lines();
        let addr = lines.by_ref().map_while(Result::ok).find_map(|l| {
            let v: Value = serde_json::from_str(&l).ok()?;
            (v["message"] == "serving").then(|| v["addr"].as_str().map(str::to_string))?
        });
        let _ = tx.send(addr);
    });
    let mut s = Server {
        child,
        base: String::new(),
        banner: Vec::new(),
        stderr_file: dir.path().join("(a pipe)"),
    };
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a `serving` log line within 30 s")
        .unwrap_or_else(|| panic!("stderr ended before `serving`: {:?}", s.child.try_wait()));
    s.base = format!("http://{addr}");
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let token = token.trim();

    let admin_event = s.url("/api/v1/admin/events/show");
    let join = s.url("/api/v1/queue/join");
    for (round, max_active) in [(0, 1), (1, 2)] {
        let ev = json!({"name": "Show", "max_active": max_active});
        let (st, body) = call(Method::PUT, &admin_event, Some(token), Some(ev)).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        let user = format!("user-{round}");
        let (st, body) = post(&join, json!({"event_id": "show", "user_id": user})).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        let (st, _) = call(Method::GET, &admin_event, Some("wrong"), None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
    }
    let (st, fig) = call(Method::GET, &admin_event, Some(token), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (fig["max_active"].as_u64(), fig["admitted"].as_u64()),
        (Some(2), Some(2)),
        "{fig}"
    );
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
}

/// A short admin token in `DATA_DIR/admin-token` (edited by hand) is checked as a
/// configured one is: accepted, with the same warning.
#[tokio::test]
async fn a_short_admin_token_kept_in_the_data_dir_is_warned_about() {
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("admin-token"), "abc\n").unwrap();
    let s = Server::serve(dir.path(), &[]);
    assert_eq!(s.printed_admin_token().as_deref(), Some("abc"));
    let (st, _) = call(
        Method::GET,
        &s.url("/api/v1/admin/events"),
        Some("abc"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let log = s.stderr();
    let warning = log
        .lines()
        .find(|l| l.contains("admin token") && l.contains("short"));
    let warning = warning.unwrap_or_else(|| panic!("no short-token warning: {log}"));
    assert!(
        warning.contains("WARN") && warning.contains("characters=3"),
        "{warning}"
    );
    assert!(warning.contains("admin-token"), "names the file: {warning}");
}

/// An empty `DATA_DIR/admin-token` (a power cut while it was written) is replaced by a new
/// token, with a warning naming the file (defect: replaced without a word, every script
/// holding the old one refused).
#[tokio::test]
async fn an_empty_admin_token_file_is_replaced_with_a_warning() {
    let dir = tempdir();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("admin-token"), " \n").unwrap();
    let s = Server::serve(dir.path(), &[]);
    let token = s.printed_admin_token().expect("a token printed");
    assert_eq!(token.len(), 64);
    assert_eq!(
        std::fs::read_to_string(data.join("admin-token")).unwrap(),
        token
    );
    let log = s.stderr();
    let warning = log
        .lines()
        .find(|l| l.contains("admin token") && l.contains("empty"));
    let warning = warning.unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(
        warning.contains("WARN") && warning.contains("admin-token"),
        "{warning}"
    );
}

/// Started with an open-descriptor limit of 64 (soft and hard, so the server cannot raise
/// it) and `--max-connections 1000`: the start warns, naming both numbers. Once the
/// descriptors run out (`accept` fails with EMFILE), an open connection is still served,
/// and the connections left waiting are served once others close.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_cap_beyond_the_descriptor_limit_is_warned_about_and_running_out_is_survived() {
    use std::os::unix::process::CommandExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    const LIMIT: u64 = 64;
    const WAITING: usize = 2 * LIMIT as usize;
    let dir = tempdir();
    let data = dir.path().join("data");
    let args = support::binary::serve_args(
        &data,
        &[
            "--admin-token",
            ADMIN,
            "--max-connections",
            "1000",
            "--header-timeout-sec",
            "30",
        ],
    );
    let limited = |cmd: &mut std::process::Command| {
        // SAFETY: `setrlimit` is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: LIMIT as libc::rlim_t,
                    rlim_max: LIMIT as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    };
    let s = Server::start_adjusted(dir.path(), &args, &[], limited);
    let log = s.stderr();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("descriptor limit"))
        .unwrap_or_else(|| panic!("no warning about the descriptor limit: {log}"));
    assert!(
        warning.contains("max_connections=1000") && warning.contains("descriptor_limit=64"),
        "{warning}"
    );

    let addr = s.base.strip_prefix("http://").unwrap().to_string();
    const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    // Sends a request and reads its whole answer (the head, then `content-length` bytes):
    // whether it is a 200.
    async fn exchange(tcp: &mut TcpStream) -> bool {
        if tcp.write_all(REQUEST).await.is_err() {
            return false;
        }
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let head = buf.windows(4).position(|w| w == b"\r\n\r\n");
            if let Some(end) = head {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    return head.starts_with("http/1.1 200");
                }
            }
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
    let mut first = TcpStream::connect(&addr).await.unwrap();
    assert!(exchange(&mut first).await);

    // Twice as many connections as there are descriptors, each with a request, held open
    // once answered: the kernel queues them all, the server cannot accept them all.
    let (answered_tx, mut answered) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WAITING {
        let mut tcp = TcpStream::connect(&addr).await.unwrap();
        let answered_tx = answered_tx.clone();
        tokio::spawn(async move {
            let ok = exchange(&mut tcp).await;
            let _ = answered_tx.send((ok, tcp));
        });
    }
    drop(answered_tx);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.stderr().contains("accepting a connection failed") {
        assert!(Instant::now() < deadline, "never out of descriptors");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Out of descriptors: an open connection is still served.
    assert!(exchange(&mut first).await, "an open connection served");
    // Closing the connections that were answered frees descriptors for those waiting.
    let mut served = 0;
    while served < WAITING {
        let next = tokio::time::timeout_at(deadline.into(), answered.recv()).await;
        let (ok, tcp) = next
            .unwrap_or_else(|_| panic!("{served} of {WAITING} served; log: {}", s.stderr()))
            .expect("every connection reports");
        assert!(ok, "connection {served} answered a 200");
        drop(tcp);
        served += 1;
    }
    assert!(exchange(&mut first).await);
    assert_eq!(s.terminate(Duration::from_secs(8)).code(), Some(0));
}

/// A node that does not run for a while (`SIGSTOP` here; `docker pause`, a paused VM)
/// receives no polls meanwhile: the places that polled as told keep their places, and one
/// that had stopped polling still expires, that much later. Before, the first tick after
/// the freeze expired every one of them.
#[tokio::test]
async fn a_frozen_node_does_not_expire_the_places_that_polled_as_told() {
    let dir = tempdir();
    let s = serve(dir.path(), &[]);
    let admin = |path: &str| s.url(&format!("/api/v1/admin/events/{path}"));
    let ev = json!({"max_active": 1, "paused": true, "waiting_idle_sec": 4});
    let (st, _) = call(Method::PUT, &admin("fz"), Some(ADMIN), Some(ev)).await;
    assert_eq!(st, StatusCode::OK);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let (st, body) = post(&s.url("/api/v1/queue/join"), json!({"event_id": "fz"})).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        tokens.push(body["waiting_token"].as_str().unwrap().to_string());
    }
    let status = |t: &str| s.url(&format!("/api/v1/queue/status?token={t}"));
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &s.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success());
    };
    // The last place stops polling now; the others poll right before the freeze.
    let abandoned_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for t in &tokens[..2] {
        assert_eq!(get(&status(t)).await.1["status"], "waiting");
    }
    signal("-STOP");
    std::thread::sleep(Duration::from_secs(7));
    signal("-CONT");
    for t in &tokens[..2] {
        let (st, body) = get(&status(t)).await;
        assert_eq!(st, StatusCode::OK, "a place that polled as told: {body}");
        assert_eq!(body["status"], "waiting");
    }
    // The abandoned place's 4 s ran 1.5 s before the freeze: about 2.5 s are left after
    // it. (Not asked for its status: that would be a poll.)
    let line = || async {
        let (st, body) = get(&s.url("/api/v1/queue/info?event_id=fz")).await;
        assert_eq!(st, StatusCode::OK);
        body["queue_length"].as_u64().unwrap()
    };
    assert_eq!(
        line().await,
        3,
        "the freeze did not count against the abandoned place"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while line().await == 3 {
        assert!(
            Instant::now() < deadline,
            "the abandoned place never expired"
        );
        for t in &tokens[..2] {
            assert_eq!(get(&status(t)).await.1["status"], "waiting");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(line().await, 2, "only the abandoned place expired");
    let expired_after = abandoned_at.elapsed();
    assert!(
        expired_after >= Duration::from_secs(10),
        "4 s of idleness plus ~7 s of freeze: {expired_after:?}"
    );
}
