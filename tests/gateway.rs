//! Gateway mode and nginx's `auth_request`, end to end: a real origin (a small axum server),
//! waitroom serving with `upstream` set (in process, on a free port), and for the nginx
//! flow a real nginx started on a free port with its own temp dir and docs/nginx.conf.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::{Message as WsMessage, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;

const ADMIN: &str = "gateway-admin-token-0123456789";

/// The origin: echoes what it was told, completes on `/checkout/done`, echoes WebSocket
/// messages on `/ws`.
async fn origin() -> SocketAddr {
    async fn echo(uri: axum::http::Uri, h: HeaderMap) -> impl IntoResponse {
        // Every line of a header, so that a test sees a line passed on beside another.
        let get = |n: &str| {
            let lines: Vec<&str> = h
                .get_all(n)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            (!lines.is_empty()).then(|| lines.join(" | "))
        };
        // A site that lets shared caches keep its pages.
        let cache = [
            ("cache-control", "public, max-age=3600"),
            ("cdn-cache-control", "max-age=3600"),
            ("surrogate-control", "max-age=3600"),
            ("cloudflare-cdn-cache-control", "max-age=3600"),
            ("edge-control", "cache-maxage=3600"),
            ("akamai-cache-control", "max-age=3600"),
            ("x-accel-expires", "3600"),
            ("expires", "Wed, 21 Oct 2037 07:28:00 GMT"),
        ];
        // Every header by its name, for the names no field below reads.
        let all: serde_json::Map<String, Value> = h
            .keys()
            .map(|n| (n.to_string(), json!(get(n.as_str()))))
            .collect();
        (
            cache,
            axum::Json(json!({
                "origin": true,
                "path": uri.path(),
                "host": get("host"),
                "user": get("x-waitroom-user"),
                "session": get("x-waitroom-session"),
                "bypass": get("x-waitroom-bypass"),
                "xff": get("x-forwarded-for"),
                "proto": get("x-forwarded-proto"),
                "xfh": get("x-forwarded-host"),
                "forwarded": get("forwarded"),
                "cookie": get("cookie"),
                "upgrade": get("upgrade"),
                "original_url": get("x-original-url").or(get("x_original_url")),
                "rewrite_url": get("x-rewrite-url").or(get("x_rewrite_url")),
                "original_uri": get("x-original-uri"),
                "headers": all,
            })),
        )
    }
    async fn done() -> impl IntoResponse {
        ([("x-waitroom-complete", "1")], "purchase done")
    }
    async fn ws(up: WebSocketUpgrade) -> impl IntoResponse {
        up.on_upgrade(|mut s| async move {
            while let Some(Ok(m)) = s.recv().await {
                if let WsMessage::Text(t) = m {
                    let _ = s.send(WsMessage::Text(format!("echo {t}").into())).await;
                }
            }
        })
    }
    // A body whose second half waits for the test to have read the first: a proxy that
    // buffered whole bodies would never deliver either.
    async fn stream() -> axum::body::Body {
        let parts = futures_util::stream::unfold(0, |i| async move {
            match i {
                0 => Some((Ok::<_, std::io::Error>("first\n".to_string()), 1)),
                1 => {
                    release().notified().await;
                    Some((Ok("second\n".to_string()), 2))
                }
                _ => None,
            }
        });
        axum::body::Body::from_stream(parts)
    }
    async fn upload(body: axum::body::Bytes) -> String {
        body.len().to_string()
    }
    let app = Router::new()
        .route("/checkout/done", get(done))
        .route("/ws", get(ws))
        .route("/stream", get(stream))
        .route("/upload", axum::routing::post(upload))
        .fallback(echo);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    addr
}

/// Lets the origin's `/stream` send its second half.
fn release() -> &'static tokio::sync::Notify {
    static RELEASE: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();
    RELEASE.get_or_init(tokio::sync::Notify::new)
}

struct Waitroom {
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// Waitroom in gateway mode in front of `upstream` (or without gateway when `None`).
async fn waitroom(upstream: Option<SocketAddr>, trusted: Option<&str>) -> Waitroom {
    let dir = tempfile::tempdir().unwrap();
    let mut s = waitroom::config::Settings {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("data"),
        admin_token: Some(ADMIN.to_string().into()),
        demo: false,
        upstream: upstream
            .map(|u| waitroom::gateway::Upstream::parse(&format!("http://{u}")).unwrap()),
        ..Default::default()
    };
    if let Some(t) = trusted {
        s.rate_limits.trusted_proxies = waitroom::config::Cidr::parse_list(t).unwrap();
    }
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        waitroom::server::run(s, l, std::future::pending())
            .await
            .unwrap()
    });
    Waitroom { addr, _dir: dir }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Creates an event and waits until the gate table knows it (on its first host, if it
/// names any).
async fn event(w: &Waitroom, id: &str, settings: Value) {
    let r = client()
        .put(format!("http://{}/api/v1/admin/events/{id}", w.addr))
        .bearer_auth(ADMIN)
        .json(&settings)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let probe = settings["paths"][0].as_str().unwrap().to_string();
    for _ in 0..200 {
        let mut gate = client()
            .get(format!("http://{}/api/v1/gate", w.addr))
            .header("x-original-uri", &probe);
        if let Some(host) = settings["hosts"][0].as_str() {
            gate = gate.header("host", host);
        }
        let r = gate.send().await.unwrap();
        if r.status() == 401 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the gate table never learnt of {id}");
}

/// Joins `event` through the API and enters at once (it has room): the waiting token and
/// the access token.
async fn api_session(w: &Waitroom, event: &str) -> (String, String) {
    let post = |path: &str, body: Value| {
        let url = format!("http://{}/api/v1{path}", w.addr);
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    let joined = post("/queue/join", json!({ "event_id": event })).await;
    let waiting = joined["waiting_token"].as_str().unwrap().to_string();
    let entered = post("/queue/enter", json!({ "waiting_token": waiting })).await;
    let jwt = entered["access_token"].as_str().unwrap().to_string();
    (waiting, jwt)
}

/// A person: their cookies, kept by hand (the client has no cookie store).
#[derive(Default, Clone)]
struct Person {
    cookies: Vec<(String, String)>,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|_| panic!("not JSON: {}", self.text))
    }
    fn is_origin(&self) -> bool {
        self.status == 200 && self.text.contains("\"origin\":true")
    }
}

impl Person {
    async fn get(&mut self, url: &str, extra: &[(&str, &str)]) -> Answer {
        let mut req = client().get(url);
        if !self.cookies.is_empty() {
            let c: Vec<String> = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            req = req.header("cookie", c.join("; "));
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        let headers = r.headers().clone();
        for sc in headers.get_all("set-cookie") {
            let sc = sc.to_str().unwrap();
            let (kv, _) = sc.split_once(';').unwrap_or((sc, ""));
            let (k, v) = kv.split_once('=').unwrap();
            self.cookies.retain(|(n, _)| n != k);
            if !sc.contains("Max-Age=0") {
                self.cookies.push((k.to_string(), v.to_string()));
            }
        }
        Answer {
            status,
            headers,
            text: r.text().await.unwrap(),
        }
    }
    fn cookie(&self, name: &str) -> Option<String> {
        self.cookies
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

fn gated(id: &str, extra: Value) -> Value {
    let mut v = json!({
        "max_active": 1,
        "paths": ["/checkout"],
        "bypass_paths": ["/checkout/static/"],
        "bypass_secret": "staff-secret-0123456789",
    });
    v.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let _ = id;
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_person_waits_in_place_and_completion_hands_the_slot_on() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);

    // Everything ungated passes straight through, without a cookie.
    let mut anyone = Person::default();
    let r = anyone.get(&url("/about?x=1"), &[]).await;
    assert!(r.is_origin(), "{}", r.text);
    assert_eq!(r.json()["path"], "/about");
    assert!(anyone.cookies.is_empty());
    // Headers some origins serve instead of the path (IIS, older Symfony and Zend) would
    // carry an ungated request to a gated page: they never reach the origin.
    let r = anyone
        .get(
            &url("/about"),
            &[
                ("x-original-url", "/checkout"),
                ("x_original_url", "/checkout"),
                ("x-rewrite-url", "/checkout"),
                ("x_rewrite_url", "/checkout"),
                ("x-original-uri", "/checkout"),
            ],
        )
        .await;
    assert!(r.is_origin(), "{}", r.text);
    assert_eq!(r.json()["original_url"], Value::Null, "{}", r.text);
    assert_eq!(r.json()["rewrite_url"], Value::Null, "{}", r.text);
    assert_eq!(r.json()["original_uri"], Value::Null, "{}", r.text);
    assert!(anyone.cookies.is_empty());

    // Below capacity: admitted at once and proxied. The origin hears who it is, never
    // what the client claimed (forged identity headers are an attack).
    let mut a = Person::default();
    let r = a
        .get(
            &url("/checkout"),
            &[
                ("x-waitroom-user", "admin"),
                ("x-waitroom-session", "forged"),
                ("x-forwarded-for", "6.6.6.6"),
            ],
        )
        .await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let seen = r.json();
    let session = seen["session"].as_str().unwrap().to_string();
    assert_ne!(session, "forged");
    assert_ne!(seen["user"], "admin");
    assert_eq!(
        seen["xff"], "127.0.0.1",
        "an untrusted client's chain is replaced"
    );
    assert_eq!(seen["proto"], "http");
    assert!(seen["forwarded"]
        .as_str()
        .unwrap()
        .starts_with("for=127.0.0.1"));
    let set = r.headers.get("set-cookie").unwrap().to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain http, not configured: {set}");
    // The same session on the next request.
    let r = a.get(&url("/checkout/pay"), &[]).await;
    assert!(r.is_origin());
    assert_eq!(r.json()["session"], session.as_str());

    // The event is full: the second person gets the waiting room at the URL they asked
    // for, with a place kept in a cookie; it refreshes itself.
    let mut b = Person::default();
    let r = b
        .get(&url("/checkout?seat=12"), &[("accept", "text/html")])
        .await;
    assert_eq!(r.status, 503);
    assert!(r.text.contains("http-equiv=\"refresh\""), "{}", r.text);
    assert!(r.text.contains("waitroom-position"));
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(r.headers["cache-control"], "no-store");
    // As the script pages: no sniffing, and the URL (where they were going) kept to us.
    assert_eq!(r.headers["x-content-type-options"], "nosniff");
    assert_eq!(r.headers["referrer-policy"], "no-referrer");
    assert!(b.cookie("waitroom_shop").is_some());
    // A JSON client gets its place and Retry-After, and keeps its place.
    let r = b
        .get(&url("/checkout?seat=12"), &[("accept", "application/json")])
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["status"], "waiting");
    assert_eq!(r.json()["position"], 1);
    assert!(
        r.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    // Another newcomer is behind.
    let mut c = Person::default();
    let r = c
        .get(&url("/checkout"), &[("accept", "application/json")])
        .await;
    assert_eq!(r.json()["position"], 2);

    // The origin says the purchase is done: the session ends, the slot goes to B at once.
    let r = a.get(&url("/checkout/done"), &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text, "purchase done");
    assert!(
        !r.headers.contains_key("x-waitroom-complete"),
        "an internal signal"
    );
    assert!(a.cookie("waitroom_shop").is_none(), "the cookie is cleared");
    let r = b.get(&url("/checkout?seat=12"), &[]).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    assert_eq!(r.json()["path"], "/checkout");
    // A's old session is over: it cannot reach the origin with it again.
    a.cookies = vec![("waitroom_shop".into(), "x".into())];
    let r = a
        .get(&url("/checkout"), &[("accept", "application/json")])
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["position"], 2, "behind C");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_expired_cookies_are_refused() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({"session_max_sec": 2}))).await;
    let url = format!("http://{}/checkout", w.addr);
    let mut a = Person::default();
    assert!(a.get(&url, &[]).await.is_origin());
    let token = a.cookie("waitroom_shop").unwrap();

    // Forgeries: a changed MAC, garbage, a valid token of another event's name.
    for forged in [
        format!("{}A", &token[..token.len() - 1]),
        "garbage".to_string(),
        String::new(),
    ] {
        let forged = if forged == token {
            format!("{}B", &token[..token.len() - 1])
        } else {
            forged
        };
        let mut m = Person {
            cookies: vec![("waitroom_shop".into(), forged.clone())],
        };
        let r = m.get(&url, &[("accept", "application/json")]).await;
        assert_eq!(r.status, 503, "{forged:?} reached the origin: {}", r.text);
        assert_ne!(
            m.cookie("waitroom_shop"),
            Some(forged),
            "a new place replaces it"
        );
    }
    let mut b = Person::default();
    let r = b.get(&url, &[("accept", "application/json")]).await;
    assert_eq!(r.status, 503);

    // A's session reaches its maximum: its cookie no longer opens the origin.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let mut late = Person {
        cookies: vec![("waitroom_shop".into(), token.clone())],
    };
    let r = late.get(&url, &[("accept", "application/json")]).await;
    assert_eq!(
        r.status, 503,
        "an expired session reached the origin: {}",
        r.text
    );
    assert_ne!(late.cookie("waitroom_shop"), Some(token));
}

