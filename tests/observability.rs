//! Observability of a real `waitroom` process: traces exported over OTLP/HTTP to a collector
//! (here a fake one: an axum route that keeps what is POSTed), and the Grafana dashboard in
//! `docs/grafana/` against the `/metrics` of a running server.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

mod support;

use support::binary::{Nodes, Server};
use support::redis::RedisServer;

const ADMIN: &str = "observability-admin-token";

/// A fake OpenTelemetry collector: every body POSTed to `/v1/traces`, decoded.
struct Collector {
    url: String,
    got: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

impl Collector {
    async fn start() -> Collector {
        let got: Arc<Mutex<Vec<ExportTraceServiceRequest>>> = Arc::default();
        let kept = got.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let kept = kept.clone();
                async move {
                    assert_eq!(
                        headers["content-type"], "application/x-protobuf",
                        "OTLP/HTTP with protobuf bodies"
                    );
                    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                    kept.lock().unwrap().push(req);
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Collector { url, got }
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Span> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    /// The service name of the first batch.
    fn service_name(&self) -> Option<String> {
        let got = self.got.lock().unwrap();
        let attrs = &got
            .first()?
            .resource_spans
            .first()?
            .resource
            .as_ref()?
            .attributes;
        let kv = attrs.iter().find(|kv| kv.key == "service.name")?;
        match kv.value.as_ref()?.value.as_ref()? {
            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => {
                Some(s.clone())
            }
            _ => None,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

/// A server (embedded, no demo) that exports its traces to the collector at `url`, in
/// batches sent every 50 ms.
fn start_exporting_to(dir: &std::path::Path, url: &str) -> Server {
    start_exporting_with(dir, url, &[])
}

/// [`start_exporting_to`] with more arguments.
fn start_exporting_with(dir: &std::path::Path, url: &str, more: &[&str]) -> Server {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--no-demo",
        "--admin-token",
        ADMIN,
    ];
    args.extend_from_slice(more);
    Server::start(
        dir,
        &args,
        &[
            ("WAITROOM_OTLP_ENDPOINT", url),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
}

async fn get(url: &str, traceparent: Option<&str>) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// With `--otlp-endpoint`, a request's span continues the caller's `traceparent`, reaches
/// the collector with that trace id, and the error body and the log lines of the request
/// carry the same id; on SIGTERM the last spans are flushed.
// Two workers: `terminate` blocks its thread while the server flushes its last spans, and
// the collector must go on answering meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_request_reaches_the_collector_with_the_callers_trace_id() {
    let collector = Collector::start().await;
    let redis = RedisServer::start();
    let nodes = Nodes::new(ADMIN);
    let data = nodes.dir.path().join("node");
    std::fs::create_dir_all(&data).unwrap();
    let server = Server::start(
        nodes.dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            &redis.url(),
            "--signing-key",
            nodes.key.to_str().unwrap(),
            "--admin-token",
            ADMIN,
            "--data-dir",
            data.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[
            ("WAITROOM_OTLP_ENDPOINT", collector.url.as_str()),
            // The log level does not silence the traces.
            ("RUST_LOG", "warn"),
        ],
    );

    // An error answer: its body names the caller's trace.
    let tp = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let (status, body) = get(&server.url("/api/v1/events/no-such-event"), Some(&tp)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "EVENT_NOT_FOUND");
    assert_eq!(body["error"]["trace_id"], TRACE, "{body}");

    // Without a traceparent a request is a trace of its own, named in its error too.
    let (_, own) = get(&server.url("/api/v1/nowhere"), None).await;
    let own_trace = own["error"]["trace_id"].as_str().unwrap().to_string();
    assert_eq!(own_trace.len(), 32);
    assert_ne!(own_trace, TRACE);
    // A malformed traceparent is ignored, not an error.
    let (status, _) = get(&server.url("/healthz"), Some("00-zz-yy-01")).await;
    assert_eq!(status, StatusCode::OK);

    // The store stops answering: the request logs (a warning, then the failed answer), and
    // each of its lines names the trace.
    let second = "0af7651916cd43dd8448eb211c80319c";
    redis.pause();
    let (status, body) = get(
        &server.url("/readyz"),
        Some(&format!("00-{second}-b7ad6b7169203331-01")),
    )
    .await;
    redis.resume();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["trace_id"], second);
    let stderr = server.stderr();
    // (Background tasks may log the outage too, outside any request: those are not these.)
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "store unavailable" || v["message"] == "response failed")
        .collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    for line in lines {
        assert_eq!(line["span"]["trace_id"], second, "{line}");
    }

    // The spans are batched; SIGTERM sends what is left before the process exits.
    assert!(server.terminate(Duration::from_secs(15)).success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let spans = collector.spans();
        let traces: BTreeSet<String> = spans.iter().map(|s| hex(&s.trace_id)).collect();
        if traces.contains(TRACE) && traces.contains(second) && traces.contains(&own_trace) {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans missing: {traces:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let span = spans.iter().find(|s| hex(&s.trace_id) == TRACE).unwrap();
    assert_eq!(
        hex(&span.parent_span_id),
        CALLER_SPAN,
        "a child of the caller's span"
    );
    assert_eq!(
        span.name, "GET /api/v1/events/{event_id}",
        "the route, not the path"
    );
    assert_eq!(
        int_attr(span, "http.response.status_code"),
        Some(404),
        "{:?}",
        span.attributes
    );
    assert_eq!(
        span.kind,
        opentelemetry_proto::tonic::trace::v1::span::SpanKind::Server as i32
    );
    let failed = spans.iter().find(|s| hex(&s.trace_id) == second).unwrap();
    assert_eq!(int_attr(failed, "http.response.status_code"), Some(503));
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32)
    );
    assert_eq!(collector.service_name().as_deref(), Some("waitroom"));
}

/// A collector that takes the connection and never answers holds up neither the requests
/// nor the exit (which must stay under the 10 s a container runtime waits).
#[tokio::test]
async fn a_stuck_collector_holds_neither_requests_nor_the_exit() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            keep.lock().unwrap().push(conn); // read nothing, answer nothing
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let server = start_exporting_with(dir.path(), &url, &["--log-format", "json"]);
    for _ in 0..20 {
        let (status, body) = get(&server.url("/api/v1/events/nope"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["trace_id"].as_str().map(str::len), Some(32));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while held.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no export was tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let log = server.stderr_file.clone();
    assert!(server.terminate(Duration::from_secs(10)).success());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "exit took {took:?}");
    // The flush that timed out is said in the log's own format: every line is JSON
    // (defect: this one line was plain text).
    let stderr = std::fs::read_to_string(log).unwrap();
    assert!(
        stderr.contains("flushing the trace export failed"),
        "{stderr}"
    );
    for line in stderr.lines() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "not JSON: {line}"
        );
    }
}

/// A collector that cannot be reached (nothing listens on its port) is told to the
/// operator: a warning that names its URL and the cause, once however many exports fail
/// within the minute, where every span used to be lost without a word.
#[tokio::test]
async fn an_unreachable_collector_is_warned_about_once() {
    // A port that was free a moment ago and is closed now: connections to it are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let server = start_exporting_to(dir.path(), &url);
    let warning = "exporting traces to the OTLP collector failed";
    let requests = || async {
        for _ in 0..5 {
            let (status, _) = get(&server.url("/api/v1/events/nope"), None).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
        }
        // Past the batch delay: the next requests are a batch (an export) of their own.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.stderr().contains(warning) {
        assert!(
            Instant::now() < deadline,
            "no warning of the failed exports: {}",
            server.stderr()
        );
        requests().await;
    }
    // More batches, each failing: still the one warning.
    for _ in 0..5 {
        requests().await;
    }
    let stderr = server.stderr();
    assert_eq!(stderr.matches(warning).count(), 1, "{stderr}");
    let line = stderr.lines().find(|l| l.contains(warning)).unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains(&format!("{url}/v1/traces")), "{line}");
    assert!(line.to_lowercase().contains("refused"), "{line}");
    assert!(server.terminate(Duration::from_secs(10)).success());
}

/// In gateway mode, the errors the gateway answers itself (a site that does not answer,
/// a transfer coding it does not pass on) carry the request's trace id as every other
/// error does (defect: they were written by hand, without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_errors_carry_the_trace_id() {
    let collector = Collector::start().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let dir = tempfile::tempdir().unwrap();
    let server = start_exporting_with(dir.path(), &collector.url, &["--upstream", &origin]);
    let tp = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let (status, body) = get(&server.url("/anything"), Some(&tp)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["code"], "UPSTREAM_UNAVAILABLE", "{body}");
    assert_eq!(body["error"]["trace_id"], TRACE, "{body}");
    // A body in a coding other than `chunked` alone, sent by hand (clients refuse to).
    let addr = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    conn.write_all(
        format!(
            "POST /upload HTTP/1.1\r\nhost: {addr}\r\ntraceparent: {tp}\r\n\
             transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer))
        .await
        .expect("the connection is closed after the answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    assert!(
        answer.contains(&format!("\"trace_id\":\"{TRACE}\"")),
        "{answer}"
    );
}

/// Without `otlp_endpoint` nothing is traced: error bodies keep their old shape.
#[tokio::test]
async fn without_export_error_bodies_have_no_trace_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--no-demo",
            "--admin-token",
            ADMIN,
        ],
        &[],
    );
    let tp = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let (status, body) = get(&server.url("/api/v1/events/nope"), Some(&tp)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"error": {"code": "EVENT_NOT_FOUND", "message": "unknown event"}})
    );
}

