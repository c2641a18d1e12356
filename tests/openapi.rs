//! The OpenAPI document against the code: every route the router serves is in it (and
//! nothing else), every error code the code can answer is in it and in docs/API.md, and
//! every code API.md names exists. Routes are added on several branches at once: the
//! failure messages say exactly what to add where.
//!
//! Also the demo booking page's own route, guarded by `waitroom-guard`.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use ed25519_dalek::SigningKey;
use serde_json::{json, Value};
use tower::ServiceExt;

use waitroom::clock::{system_now, Clock};
use waitroom::core::QueueError;
use waitroom::http::error::code;
use waitroom::http::{openapi, route_list, router, AppError};
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::StoreError;
use waitroom::AppState;

fn state() -> AppState {
    AppState::new(
        Arc::new(EmbeddedStore::new()),
        &SigningKey::from_bytes(&[7; 32]),
        "admin",
        Clock::manual(system_now()),
    )
    .unwrap()
}

#[test]
fn every_served_route_is_documented_and_every_documented_route_is_served() {
    let served: BTreeSet<(String, String)> = route_list(&state())
        .into_iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let doc = openapi::document();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.clone(), path.clone()));
        }
    }
    let missing: Vec<String> = served
        .difference(&documented)
        .map(|(m, p)| {
            format!(
                "  {} {p}: served (src/http/mod.rs) but not in the OpenAPI document. Add to \
                 src/http/openapi.rs a stub `#[utoipa::path({m}, path = \"{p}\", tag = …, \
                 responses(…))] fn name() {{}}` and list `name` in `paths(…)` of `Doc`",
                m.to_uppercase()
            )
        })
        .collect();
    let stale: Vec<String> = documented
        .difference(&served)
        .map(|(m, p)| {
            format!(
                "  {} {p}: in src/http/openapi.rs but no such route is served",
                m.to_uppercase()
            )
        })
        .collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "the OpenAPI document and the router disagree:\n{}",
        missing
            .iter()
            .chain(&stale)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        served.len() >= 40,
        "the route list is suspiciously short: {served:?}"
    );
}

/// The codes of API.md's "Errors" table (`| 404 | \`EVENT_NOT_FOUND\` | …`).
fn api_md_codes() -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/API.md")).unwrap();
    let errors = text.split("\n## Errors").nth(1).unwrap();
    let errors = errors.split("\n## ").next().unwrap();
    errors
        .lines()
        .filter(|l| l.starts_with("| "))
        .filter_map(|l| l.split('|').nth(2))
        .filter_map(|cell| {
            cell.trim()
                .strip_prefix('`')?
                .strip_suffix('`')
                .map(String::from)
        })
        .collect()
}

#[test]
fn every_error_code_is_documented_and_every_documented_code_exists() {
    let all: BTreeSet<String> = code::ALL.iter().map(|c| c.to_string()).collect();
    let md = api_md_codes();
    let undocumented: Vec<_> = all.difference(&md).collect();
    assert!(
        undocumented.is_empty(),
        "codes the server can answer but docs/API.md \"Errors\" does not list (add a row \
         `| status | \\`CODE\\` | when |`): {undocumented:?}"
    );
    let unknown: Vec<_> = md.difference(&all).collect();
    assert!(
        unknown.is_empty(),
        "codes docs/API.md lists that the code never answers (declare them in `codes!` of \
         src/http/error.rs, or drop the row): {unknown:?}"
    );

    // The document lists the same codes, and names only those in its responses.
    let doc = openapi::document();
    let listed: BTreeSet<String> = doc["components"]["schemas"]["ErrorDetail"]["properties"]
        ["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, all);
    let mut named = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, res) in op["responses"].as_object().unwrap() {
                if !status.starts_with('4') && !status.starts_with('5') {
                    continue;
                }
                let text = res["description"].as_str().unwrap_or("");
                let codes: Vec<&str> = text
                    .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                    .filter(|w| w.len() > 3 && w.contains('_') || all.contains(*w))
                    .collect();
                assert!(
                    !codes.is_empty(),
                    "{method} {path} {status}: the description names no error code: {text}"
                );
                for c in codes {
                    named.insert((c.to_string(), format!("{method} {path} {status}")));
                }
            }
        }
    }
    let bad: Vec<_> = named.iter().filter(|(c, _)| !all.contains(c)).collect();
    assert!(
        bad.is_empty(),
        "the document names codes that do not exist: {bad:?}"
    );

    // Every queue error reaches clients as a documented code.
    for q in QueueError::NAMED
        .into_iter()
        .chain([QueueError::Invalid("x".into())])
    {
        let c = AppError::from(StoreError::Queue(q.clone())).code();
        assert!(
            all.contains(c),
            "{q:?} answers {c}, which is not in code::ALL"
        );
    }
}