/// A trusted proxy that adds its hop as a line of its own (HAProxy's `option forwardfor`)
/// after the line a client invented: the origin must get the whole chain, the real client
/// included, or the invention becomes the nearest untrusted hop and the origin's own
/// per-address rules see the address the client chose. Of `X-Forwarded-Proto` only the
/// proxy's line, the last, counts and goes on; `X-Forwarded-Host` is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_own_header_line_is_kept_in_the_chain() {
    let o = origin().await;
    let w = waitroom(Some(o), Some("127.0.0.1")).await;
    event(&w, "shop", gated("shop", json!({"max_active": 5}))).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let lines = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "5.5.5.5"),
        ("forwarded", "for=6.6.6.6;proto=https"),
        ("forwarded", "for=5.5.5.5;proto=http"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-proto", "http"),
        ("x-forwarded-host", "evil.example"),
        ("x-forwarded-host", "shop.example"),
    ];
    let seen = Person::default().get(&url("/pub"), &lines).await.json();
    // `X-Forwarded-Host` is the host the gate matched, never one passed on: a proxy that
    // passes a client's line on untouched would let it name a host whose gate it skipped.
    assert_eq!(seen["xfh"], seen["host"], "the host the gate matched");
    assert_ne!(seen["xfh"], "shop.example");
    assert_eq!(seen["xff"], "6.6.6.6, 5.5.5.5, 127.0.0.1");
    assert_eq!(seen["proto"], "http", "one line, the proxy's");
    let forwarded = seen["forwarded"].as_str().unwrap();
    assert!(
        forwarded.starts_with("for=6.6.6.6;proto=https, for=5.5.5.5;proto=http, for=127.0.0.1;"),
        "{forwarded}"
    );
    assert!(forwarded.ends_with(";proto=http"), "{forwarded}");
    // The session cookie follows the proxy's line too: not `Secure` over http…
    let mut a = Person::default();
    let r = a.get(&url("/checkout"), &lines).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let set = r.headers["set-cookie"].to_str().unwrap();
    assert!(!set.contains("Secure"), "{set}");
    // …and `Secure` when the proxy says https after a client's http.
    let mut b = Person::default();
    let r = b
        .get(
            &url("/checkout"),
            &[
                ("x-forwarded-proto", "http"),
                ("x-forwarded-proto", "https"),
            ],
        )
        .await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    assert_eq!(r.json()["proto"], "https");
    let set = r.headers["set-cookie"].to_str().unwrap();
    assert!(set.contains("Secure"), "{set}");
}

/// The headers besides the forwarding ones that origins and frameworks read the client's
/// address from (Rails and PHP `Client-IP`, nginx setups `X-Real-IP`, CDNs' own), with
/// spellings that CGI-style origins read as the same names (`HTTP_X_REAL_IP`).
const CLIENT_IP_HEADERS: [&str; 13] = [
    "x-real-ip",
    "true-client-ip",
    "client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "fly-client-ip",
    "x-originating-ip",
    "x-remote-ip",
    "x-remote-addr",
    "x-forwarded",
    "forwarded-for",
];
const CLIENT_IP_UNDERSCORED: [&str; 6] = [
    "x_real_ip",
    "true_client_ip",
    "client_ip",
    "x-cluster_client-ip",
    "x_forwarded",
    "forwarded_for",
];

/// A client that is no trusted proxy names itself in every client-address header an
/// origin might read (a bot against the origin's per-address limits): none reaches the
/// origin, which gets `X-Real-IP` as the address the connection came from instead, on an
/// ungated path and on a gated one alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_client_cannot_name_its_address_in_any_client_ip_header() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({"max_active": 5}))).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let forged: Vec<(&str, &str)> = CLIENT_IP_HEADERS
        .iter()
        .chain(&CLIENT_IP_UNDERSCORED)
        .map(|n| (*n, "6.6.6.6"))
        .collect();
    for path in ["/pub", "/checkout"] {
        let r = Person::default().get(&url(path), &forged).await;
        assert!(r.is_origin(), "{path}: {} {}", r.status, r.text);
        let seen = &r.json()["headers"];
        assert_eq!(seen["x-real-ip"], "127.0.0.1", "{path}: {seen}");
        for n in CLIENT_IP_HEADERS
            .iter()
            .skip(1)
            .chain(&CLIENT_IP_UNDERSCORED)
        {
            assert_eq!(seen[*n], Value::Null, "{path}: {n} reached the origin");
        }
        assert_eq!(r.json()["xff"], "127.0.0.1");
    }
}

/// From a trusted proxy the client-address headers are kept: its `X-Real-IP` (of several
/// lines only the last, its own) and the others as they came. Without an `X-Real-IP`
/// the origin gets the client the proxy's chain names. A spelling with `_` is dropped
/// even so: a proxy that sets `X-Real-IP` passes a client's `X_Real_IP` on untouched,
/// and a CGI-style origin reads the two as one name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_client_ip_headers_are_kept() {
    let o = origin().await;
    let w = waitroom(Some(o), Some("127.0.0.1")).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let mut sent: Vec<(&str, &str)> =
        vec![("x-forwarded-for", "203.0.113.9"), ("x-real-ip", "6.6.6.6")];
    sent.extend(CLIENT_IP_HEADERS.iter().map(|n| (*n, "203.0.113.9")));
    sent.extend(CLIENT_IP_UNDERSCORED.iter().map(|n| (*n, "6.6.6.6")));
    let r = Person::default().get(&url("/pub"), &sent).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let seen = &r.json()["headers"];
    assert_eq!(
        seen["x-real-ip"], "203.0.113.9",
        "one line, the client the chain names: {seen}"
    );
    for n in CLIENT_IP_HEADERS {
        assert_eq!(seen[n], "203.0.113.9", "{n}: {seen}");
    }
    for n in CLIENT_IP_UNDERSCORED {
        assert_eq!(seen[n], Value::Null, "{n} reached the origin");
    }
    assert_eq!(r.json()["xff"], "203.0.113.9, 127.0.0.1");
    // No `X-Real-IP` from the proxy: the client its chain names.
    let r = Person::default()
        .get(
            &url("/pub"),
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.4")],
        )
        .await;
    assert_eq!(r.json()["headers"]["x-real-ip"], "198.51.100.4");
    // A proxy that passed a client's `X-Real-IP` on untouched (one that sets only
    // `X-Forwarded-For`): the chain's client all the same, not the client's word.
    let r = Person::default()
        .get(
            &url("/pub"),
            &[
                ("x-forwarded-for", "198.51.100.4"),
                ("x-real-ip", "6.6.6.6"),
            ],
        )
        .await;
    assert_eq!(r.json()["headers"]["x-real-ip"], "198.51.100.4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_frees_its_slot_and_use_renews_it() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({"session_idle_sec": 2}))).await;
    let url = format!("http://{}/checkout", w.addr);
    let mut a = Person::default();
    assert!(a.get(&url, &[]).await.is_origin());
    // In use for longer than the idle timeout: each request renews it.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(a.get(&url, &[]).await.is_origin(), "renewed by use");
    }
    let mut b = Person::default();
    assert_eq!(
        b.get(&url, &[("accept", "application/json")]).await.status,
        503
    );
    // Then A goes quiet: the slot is freed, and B is let in at the same URL.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let r = b.get(&url, &[]).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_rules_never_queue() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let mut a = Person::default();
    assert!(a.get(&url("/checkout"), &[]).await.is_origin());
    // Full. Assets under a bypass path pass, without a place.
    let mut s = Person::default();
    let r = s.get(&url("/checkout/static/app.js"), &[]).await;
    assert!(r.is_origin(), "{}", r.text);
    assert!(s.cookies.is_empty());
    // …but a path that only starts like one is queued.
    for sneaky in [
        "/checkout/static/../pay",
        "/checkout/static/%2e%2e/pay",
        "/CHECKOUT/pay",
    ] {
        let r = Person::default()
            .get(&url(sneaky), &[("accept", "application/json")])
            .await;
        assert_eq!(r.status, 503, "{sneaky} skipped the queue");
    }
    // The staff header passes and never reaches the origin; a wrong one queues.
    let r = Person::default()
        .get(
            &url("/checkout"),
            &[("x-waitroom-bypass", "staff-secret-0123456789")],
        )
        .await;
    assert!(r.is_origin());
    assert_eq!(r.json()["bypass"], Value::Null);
    let r = Person::default()
        .get(
            &url("/checkout"),
            &[
                ("x-waitroom-bypass", "staff-secret-guess"),
                ("accept", "application/json"),
            ],
        )
        .await;
    assert_eq!(r.status, 503);
    // The secret is never shown back.
    let r = client()
        .get(url("/api/v1/admin/events/shop"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !r.contains("staff-secret") && r.contains("\"bypass_secret_set\":true"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_and_streamed_bodies_pass_through() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    let (mut ws, res) = tokio_tungstenite::connect_async(format!("ws://{}/ws", w.addr))
        .await
        .unwrap();
    assert_eq!(res.status(), 101);
    for word in ["one", "two"] {
        ws.send(tokio_tungstenite::tungstenite::Message::Text(word.into()))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), format!("echo {word}"));
    }
    // Bodies stream both ways: the first half arrives before the origin has the second,
    // and an upload far over the API's 64 KiB limit reaches the origin whole.
    let mut r = client()
        .get(format!("http://{}/stream", w.addr))
        .send()
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), r.chunk())
        .await
        .expect("the first half arrives while the origin holds the second")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"first\n");
    release().notify_one();
    let second = r.chunk().await.unwrap().unwrap();
    assert_eq!(&second[..], b"second\n");
    let big = vec![b'x'; 1_000_000];
    let r = client()
        .post(format!("http://{}/upload", w.addr))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "1000000");
    // Only a WebSocket's upgrade reaches the origin: another protocol (`h2c`) would carry
    // the connection's later requests past the gate.
    let r = client()
        .get(format!("http://{}/about", w.addr))
        .header("upgrade", "h2c")
        .header("connection", "Upgrade, HTTP2-Settings")
        .header("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen: Value = r.json().await.unwrap();
    assert_eq!(seen["upgrade"], Value::Null, "{seen}");
    // Waitroom's own routes stay waitroom's.
    let r = client()
        .get(format!("http://{}/healthz", w.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.text().await.unwrap().contains("origin"));
}

/// The gated waiting room of an unknown event (deleted while a browser waited, a broken
/// link): a browser gets the page that leads back to the start; other clients the JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_room_of_an_unknown_event_is_a_page_for_a_browser() {
    let w = waitroom(None, None).await;
    for id in ["nope", "bad*id"] {
        let url = format!("http://{}/wait/{id}/queue?return=/x", w.addr);
        let r = client()
            .get(&url)
            .header("accept", "text/html,*/*")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{id}");
        let kind = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/html"), "{id}: {kind}");
        assert!(r.text().await.unwrap().contains("href=\"/\""), "{id}");
        let r = client().get(&url).send().await.unwrap();
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["code"].is_string(), "{id}: {body}");
    }
}

/// A gated event that asks what a visitor at a gated path cannot bring (an invite here)
/// says where people join it, its own id filled in (defect: `/wait/{event_id}` as is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_invite_event_names_its_own_waiting_page() {
    let w = waitroom(None, None).await;
    event(&w, "club", gated("club", json!({"access": "invite"}))).await;
    let room = format!("http://{}/wait/club/queue?return=/checkout", w.addr);
    let r = Person::default().get(&room, &[]).await;
    assert_eq!(r.status, 400);
    let said = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(said.contains("people join it at /wait/club,"), "{said}");
}