/// Every metric the dashboard queries, and its template variables.
fn dashboard_metrics() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana/waitroom.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(dash["uid"], "waitroom");
    let mut queries = Vec::new();
    let mut ids = BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        assert!(p["gridPos"]["w"].as_u64().unwrap() <= 24);
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{t}");
            queries.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            queries.push(q.to_string());
        }
    }
    let mut names = BTreeSet::new();
    for q in &queries {
        let mut rest = q.as_str();
        while let Some(i) = rest.find("waitroom_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

/// Every metric docs/API.md lists (its "**Metrics**" items).
fn documented_metrics() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/API.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let mut names = BTreeSet::new();
    let mut in_item = false;
    for line in doc.lines() {
        if line.starts_with("- ") || line.trim().is_empty() || line.starts_with('#') {
            in_item = line.starts_with("- **Metrics**");
        }
        if !in_item {
            continue;
        }
        for quoted in line.split('`').skip(1).step_by(2) {
            if quoted.starts_with("waitroom_") && !quoted.contains(['{', ' ']) {
                names.insert(quoted.to_string());
            }
        }
    }
    names
}

/// The documented metrics a fresh node cannot export yet: their labels name events or
/// requests, none of which there are before the first.
const NOT_BEFORE_USE: [&str; 13] = [
    "waitroom_waiting",
    "waitroom_admitted",
    "waitroom_active",
    "waitroom_capacity",
    "waitroom_joins_total",
    "waitroom_admissions_total",
    "waitroom_entries_total",
    "waitroom_expirations_total",
    "waitroom_leaves_total",
    "waitroom_completions_total",
    "waitroom_store_memory_bytes",
    "waitroom_http_requests_total",
    "waitroom_http_request_duration_seconds",
];

/// The families `/metrics` answers (its `# TYPE` lines).
fn exported_families(text: &str) -> BTreeSet<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect()
}

