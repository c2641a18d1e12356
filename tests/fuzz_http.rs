//! Fuzzing the HTTP surface: raw request bytes, arbitrary and structured-but-mutated
//! (methods, the real routes and made-up ones, query strings, headers, JSON-ish and random
//! bodies, chunked encoding, pipelining), each fed through hyper's HTTP/1.1 server
//! connection over an in-memory `tokio::io::duplex` into the real router, with an
//! in-memory store that holds real events, places and tokens (so the handlers past token
//! checks are reached too).
//!
//! For every case: no panic anywhere (a panic hook counts them; the router's catch-panic
//! layer would otherwise hide them as 500s), every response parses as HTTP/1.1, no 5xx
//! except `503 UNAVAILABLE` / `QUEUE_FULL`, and every error response from our router is the
//! JSON error shape. Responses that hyper makes itself for unparsable requests (an empty
//! body and no content type) are counted apart.
//!
//! The suite runs 2,000 cases; `FUZZ_CASES=1000000 cargo test --release --test fuzz_http`
//! runs the long one. Failures are not persisted to files (nothing tracked is written).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use axum::Router;
use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

use waitroom::clock::Clock;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::AppState;

const ADMIN: &str = "fuzz-admin-token";

static PANICS: AtomicU64 = AtomicU64::new(0);

/// The router and the real tokens the generated requests may carry.
struct Target {
    router: Router,
    tokens: Vec<String>,
}

async fn call(router: &Router, method: Method, uri: &str, body: Value, admin: bool) -> Value {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if admin {
        b = b.header("authorization", format!("Bearer {ADMIN}"));
    }
    let res = router
        .clone()
        .oneshot(b.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

async fn target() -> Target {
    let key = SigningKey::from_bytes(&[9; 32]);
    let state =
        AppState::new(Arc::new(EmbeddedStore::new()), &key, ADMIN, Clock::system()).unwrap();
    // As a server does before it serves (no background task runs here): until then the
    // gate and `/readyz` answer 503.
    let now = state.clock.now();
    assert!(state.gates.refresh(state.store.as_ref(), now).await);
    let router = waitroom::http::router(state);
    let mut tokens = vec![ADMIN.to_string()];
    for (id, cfg) in [
        ("concert-a", json!({"max_active": 2})),
        ("demo", json!({"max_queue_length": 50})),
        ("paused", json!({"paused": true})),
    ] {
        call(
            &router,
            Method::PUT,
            &format!("/api/v1/admin/events/{id}"),
            cfg,
            true,
        )
        .await;
    }
    for u in ["u1", "u2", "u3"] {
        let v = call(
            &router,
            Method::POST,
            "/api/v1/queue/join",
            json!({"event_id": "concert-a", "user_id": u}),
            false,
        )
        .await;
        if let Some(t) = v["waiting_token"].as_str() {
            tokens.push(t.to_string());
        }
    }
    // An access token too, for verify and the session endpoints.
    let v = call(
        &router,
        Method::POST,
        "/api/v1/queue/enter",
        json!({"waiting_token": tokens[1]}),
        false,
    )
    .await;
    if let Some(t) = v["access_token"].as_str() {
        tokens.push(t.to_string());
    }
    assert!(tokens.len() >= 5, "setup failed: {tokens:?}");
    Target { router, tokens }
}

const PATHS: &[&str] = &[
    "/api/v1/queue/join",
    "/api/v1/queue/status",
    "/api/v1/queue/heartbeat",
    "/api/v1/queue/enter",
    "/api/v1/queue/leave",
    "/api/v1/queue/verify",
    "/api/v1/queue/info",
    "/api/v1/queue/ws",
    "/api/v1/queue/events",
    "/api/v1/events",
    "/api/v1/events/concert-a",
    "/api/v1/session/heartbeat",
    "/api/v1/session/complete",
    "/api/v1/session/holds",
    "/api/v1/session/extend",
    "/api/v1/admin/events",
    "/api/v1/admin/events/concert-a/inventory",
    "/api/v1/admin/events/concert-a",
    "/api/v1/admin/events/fuzzed",
    "/api/v1/admin/events/concert-a/pause",
    "/api/v1/admin/events/concert-a/resume",
    "/api/v1/admin/events/demo/clear",
    "/api/v1/admin/events/concert-a/queue",
    "/api/v1/admin/stats",
    "/api/v1/admin/events/concert-a/history",
    "/api/v1/admin/events/concert-a/history.csv",
    "/api/v1/admin/audit",
    "/.well-known/jwks.json",
    "/healthz",
    "/readyz",
    "/metrics",
    "/",
    "/wait/concert-a",
    "/wait/nope",
    "/wait/concert-a/theme.css",
    "/branding/logo.png",
    "/branding/..%2fstore",
    "/demo/booking",
    "/demo/booking/order",
    "/demo/booking/order?event=concert-a",
    "/api/v1/openapi.json",
    "/admin",
    "/assets/wait.js",
    "/assets/..%2f..%2fetc%2fpasswd",
    "/api/v1/events/..",
    "/nope",
    "*",
    "//",
];

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE", "get", "FOO",
];

const FIELDS: &[&str] = &[
    "event_id",
    "user_id",
    "token",
    "waiting_token",
    "metadata",
    "user_token",
    "invite",
    "pow",
    "name",
    "max_active",
    "admit_per_minute",
    "max_queue_length",
    "paused",
    "target_url",
    "waiting_idle_sec",
    "overbooking_ratio",
    "count",
    "title",
    "theme_color",
    "logo_url",
];

/// JSON-ish values: real field names, real tokens and ids, odd numbers and nesting.
fn json_value(tokens: Vec<String>) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![0u64, 1, 2, 64, 65, 4096, u32::MAX as u64, u64::MAX])
            .prop_map(Value::from),
        "[a-z0-9._-]{0,70}".prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        prop::sample::select(tokens).prop_map(Value::from),
        prop::sample::select(vec!["concert-a", "demo", "paused", "..", ""]).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS.to_vec()), inner), 0..6).prop_map(
                |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            ),
        ]
    })
}