/// A waiting person who reloads faster than the poll limit is still sent to the waiting
/// room: nginx's `auth_request` takes only 2xx, 401 and 403, and answered a 429 with 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_sends_a_fast_reloading_waiter_to_the_waiting_room() {
    let w = waitroom(None, None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let room = format!("http://{}/wait/shop/queue?return=/checkout", w.addr);
    let mut first = Person::default();
    assert_eq!(first.get(&room, &[]).await.status, 303);
    let mut second = Person::default();
    second.get(&room, &[]).await;
    let cookie = second.cookie("waitroom_shop").expect("a waiting place");
    let gate = format!("http://{}/api/v1/gate", w.addr);
    for i in 0..15 {
        let r = client()
            .get(&gate)
            .header("x-original-uri", "/checkout")
            .header("cookie", format!("waitroom_shop={cookie}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "reload {i}");
        assert_eq!(
            r.headers()["x-waitroom-redirect"],
            "/wait/shop/queue?return=%2Fcheckout"
        );
    }
}

/// A browser reloading the waiting room faster than a place may poll gets a page saying
/// so, which reloads itself after its `Retry-After`, as the waiting page does (defect: it
/// stayed on screen, and a person who left the tab open, as told, lost the place after
/// `waiting_idle_sec`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_browser_gets_a_page_that_tries_again() {
    let w = waitroom(Some(origin().await), None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let room = format!("http://{}/wait/shop/queue?return=/checkout", w.addr);
    let mut first = Person::default();
    assert_eq!(first.get(&room, &[]).await.status, 303);
    let mut second = Person::default();
    let html = [("accept", "text/html,application/xhtml+xml,*/*;q=0.8")];
    let mut limited = None;
    for _ in 0..30 {
        let r = second.get(&room, &html).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text);
    }
    let r = limited.expect("fast reloads are limited");
    let retry = r.headers["retry-after"].to_str().unwrap();
    assert!(retry.parse::<u64>().is_ok_and(|s| s >= 1), "{retry}");
    let refresh = format!("<meta http-equiv=\"refresh\" content=\"{retry}\">");
    assert!(r.text.contains(&refresh), "{}", r.text);
    assert!(r.text.contains("tries again by itself"), "{}", r.text);
    // A form's `POST` refused so in gateway mode keeps its page: a reload would send it
    // again as a `GET`, its data lost.
    let cookie = format!("waitroom_shop={}", second.cookie("waitroom_shop").unwrap());
    let mut posted = None;
    for _ in 0..30 {
        let r = client()
            .post(format!("http://{}/checkout", w.addr))
            .header("accept", html[0].1)
            .header("cookie", &cookie)
            .form(&[("seat", "12")])
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            posted = Some(r.text().await.unwrap());
            break;
        }
    }
    let page = posted.expect("fast posts are limited");
    assert!(page.contains("id=\"waitroom-refused\""), "{page}");
    assert!(!page.contains("http-equiv=\"refresh\""), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_endpoint_answers_auth_request() {
    let w = waitroom(None, None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let gate = format!("http://{}/api/v1/gate", w.addr);
    let ask = |uri: &'static str, cookie: Option<String>, bearer: Option<String>| {
        let gate = gate.clone();
        async move {
            let mut r = client().get(&gate).header("x-original-uri", uri);
            if let Some(c) = cookie {
                r = r.header("cookie", format!("waitroom_shop={c}"));
            }
            if let Some(b) = bearer {
                r = r.bearer_auth(b);
            }
            r.send().await.unwrap()
        }
    };
    // Ungated URLs pass; gated ones without a session are sent to the waiting room with
    // their return path; only same-site paths come back (an open redirect is an attack).
    assert_eq!(ask("/about", None, None).await.status(), 204);
    // An nginx that forgot to pass the URI is refused, not let through as `/` (fail
    // closed): with or without the event named.
    for q in [&[][..], &[("event_id", "shop")][..]] {
        let r = client().get(&gate).query(q).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "INVALID_REQUEST");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("X-Original-URI"));
    }
    // Two lines: a front proxy that appended its own after the client's. Taking the first
    // let the client choose an ungated URI.
    let r = client()
        .get(&gate)
        .header("x-original-uri", "/about")
        .header("x-original-uri", "/checkout")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A WHATWG parser (Node's `new URL(req.url, base)`) reads `//x/checkout` as host `x`,
    // path `/checkout`: gated.
    for uri in ["//x/checkout", "/\\x/checkout"] {
        assert_eq!(ask(uri, None, None).await.status(), 401, "{uri}");
    }
    let r = ask("/checkout?seat=1", None, None).await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["x-waitroom-redirect"],
        "/wait/shop/queue?return=%2Fcheckout%3Fseat%3D1"
    );
    for (evil, back) in [
        ("//evil.example/checkout", "%2F"),
        // An absolute URL's path is the return, never its host.
        ("http://evil.example/checkout", "%2Fcheckout"),
    ] {
        let r = client()
            .get(&gate)
            .query(&[("event_id", "shop")])
            .header("x-original-uri", evil)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(
            r.headers()["x-waitroom-redirect"],
            format!("/wait/shop/queue?return={back}").as_str()
        );
    }
    // A proxy that passes the full URL (forward-auth recipes): its path is gated as the
    // gateway gates an absolute-form target (defect: an absolute URL passed every gated
    // path). A target that is neither a path nor a URL is refused (fail closed).
    for uri in [
        "http://shop.example/checkout/x",
        "https://evil.example/checkout",
        "HTTP://user@shop.example:8080/checkout?seat=1",
    ] {
        assert_eq!(ask(uri, None, None).await.status(), 401, "{uri}");
    }
    assert_eq!(
        ask("http://shop.example/about", None, None).await.status(),
        204
    );
    for uri in [
        "*",
        "checkout/x",
        "http://",
        "1http://x/checkout",
        "http://a b/checkout",
    ] {
        assert_eq!(ask(uri, None, None).await.status(), 400, "{uri}");
    }
    // The waiting room joins (room: admitted at once) and sends the person back, but
    // never to another site.
    let mut a = Person::default();
    let r = a
        .get(
            &format!(
                "http://{}/wait/shop/queue?return=https://evil.example/x",
                w.addr
            ),
            &[],
        )
        .await;
    assert_eq!(r.status, 303);
    assert_eq!(r.headers["location"], "/");
    let cookie = a.cookie("waitroom_shop").unwrap();
    let r = ask("/checkout", Some(cookie.clone()), None).await;
    assert_eq!(r.status(), 204);
    // A sibling subdomain's cookie of the same name, sent first (a longer `Path`), does
    // not hide the place's (defect: only the first pair was read).
    let tossed = format!("forged-by-a-sibling; waitroom_shop={cookie}");
    assert_eq!(ask("/checkout", Some(tossed), None).await.status(), 204);
    assert!(r.headers().contains_key("x-waitroom-session"));
    assert_eq!(
        ask("/checkout", Some("forged".into()), None).await.status(),
        401
    );

    // A Bearer access token of the event's API flow works too.
    event(&w, "other", gated("other", json!({"paths": ["/other"]}))).await;
    let (_, jwt) = api_session(&w, "other").await;
    assert_eq!(ask("/other/x", None, Some(jwt.clone())).await.status(), 204);
    // `X-Waitroom-User` is a user id only when the join proved it: a bare one is anyone's
    // to type (defect: a site reading the header acted for whoever typed "victim").
    let room = json!({"paths": ["/ids"], "max_active": 10});
    event(&w, "ids", gated("ids", room)).await;
    for (user, server_key, told) in [("victim", false, false), ("carol", true, true)] {
        let url = |p: &str| format!("http://{}/api/v1{p}", w.addr);
        let mut join = client()
            .post(url("/queue/join"))
            .json(&json!({"event_id": "ids", "user_id": user}));
        if server_key {
            join = join.bearer_auth(ADMIN);
        }
        let joined: Value = join.send().await.unwrap().json().await.unwrap();
        let entered: Value = client()
            .post(url("/queue/enter"))
            .json(&json!({"waiting_token": joined["waiting_token"]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = entered["access_token"].as_str().unwrap().to_string();
        let r = ask("/ids/x", None, Some(token)).await;
        assert_eq!(r.status(), 204);
        let named = &r.headers()["x-waitroom-user"];
        if told {
            assert_eq!(named, user);
        } else {
            assert_eq!(named, &r.headers()["x-waitroom-session"], "{user}");
        }
    }
    // …for its own event only; and a Bearer token that is not the event's (the site's own
    // API auth, say) hides neither the cookie nor the way to the waiting room.
    let r = ask("/checkout", None, Some(jwt.clone())).await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["x-waitroom-redirect"],
        "/wait/shop/queue?return=%2Fcheckout"
    );
    let r = ask(
        "/checkout",
        Some(cookie.clone()),
        Some("site-api-key".into()),
    )
    .await;
    assert_eq!(r.status(), 204, "the admitted cookie still counts");
    let r = ask("/checkout", Some(cookie), Some(jwt)).await;
    assert_eq!(
        r.status(),
        204,
        "another event's token does not hide the cookie"
    );
}

/// A free port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn nginx_binary() -> String {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if std::path::Path::new(p).exists() {
            return p.to_string();
        }
    }
    panic!("nginx is not installed (scripts/test.sh installs Debian's nginx)");
}