/// The first scrape of a node that has served nothing yet has every documented metric
/// whose labels are fixed, but those of `other_stores` (metrics of the other store only),
/// with every value of those labels.
async fn assert_exported_from_the_start(s: &Server, other_stores: &[&str]) {
    let documented = documented_metrics();
    assert!(documented.len() >= 20, "{documented:?}");
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported = exported_families(&text);
    let missing: Vec<&String> = documented
        .iter()
        .filter(|n| !NOT_BEFORE_USE.contains(&n.as_str()) && !other_stores.contains(&n.as_str()))
        .filter(|n| !exported.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not in /metrics at the start: {missing:?}\n{text}"
    );
    for series in [
        "waitroom_live_connections 0",
        "waitroom_connections_refused_total 0",
        "waitroom_rate_limited_total{limit=\"join\"} 0",
        "waitroom_rate_limited_total{limit=\"poll\"} 0",
        "waitroom_rate_limited_total{limit=\"admin\"} 0",
        "waitroom_rate_limited_total{limit=\"streams\"} 0",
        "waitroom_gateway_requests_total{outcome=\"unavailable\"} 0",
    ] {
        assert!(text.lines().any(|l| l == series), "no `{series}`:\n{text}");
    }
}

/// The Redis store's metrics, which an embedded server does not export.
const REDIS_ONLY: [&str; 3] = [
    "waitroom_replica_lag_seconds",
    "waitroom_replica_status_total",
    "waitroom_replica_resyncs_total",
];

/// The embedded store's metrics, which a server on Redis does not export.
const EMBEDDED_ONLY: [&str; 2] = [
    "waitroom_store_sync_seconds",
    "waitroom_gateway_thread_connections_total",
];