/// A request in parts, before mutation.
#[derive(Debug, Clone)]
struct Shape {
    method: String,
    path: String,
    query: Option<String>,
    version: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    length: LengthMode,
    pipeline: bool,
}

#[derive(Debug, Clone)]
enum LengthMode {
    Exact,
    None,
    Wrong(u64),
    Chunked(usize),
}

fn shape(tokens: Vec<String>) -> impl Strategy<Value = Shape> {
    let method = prop_oneof![
        8 => prop::sample::select(METHODS.to_vec()).prop_map(String::from),
        1 => "[A-Z]{1,10}",
    ];
    let path = prop_oneof![
        6 => prop::sample::select(PATHS.to_vec()).prop_map(String::from),
        2 => (prop::sample::select(PATHS.to_vec()), "[a-zA-Z0-9%./_~-]{0,30}")
            .prop_map(|(p, s)| format!("{p}/{s}")),
        1 => "/[a-zA-Z0-9%./_~!$&'()*+,;=:@-]{0,60}",
    ];
    let query = prop::option::of(prop_oneof![
        prop::sample::select(tokens.clone()).prop_map(|t| format!("token={t}")),
        prop::sample::select(vec![
            "event_id=",
            "event_id=concert-a",
            "event_id=..",
            "token=",
            "token=%ZZ",
            "a=b&a=c",
            "=",
            "&&"
        ])
        .prop_map(String::from),
        "[a-zA-Z0-9%./_~!$&'()*+,;=:@?-]{0,40}",
    ]);
    let version = prop_oneof![
        8 => Just("HTTP/1.1"),
        1 => prop::sample::select(vec!["HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", ""]),
    ];
    let header = prop_oneof![
        prop::sample::select(vec![
            ("content-type", "application/json"),
            ("content-type", "text/plain"),
            ("content-type", "application/x-www-form-urlencoded"),
            (
                "content-type",
                "application/merge-patch+json; charset=utf-8"
            ),
            ("content-type", ""),
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("expect", "100-continue"),
            ("accept-language", "ko"),
            ("accept", "text/html,application/xhtml+xml"),
            ("accept", "application/json"),
            ("accept-encoding", "gzip"),
            ("if-none-match", "\"x\""),
            ("x-forwarded-for", "1.2.3.4, 5.6.7.8"),
            ("forwarded", "for=\"[::1]\";proto=https"),
            ("connection", "close"),
        ])
        .prop_map(|(k, v)| (k.to_string(), v.to_string())),
        prop::sample::select(tokens.clone())
            .prop_map(|t| ("authorization".to_string(), format!("Bearer {t}"))),
        ("[a-zA-Z-]{1,20}", "[!-~][ -~]{0,40}"),
    ];
    let headers = prop::collection::vec(header, 0..6);
    let body = prop_oneof![
        3 => json_value(tokens).prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => Just(Vec::new()),
    ];
    let length = prop_oneof![
        6 => Just(LengthMode::Exact),
        1 => Just(LengthMode::None),
        1 => prop::sample::select(vec![0u64, 1, 70_000, u64::MAX]).prop_map(LengthMode::Wrong),
        1 => (1usize..16).prop_map(LengthMode::Chunked),
    ];
    (
        method,
        path,
        query,
        version,
        headers,
        body,
        length,
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(method, path, query, version, headers, body, length, pipeline)| Shape {
                method,
                path,
                query,
                version,
                headers,
                body,
                length,
                pipeline,
            },
        )
}