/// The nginx process, killed when dropped. It runs without a master (`master_process
/// off`), so that killing it leaves no worker behind.
struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_nginx_with_the_documented_config_walks_the_flow() {
    let o = origin().await;
    // nginx is on loopback, a trusted proxy: its X-Forwarded-For names the client.
    let w = waitroom(None, Some("127.0.0.1")).await;
    // `/ws`: a gated WebSocket of the site's.
    event(
        &w,
        "shop",
        gated("shop", json!({"paths": ["/checkout", "/ws"]})),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let site = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/nginx.conf"))
        .unwrap()
        .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"))
        .replace("127.0.0.1:8081", &w.addr.to_string())
        .replace("127.0.0.1:3000", &o.to_string())
        .replace(
            "/var/log/nginx/access.log",
            &dir.path().join("access.log").display().to_string(),
        );
    let d = dir.path().display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         {site}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let child = std::process::Command::new(nginx_binary())
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let _nginx = Nginx(child);
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let mut up = false;
    for _ in 0..100 {
        if client().get(url("/about")).send().await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        up,
        "nginx did not start: {}",
        std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
    );

    // Ungated: straight to the site.
    assert!(Person::default().get(&url("/about"), &[]).await.is_origin());
    // The waiting page's own files come from waitroom (by name); the site keeps the rest
    // of its `/assets/`.
    let r = Person::default().get(&url("/assets/wait.js"), &[]).await;
    assert!(
        r.status == 200
            && !r.is_origin()
            && r.headers["content-type"]
                .to_str()
                .unwrap()
                .contains("javascript"),
        "{} {}",
        r.status,
        r.text
    );
    assert!(Person::default()
        .get(&url("/assets/site.js"), &[])
        .await
        .is_origin());
    // Gated, no session: to the waiting room, which admits (there is room) and sends
    // the person back to where they were going.
    let mut a = Person::default();
    let r = a
        .get(&url("/checkout?seat=3"), &[("x-waitroom-user", "admin")])
        .await;
    assert_eq!(r.status, 302, "{}", r.text);
    let to = r.headers["location"].to_str().unwrap().to_string();
    assert!(
        to.ends_with("/wait/shop/queue?return=%2Fcheckout%3Fseat%3D3"),
        "{to}"
    );
    let r = a
        .get(&url("/wait/shop/queue?return=%2Fcheckout%3Fseat%3D3"), &[])
        .await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(r.headers["location"], "/checkout?seat=3");
    let r = a
        .get(&url("/checkout?seat=3"), &[("x-waitroom-user", "admin")])
        .await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let seen = r.json();
    assert!(
        seen["session"].as_str().is_some_and(|s| !s.is_empty()),
        "{seen}"
    );
    assert_ne!(
        seen["user"], "admin",
        "the client's copy never reaches the site"
    );

    // The second person waits in the waiting room, which refreshes itself.
    let mut b = Person::default();
    let r = b.get(&url("/checkout"), &[]).await;
    assert_eq!(r.status, 302);
    let r = b
        .get(&url("/wait/shop/queue?return=%2Fcheckout"), &[])
        .await;
    assert_eq!(r.status, 503);
    assert!(r.text.contains("http-equiv=\"refresh\""));
    let r = b.get(&url("/checkout"), &[]).await;
    assert_eq!(r.status, 302, "not admitted yet");
    // Many origins route without regard to case (Express, ASP.NET): another spelling of a
    // gated path still asks waitroom, which gates it.
    for sneaky in ["/CHECKOUT", "/Checkout/pay"] {
        let r = Person::default().get(&url(sneaky), &[]).await;
        assert_eq!(r.status, 302, "{sneaky} skipped the queue: {}", r.text);
    }

    // The staff secret lets a request through but is the waiting room's, never the site's
    // (its logs, its own upstreams).
    let r = Person::default()
        .get(
            &url("/checkout"),
            &[("x-waitroom-bypass", "staff-secret-0123456789")],
        )
        .await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    assert_eq!(
        r.json()["bypass"],
        Value::Null,
        "the secret reached the site"
    );
    // On ungated paths too, the site never sees a client's own session headers: it can
    // trust them wherever it reads them.
    let r = Person::default()
        .get(
            &url("/about"),
            &[
                ("x-waitroom-user", "admin"),
                ("x-waitroom-session", "forged"),
            ],
        )
        .await;
    assert!(r.is_origin());
    let seen = r.json();
    assert_eq!(seen["user"], Value::Null, "{seen}");
    assert_eq!(seen["session"], Value::Null, "{seen}");
    // Nor the headers some origins serve instead of the path (IIS, older Symfony and
    // Zend): nginx asked waitroom about `/about`, the site would serve `/checkout`.
    let r = Person::default()
        .get(
            &url("/about"),
            &[
                ("x-original-url", "/checkout"),
                ("x-rewrite-url", "/checkout"),
                ("x-original-uri", "/checkout"),
            ],
        )
        .await;
    assert!(r.is_origin());
    let seen = r.json();
    assert_eq!(seen["original_url"], Value::Null, "{seen}");
    assert_eq!(seen["rewrite_url"], Value::Null, "{seen}");
    assert_eq!(seen["original_uri"], Value::Null, "{seen}");

    // The waiting page's live updates pass through it: the WebSocket's upgrade too.
    let joined: Value = client()
        .post(url("/api/v1/queue/join"))
        .json(&json!({"event_id": "shop"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = joined["waiting_token"].as_str().expect("joined");
    let ws = format!("ws://127.0.0.1:{port}/api/v1/queue/ws?token={token}");
    let (mut ws, resp) = tokio_tungstenite::connect_async(ws)
        .await
        .expect("a WebSocket through nginx");
    assert_eq!(resp.status(), 101);
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::StreamExt::next(&mut ws),
    )
    .await
    .expect("a first message")
    .unwrap()
    .unwrap();
    assert!(first.to_text().unwrap().contains("queue-update"), "{first}");

    // Spellings nginx does not resolve but an origin does (`..;` is `..` to Java servers,
    // `\` a separator to Windows ones) are gated too (defect: a location per gated path
    // passed them to the site unasked).
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for sneaky in [
        "/x/..;/checkout",
        "/;x/checkout",
        "/x\\..\\checkout",
        "/%5ccheckout",
    ] {
        let raw =
            format!("GET {sneaky} HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n");
        let code = raw_status(addr, raw.as_bytes()).await;
        assert_eq!(code, 302, "{sneaky} reached the site unasked: {code}");
    }
    // Only a WebSocket's upgrade reaches the site: another protocol (`h2c`) would carry
    // later requests past the gate inside one connection.
    let r = Person::default()
        .get(
            &url("/about"),
            &[("upgrade", "h2c"), ("connection", "Upgrade")],
        )
        .await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    assert_eq!(r.json()["upgrade"], Value::Null, "{}", r.text);
    // A long URI is sent to the waiting room without its return path, not refused by
    // nginx (defect: a return path of 1,400 `/` carried encoded made a header over
    // nginx's 4 KiB: its `502`, the visitor's `500`).
    let long = format!("/checkout?q={}", "/".repeat(1390));
    let r = Person::default().get(&url(&long), &[]).await;
    assert_eq!(r.status, 302, "{}", r.text);
    assert_eq!(r.headers["location"], "/wait/shop/queue?return=%2F");
    // A gated WebSocket: the waiting room without a session, the site's own with one
    // (defect: the upgrade was dropped on the way, so the site answered a plain GET).
    let r = b.get(&url("/ws"), &[]).await;
    assert_eq!(r.status, 302, "{}", r.text);
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        format!("ws://127.0.0.1:{port}/ws"),
    )
    .unwrap();
    let cookie: Vec<String> = a.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
    req.headers_mut()
        .insert("cookie", cookie.join("; ").parse().unwrap());
    let (mut ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .expect("the site's WebSocket through nginx");
    assert_eq!(resp.status(), 101);
    ws.send(tokio_tungstenite::tungstenite::Message::Text("hi".into()))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.into_text().unwrap().as_str(), "echo hi");
    // The redirect keeps the visitor's own scheme, host and port (a TLS load balancer in
    // front of nginx): a path, not nginx's `http://host:port`.
    let r = Person::default().get(&url("/checkout"), &[]).await;
    let to = r.headers["location"].to_str().unwrap();
    assert!(to.starts_with("/wait/shop/queue?"), "{to}");

    // Tokens in query strings stay out of the access log (the page's WebSocket and a
    // user's link carry them there): the log names the paths alone.
    let waiting = a
        .get(
            &url("/api/v1/queue/status?token=waiting-token-in-a-query"),
            &[],
        )
        .await;
    assert_ne!(waiting.status, 200);
    Person::default()
        .get(&url("/wait/shop?user_token=user-token-in-a-query"), &[])
        .await;
    // nginx writes a line once the answer is sent: read until both are there.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = std::fs::read_to_string(dir.path().join("access.log")).unwrap_or_default();
        let both = log.contains("\"GET /api/v1/queue/status HTTP/1.1\"")
            && log.contains("\"GET /wait/shop HTTP/1.1\"");
        if both || std::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        log.contains("\"GET /api/v1/queue/status HTTP/1.1\""),
        "{log}"
    );
    assert!(log.contains("\"GET /wait/shop HTTP/1.1\""), "{log}");
    assert!(!log.contains("token-in-a-query"), "{log}");
}

/// Sends `raw` (a whole HTTP/1.1 request) to `addr` and answers the status line's code.
async fn raw_status(addr: SocketAddr, raw: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_and_host_spellings_do_not_skip_the_queue() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    // A second event gated on one host only, its whole site under `/`, assets bypassed.
    let hosted = json!({
        "max_active": 1,
        "paths": ["/"],
        "hosts": ["shop.example"],
        "bypass_paths": ["/static/"],
    });
    event(&w, "hosted", hosted).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let on_shop = [("host", "shop.example"), ("accept", "application/json")];
    // Both events full.
    assert!(Person::default()
        .get(&url("/checkout"), &[])
        .await
        .is_origin());
    assert!(Person::default()
        .get(&url("/account"), &on_shop)
        .await
        .is_origin());
    // Java origins drop `;` path parameters (`/checkout;jsessionid=…` is `/checkout`, and
    // `..;` is `..`), so these are the gated pages; waitroom must queue them.
    for sneaky in [
        "/checkout;jsessionid=1",
        "/CHECKOUT;x/pay",
        "/checkout/static/..;/pay",
    ] {
        let r = Person::default()
            .get(&url(sneaky), &[("accept", "application/json")])
            .await;
        assert_eq!(r.status, 503, "{sneaky} skipped the queue: {}", r.text);
    }
    let r = Person::default()
        .get(&url("/static/..;/account"), &on_shop)
        .await;
    assert_eq!(
        r.status, 503,
        "a bypass path escaped with `..;`: {}",
        r.text
    );
    // A fully qualified host name (trailing dot) is the same host to DNS and to nginx.
    let r = Person::default()
        .get(
            &url("/account"),
            &[("host", "shop.example."), ("accept", "application/json")],
        )
        .await;
    assert_eq!(
        r.status, 503,
        "`shop.example.` skipped the queue: {}",
        r.text
    );
    // nginx reads the host of `shop.example:80:x` as `shop.example` (all after the first
    // colon is the port to it): not a host and port, refused.
    let r = Person::default()
        .get(
            &url("/account"),
            &[
                ("host", "shop.example:80:x"),
                ("accept", "application/json"),
            ],
        )
        .await;
    assert_eq!(
        r.status, 400,
        "`shop.example:80:x` was answered {}: {}",
        r.status, r.text
    );
    // Two Host headers: the origin may read either; such a request is refused (RFC 9112
    // §3.2), never checked by one and served by the other.
    let code = raw_status(
        w.addr,
        b"GET /account HTTP/1.1\r\nHost: blog.example\r\nHost: shop.example\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        code, 400,
        "a request with two Host headers was answered {code}"
    );
    // A Host that is not ASCII text cannot be read as a host name here, but nginx serves
    // `shop.example:\xff` as `shop.example`: refused too.
    let code = raw_status(
        w.addr,
        b"GET /account HTTP/1.1\r\nHost: shop.example:\xff\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        code, 400,
        "a request with a non-ASCII Host was answered {code}"
    );
}

/// A site's own cookie holding bytes outside ASCII (set with raw UTF-8, which browsers send
/// back as it was) does not hide the person's place (defect: the whole `Cookie` line was
/// skipped, so every request took a new place and never got through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_cookie_outside_ascii_does_not_hide_the_place() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({"max_active": 2}))).await;
    let url = format!("http://{}/checkout", w.addr);
    let mut a = Person::default();
    let r = a.get(&url, &[]).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let session = r.json()["session"].clone();
    let (k, v) = a.cookies[0].clone();
    for line in [
        format!("pref=caf\u{e9}; {k}={v}"),
        format!("{k}={v}; pref=caf\u{e9}"),
    ] {
        for _ in 0..3 {
            let r = client()
                .get(&url)
                .header(
                    "cookie",
                    axum::http::HeaderValue::from_bytes(line.as_bytes()).unwrap(),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{line}");
            assert!(
                r.headers().get("set-cookie").is_none(),
                "a new place: {line}"
            );
            let seen: Value = r.json().await.unwrap();
            assert_eq!(seen["session"], session, "{line}");
        }
    }
    let figures: Value = client()
        .get(format!("http://{}/api/v1/admin/events/shop", w.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(figures["active"], 1, "{figures}");
    assert_eq!(figures["joins"], 1, "{figures}");
}

/// A deleted event's session does not pass the gate of the event created again under its
/// id (defect: it passed on this node's renewal for up to a quarter of the idle timeout,
/// beside the new event's own session: two through a gate of capacity 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_events_session_does_not_pass_its_successors_gate() {
    let w = waitroom(None, None).await;
    let settings = json!({"paths": ["/pay"], "max_active": 1});
    event(&w, "gsale", settings.clone()).await;
    let ask = |cookie: String| {
        client()
            .get(format!("http://{}/api/v1/gate", w.addr))
            .header("x-original-uri", "/pay/x")
            .header("cookie", cookie)
            .send()
    };
    let mut old = Person::default();
    let r = old
        .get(
            &format!("http://{}/wait/gsale/queue?return=/pay", w.addr),
            &[],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.text);
    let cookie = format!("{}={}", old.cookies[0].0, old.cookies[0].1);
    assert_eq!(ask(cookie.clone()).await.unwrap().status(), 204);
    let r = client()
        .delete(format!("http://{}/api/v1/admin/events/gsale", w.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    event(&w, "gsale", settings).await;
    let r = ask(cookie).await.unwrap();
    assert_eq!(
        r.status(),
        401,
        "{:?}",
        r.headers().get("x-waitroom-session")
    );
}

/// Two events whose prefixes nest: a path written under the inner one that resolves to the
/// outer one's page is refused, never passed under the inner one's queue (defect:
/// `/checkout/help/../pay` was admitted at once under `help` while `general`, paused, kept
/// everyone else from `/checkout/pay`; the origin served that page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_cannot_borrow_another_events_queue() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(
        &w,
        "general",
        json!({"paths": ["/checkout"], "paused": true}),
    )
    .await;
    event(
        &w,
        "help",
        json!({"paths": ["/checkout/help"], "max_active": 1000}),
    )
    .await;
    let get = |path: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: shop.example\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
        )
    };
    assert_eq!(
        raw_status(w.addr, get("/checkout/pay").as_bytes()).await,
        503
    );
    assert_eq!(
        raw_status(w.addr, get("/checkout/help/faq").as_bytes()).await,
        200
    );
    for sneaky in [
        "/checkout/help/../pay",
        "/checkout/help/%2e%2e/pay",
        "/checkout/help%00/../pay",
        "/checkout/x%2f..%2fhelp",
    ] {
        let code = raw_status(w.addr, get(sneaky).as_bytes()).await;
        assert_eq!(code, 400, "{sneaky} was answered {code}");
    }
    // nginx's `auth_request` asks with the URI as sent.
    let gate = |uri: &'static str| {
        client()
            .get(format!("http://{}/api/v1/gate", w.addr))
            .header("x-original-uri", uri)
            .send()
    };
    let r = gate("/checkout/help/../pay").await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "INVALID_REQUEST");
    assert_eq!(gate("/checkout/pay").await.unwrap().status(), 401);
}