async fn send(
    app: &Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 22)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_document_is_served_as_openapi_3_1() {
    let app = router(state());
    let (status, doc) = send(&app, "GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    // Types come from the code: the join answer carries the place's fields flattened.
    let joined = &doc["components"]["schemas"]["Joined"];
    assert!(joined.to_string().contains("waiting_token"), "{joined}");
    assert!(doc.to_string().contains("queue_length"));
    assert_eq!(
        doc["paths"]["/api/v1/admin/stats"]["get"]["security"],
        json!([{"admin": []}])
    );
}

/// An access token for `event` from the real flow (join, enter).
async fn access_token(app: &Router, event: &str) -> String {
    let (s, _) = send(
        app,
        "PUT",
        &format!("/api/v1/admin/events/{event}"),
        Some("admin"),
        Some(json!({"max_active": 5})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, joined) = send(
        app,
        "POST",
        "/api/v1/queue/join",
        None,
        Some(json!({"event_id": event, "user_id": "ann"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{joined}");
    let (s, entered) = send(
        app,
        "POST",
        "/api/v1/queue/enter",
        None,
        Some(json!({"waiting_token": joined["waiting_token"]})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{entered}");
    entered["access_token"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_demo_booking_route_is_guarded_by_the_origin_library() {
    let app = router(state());
    let token = access_token(&app, "fest").await;
    let area = Some(json!({"area": "balcony"}));
    let (s, order) = send(
        &app,
        "POST",
        "/demo/booking/order?event=fest",
        Some(&token),
        area.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{order}");
    assert_eq!(
        (
            order["booked"].as_bool(),
            order["event_id"].as_str(),
            order["user_id"].as_str(),
            order["area"].as_str()
        ),
        (Some(true), Some("fest"), Some("ann"), Some("balcony"))
    );
    // The page's event is the demo event by default: a token of another event is refused.
    let (s, e) = send(
        &app,
        "POST",
        "/demo/booking/order",
        Some(&token),
        area.clone(),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("ACCESS_DENIED")),
        "{e}"
    );
    let (s, _) = send(
        &app,
        "POST",
        "/demo/booking/order?event=",
        Some(&token),
        area.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = send(
        &app,
        "POST",
        "/demo/booking/order?event=fest",
        None,
        area.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Signed by a key this server does not have.
    let forger = AppState::new(
        Arc::new(EmbeddedStore::new()),
        &SigningKey::from_bytes(&[8; 32]),
        "admin",
        Clock::manual(system_now()),
    )
    .unwrap();
    let forged = access_token(&router(forger), "fest").await;
    let (s, e) = send(
        &app,
        "POST",
        "/demo/booking/order?event=fest",
        Some(&forged),
        area,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{e}");
    // A valid token still gets our JSON errors for a bad body.
    let (s, e) = send(
        &app,
        "POST",
        "/demo/booking/order?event=fest",
        Some(&token),
        Some(json!({"area": "roof"})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_REQUEST")),
        "{e}"
    );
}

/// Routes are only ever added through `route!` (which records them for the test above): a
/// bare `.route(…)`, `.nest(…)` or `.route_service(…)` anywhere in `src/` (outside unit
/// tests) would serve a path the list, and so the document, never hear of.
#[test]
fn every_route_goes_through_the_recording_macro() {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut bare = Vec::new();
    for f in all {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            // Unit tests (from the first `#[cfg(test)]` on) build routers of their own.
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let code = line.split("//").next().unwrap();
            let adds = [".route(", ".nest(", ".nest_service(", ".route_service("]
                .iter()
                .any(|m| code.contains(m));
            // The macro's own expansion is the one allowed call.
            if adds && !code.contains("$routes") {
                bare.push(format!("  {}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "routes added without `route!` (src/http/mod.rs), so missing from `route_list` and \
         unchecked against the OpenAPI document:\n{}",
        bare.join("\n")
    );
}

/// What a client generated from the document needs: the token's body on the routes that
/// take one, the token optional where a Bearer header may carry it, every admin route's
/// 401, the parameters' ranges, the settings' fields, and the invites' CSV.
#[test]
fn the_document_describes_bodies_tokens_ranges_and_settings() {
    let doc = openapi::document();
    let op = |method: &str, path: &str| doc["paths"][path][method].clone();
    for path in [
        "/api/v1/queue/enter",
        "/api/v1/queue/heartbeat",
        "/api/v1/queue/leave",
    ] {
        let body = &op("post", path)["requestBody"]["content"]["application/json"]["schema"];
        assert!(body.to_string().contains("TokenBody"), "{path}: {body}");
    }
    for (method, path) in [
        ("get", "/api/v1/queue/status"),
        ("delete", "/api/v1/queue/leave"),
    ] {
        let token = op(method, path)["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "token")
            .cloned()
            .unwrap();
        assert_ne!(token["required"], true, "{path}: {token}");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        if path.starts_with("/api/v1/admin/") {
            for (method, o) in item.as_object().unwrap() {
                assert!(o["responses"].get("401").is_some(), "{method} {path}");
            }
        }
    }
    let limit = op("get", "/api/v1/admin/audit")["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .cloned()
        .unwrap();
    assert_eq!(
        (&limit["schema"]["minimum"], &limit["schema"]["maximum"]),
        (&json!(1), &json!(1000))
    );
    let schemas = &doc["components"]["schemas"];
    let settings = schemas["EventSettings"].to_string();
    assert!(
        settings.contains("\"max_active\":{\"type\":\"integer\"}"),
        "{settings}"
    );
    let admin = schemas["AdminEvent"].to_string();
    assert!(
        admin.contains("\"waiting\":{\"type\":\"integer\"}"),
        "{admin}"
    );
    let invites = &op("post", "/api/v1/admin/events/{event_id}/invites")["responses"]["200"];
    assert!(invites["content"].get("text/csv").is_some(), "{invites}");
}