impl Shape {
    fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let target = match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        };
        out.extend_from_slice(format!("{} {target} {}\r\n", self.method, self.version).as_bytes());
        out.extend_from_slice(b"host: fuzz\r\n");
        for (k, v) in &self.headers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        match &self.length {
            LengthMode::Exact => {
                out.extend_from_slice(format!("content-length: {}\r\n", self.body.len()).as_bytes())
            }
            LengthMode::None => {}
            LengthMode::Wrong(n) => {
                out.extend_from_slice(format!("content-length: {n}\r\n").as_bytes())
            }
            LengthMode::Chunked(_) => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        }
        out.extend_from_slice(b"\r\n");
        match &self.length {
            LengthMode::Chunked(size) => {
                for chunk in self.body.chunks(*size) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
            _ => out.extend_from_slice(&self.body),
        }
        if self.pipeline {
            out.extend_from_slice(b"GET /healthz HTTP/1.1\r\nhost: fuzz\r\n\r\n");
        }
        out
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
}

fn mutate(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if bytes.is_empty() {
            break;
        }
        let n = bytes.len();
        match m {
            Mutation::Flip(i, x) => bytes[i % n] ^= x | 1,
            Mutation::Insert(i, b) => {
                let at = i % (n + 1);
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Delete(i, len) => {
                let at = i % n;
                let end = (at + len).min(n);
                bytes.drain(at..end);
            }
            Mutation::Truncate(i) => bytes.truncate(i % (n + 1)),
        }
    }
    bytes
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (
            any::<usize>(),
            prop_oneof![
                prop::collection::vec(any::<u8>(), 1..8),
                prop::sample::select(vec![
                    b"\r\n".to_vec(),
                    b"\r\n\r\n".to_vec(),
                    b"\0".to_vec(),
                    b":".to_vec(),
                    b" ".to_vec(),
                    b"\xff\xfe".to_vec(),
                    b"{".to_vec(),
                    b"\"".to_vec(),
                ]),
            ]
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// The raw bytes of one case.
fn request_bytes(tokens: Vec<String>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..300),
        5 => shape(tokens.clone()).prop_map(|s| s.render()),
        3 => (shape(tokens), prop::collection::vec(mutation(), 1..4))
            .prop_map(|(s, m)| mutate(s.render(), &m)),
    ]
}