/// A bare HTTP/1.1 origin that counts its connections: `/empty` answers `204`, anything
/// else a 2-byte body (none to `HEAD`). With `close_each`, it closes every connection after
/// its first answer without saying so (as an origin's idle timeout does between requests).
async fn counting_origin(
    close_each: bool,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    buf.drain(..end + 4);
                    let answer: &[u8] = if head.starts_with("GET /empty") {
                        b"HTTP/1.1 204 No Content\r\n\r\n"
                    } else if head.starts_with("HEAD ") {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                    };
                    if s.write_all(answer).await.is_err() || close_each {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

/// The gateway's connections to the origin are kept and reused: sequential requests,
/// empty answers (`204`, `HEAD`) among them, share one connection; and a kept connection
/// the origin closed meanwhile is replaced, never answered `502`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_connections_are_reused_and_a_closed_one_is_replaced() {
    use http_body_util::BodyExt as _;
    use std::sync::atomic::Ordering;
    let (o, opened) = counting_origin(false).await;
    let w = waitroom(Some(o), None).await;
    // One client connection, driven by hand: a pooling client may open a second one when
    // its next request comes before the last answer's connection is back in its pool, and
    // that one may land on another serving thread, whose pool of origin connections is
    // its own.
    let tcp = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    for i in 0..30 {
        let (method, path, status) = match i % 3 {
            0 => (axum::http::Method::GET, "/page", 200),
            1 => (axum::http::Method::GET, "/empty", 204),
            _ => (axum::http::Method::HEAD, "/page", 200),
        };
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", w.addr.to_string())
            .body(http_body_util::Empty::<axum::body::Bytes>::new())
            .unwrap();
        send.ready().await.unwrap();
        let r = send.send_request(req).await.unwrap();
        assert_eq!(r.status(), status, "request {i}");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            if i % 3 == 0 { &b"ok"[..] } else { b"" },
            "request {i}"
        );
    }
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "30 requests one after the other need one connection to the origin"
    );

    let (o, opened) = counting_origin(true).await;
    let w = waitroom(Some(o), None).await;
    let c = client();
    for i in 0..10 {
        let r = c
            .get(format!("http://{}/page", w.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.text().await.unwrap(), "ok");
        // Give the origin's close time to arrive: the kept connection is dead when taken.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(opened.load(Ordering::SeqCst), 10);
}

/// A bare HTTP/1.1 origin whose every connection answers its first request (`ok`) and, on
/// the next, either closes without answering (an origin's keep-alive timeout striking as
/// a request goes out on a kept connection) or, with `second`, answers with that head: a
/// request the origin had. Counts the requests it read.
async fn forgetful_origin(
    second: Option<String>,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (second, counted) = (second.clone(), counted.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut answered = false;
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        counted.fetch_add(1, Ordering::SeqCst);
                        let answer = match (answered, &second) {
                            (false, _) => {
                                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_string()
                            }
                            (true, Some(head)) => head.clone(),
                            (true, None) => return, // closed, unanswered
                        };
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        answered = true;
                        continue;
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, count)
}

/// A request lost with a kept connection the origin closed as it went out is sent again
/// on a new one when that is safe (a GET without a body), never otherwise: not a POST, and
/// not a request the origin answered (here with more header fields than the gateway reads,
/// 100), which it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safe_request_lost_with_a_kept_connection_is_sent_again() {
    use http_body_util::BodyExt as _;
    use std::sync::atomic::Ordering;
    async fn client_of(
        w: &Waitroom,
    ) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<axum::body::Bytes>> {
        // One client connection, driven by hand, so that every request meets one pool.
        let tcp = tokio::net::TcpStream::connect(w.addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        send
    }
    async fn ask(
        send: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<axum::body::Bytes>>,
        w: &Waitroom,
        method: axum::http::Method,
        body: &'static str,
    ) -> StatusCode {
        let req = axum::http::Request::builder()
            .method(method)
            .uri("/page")
            .header("host", w.addr.to_string())
            .body(http_body_util::Full::new(axum::body::Bytes::from(body)))
            .unwrap();
        let r = send.send_request(req).await.unwrap();
        let status = r.status();
        r.into_body().collect().await.unwrap();
        status
    }
    // A gateway whose kept origin connection has been idle for 300 ms after a first GET.
    let idle_after_a_get = |second: Option<String>| async move {
        let (o, seen) = forgetful_origin(second).await;
        let w = waitroom(Some(o), None).await;
        let mut send = client_of(&w).await;
        let first = ask(&mut send, &w, axum::http::Method::GET, "").await;
        assert_eq!(first, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(300)).await;
        (w, send, seen)
    };
    let (w, mut send, _) = idle_after_a_get(None).await;
    let again = ask(&mut send, &w, axum::http::Method::GET, "").await;
    assert_eq!(again, StatusCode::OK, "the GET was not sent again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let post = ask(&mut send, &w, axum::http::Method::POST, "x").await;
    assert_eq!(
        post,
        StatusCode::BAD_GATEWAY,
        "a POST must not be sent twice"
    );

    let cookies: String = (0..150)
        .map(|i| format!("set-cookie: c{i}=v\r\n"))
        .collect();
    let head = format!("HTTP/1.1 200 OK\r\n{cookies}content-length: 2\r\n\r\nok");
    let (w, mut send, seen) = idle_after_a_get(Some(head)).await;
    let answered = ask(&mut send, &w, axum::http::Method::GET, "").await;
    assert_eq!(answered, StatusCode::BAD_GATEWAY);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "an answered GET was sent again"
    );
}

/// An HTTP/2 client may split its cookies over several fields; the origin, reached over
/// HTTP/1.1, gets them on one line (RFC 9113 8.2.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_split_over_http2_fields_reach_the_origin_on_one_line() {
    use http_body_util::BodyExt as _;
    let w = waitroom(Some(origin().await), None).await;
    let tcp = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = axum::http::Request::builder()
        .uri(format!("http://{}/about", w.addr))
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
        .unwrap();
    let r = send.send_request(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let seen: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["cookie"], "a=1; b=2", "{seen}");
}