/// The dashboard queries only metrics that a running server exports: a server on Redis is
/// driven through every kind of change (join, admission, entry, completion, leave, expiry,
/// a limit, a refused connection, a live follower), then its `/metrics` is read.
/// The Redis-only memory gauge does not appear on an embedded server when an event is
/// deleted (zeroing a deleted event's gauges created its series). Before that, the first
/// scrape has every documented metric with fixed labels (in gateway mode, for the
/// gateway's).
#[tokio::test]
async fn an_embedded_server_has_no_store_memory_series() {
    use reqwest::Method;
    use support::binary::call;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::start(
        dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--admin-token",
            ADMIN,
            "--no-demo",
            "--upstream",
            "http://127.0.0.1:9",
        ]
        .into_iter()
        .chain(["--data-dir", data.to_str().unwrap()])
        .collect::<Vec<_>>(),
        &[],
    );
    assert_exported_from_the_start(&s, &REDIS_ONLY).await;
    let ev = s.url("/api/v1/admin/events/gone");
    let (st, body) = call(Method::PUT, &ev, Some(ADMIN), Some(json!({}))).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, _) = call(Method::DELETE, &ev, Some(ADMIN), None).await;
    assert_eq!(st, StatusCode::OK);
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("waitroom_waiting{event=\"gone\"} 0"),
        "{text}"
    );
    assert!(!text.contains("waitroom_store_memory_bytes"), "{text}");
}