/// Sends `bytes` on a fresh in-memory connection served by hyper and the router; answers
/// every byte the server wrote back before closing (or, for a stream, its head), and
/// whether hyper ended the connection on a protocol error (a malformed request body read
/// after the answer began), which may cut the last answer short.
async fn exchange(router: Router, bytes: Vec<u8>) -> Result<(Vec<u8>, bool), String> {
    // Big enough that no answer ever waits for the reader (`/metrics` passes 256 KiB once
    // the fuzz has touched enough routes). With `half_close(true)` below, hyper 1.x leaves a
    // connection neither answering nor closing when an answer's write waited on the pipe
    // while a pipelined request sat in its read buffer (its mid-message EOF check returns
    // `Pending` without asking for a wake-up). The real server does not allow half-closes.
    let (client, server) = tokio::io::duplex(16 << 20);
    let (mut rd, mut wr) = tokio::io::split(client);
    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        router.clone().oneshot(req.map(Body::new))
    });
    let conn = tokio::spawn(async move {
        // The client below half-closes its side once it has written the case ("nothing
        // more to send", which is also what ends a request cut short). By default hyper
        // takes an end of input while a request is in flight for the client having gone
        // and drops the connection unanswered; whether it sees that end before the answer
        // is a race, lost by about half of all well-formed requests on any route, which
        // then tested nothing. Allowing the half-close makes every case reach the router.
        hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), svc)
            .with_upgrades()
            .await
            .is_err()
    });
    let write = async {
        // The server may stop reading (and close) before taking everything: fine.
        let _ = wr.write_all(&bytes).await;
        let _ = wr.shutdown().await;
    };
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            // A live stream or an upgrade never ends by itself: its head is enough.
            if let Ok(rs) = parse_all(&out, true, false) {
                if rs.last().is_some_and(|r| r.open_ended) {
                    return true;
                }
            }
        }
    };
    let (_, finished) = tokio::join!(write, async {
        tokio::time::timeout(Duration::from_secs(10), read).await
    });
    let errored = match finished {
        // The connection ended by itself: its result is there.
        Ok(false) => conn.await.unwrap_or(false),
        _ => {
            conn.abort();
            false
        }
    };
    match finished {
        Ok(_) => Ok((out, errored)),
        Err(_) => Err(format!(
            "no end to the answer after 10 s; so far: {:?}",
            String::from_utf8_lossy(&out)
        )),
    }
}

struct Answer {
    status: u16,
    content_type: Option<String>,
    body: Vec<u8>,
    open_ended: bool,
    /// The connection ended inside this answer's body.
    cut_short: bool,
}

/// Parses every response in `bytes`; an incomplete last one is an error. `head_req`: the
/// request may have been a `HEAD`, whose answer has a length but no body.
fn parse_all(mut bytes: &[u8], head_req: bool, cut: bool) -> Result<Vec<Answer>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut headers);
        let head = match r.parse(bytes) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Err("a partial response head".into()),
            Err(e) => return Err(format!("an unparsable response: {e}")),
        };
        let status = r.code.ok_or("no status")?;
        let get = |name: &str| {
            r.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).to_string())
        };
        let content_type = get("content-type");
        let rest = &bytes[head..];
        let open_ended = status == 101
            || content_type
                .as_deref()
                .is_some_and(|c| c.starts_with("text/event-stream"));
        if open_ended {
            out.push(Answer {
                status,
                content_type,
                body: Vec::new(),
                open_ended,
                cut_short: false,
            });
            return Ok(out);
        }
        let mut cut_short = false;
        let (body, used) = if (100..200).contains(&status) || status == 204 || status == 304 {
            (Vec::new(), 0)
        } else if get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
            dechunk(rest)?
        } else if let Some(len) = get("content-length") {
            let len: usize = len.trim().parse().map_err(|_| "a bad content-length")?;
            if head_req && (rest.len() < len || rest.starts_with(b"HTTP/1.".as_slice())) {
                (Vec::new(), 0)
            } else if rest.len() < len && cut {
                cut_short = true;
                (rest.to_vec(), rest.len())
            } else if rest.len() < len {
                return Err("a truncated body".into());
            } else {
                (rest[..len].to_vec(), len)
            }
        } else {
            (rest.to_vec(), rest.len())
        };
        out.push(Answer {
            status,
            content_type,
            body,
            open_ended,
            cut_short,
        });
        bytes = &rest[used..];
    }
    Ok(out)
}