/// A value of `/metrics` text: the sample `name{labels}`, 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Proxied requests are counted by outcome, with their latency, on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_requests_are_counted_by_outcome() {
    let metrics = |w: &Waitroom| {
        let url = format!("http://{}/metrics", w.addr);
        async move {
            client()
                .get(url)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "counted", gated("counted", json!({}))).await;
    let pass = r#"waitroom_gateway_requests_total{outcome="pass"}"#;
    let pass_n = r#"waitroom_gateway_request_duration_seconds_count{outcome="pass"}"#;
    let waiting = r#"waitroom_gateway_requests_total{outcome="waiting"}"#;
    let admitted = r#"waitroom_gateway_requests_total{outcome="admitted"}"#;
    let down = r#"waitroom_gateway_requests_total{outcome="unavailable"}"#;
    let before = metrics(&w).await;

    let mut first = Person::default();
    for _ in 0..3 {
        assert!(first
            .get(&format!("http://{}/", w.addr), &[])
            .await
            .is_origin());
    }
    assert!(first
        .get(&format!("http://{}/checkout", w.addr), &[])
        .await
        .is_origin());
    let mut second = Person::default();
    let r = second
        .get(&format!("http://{}/checkout", w.addr), &[])
        .await;
    assert_eq!(r.status, 503, "the second person waits: {}", r.text);

    // An origin that is gone: the answer is 502, counted as such.
    let gone = waitroom(Some(dead_origin().await), None).await;
    let r = client()
        .get(format!("http://{}/", gone.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);

    let after = metrics(&w).await;
    // (Other tests of this process count in the same registry: at least, not exactly.)
    for (series, n) in [
        (pass, 3.0),
        (pass_n, 3.0),
        (admitted, 1.0),
        (waiting, 1.0),
        (down, 1.0),
    ] {
        assert!(
            sample(&after, series) >= sample(&before, series) + n,
            "{series}: before {}, after {}\n{after}",
            sample(&before, series),
            sample(&after, series)
        );
    }
    assert!(
        after.contains(
            r#"waitroom_gateway_request_duration_seconds_bucket{outcome="pass",le="0.005"}"#
        ),
        "a histogram with the HTTP latency buckets:\n{after}"
    );
}

/// A lax HTTP/1.1 origin: answers each request with its path as the body, reading (and
/// skipping) a `content-length` body first, except on `/early`, which it answers at once
/// and whose body it then reads as the next request (as an origin does that refuses an
/// upload without draining it). What it answered is recorded, each new connection as
/// `accept`.
async fn lax_origin() -> (SocketAddr, std::sync::Arc<parking_lot::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let log = log.clone();
            log.lock().push("accept".to_string());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut skip = 0usize;
                loop {
                    let taken = skip.min(buf.len());
                    buf.drain(..taken);
                    skip -= taken;
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n");
                    let (Some(end), 0) = (end, skip) else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    buf.drain(..end + 4);
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    if path != "/early" {
                        skip = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                    }
                    log.lock().push(path.clone());
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
                        path.len()
                    );
                    if s.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Reads `s` until what came ends with `suffix` (an answer's body); panics if the gateway
/// closes first or nothing comes for 5 s. Answers all that came.
async fn read_until_it_ends_with(s: &mut tokio::net::TcpStream, suffix: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !String::from_utf8_lossy(&got).ends_with(suffix) {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
            .await
            .expect("an answer")
            .unwrap();
        assert!(
            n > 0,
            "the gateway closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// An origin that answers before the request's body was sent whole leaves that connection
/// mid-request: the rest of the body still goes out on it. Reused for another client, the
/// origin would read that rest as a request of its own (here a smuggled `GET /smuggled`)
/// and its answer would reach the other client. Such a connection is closed, never pooled;
/// a request sent whole still reuses its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_answered_before_its_request_body_was_sent_is_never_reused() {
    use tokio::io::AsyncWriteExt;
    let (o, seen) = lax_origin().await;
    let w = waitroom(Some(o), None).await;
    let c = client();
    // A POST sent whole leaves its connection reusable. Both go over one client connection,
    // so that they are served one after the other by one serving task (an HTTP client's
    // pool may open a second connection for the second request, served by another thread
    // with a pool of its own, and the origin would see a second `accept` for that reason).
    let mut keep = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    for path in ["/first", "/second"] {
        let req = format!("POST {path} HTTP/1.1\r\nhost: shop\r\ncontent-length: 6\r\n\r\na body");
        keep.write_all(req.as_bytes()).await.unwrap();
        let got = read_until_it_ends_with(&mut keep, path).await;
        assert!(got.starts_with("HTTP/1.1 200"));
    }
    drop(keep);
    assert_eq!(*seen.lock(), ["accept", "/first", "/second"]);

    let smuggled = b"GET /smuggled HTTP/1.1\r\nhost: origin\r\n\r\n";
    let mut attacker = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    let head = format!(
        "POST /early HTTP/1.1\r\nhost: shop\r\ncontent-length: {}\r\n\r\n",
        smuggled.len()
    );
    attacker.write_all(head.as_bytes()).await.unwrap();
    read_until_it_ends_with(&mut attacker, "/early").await;
    // The answer came; now the body, which the origin will read as a request.
    attacker.write_all(smuggled).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    for i in 0..5 {
        let path = format!("/victim{i}");
        let r = c
            .get(format!("http://{}{path}", w.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.text().await.unwrap(),
            path,
            "another client got someone else's answer (the origin saw {:?})",
            seen.lock()
        );
    }
    drop(attacker);
}

/// A request with both `Transfer-Encoding: chunked` and a `Content-Length` (the classic
/// smuggling pair) is framed by its chunks alone: the origin gets the whole body as one
/// upload (not the first `Content-Length` bytes, the rest read as a request of its own),
/// and the client connection answers that one request and closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_encoding_with_content_length_cannot_smuggle_a_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    let inner = "GET /smuggled HTTP/1.1\r\nhost: shop\r\n\r\n";
    let raw = format!(
        "POST /upload HTTP/1.1\r\nhost: shop\r\ncontent-length: 3\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n{inner}\r\n0\r\n\r\n",
        inner.len()
    );
    let mut s = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("the connection closes after its one answer")
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    assert_eq!(text.matches("HTTP/1.1 ").count(), 1, "{text}");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.ends_with(&format!("\r\n\r\n{}", inner.len())),
        "the origin did not get the whole chunked body: {text}"
    );
}

/// One keep-alive connection to the gateway (hyper's client on one socket): every request
/// goes over the same connection, so what the gateway keeps per connection is in play.
struct OneConnection {
    send: hyper::client::conn::http1::SendRequest<http_body_util::Empty<axum::body::Bytes>>,
}

impl OneConnection {
    async fn open(addr: SocketAddr) -> Self {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        OneConnection { send }
    }

    /// `GET path` with `cookie` as its one `Cookie` header, asking for JSON.
    async fn get(&mut self, path: &str, cookie: &str) -> Answer {
        use http_body_util::BodyExt;
        let req = axum::http::Request::get(path)
            .header("host", "shop")
            .header("accept", "application/json")
            .header("cookie", cookie)
            .body(http_body_util::Empty::new())
            .unwrap();
        self.send.ready().await.expect("the connection stays open");
        let r = self.send.send_request(req).await.unwrap();
        let (status, headers) = (r.status(), r.headers().clone());
        let body = r.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            text: String::from_utf8_lossy(&body).into_owned(),
        }
    }
}

/// Attack: the gateway keeps, per connection, the place the last session cookie named.
/// On one connection that sent a valid cookie, a one-byte forgery is not admitted, and
/// once the session is completed (or reached its maximum) the very same cookie, sent
/// again on that connection, no longer reaches the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cannot_reuse_a_cookie_that_was_forged_completed_or_expired() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let mut a = Person::default();
    let r = a.get(&url("/checkout"), &[]).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let session = r.json()["session"].as_str().unwrap().to_string();
    let token = a.cookie("waitroom_shop").unwrap();
    let cookie = format!("waitroom_shop={token}");

    let mut conn = OneConnection::open(w.addr).await;
    for _ in 0..3 {
        let r = conn.get("/checkout", &cookie).await;
        assert!(r.is_origin(), "{} {}", r.status, r.text);
        assert_eq!(r.json()["session"], session.as_str());
    }
    // A forgery on the same connection: the event is full, so a new place waits.
    let last = token.chars().last().unwrap();
    let forged = format!(
        "waitroom_shop={}{}",
        &token[..token.len() - 1],
        if last == 'A' { 'B' } else { 'A' }
    );
    let r = conn.get("/checkout", &forged).await;
    assert_eq!(r.status, 503, "a forgery reached the origin: {}", r.text);
    let r = conn.get("/checkout", &cookie).await;
    assert_eq!(
        r.json()["session"],
        session.as_str(),
        "the real one still opens"
    );

    // The origin completes the session (over another connection).
    let r = a.get(&url("/checkout/done"), &[]).await;
    assert_eq!(r.text, "purchase done");
    for _ in 0..2 {
        let r = conn.get("/checkout", &cookie).await;
        assert!(
            !r.is_origin() || r.json()["session"] != session.as_str(),
            "a completed session reached the origin again: {}",
            r.text
        );
        assert_eq!(
            r.status, 503,
            "the forger's place holds the slot now: {}",
            r.text
        );
    }

    // A session that reaches its maximum, used over one connection until then.
    event(
        &w,
        "brief",
        json!({"max_active": 1, "paths": ["/brief"], "session_max_sec": 2}),
    )
    .await;
    let mut b = Person::default();
    let r = b.get(&url("/brief"), &[]).await;
    assert!(r.is_origin(), "{} {}", r.status, r.text);
    let session = r.json()["session"].as_str().unwrap().to_string();
    let cookie = format!("waitroom_brief={}", b.cookie("waitroom_brief").unwrap());
    let mut conn = OneConnection::open(w.addr).await;
    assert!(conn.get("/brief", &cookie).await.is_origin());
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let r = conn.get("/brief", &cookie).await;
    assert!(
        !r.is_origin() || r.json()["session"] != session.as_str(),
        "an expired session reached the origin: {}",
        r.text
    );
}

/// The automatic proof of work holds at gated URLs too: gated joins count toward the join
/// rate, and while that rate asks work of every join a gated one (which brings none) is
/// refused rather than given a place. Once the sale ends, a browser at a gated URL is shown
/// a page with the operator's message, and a JSON client the API's refusal with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_joins_meet_the_surge_defence_and_an_ended_sale_says_so() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "surge", gated("surge", json!({"pow_auto_above": 1}))).await;
    let url = |p: &str| format!("http://{}{p}", w.addr);
    let json_accept = [("accept", "application/json")];
    // A burst of new people at the gated URL, each without a cookie: past one join a
    // second, work is asked of every join, so gated ones are refused.
    let mut placed = 0;
    let mut refused = 0;
    for _ in 0..6 {
        let r = Person::default().get(&url("/checkout"), &json_accept).await;
        match r.status.as_u16() {
            200 | 503 => placed += 1,
            400 => {
                assert_eq!(r.json()["error"]["code"], "INVALID_REQUEST", "{}", r.text);
                refused += 1;
            }
            s => panic!("unexpected {s}: {}", r.text),
        }
    }
    assert!(refused >= 4, "placed {placed}, refused {refused}");
    // The same through the nginx flow's waiting room.
    let r = Person::default()
        .get(&url("/wait/surge/queue?return=%2Fcheckout"), &json_accept)
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    // And the gated joins counted: the API asks work of the next join.
    let r = client()
        .post(url("/api/v1/queue/join"))
        .json(&json!({"event_id": "surge"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 428);

    event(&w, "done", gated("done", json!({"paths": ["/tickets"]}))).await;
    let r = client()
        .post(url("/api/v1/admin/events/done/end"))
        .bearer_auth(ADMIN)
        .json(&json!({"reason": "sold_out", "message": {"en": "All <gone> & sold"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for path in ["/tickets/a", "/wait/done/queue?return=%2Ftickets"] {
        let r = Person::default().get(&url(path), &json_accept).await;
        assert_eq!(r.status, 409, "{path}: {}", r.text);
        let body = r.json();
        assert_eq!(body["error"]["code"], "EVENT_CLOSED", "{path}: {body}");
        assert_eq!(body["error"]["reason"], "sold_out", "{path}: {body}");
        // `fetch`'s default `*/*` is not a page's navigation: JSON too.
        let r = Person::default()
            .get(&url(path), &[("accept", "*/*")])
            .await;
        assert_eq!(r.json()["error"]["reason"], "sold_out", "{path}");
        let r = Person::default()
            .get(&url(path), &[("accept", "text/html,*/*")])
            .await;
        assert_eq!(r.status, 409, "{path}");
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{path}"
        );
        assert_eq!(r.headers["cache-control"], "no-store", "{path}");
        assert!(r.text.contains("Sold out"), "{path}: {}", r.text);
        assert!(
            r.text.contains("All &lt;gone&gt; &amp; sold"),
            "{path}: the operator's message, escaped: {}",
            r.text
        );
    }
    // So is an event that asks a user token, an invite or work of every join (defect: it
    // was told to join at /wait, `400`, whatever the end).
    let strict = json!({"paths": ["/strict"], "access": "invite"});
    event(&w, "strict", gated("strict", strict)).await;
    let r = client()
        .post(url("/api/v1/admin/events/strict/end"))
        .bearer_auth(ADMIN)
        .json(&json!({"reason": "closed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = Person::default().get(&url("/strict/a"), &json_accept).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.json()["error"]["reason"], "closed", "{}", r.text);
}

/// A return path with characters outside ASCII comes back percent-encoded in `Location`
/// (a header is ASCII; raw bytes there are read differently by each client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_return_location_is_ascii() {
    let w = waitroom(None, None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let r = Person::default()
        .get(
            &format!(
                "http://{}/wait/shop/queue?return=%2Fcaf%C3%A9%3Fa%3D%25C3",
                w.addr
            ),
            &[],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(r.headers["location"].as_bytes(), b"/caf%C3%A9?a=%C3");
}

/// A session that ends on this node stops passing its gate at once: the gate's few seconds
/// of trust in a renewed session are for ends decided elsewhere: completed, or left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_here_stops_passing_the_gate_at_once() {
    let w = waitroom(None, None).await;
    event(&w, "shop", gated("shop", json!({"max_active": 5}))).await;
    let api = |p: &str| format!("http://{}/api/v1{p}", w.addr);
    let gate = |jwt: String| {
        let url = api("/gate");
        async move {
            client()
                .get(url)
                .header("x-original-uri", "/checkout/pay")
                .bearer_auth(jwt)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    let session = || async {
        let (waiting, jwt) = api_session(&w, "shop").await;
        assert_eq!(gate(jwt.clone()).await, 204, "a live session passes");
        (waiting, jwt)
    };

    // Completed (with the access token), or left (with the waiting token).
    for (end, with_access) in [("/session/complete", true), ("/queue/leave", false)] {
        let (waiting, jwt) = session().await;
        let r = client()
            .post(api(end))
            .bearer_auth(if with_access { &jwt } else { &waiting })
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{end}");
        assert_eq!(gate(jwt).await, 401, "{end}");
    }

    // Replaced: a proven join of the user ends the place made with the bare id, as a
    // `leave` would (defect: its session passed the gate until the next renewal, while its
    // slot went to the new place).
    let post = |path: &str, body: Value, auth: Option<&str>| {
        let mut r = client().post(api(path)).json(&body);
        if let Some(a) = auth {
            r = r.bearer_auth(a);
        }
        async move { r.send().await.unwrap() }
    };
    let bare = post(
        "/queue/join",
        json!({"event_id": "shop", "user_id": "bob"}),
        None,
    )
    .await;
    let bare: Value = bare.json().await.unwrap();
    let waiting = bare["waiting_token"].as_str().unwrap();
    let entered = post("/queue/enter", json!({ "waiting_token": waiting }), None).await;
    let jwt = entered.json::<Value>().await.unwrap()["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        gate(jwt.clone()).await,
        204,
        "the bare place's session passes"
    );
    let proven = post(
        "/queue/join",
        json!({"event_id": "shop", "user_id": "bob"}),
        Some(ADMIN),
    )
    .await;
    assert_eq!(proven.status(), 200);
    let proven: Value = proven.json().await.unwrap();
    assert_ne!(proven["place_id"], bare["place_id"], "a new place");
    assert_eq!(gate(jwt).await, 401, "replaced");
}

/// The origin's answer that also carries the session cookie waitroom set is never kept by
/// a shared cache, whatever the origin said: the next visitor would get the cookie. Answers
/// without a cookie of ours keep the origin's caching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_carrying_our_cookie_is_not_cached() {
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({}))).await;
    let mut a = Person::default();
    let url = format!("http://{}/checkout", w.addr);
    let first = a.get(&url, &[]).await;
    assert!(first.is_origin(), "admitted at once: {}", first.text);
    assert!(first.headers.contains_key("set-cookie"));
    assert_eq!(first.headers["cache-control"], "no-store");
    // Nor the words a CDN reads instead of `Cache-Control`, or beside it (defect: they
    // went out with the cookie).
    for name in [
        "cdn-cache-control",
        "cloudflare-cdn-cache-control",
        "surrogate-control",
        "edge-control",
        "akamai-cache-control",
        "x-accel-expires",
        "expires",
    ] {
        assert!(!first.headers.contains_key(name), "{name}");
    }
    let again = a.get(&url, &[]).await;
    assert!(again.is_origin());
    assert!(!again.headers.contains_key("set-cookie"));
    assert_eq!(again.headers["cache-control"], "public, max-age=3600");
    assert_eq!(again.headers["cdn-cache-control"], "max-age=3600");
    // A request refused before any gate is chosen (here a `Host` that is no host) is not
    // kept either (the fix-check found it without `Cache-Control`).
    let r = client()
        .get(&url)
        .header("host", "other@shop.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["cache-control"], "no-store");
}

/// How many joins event `id` counted (its figures).
async fn joins_of(w: &Waitroom, id: &str) -> u64 {
    let r = client()
        .get(format!("http://{}/api/v1/admin/events/{id}", w.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    v["joins"].as_u64().unwrap()
}

/// Another site's page loading a gated URL (an `<img>`, a script, a fetch: the browser says
/// so in `Sec-Fetch-*`) makes no place, in the waiting room and in gateway mode; a link
/// followed from another site (a navigation) does. A sibling subdomain's page
/// (`same-site`: one with its users' content, say) is another site too (defect: it made a
/// place for each of its visitors' browsers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sites_page_cannot_fill_the_line() {
    let origin = origin().await;
    let w = waitroom(Some(origin), None).await;
    // Paused: every visit waits, so a place made shows as a 503 waiting room.
    event(&w, "shop", gated("shop", json!({"paused": true}))).await;
    let joins = || joins_of(&w, "shop");
    let fetch = |site: &'static str, path: &'static str, mode: &'static str, dest: &'static str| {
        let url = format!("http://{}{path}", w.addr);
        async move {
            client()
                .get(url)
                .header("sec-fetch-site", site)
                .header("sec-fetch-mode", mode)
                .header("sec-fetch-dest", dest)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    let sites = ["cross-site", "same-site"];
    for site in sites {
        for path in ["/wait/shop/queue?return=/checkout", "/checkout"] {
            for (mode, dest) in [
                ("no-cors", "image"),
                ("cors", "empty"),
                ("no-cors", "script"),
            ] {
                let status = fetch(site, path, mode, dest).await;
                assert_eq!(status, 400, "{site}: {path} as {dest}");
            }
        }
    }
    assert_eq!(joins().await, 0, "no place made");
    for site in sites {
        for path in ["/wait/shop/queue?return=/checkout", "/checkout"] {
            let status = fetch(site, path, "navigate", "document").await;
            assert_eq!(status, 503, "{site}: {path}");
        }
    }
    assert_eq!(joins().await, 4, "a visit from a link joins");
}

/// `HEAD` (and `OPTIONS`) are safe methods: a link checker or an uptime monitor asking one
/// at a gated URL makes no place, in the waiting room and in gateway mode (defect: each
/// made one, holding a position until it lapsed). It gets the head of a waiting page, with no cookie; a `GET`
/// then joins as usual, and a `HEAD` with a live place reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_request_makes_no_place() {
    let origin = origin().await;
    let w = waitroom(Some(origin), None).await;
    event(&w, "shop", gated("shop", json!({"paused": true}))).await;
    let joins = || joins_of(&w, "shop");
    let (head, options) = (reqwest::Method::HEAD, reqwest::Method::OPTIONS);
    for (method, path) in [
        (&head, "/wait/shop/queue?return=/checkout"),
        (&head, "/checkout"),
        // An `OPTIONS` too, in gateway mode (the waiting room's own route has none).
        (&options, "/checkout"),
    ] {
        for accept in ["text/html", "application/json", "*/*"] {
            let r = client()
                .request(method.clone(), format!("http://{}{path}", w.addr))
                .header("accept", accept)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 503, "{path} {accept}");
            assert!(r.headers().contains_key("retry-after"), "{path}");
            assert_eq!(r.headers()["cache-control"], "no-store", "{path}");
            assert!(!r.headers().contains_key("set-cookie"), "{path} {accept}");
        }
    }
    assert_eq!(joins().await, 0, "no place made by a HEAD");
    let mut a = Person::default();
    let url = format!("http://{}/checkout", w.addr);
    let first = a.get(&url, &[]).await;
    assert_eq!(first.status, 503, "{}", first.text);
    assert!(first.headers.contains_key("set-cookie"));
    assert_eq!(joins().await, 1, "a GET joins");
    let cookie = first.headers["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_string();
    let head = client()
        .head(&url)
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 503);
    assert_eq!(joins().await, 1, "a HEAD with its place reads it");
}

/// The address of an origin that is gone: nothing listens there.
async fn dead_origin() -> SocketAddr {
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead);
    addr
}

/// A site that does not answer, or answers what cannot be passed on: a browser gets a page
/// in its language under the same `502`, which tries again by itself (`Retry-After` and a
/// refresh of as many seconds, never cached); any other client the API's JSON error, as
/// before (defect: a person's browser showed the raw JSON).
#[tokio::test]
async fn a_browser_gets_a_page_when_the_site_does_not_answer() {
    let dead = waitroom(Some(dead_origin().await), None).await;
    let mut anyone = Person::default();
    let url = format!("http://{}/checkout?seat=12", dead.addr);
    let browser = "text/html,application/xhtml+xml,*/*;q=0.8";
    let page = |r: &Answer, lang: &str| {
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text);
        let kind = r.headers["content-type"].to_str().unwrap();
        assert!(kind.starts_with("text/html"), "{kind}: {}", r.text);
        let retry = r.headers["retry-after"].to_str().unwrap();
        assert!(retry.parse::<u64>().is_ok_and(|s| (1..=30).contains(&s)));
        assert_eq!(r.headers["cache-control"], "no-store");
        let refresh = format!("<meta http-equiv=\"refresh\" content=\"{retry}\">");
        assert!(r.text.contains(&refresh), "{}", r.text);
        assert!(
            r.text.contains(&format!("<html lang=\"{lang}\">")),
            "{}",
            r.text
        );
        assert!(!r.text.contains("UPSTREAM_UNAVAILABLE"), "{}", r.text);
    };
    let r = anyone.get(&url, &[("accept", browser)]).await;
    page(&r, "en");
    assert!(r.text.contains("not answering"), "{}", r.text);
    let r = anyone
        .get(&url, &[("accept", browser), ("accept-language", "ko")])
        .await;
    page(&r, "ko");
    assert!(r.text.contains("응답하지 않습니다"), "{}", r.text);
    // Every line of `Accept` and of `Accept-Language` counts, as the gate's own answers
    // read them (defect: the 502 kept the first line of each, so a browser whose JSON entry
    // came on a line of its own got the JSON here and a page from the gate).
    let lines = [
        ("accept", "application/json"),
        ("accept", "text/html"),
        ("accept-language", "fr"),
        ("accept-language", "ko"),
    ];
    page(&anyone.get(&url, &lines).await, "ko");

    // Any other client: the contract's JSON error, as it was.
    for accept in [None, Some("*/*"), Some("application/json")] {
        let extra: Vec<(&str, &str)> = accept.iter().map(|a| ("accept", *a)).collect();
        let r = anyone.get(&url, &extra).await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{accept:?}");
        assert!(!r.headers.contains_key("retry-after"), "{accept:?}");
        assert_eq!(
            r.json()["error"]["code"],
            "UPSTREAM_UNAVAILABLE",
            "{accept:?}"
        );
    }

    // A form's POST gets the JSON even from a browser: the page's reload would come back
    // as a GET, the form's data lost.
    let r = client()
        .post(&url)
        .header("accept", browser)
        .body("seat=12")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert!(!r.headers().contains_key("retry-after"));
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "UPSTREAM_UNAVAILABLE"
    );

    // An answer the gateway cannot pass on is the same `502`, and the same page.
    let misframed = raw_answer_origin(|_| {
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n\
         3\r\nxyz\r\n0\r\n\r\n"
    })
    .await;
    let w = waitroom(Some(misframed), None).await;
    let url = format!("http://{}/", w.addr);
    let r = anyone
        .get(&url, &[("accept", browser), ("accept-language", "ko")])
        .await;
    page(&r, "ko");
    let r = anyone.get(&url, &[("accept", "application/json")]).await;
    assert_eq!(r.json()["error"]["code"], "UPSTREAM_UNAVAILABLE");
}

/// An origin that answers each path with the raw bytes `answers` gives it, then closes.
async fn raw_answer_origin(answers: fn(&str) -> &'static str) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_string();
                let path = head.split(' ').nth(1).unwrap_or("");
                let _ = s.write_all(answers(path).as_bytes()).await;
            });
        }
    });
    addr
}

/// An origin answer framed by `Transfer-Encoding` reaches the client whole whatever
/// `Content-Length` it also carries, and one with another transfer coding than `chunked`
/// is a `502`, as nginx answers it (defect: the stale length framed the answer, so the
/// client got it cut short, or nothing at all; a `gzip, chunked` body came still gzipped
/// with nothing saying so).
#[tokio::test]
async fn an_origins_answer_is_framed_by_its_chunks_or_refused() {
    let origin = raw_answer_origin(|path| match path {
        "/short" => {
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\n\r\nb\r\nhello world\r\n0\r\n\r\n"
        }
        "/long" => {
            "HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        }
        "/unchanged" => {
            "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: gzip, chunked\r\n\
             connection: close\r\n\r\n"
        }
        // A switch to a request that asked for none (RFC 9110 §15.2.2).
        "/switch" => {
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"
        }
        _ => {
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n\
             3\r\nxyz\r\n0\r\n\r\n"
        }
    })
    .await;
    let w = waitroom(Some(origin), None).await;
    let get = |path: &'static str| {
        let url = format!("http://{}{path}", w.addr);
        async move {
            let r = client().get(url).send().await.expect("an answer");
            (r.status(), r.text().await.expect("a whole body"))
        }
    };
    assert_eq!(get("/short").await, (StatusCode::OK, "hello world".into()));
    assert_eq!(get("/long").await, (StatusCode::OK, "hello".into()));
    assert_eq!(get("/gzip").await.0, StatusCode::BAD_GATEWAY);
    // Without a body, the coding only says what a body would have had: passed on.
    assert_eq!(get("/unchanged").await.0, StatusCode::NOT_MODIFIED);
    // Passed on, it left the client a switched connection with nothing on it.
    assert_eq!(get("/switch").await.0, StatusCode::BAD_GATEWAY);
}

/// The origin's completion signal never reaches a visitor, on an ungated path or a
/// bypassed one either (defect: there it was passed on as it was).
#[tokio::test]
async fn the_completion_signal_never_reaches_the_visitor() {
    let w = waitroom(Some(origin().await), None).await;
    let get = |w: &Waitroom| {
        let url = format!("http://{}/checkout/done", w.addr);
        async move { client().get(url).send().await.unwrap() }
    };
    let ungated = get(&w).await;
    assert_eq!(ungated.status(), StatusCode::OK);
    assert!(!ungated.headers().contains_key("x-waitroom-complete"));
    event(
        &w,
        "shop",
        json!({"paths": ["/checkout"], "bypass_paths": ["/checkout/done"]}),
    )
    .await;
    let bypassed = get(&w).await;
    assert_eq!(bypassed.status(), StatusCode::OK);
    assert_eq!(bypassed.text().await.unwrap(), "purchase done");
    let bypassed = get(&w).await;
    assert!(!bypassed.headers().contains_key("x-waitroom-complete"));
}

/// The gateway's own answers made before a request's body arrived (the waiting room's
/// page, here for a paused sale) leave the connection serving the client's next request
/// (defect: the unread body made hyper close the connection after the answer, without
/// saying so, and the client's next request on it got no answer).
#[tokio::test]
async fn an_answer_before_the_body_keeps_the_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let o = origin().await;
    let w = waitroom(Some(o), None).await;
    event(&w, "shop", gated("shop", json!({"paused": true}))).await;
    let mut sock = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    let body = b"seat=3&qty=1";
    let head = format!(
        "POST /checkout HTTP/1.1\r\nhost: x\r\naccept: text/html\r\n\
         content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    // The waiting room's answer, whole (its length is in its head).
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = sock.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the answer");
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let len: usize = text[..end]
                    .to_ascii_lowercase()
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return text;
                }
            }
        }
    })
    .await
    .expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    // The body comes after its answer, as a client that wrote the head first sends it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    sock.write_all(body).await.unwrap();
    sock.write_all(b"GET /about HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut next = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = sock.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            next.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&next).contains("\"origin\":true") {
                return;
            }
        }
    })
    .await;
    let next = String::from_utf8_lossy(&next);
    assert!(read.is_ok() && next.starts_with("HTTP/1.1 200"), "{next}");
    assert!(next.contains("\"origin\":true"), "{next}");
}