#[tokio::test]
async fn every_metric_of_the_dashboard_is_exported_by_a_running_server() {
    let names = dashboard_metrics();
    assert!(names.len() >= 15, "{names:?}");

    let redis = RedisServer::start();
    let nodes = Nodes::new(ADMIN);
    let data = nodes.dir.path().join("node");
    std::fs::create_dir_all(&data).unwrap();
    let s = Server::start(
        nodes.dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--store",
            &redis.url(),
            "--signing-key",
            nodes.key.to_str().unwrap(),
            "--admin-token",
            ADMIN,
            "--data-dir",
            data.to_str().unwrap(),
            "--admin-failures-per-minute",
            "1",
            "--max-connections-per-client",
            "8",
            // Gateway mode, in front of an origin that is not there: a proxied request
            // counts as `unavailable` in the gateway's metrics.
            "--upstream",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert_exported_from_the_start(&s, &EMBEDDED_ONLY).await;
    use reqwest::Method;
    use support::binary::call;
    let ev = json!({"max_active": 1, "ready_ttl_sec": 1});
    let (st, body) = call(
        Method::PUT,
        &s.url("/api/v1/admin/events/dash"),
        Some(ADMIN),
        Some(ev),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let join = s.url("/api/v1/queue/join");
    let joined = |user: &'static str| {
        let join = join.clone();
        async move {
            let body = json!({"event_id": "dash", "user_id": user});
            let (st, place) = call(Method::POST, &join, None, Some(body)).await;
            assert_eq!(st, StatusCode::OK, "{place}");
            place["waiting_token"].as_str().unwrap().to_string()
        }
    };
    // Ann is admitted and lets her turn lapse (expiry).
    joined("ann").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, fig) = call(
            Method::GET,
            &s.url("/api/v1/admin/events/dash"),
            Some(ADMIN),
            None,
        )
        .await;
        if fig["expired"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no expiry: {fig}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ben enters and completes; Cy, behind him, follows live, then leaves.
    let ben = joined("ben").await;
    let cy = joined("cy").await;
    let live = reqwest::Client::new()
        .get(s.url(&format!("/api/v1/queue/events?token={cy}")))
        .send()
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let (st, granted) = call(
        Method::POST,
        &s.url("/api/v1/queue/enter"),
        None,
        Some(json!({"waiting_token": ben})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{granted}");
    let access = granted["access_token"].as_str().unwrap();
    let (st, _) = call(
        Method::POST,
        &s.url("/api/v1/session/complete"),
        Some(access),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = call(
        Method::DELETE,
        &s.url(&format!("/api/v1/queue/leave?token={cy}")),
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    // Wrong admin tokens past the limit.
    for _ in 0..3 {
        call(
            Method::GET,
            &s.url("/api/v1/admin/events"),
            Some("wrong"),
            None,
        )
        .await;
    }
    // A request for the site behind the gateway (no event gates `/shop`).
    let shop = reqwest::get(s.url("/shop")).await.unwrap();
    assert_eq!(shop.status(), StatusCode::BAD_GATEWAY);
    // More connections than one client may hold.
    let addr = s.base.trim_start_matches("http://").to_string();
    let held: Vec<_> = (0..12)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();

    // Until the server has seen the held connections close, a new one may be refused too;
    // and the memory gauge is set by a background task: so ask until everything is there.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = match reqwest::get(s.url("/metrics")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let exported: BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !exported.contains(n.as_str()))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not in /metrics: {missing:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(live);
}

/// An origin that keeps the headers of every request it gets.
async fn recording_origin() -> (String, Arc<Mutex<Vec<axum::http::HeaderMap>>>) {
    let got: Arc<Mutex<Vec<axum::http::HeaderMap>>> = Arc::default();
    let kept = got.clone();
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let kept = kept.clone();
        async move {
            kept.lock().unwrap().push(headers);
            "from the origin"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

fn gateway(dir: &std::path::Path, origin: &str, env: &[(&str, &str)]) -> Server {
    let data = dir.join("data");
    Server::start(
        dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--no-demo",
            "--admin-token",
            ADMIN,
            "--data-dir",
            data.to_str().unwrap(),
            "--upstream",
            origin,
        ],
        env,
    )
}

async fn proxied(url: &str, traceparent: Option<&str>) -> String {
    let mut req = reqwest::Client::new().get(url);
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.text().await.unwrap()
}

/// Through the gateway with export on: the proxied request's span continues the client's
/// trace, and the origin is handed a `traceparent` of the same trace whose parent is that
/// span, so the origin's own spans join the trace under the gateway's.
#[tokio::test]
async fn the_gateway_passes_the_trace_on_to_the_origin() {
    let collector = Collector::start().await;
    let (origin, seen) = recording_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let server = gateway(
        dir.path(),
        &origin,
        &[
            ("WAITROOM_OTLP_ENDPOINT", collector.url.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let tp = format!("00-{TRACE}-{CALLER_SPAN}-01");
    assert_eq!(
        proxied(&server.url("/shop/page?x=1"), Some(&tp)).await,
        "from the origin"
    );
    // Without one, the proxied request starts a trace, and the origin still hears of it.
    proxied(&server.url("/other"), None).await;

    let headers = seen.lock().unwrap().clone();
    assert_eq!(headers.len(), 2);
    let sent: Vec<Vec<String>> = headers
        .iter()
        .map(|h| {
            let tp = h["traceparent"].to_str().unwrap();
            tp.split('-').map(str::to_string).collect()
        })
        .collect();
    assert_eq!(sent[0][0], "00");
    assert_eq!(
        sent[0][1], TRACE,
        "the client's trace goes on to the origin"
    );
    assert_ne!(sent[0][2], CALLER_SPAN, "its parent is the gateway's span");
    assert_eq!(sent[0][3], "01", "still sampled");
    assert_eq!(sent[1][1].len(), 32);
    assert_ne!(sent[1][1], TRACE);

    // The collector runs on this test's runtime: the exit is waited for off it, so that
    // the collector answers the exports the server makes meanwhile, as a real one would.
    // (Blocked, it left an export unanswered, the batch processor waited on it, and the
    // last span was still queued when the exit's flush timed out.)
    let exited = tokio::task::spawn_blocking(move || server.terminate(Duration::from_secs(15)));
    assert!(exited.await.unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let span = loop {
        let found = collector
            .spans()
            .into_iter()
            .find(|s| hex(&s.trace_id) == TRACE);
        if let Some(s) = found {
            break s;
        }
        assert!(Instant::now() < deadline, "no span of the trace exported");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        hex(&span.parent_span_id),
        CALLER_SPAN,
        "a child of the client's span"
    );
    assert_eq!(
        hex(&span.span_id),
        sent[0][2],
        "the parent the origin was given"
    );
    assert_eq!(span.name, "GET gateway", "no raw path in the span's name");
    assert_eq!(int_attr(&span, "http.response.status_code"), Some(200));
    assert!(
        collector
            .spans()
            .iter()
            .any(|s| hex(&s.trace_id) == sent[1][1] && hex(&s.span_id) == sent[1][2]),
        "the second request's span is the origin's parent too"
    );
}

/// Without export the gateway neither makes spans nor touches the trace headers: the
/// client's `traceparent` and `tracestate` reach the origin as they came.
#[tokio::test]
async fn without_export_the_gateway_passes_the_clients_traceparent_unchanged() {
    let (origin, seen) = recording_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let server = gateway(dir.path(), &origin, &[]);
    let tp = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let resp = reqwest::Client::new()
        .get(server.url("/page"))
        .header("traceparent", &tp)
        .header("tracestate", "vendor=abc")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    proxied(&server.url("/page"), None).await;
    let headers = seen.lock().unwrap().clone();
    assert_eq!(headers.len(), 2);
    assert_eq!(headers[0]["traceparent"], tp.as_str());
    assert_eq!(headers[0]["tracestate"], "vendor=abc");
    assert!(
        !headers[1].contains_key("traceparent"),
        "no trace is made up for a request that had none"
    );
}