fn dechunk(mut b: &[u8]) -> Result<(Vec<u8>, usize), String> {
    let start = b.len();
    let mut body = Vec::new();
    loop {
        let line_end = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a partial chunk size")?;
        let size_text = std::str::from_utf8(&b[..line_end]).map_err(|_| "a bad chunk size")?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .map_err(|_| "a bad chunk size")?;
        b = &b[line_end + 2..];
        if b.len() < size + 2 {
            return Err("a partial chunk".into());
        }
        body.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
        if size == 0 {
            return Ok((body, start - b.len()));
        }
    }
}

#[derive(Default)]
struct Counts {
    cases: AtomicU64,
    responses: AtomicU64,
    from_hyper: AtomicU64,
    no_answer: AtomicU64,
    cut_short: AtomicU64,
    first_head_only: AtomicU64,
}

fn check(bytes: &[u8], answer: &[u8], cut: bool, counts: &Counts) -> Result<(), TestCaseError> {
    let head = bytes.windows(5).any(|w| w == b"HEAD ");
    let responses = parse_all(answer, head, cut).map_err(|e| {
        TestCaseError::fail(format!(
            "{e} in {:?}\nfor {:?}",
            String::from_utf8_lossy(answer),
            String::from_utf8_lossy(bytes)
        ))
    })?;
    if responses.is_empty() {
        counts.no_answer.fetch_add(1, Ordering::Relaxed);
    }
    for r in responses {
        counts.responses.fetch_add(1, Ordering::Relaxed);
        if r.cut_short {
            counts.cut_short.fetch_add(1, Ordering::Relaxed);
        }
        let json: Option<Value> = serde_json::from_slice(&r.body).ok();
        let code = json
            .as_ref()
            .and_then(|v| v["error"]["code"].as_str())
            .map(String::from);
        let why = |what: &str| {
            TestCaseError::fail(format!(
                "{what}: {} {:?}\nfor {:?}",
                r.status,
                String::from_utf8_lossy(&r.body),
                String::from_utf8_lossy(bytes)
            ))
        };
        if r.status >= 500 && !matches!(code.as_deref(), Some("UNAVAILABLE" | "QUEUE_FULL")) {
            return Err(why("a server error"));
        }
        if r.status >= 400 {
            if r.status == 404 && html_not_found_asked(bytes, &r) {
                // The page of an unknown event, for a browser (API.md "Pages").
                continue;
            }
            if r.content_type.is_none() && r.body.is_empty() {
                // hyper's own answer to a request it could not parse.
                counts.from_hyper.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if r.cut_short {
                continue;
            }
            if head && r.body.is_empty() {
                // The answer to a HEAD: the shape shows in the headers only.
                if r.content_type.as_deref() != Some("application/json") {
                    return Err(why("an error to HEAD that is not application/json"));
                }
                continue;
            }
            let msg_ok = json
                .as_ref()
                .and_then(|v| v["error"]["message"].as_str())
                .is_some_and(|m| !m.is_empty());
            if code.is_none() || !msg_ok {
                return Err(why("an error without the JSON error shape"));
            }
            if r.content_type.as_deref() != Some("application/json") {
                return Err(why("an error that is not application/json"));
            }
        }
    }
    Ok(())
}

/// A `404` in HTML, to a request for a waiting page that accepts HTML: the one error that is
/// a page rather than JSON. Its body (unless a HEAD's) must lead back to the start.
fn html_not_found_asked(bytes: &[u8], r: &Answer) -> bool {
    let request = String::from_utf8_lossy(bytes).to_ascii_lowercase();
    r.content_type.as_deref() == Some("text/html; charset=utf-8")
        && request.contains("/wait/")
        && request.contains("accept: text/html")
        && (r.body.is_empty() || String::from_utf8_lossy(&r.body).contains("href=\"/\""))
}

/// The first answer's head parses and is not a server error.
fn check_first_head(bytes: &[u8], answer: &[u8]) -> Result<(), TestCaseError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut headers);
    let fail = |what: &str| {
        TestCaseError::fail(format!(
            "{what} in {:?}\nfor {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(2000)]),
            String::from_utf8_lossy(bytes)
        ))
    };
    if answer.is_empty() {
        return Ok(());
    }
    match r.parse(answer) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(fail("an unparsable first answer")),
    }
    // A 503 here cannot be told from another 5xx without its body; none is expected.
    if r.code.is_some_and(|c| c >= 500) {
        return Err(fail("a server error"));
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(2_000)
}