/// Sends `raw` (whole requests, the last asking to close) to `addr`: the status of the
/// first answer and all that came until the gateway closed.
async fn raw_exchange(addr: SocketAddr, raw: impl AsRef<[u8]>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_ref()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the gateway closes after a request asking it to")
        .unwrap();
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    (status, text)
}

/// A gateway with an event gating `/checkout` on `shop.example` only, its one slot taken:
/// a request to it on that host waits (`503`), on another host it reaches the origin.
async fn full_on_one_host() -> Waitroom {
    let w = waitroom(Some(origin().await), None).await;
    let hosted = json!({"max_active": 1, "paths": ["/checkout"], "hosts": ["shop.example"]});
    event(&w, "hosted", hosted).await;
    let (status, text) = get_on(&w, "/checkout/pay", Some("shop.example")).await;
    assert!(status == 200 && text.contains("\"origin\":true"), "{text}");
    assert_eq!(
        get_on(&w, "/checkout/pay", Some("shop.example")).await.0,
        503
    );
    w
}

/// `GET target` over HTTP/1.1 with `host` as its `Host` line (`None`: no such line).
async fn get_on(w: &Waitroom, target: &str, host: Option<&str>) -> (u16, String) {
    let host = host.map_or(String::new(), |h| format!("Host: {h}\r\n"));
    let raw = format!(
        "GET {target} HTTP/1.1\r\n{host}Accept: application/json\r\nConnection: close\r\n\r\n"
    );
    raw_exchange(w.addr, raw).await
}

/// `GET /api/v1/gate` for `/checkout/pay`, with `host` as nginx's `$host`.
async fn gate_on(w: &Waitroom, host: &str) -> (u16, String) {
    let r = client()
        .get(format!("http://{}/api/v1/gate", w.addr))
        .header("x-original-uri", "/checkout/pay")
        .header("host", host)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A `Host` that is not a host name or address with an optional port is refused `400`
/// before any gate is asked (defect: the gate compared the text with `hosts`, found another
/// host and passed the request, while an origin such as Node's `new URL()` read each of
/// these as `shop.example` and served its gated page). What is a host and port is read as
/// before: case, port and a trailing dot aside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_a_host_and_port_is_refused_before_the_gate() {
    let w = full_on_one_host().await;
    for bad in [
        "other@shop.example",
        "x:y@shop.example",
        "shop.example/",
        "shop.example#",
        "shop.example?",
        "shop%2Eexample",
        "shop.ex%61mple",
        "shop.example;x",
        "shop..example",
        "shop.example:80:x",
        "",
    ] {
        let (status, text) = get_on(&w, "/checkout/pay", Some(bad)).await;
        assert_eq!(status, 400, "Host: {bad:?} was answered {text}");
        assert!(text.contains("INVALID_REQUEST"), "{text}");
    }
    // A browser is told on a page, in its language, never cached (defect: it was shown the
    // JSON), whatever the method.
    for (method, lang, words) in [
        ("GET", "ko", "지금은 대기실에 들어갈 수 없습니다"),
        ("POST", "en", "The waiting room cannot let you in right now"),
    ] {
        let raw = format!(
            "{method} /checkout/pay HTTP/1.1\r\nHost: other@shop.example\r\n\
             Accept: text/html,application/xhtml+xml\r\nAccept-Language: {lang}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (status, text) = raw_exchange(w.addr, raw).await;
        assert_eq!(status, 400, "{text}");
        let head = text.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
        assert!(head.contains("content-type: text/html"), "{text}");
        assert!(head.contains("cache-control: no-store"), "{text}");
        assert!(text.contains(words), "{text}");
    }
    for same in ["SHOP.example:8080", "shop.example.", "Shop.Example.:443"] {
        let (status, text) = get_on(&w, "/checkout/pay", Some(same)).await;
        assert_eq!(status, 503, "Host: {same} skipped the queue: {text}");
    }
    for other in ["other.example", "[::1]:8080", "127.0.0.1", "my_host"] {
        let (status, text) = get_on(&w, "/checkout/pay", Some(other)).await;
        assert!(
            status == 200 && text.contains("\"origin\":true"),
            "{other}: {text}"
        );
    }
}

/// `GET /api/v1/gate` applies the gateway's rule to the `Host` nginx passes (its `$host`,
/// which keeps these as they came): `400`, which nginx answers the visitor `500`, rather
/// than `204` for a host the event does not name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_endpoint_refuses_a_host_that_is_not_a_host_and_port() {
    let w = full_on_one_host().await;
    for bad in ["other@shop.example", "shop.example?", "shop.ex%61mple"] {
        let (status, text) = gate_on(&w, bad).await;
        assert_eq!(status, 400, "Host: {bad}: {text}");
        assert!(text.contains("INVALID_REQUEST"), "{text}");
    }
    assert_eq!(gate_on(&w, "SHOP.example.").await.0, 401);
    assert_eq!(gate_on(&w, "other.example").await.0, 204);
}

/// A request naming no host is refused `400` (defect: it was gated as on no host, and sent
/// to the origin with the origin's own address as `Host`, so served as its default site):
/// HTTP/1.1 requires `Host` (RFC 9112 §3.2), and RFC 9110 §7.2 asks it of every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_no_host_is_refused() {
    let w = full_on_one_host().await;
    let (status, text) = get_on(&w, "/checkout/pay", None).await;
    assert_eq!(status, 400, "{text}");
    let (status, text) = raw_exchange(
        w.addr,
        b"GET /checkout/pay HTTP/1.0\r\nAccept: application/json\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400, "{text}");
}

/// An absolute-form target names the request's host (RFC 9112 §3.2.2: a proxy ignores
/// `Host` then): the gate matches it and the origin is sent it as `Host` (defect: both
/// went by the `Host` line, so a client could be gated as one host and name another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_form_target_is_gated_and_forwarded_by_its_authority() {
    let w = full_on_one_host().await;
    for target in [
        "http://shop.example/checkout/pay",
        "http://user:secret@shop.example:80/checkout/pay",
    ] {
        let (status, text) = get_on(&w, target, Some("other.example")).await;
        assert_eq!(status, 503, "{target} skipped the queue: {text}");
    }
    let (status, text) = get_on(
        &w,
        "http://other.example/checkout/pay",
        Some("shop.example"),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["host"], "other.example");
    assert_eq!(body["xfh"], "other.example");
    let (status, text) = get_on(
        &w,
        "http://shop.example;x/checkout/pay",
        Some("shop.example"),
    )
    .await;
    assert_eq!(status, 400, "{text}");
}

/// The answer's status line carries the client connection's HTTP version, not the
/// origin's (defect: an HTTP/1.0 origin's `HTTP/1.0 200 OK` reached HTTP/1.1 clients,
/// which then take the connection as closing while the gateway keeps it open).
#[tokio::test]
async fn the_answer_carries_the_clients_http_version() {
    use tokio::io::AsyncWriteExt;
    let origin = raw_answer_origin(|_| "HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let w = waitroom(Some(origin), None).await;
    let mut s = tokio::net::TcpStream::connect(w.addr).await.unwrap();
    for _ in 0..2 {
        s.write_all(b"GET /a HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_it_ends_with(&mut s, "ok").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    }
    let (status, answer) =
        raw_exchange(w.addr, b"GET /a HTTP/1.0\r\nHost: shop.example\r\n\r\n").await;
    assert_eq!(status, 200);
    assert!(answer.starts_with("HTTP/1.0 200 OK\r\n"), "{answer}");
}

/// A request body in a transfer coding other than `chunked` alone is refused `501`, as
/// nginx refuses it (defect: `gzip, chunked` was read by its chunks and reached the origin
/// as `chunked`, still gzipped, with nothing saying so).
#[tokio::test]
async fn a_request_body_coded_otherwise_than_by_chunks_is_refused() {
    let w = waitroom(Some(origin().await), None).await;
    // No `Connection: close`: the gateway closes the connection after the `501` (the body's
    // coding is not understood), as after an answer that is the last.
    let post = |coding: &str| {
        let raw = format!(
            "POST /upload HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: {coding}\r\n\
             \r\n3\r\nabc\r\n0\r\n\r\n"
        );
        raw_exchange(w.addr, raw)
    };
    for coding in ["gzip, chunked", "identity, chunked", "chunked, chunked"] {
        let (status, text) = post(coding).await;
        assert_eq!(status, 501, "{coding}: {text}");
        assert!(text.contains("NOT_IMPLEMENTED"), "{text}");
    }
    let raw = "POST /upload HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: Chunked\r\n\
               Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (status, text) = raw_exchange(w.addr, raw).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("\r\n\r\n3"), "{text}");
}

/// An origin that sends its head and part of the body, then closes, gets the client that
/// head and that part before the cut, every time, as nginx does (defect: about one time in
/// three the client got nothing at all, not even the status line, as the body's error
/// reached the serving connection before it had written what it held).
#[tokio::test]
async fn an_origin_cut_mid_body_passes_on_its_head_and_what_came() {
    let origin = raw_answer_origin(|path| match path {
        "/head" => "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n",
        _ => "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
    })
    .await;
    let w = waitroom(Some(origin), None).await;
    for i in 0..30 {
        for (path, body) in [("/cut", "hello"), ("/head", "\r\n\r\n")] {
            let (status, text) = raw_exchange(
                w.addr,
                format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
            )
            .await;
            assert_eq!(status, 200, "request {i} of {path}: {text}");
            assert!(text.ends_with(body), "request {i} of {path}: {text}");
        }
    }
}

/// `POST /wait/{id}/queue` (the script page handing its place to the gate) refuses what is
/// no live place of the event and another site's form, and tells a browser so on a page.
/// Defects: the place of a token whose place had ended (left) was handed over (`303` and
/// its cookie, then a new place made at the gate without a word); a browser that sends no
/// `Sec-Fetch-Site` (Safari before 16.4) had another site's form accepted; the refusals
/// were JSON to a browser; and the JSON refusals at gated URLs carried no `no-store`.
#[tokio::test]
async fn the_hand_over_takes_only_a_live_place_from_the_waiting_rooms_own_page() {
    let w = waitroom(None, None).await;
    event(&w, "ho", gated("ho", json!({"max_active": 5}))).await;
    let url = format!("http://{}/wait/ho/queue?return=%2Fcheckout", w.addr);
    let post = |token: String, extra: Vec<(&'static str, String)>| {
        let url = url.clone();
        async move {
            let mut req = client()
                .post(url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("waiting_token={token}"));
            for (k, v) in extra {
                req = req.header(k, v);
            }
            let r = req.send().await.unwrap();
            let status = r.status();
            let headers = r.headers().clone();
            (status, headers, r.text().await.unwrap())
        }
    };
    let (live, _) = api_session(&w, "ho").await;
    let (gone, _) = api_session(&w, "ho").await;
    let r = client()
        .delete(format!("http://{}/api/v1/queue/leave?token={gone}", w.addr))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());

    // A live place is handed over: its cookie.
    let (st, h, body) = post(live.clone(), vec![]).await;
    assert_eq!(st, StatusCode::SEE_OTHER, "{body}");
    assert!(h["set-cookie"].to_str().unwrap().contains(&live));
    // So is one posted by the page itself from a browser without `Sec-Fetch-Site`: it
    // names its own origin.
    // (A proxy's `Host` may leave the port out, as nginx's `$host` does.)
    let own = format!("http://{}", w.addr);
    let (st, _, body) = post(live.clone(), vec![("origin", own.clone())]).await;
    assert_eq!(st, StatusCode::SEE_OTHER, "{own}: {body}");
    let proxied = vec![
        ("origin", "https://Shop.example:8443".to_string()),
        ("host", "shop.example".to_string()),
    ];
    let (st, _, body) = post(live.clone(), proxied).await;
    assert_eq!(st, StatusCode::SEE_OTHER, "{body}");
    // Or `null`, as such a browser says it for the page's own form (it sends no referrer).
    let (st, _, body) = post(live.clone(), vec![("origin", "null".to_string())]).await;
    assert_eq!(st, StatusCode::SEE_OTHER, "{body}");
    // A token with spaces around it (a line break, a no-break space) is the place: its
    // cookie holds the token alone (defect: a line break made the header invalid, a `500`;
    // a no-break space a cookie the gate could not read).
    for pad in ["%0A", "%0D%0A", "%0B", "%0C", "%C2%A0", "%E3%80%80", "+"] {
        let (st, h, body) = post(format!("{pad}{live}{pad}"), vec![]).await;
        assert_eq!(st, StatusCode::SEE_OTHER, "{pad}: {body}");
        let cookie = h["set-cookie"].to_str().unwrap();
        assert!(
            cookie.starts_with(&format!("waitroom_ho={live};")),
            "{pad}: {cookie}"
        );
    }
    // A place that ended, another site's form (by `Sec-Fetch-Site` or, without it, by
    // `Origin`): refused, no cookie, never cached.
    let refused = [
        (gone.clone(), vec![]),
        (
            live.clone(),
            vec![("sec-fetch-site", "cross-site".to_string())],
        ),
        (
            live.clone(),
            vec![("origin", "https://evil.example".to_string())],
        ),
        (
            live.clone(),
            vec![("origin", format!("http://localhost:{}", w.addr.port()))],
        ),
        (
            live.clone(),
            vec![
                ("origin", "https://shop.example.evil".to_string()),
                ("host", "shop.example".to_string()),
            ],
        ),
    ];
    for (token, extra) in refused.clone() {
        let (st, h, body) = post(token, extra.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{extra:?}: {body}");
        assert!(h.get("set-cookie").is_none(), "{extra:?}");
        assert_eq!(h["cache-control"], "no-store", "{extra:?}");
        assert!(body.contains("INVALID_REQUEST"), "{extra:?}: {body}");
    }
    // A browser is told on a page, which does not post the form again.
    for (token, mut extra) in refused {
        extra.push(("accept", "text/html,application/xhtml+xml".to_string()));
        let (st, h, body) = post(token, extra.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{extra:?}");
        assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
        assert_eq!(h["cache-control"], "no-store", "{extra:?}");
        assert!(!body.contains("http-equiv=\"refresh\""), "{body}");
    }
    // The refusal of a gated URL's visit as JSON carries `no-store` as its page does.
    let mut p = Person::default();
    let r = p
        .get(
            &url,
            &[
                ("sec-fetch-site", "cross-site"),
                ("sec-fetch-dest", "image"),
                ("accept", "application/json"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.headers["cache-control"], "no-store");
    // So does the JSON answer for an event that does not exist, or an id that is none.
    for (path, status) in [
        ("/wait/nope/queue", StatusCode::NOT_FOUND),
        ("/wait/bad%20id/queue", StatusCode::BAD_REQUEST),
    ] {
        let r = p
            .get(
                &format!("http://{}{path}", w.addr),
                &[("accept", "application/json")],
            )
            .await;
        assert_eq!(r.status, status, "{path}: {}", r.text);
        assert_eq!(r.headers["cache-control"], "no-store", "{path}");
    }
}