#[test]
fn raw_requests_never_panic_and_always_answer_in_shape() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let target = rt.block_on(target());
    let counts = Counts::default();
    let n = cases();
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        max_shrink_iters: 2_000,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let result = runner.run(&request_bytes(target.tokens.clone()), |bytes| {
        counts.cases.fetch_add(1, Ordering::Relaxed);
        let (answer, errored) = rt
            .block_on(exchange(target.router.clone(), bytes.clone()))
            .map_err(TestCaseError::fail)?;
        // Two hyper behaviours make the byte stream after the first answer's head
        // unreliable for requests that only hurt their sender: an `Upgrade` header makes
        // hyper take the connection as wanting an upgrade, and it may hand it over (closing
        // it) inside a long non-101 answer; with `Expect: 100-continue` and a body the
        // handler never reads, hyper reads the body as the next request and may close, or
        // write that request's 400, inside a long answer. There only the first head counts.
        let lower = bytes.to_ascii_lowercase();
        let has = |h: &[u8]| lower.windows(h.len()).any(|w| w == h);
        let quirk = has(b"\nupgrade:") || has(b"\nexpect:");
        let full = check(&bytes, &answer, errored || quirk, &counts);
        if full.is_err() && quirk {
            counts.first_head_only.fetch_add(1, Ordering::Relaxed);
            check_first_head(&bytes, &answer)?;
            return Ok(());
        }
        full?;
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a panic while serving");
        Ok(())
    });
    println!(
        "fuzz_http: {} cases, {} responses ({} from hyper's parser, {} cases answered \
         nothing, {} answers cut short by a malformed request body or an upgrade, {} checked by \
         their first head only), {} panics, in {:.1} s",
        counts.cases.load(Ordering::Relaxed),
        counts.responses.load(Ordering::Relaxed),
        counts.from_hyper.load(Ordering::Relaxed),
        counts.no_answer.load(Ordering::Relaxed),
        counts.cut_short.load(Ordering::Relaxed),
        counts.first_head_only.load(Ordering::Relaxed),
        PANICS.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
    assert!(counts.cases.load(Ordering::Relaxed) >= n as u64);
}

/// The one error that is not JSON, checked on purpose (random requests rarely ask for it):
/// a browser's request for the page of an unknown event answers a `404` HTML page, which
/// `check` accepts for such a request only; any other client gets the JSON error.
#[test]
fn an_unknown_events_page_is_the_one_html_error() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let target = rt.block_on(target());
    let counts = Counts::default();
    let ask = |method: &str, path: &str, accept: &str| {
        format!("{method} {path} HTTP/1.1\r\nhost: fuzz\r\naccept: {accept}\r\n\r\n").into_bytes()
    };
    for (accept, html) in [
        ("text/html,application/xhtml+xml,*/*;q=0.8", true),
        ("application/json", false),
        ("*/*", false),
    ] {
        for method in ["GET", "HEAD"] {
            let bytes = ask(method, "/wait/nope", accept);
            let (answer, errored) = rt
                .block_on(exchange(target.router.clone(), bytes.clone()))
                .unwrap();
            assert!(!errored);
            let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
            assert!(text.starts_with("http/1.1 404"), "{text}");
            assert_eq!(
                text.contains("content-type: text/html"),
                html,
                "{method} {accept}: {text}"
            );
            check(&bytes, &answer, false, &counts).unwrap();
        }
    }
    // The HTML answer passes as the answer to a browser's request for a waiting page only.
    let (page, _) = rt
        .block_on(exchange(
            target.router.clone(),
            ask("GET", "/wait/nope", "text/html"),
        ))
        .unwrap();
    assert!(check(
        &ask("GET", "/wait/nope", "text/html"),
        &page,
        false,
        &counts
    )
    .is_ok());
    assert!(check(
        &ask("GET", "/api/v1/events/nope", "text/html"),
        &page,
        false,
        &counts
    )
    .is_err());
    assert!(check(&ask("GET", "/wait/nope", "*/*"), &page, false, &counts).is_err());
}

/// The harness itself: a complete request followed by the client's half-close is answered,
/// every time, on any route (were it not, the cases above would test nothing at random).
#[test]
fn every_complete_request_reaches_the_router() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let target = rt.block_on(target());
    for path in [
        "/healthz",
        "/api/v1/events",
        "/wait/concert-a",
        "/wait/nope",
    ] {
        for _ in 0..50 {
            let bytes = format!("GET {path} HTTP/1.1\r\nhost: fuzz\r\naccept: text/html\r\n\r\n");
            let (answer, errored) = rt
                .block_on(exchange(target.router.clone(), bytes.into_bytes()))
                .unwrap();
            assert!(!errored, "{path}: the connection ended on an error");
            assert!(
                answer.starts_with(b"HTTP/1.1 "),
                "{path}: no answer: {:?}",
                String::from_utf8_lossy(&answer)
            );
        }
    }
}

/// Every documented route with a path parameter answers a parameter that is not UTF-8
/// (`%ff`) with the JSON error shape, whatever the method (defect: the waiting room URL
/// nginx redirects to, `/wait/{event_id}/queue`, answered axum's plain-text rejection).
#[test]
fn a_path_parameter_that_is_not_utf8_is_a_json_error_on_every_route() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let t = target().await;
        let doc = call(
            &t.router,
            Method::GET,
            "/api/v1/openapi.json",
            Value::Null,
            false,
        )
        .await;
        let mut checked = 0;
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            if !path.contains('{') {
                continue;
            }
            let uri: String = path
                .split('/')
                .map(|seg| if seg.starts_with('{') { "%ff" } else { seg })
                .collect::<Vec<_>>()
                .join("/");
            for method in ops.as_object().unwrap().keys() {
                let Ok(m) = method.to_uppercase().parse::<Method>() else {
                    continue;
                };
                let req = Request::builder()
                    .method(m.clone())
                    .uri(&uri)
                    .header("authorization", format!("Bearer {ADMIN}"))
                    .header("accept", "application/json")
                    .header("content-type", "application/json")
                    .body(Body::from("{}"))
                    .unwrap();
                let res = t.router.clone().oneshot(req).await.unwrap();
                let status = res.status();
                let ct = res
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
                    .await
                    .unwrap();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                assert!(
                    status.is_client_error()
                        && ct.starts_with("application/json")
                        && body["error"]["code"].is_string(),
                    "{m} {uri}: {status} {ct} {}",
                    String::from_utf8_lossy(&bytes)
                );
                checked += 1;
            }
        }
        assert!(checked >= 20, "only {checked} routes with a parameter");
    });
}
