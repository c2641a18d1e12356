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

/// No value of the document is `null`: where OpenAPI takes an array or an object a
/// `null` makes the document invalid for validators and generators (defect: the post-pass
/// that writes the event id's rule inserted `"parameters": null` into 19 operations
/// without parameters, as indexing a missing key of a JSON value does).
#[tokio::test]
async fn the_document_holds_no_null() {
    fn nulls(v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Null => out.push(at.to_string()),
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    nulls(x, &format!("{at}/{i}"), out);
                }
            }
            Value::Object(o) => {
                for (k, x) in o {
                    nulls(x, &format!("{at}/{k}"), out);
                }
            }
            _ => {}
        }
    }
    let app = router(state());
    let (_, doc) = send(&app, "GET", "/api/v1/openapi.json", None, None).await;
    let mut found = Vec::new();
    nulls(&doc, "", &mut found);
    assert!(found.is_empty(), "{found:?}");
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
    // The settings and figures are named schemas that the admin answers refer to.
    let settings = schemas["Settings"].to_string();
    assert!(
        settings.contains("\"max_active\":{\"type\":\"integer\"}"),
        "{settings}"
    );
    assert!(schemas["EventSettings"]
        .to_string()
        .contains("#/components/schemas/Settings"));
    let figures = schemas["EventFigures"].to_string();
    assert!(
        figures.contains("\"waiting\":{\"type\":\"integer\"}"),
        "{figures}"
    );
    assert!(schemas["AdminEvent"]
        .to_string()
        .contains("#/components/schemas/EventFigures"));
    let invites = &op("post", "/api/v1/admin/events/{event_id}/invites")["responses"]["200"];
    assert!(invites["content"].get("text/csv").is_some(), "{invites}");
}

// ---------------------------------------------------------------------------------------
// The document against real answers: every answer of a scenario that visits every state
// (waiting, admitted, active, paused, ended, deleted, refused) must be documented by its
// route: its status, its content type, its body's schema (with no field the schema does
// not declare), the error code in the status's description, and the headers it carries.
// ---------------------------------------------------------------------------------------

/// The schema at a `#/components/schemas/…` reference.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").expect(r);
            let s = &doc["components"]["schemas"][name];
            assert!(!s.is_null(), "dangling reference {r}");
            resolve(doc, s)
        }
        None => schema,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        other => panic!("unknown type {other}"),
    }
}

/// The errors of `v` against `schema`: the part of JSON Schema 2020-12 the document uses
/// (`$ref`, `type`, `enum`, `properties`, `required`, `items`, `allOf`, `oneOf`, `anyOf`,
/// `minimum`, `maximum`, `additionalProperties`).
fn schema_errors(doc: &Value, schema: &Value, v: &Value, at: &str, out: &mut Vec<String>) {
    let s = resolve(doc, schema);
    match &s["type"] {
        Value::String(t) if !type_matches(t, v) => {
            out.push(format!("{at}: {v} is not {t}"));
            return;
        }
        Value::Array(ts) if !ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)) => {
            out.push(format!("{at}: {v} is none of {ts:?}"));
            return;
        }
        _ => {}
    }
    if let Some(e) = s["enum"].as_array() {
        if !e.contains(v) {
            out.push(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (s["minimum"].as_f64(), v.as_f64()) {
        if n < min {
            out.push(format!("{at}: {n} < minimum {min}"));
        }
    }
    if let (Some(max), Some(n)) = (s["maximum"].as_f64(), v.as_f64()) {
        if n > max {
            out.push(format!("{at}: {n} > maximum {max}"));
        }
    }
    for part in s["allOf"].as_array().into_iter().flatten() {
        schema_errors(doc, part, v, at, out);
    }
    for (key, exactly_one) in [("oneOf", true), ("anyOf", false)] {
        if let Some(alts) = s[key].as_array() {
            let passing = alts
                .iter()
                .filter(|a| {
                    let mut e = Vec::new();
                    schema_errors(doc, a, v, at, &mut e);
                    e.is_empty()
                })
                .count();
            if passing == 0 || (exactly_one && passing > 1) {
                out.push(format!("{at}: {v} matches {passing} of the {key} {alts:?}"));
            }
        }
    }
    if let Some(obj) = v.as_object() {
        for r in s["required"].as_array().into_iter().flatten() {
            if !obj.contains_key(r.as_str().unwrap()) {
                out.push(format!("{at}: required field {r} missing"));
            }
        }
        let props = s["properties"].as_object();
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(p) => schema_errors(doc, p, x, &format!("{at}.{k}"), out),
                None if s["additionalProperties"].is_object() => schema_errors(
                    doc,
                    &s["additionalProperties"],
                    x,
                    &format!("{at}.{k}"),
                    out,
                ),
                None if s["additionalProperties"] == false => {
                    out.push(format!("{at}: field {k} not allowed"))
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            schema_errors(doc, items, x, &format!("{at}[{i}]"), out);
        }
    }
}

/// The fields of `v` (at any depth) that no schema of the match declares: a field the
/// server sends that a generated client cannot see.
fn undeclared(doc: &Value, schema: &Value, v: &Value, at: &str, out: &mut Vec<String>) {
    let s = resolve(doc, schema);
    // Of a choice, the declared fields of the alternative that matches.
    for key in ["oneOf", "anyOf"] {
        for alt in s[key].as_array().into_iter().flatten() {
            let mut e = Vec::new();
            schema_errors(doc, alt, v, at, &mut e);
            if e.is_empty() {
                undeclared(doc, alt, v, at, out);
                return;
            }
        }
    }
    // The fields every part declares, and each field's schemas.
    fn declared<'a>(doc: &'a Value, s: &'a Value, into: &mut Vec<(&'a String, &'a Value)>) -> bool {
        let s = resolve(doc, s);
        // Any value (`{}`, a setting's old and new value in the audit) declares any field.
        let any = s
            .as_object()
            .is_some_and(|m| m.keys().all(|k| k == "description"));
        let mut open = any || s.get("additionalProperties").is_some_and(|a| a != false);
        for (k, p) in s["properties"].as_object().into_iter().flatten() {
            into.push((k, p));
        }
        for part in s["allOf"].as_array().into_iter().flatten() {
            open |= declared(doc, part, into);
        }
        open
    }
    let mut fields = Vec::new();
    let open = declared(doc, s, &mut fields);
    if let Some(obj) = v.as_object() {
        for (k, x) in obj {
            let of_k: Vec<&Value> = fields
                .iter()
                .filter(|(n, _)| *n == k)
                .map(|f| f.1)
                .collect();
            if of_k.is_empty() && !open {
                out.push(format!("{at}.{k}"));
            }
            for p in of_k {
                undeclared(doc, p, x, &format!("{at}.{k}"), out);
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            undeclared(doc, items, x, &format!("{at}[{i}]"), out);
        }
    }
}

/// The document's operation for a request: its path template and the operation. A method
/// the path does not serve (405) is one of the path's `default` answers: any of its
/// operations stands for it.
fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> Option<(&'a String, &'a Value)> {
    let segs: Vec<&str> = path.split('/').collect();
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .find_map(|(p, item)| {
            let t: Vec<&str> = p.split('/').collect();
            let fits = t.len() == segs.len()
                && t.iter()
                    .zip(&segs)
                    .all(|(a, b)| a == b || (a.starts_with('{') && a.ends_with('}')));
            let op = item
                .get(method.to_lowercase())
                .or_else(|| item.as_object()?.values().next())?;
            fits.then_some((p, op))
        })
}

/// One answer, as the scenario saw it.
struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    json: Value,
}

/// Sends requests to the router as a client at 192.0.2.1 and checks every answer against
/// the document.
struct Conformance {
    state: AppState,
    app: Router,
    doc: Value,
    problems: Vec<String>,
    /// (method, path template, status) of every answer.
    seen: BTreeSet<(String, String, String)>,
}

impl Conformance {
    fn new() -> Self {
        let state = state();
        Conformance {
            app: router(state.clone()),
            state,
            doc: openapi::document(),
            problems: Vec::new(),
            seen: BTreeSet::new(),
        }
    }

    async fn send(
        &mut self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Option<(&str, String)>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let sent = body.clone();
        let mut req = match body {
            Some((ct, b)) => req.header("content-type", ct).body(Body::from(b)),
            None => req.body(Body::empty()),
        }
        .unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                [192, 0, 2, 1],
                40000,
            ))));
        let res = self.app.clone().oneshot(req).await.unwrap();
        let (status, headers) = (res.status(), res.headers().clone());
        let ct = headers.get("content-type").map(|v| {
            v.to_str()
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .trim()
                .to_string()
        });
        // A live stream does not end: its head is what is checked.
        let bytes = if ct.as_deref() == Some("text/event-stream") {
            Default::default()
        } else {
            axum::body::to_bytes(res.into_body(), 1 << 22)
                .await
                .unwrap()
        };
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = uri.split('?').next().unwrap();
        let tag = format!("{method} {uri} -> {}", status.as_u16());
        let Some((template, op)) = operation(&self.doc, method, path) else {
            self.problems.push(format!("{tag}: no such operation"));
            return Answer {
                status,
                headers,
                json,
            };
        };
        let code = status.as_u16().to_string();
        // A body the server took is one the document describes, field for field (its
        // schema refuses nothing the server accepts); no body where it says one is needed.
        let request = &op["requestBody"];
        match &sent {
            _ if !status.is_success() => {}
            None if request["required"] == true => self
                .problems
                .push(format!("{tag}: answered without the required body")),
            Some((ct, b)) if !(b.is_empty() || b == "{}" && request.is_null()) => {
                match request["content"].get(*ct) {
                    None => self
                        .problems
                        .push(format!("{tag}: a {ct} body is not documented")),
                    Some(media) => {
                        let v: Value = serde_json::from_str(b).unwrap();
                        let mut errs = Vec::new();
                        schema_errors(&self.doc, &media["schema"], &v, "request", &mut errs);
                        undeclared(&self.doc, &media["schema"], &v, "request", &mut errs);
                        for e in errs {
                            self.problems.push(format!("{tag}: request body: {e}"));
                        }
                    }
                }
            }
            _ => {}
        }
        self.seen
            .insert((method.to_lowercase(), template.clone(), code.clone()));
        // `default` stands for what any route may answer, nothing a route answers itself.
        let any_route = ["405", "413", "500", "503"].contains(&code.as_str());
        let fallback = op["responses"].get("default").filter(|_| any_route);
        let Some(doc_res) = op["responses"].get(&code).or(fallback) else {
            let documented: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
            self.problems.push(format!(
                "{tag}: undocumented status (documented: {documented:?}) {json}"
            ));
            return Answer {
                status,
                headers,
                json,
            };
        };
        for h in ["retry-after", "x-waitroom-redirect"] {
            let declared = doc_res["headers"]
                .as_object()
                .is_some_and(|d| d.keys().any(|k| k.eq_ignore_ascii_case(h)));
            if headers.contains_key(h) && !declared {
                self.problems
                    .push(format!("{tag}: header {h} not declared"));
            }
        }
        let content = doc_res["content"].as_object();
        match (ct, content) {
            (None, _) if bytes.is_empty() => {}
            (Some(ct), Some(content)) => match content.get(&ct) {
                None => self.problems.push(format!(
                    "{tag}: content type {ct} not among {:?}",
                    content.keys().collect::<Vec<_>>()
                )),
                Some(media) if ct == "application/json" => {
                    let mut errs = Vec::new();
                    schema_errors(&self.doc, &media["schema"], &json, "body", &mut errs);
                    let mut extra = Vec::new();
                    undeclared(&self.doc, &media["schema"], &json, "body", &mut extra);
                    if !extra.is_empty() {
                        errs.push(format!("fields the schema does not declare: {extra:?}"));
                    }
                    if let Some(c) = json["error"]["code"].as_str() {
                        let d = doc_res["description"].as_str().unwrap_or("");
                        if !d.contains(c) {
                            errs.push(format!("code {c} not named in {d:?}"));
                        }
                    }
                    for e in errs {
                        self.problems.push(format!("{tag}: {e}\n      {json}"));
                    }
                }
                Some(_) => {}
            },
            (ct, _) => self.problems.push(format!(
                "{tag}: a body ({ct:?}) where the document has none"
            )),
        }
        Answer {
            status,
            headers,
            json,
        }
    }

    /// Two refusals every conformance walk needs: a join to a full `reject` event
    /// (`EVENT_FULL`, answered), and each place route on a place whose event was deleted
    /// (`EVENT_NOT_FOUND`).
    async fn full_and_deleted_events(&mut self, admin: Option<&str>) -> Answer {
        let config = json!({"max_active": 1, "queueing_method": "reject"});
        self.json("PUT", "/api/v1/admin/events/rj", admin, config)
            .await;
        let join = json!({"event_id": "rj"});
        self.json("POST", "/api/v1/queue/join", None, join.clone())
            .await;
        let full = self.json("POST", "/api/v1/queue/join", None, join).await;
        assert_eq!(full.json["error"]["code"], "EVENT_FULL");
        let config = json!({"max_active": 1});
        self.json("PUT", "/api/v1/admin/events/dl", admin, config)
            .await;
        let join = json!({"event_id": "dl"});
        self.json("POST", "/api/v1/queue/join", None, join.clone())
            .await;
        let waiting = self.json("POST", "/api/v1/queue/join", None, join).await;
        let gone = waiting.json["waiting_token"].as_str().unwrap().to_string();
        self.get("DELETE", "/api/v1/admin/events/dl", admin).await;
        for (m, uri) in [
            ("POST", "/api/v1/queue/enter"),
            ("POST", "/api/v1/queue/heartbeat"),
            ("GET", "/api/v1/queue/status"),
            ("GET", "/api/v1/queue/events"),
        ] {
            let a = self.get(m, &format!("{uri}?token={gone}"), None).await;
            assert_eq!(a.json["error"]["code"], "EVENT_NOT_FOUND", "{m} {uri}");
        }
        full
    }

    async fn json(&mut self, method: &str, uri: &str, auth: Option<&str>, body: Value) -> Answer {
        let h = auth.map(|a| format!("Bearer {a}"));
        let headers: Vec<(&str, &str)> = h.iter().map(|h| ("authorization", h.as_str())).collect();
        self.send(
            method,
            uri,
            &headers,
            Some(("application/json", body.to_string())),
        )
        .await
    }

    async fn get(&mut self, method: &str, uri: &str, auth: Option<&str>) -> Answer {
        let h = auth.map(|a| format!("Bearer {a}"));
        let headers: Vec<(&str, &str)> = h.iter().map(|h| ("authorization", h.as_str())).collect();
        self.send(method, uri, &headers, None).await
    }

    fn assert_clean(&self) {
        assert!(
            self.problems.is_empty(),
            "answers the OpenAPI document does not describe:\n  {}",
            self.problems.join("\n  ")
        );
    }
}

/// Every array in the document says what its items are: a generator drops a model with an
/// array of unknown items, and every operation that answers it (openapi-python-client).
#[test]
fn every_array_schema_has_items() {
    fn walk(v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                let array = match m.get("type") {
                    Some(Value::String(t)) => t == "array",
                    Some(Value::Array(ts)) => ts.contains(&json!("array")),
                    _ => false,
                };
                if array && !m.contains_key("items") {
                    out.push(at.to_string());
                }
                for (k, x) in m {
                    walk(x, &format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&openapi::document(), "#", &mut out);
    assert!(out.is_empty(), "arrays without items: {out:?}");
}

/// The admin reads answer the settings field for field as the schemas say, the fields an
/// event has only once set (`closes_at`, `ended`, `announcement`) and the lists included;
/// every settings field has a type.
#[tokio::test]
async fn admin_settings_answers_are_described_field_for_field() {
    let mut c = Conformance::new();
    let admin = Some("admin");
    let ev = "/api/v1/admin/events/ev";
    let a = c
        .json(
            "PUT",
            ev,
            admin,
            json!({"name": "Ev", "closes_at": "2031-01-01T00:00:00Z",
            "paths": ["/checkout"], "hosts": ["shop.example"], "bypass_paths": ["/checkout/s/"],
            "bypass_cidrs": ["10.0.0.0/8"], "title": {"en": "Ev"}, "admit_per_minute": 60,
            "rate_limits": {"joins_per_minute": 1000}, "opens_at": "2030-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json);
    assert_eq!(a.json["closes_at"], "2031-01-01T00:00:00Z");
    assert_eq!(a.headers["cache-control"], "no-store");
    // (These two answers are checked in `every_answer_of_every_state_is_documented`.)
    let message = json!({"message": {"en": "hi"}});
    let url = format!("{ev}/announcement");
    send(&c.app, "POST", &url, admin, Some(message)).await;
    for uri in ["/api/v1/admin/events", ev, "/api/v1/admin/defaults"] {
        assert_eq!(c.get("GET", uri, admin).await.status, StatusCode::OK);
    }
    let end = Some(json!({"reason": "closed"}));
    send(&c.app, "POST", &format!("{ev}/end"), admin, end).await;
    let a = c.get("GET", ev, admin).await;
    assert_eq!(a.json["ended"]["message"], Value::Null, "{}", a.json);
    c.get("POST", &format!("{ev}/pause"), admin).await;
    c.get("POST", &format!("{ev}/resume"), admin).await;
    c.assert_clean();
    let props = &c.doc["components"]["schemas"]["Settings"]["properties"];
    for f in [
        "closes_at",
        "ended",
        "announcement",
        "paths",
        "opens_at",
        "rate_limits",
    ] {
        assert!(props.get(f).is_some(), "{f} missing: {props}");
    }
    for (k, p) in props.as_object().unwrap() {
        assert!(
            p.get("type").is_some() || p.get("$ref").is_some(),
            "{k} has no type: {p}"
        );
    }
}

/// The waiting room a gated URL redirects to never answers 200: admitted is a 303 to the
/// return path, waiting a 503 (the page, or the place as JSON), a refusal its error (JSON,
/// or a page for a browser). Each is documented as the server answers it.
#[tokio::test]
async fn the_gated_waiting_room_answers_are_documented() {
    let mut c = Conformance::new();
    let admin = Some("admin");
    c.json(
        "PUT",
        "/api/v1/admin/events/gq",
        admin,
        json!({"max_active": 1}),
    )
    .await;
    let q = "/wait/gq/queue?return=/checkout";
    let a = c.get("GET", q, None).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.headers["location"], "/checkout");
    let html = [("accept", "text/html")];
    let a = c.send("GET", q, &html, None).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(a.headers.contains_key("retry-after"));
    let a = c
        .send("GET", q, &[("accept", "application/json")], None)
        .await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("waiting"))
    );
    let cross = [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-dest", "image"),
    ];
    assert_eq!(
        c.send("GET", q, &cross, None).await.status,
        StatusCode::BAD_REQUEST
    );
    // The hand-over's refusal: the JSON error, or a browser's page (which the document
    // left out).
    let form = || {
        Some((
            "application/x-www-form-urlencoded",
            "waiting_token=x".to_string(),
        ))
    };
    for headers in [&[][..], &html[..]] {
        let a = c.send("POST", q, headers, form()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
    }
    // (The end's answer is checked in `every_answer_of_every_state_is_documented`.)
    let end = Some(json!({"reason": "sold_out"}));
    send(&c.app, "POST", "/api/v1/admin/events/gq/end", admin, end).await;
    let a = c.get("GET", q, None).await;
    assert_eq!(
        (a.status, &a.json["error"]["reason"]),
        (StatusCode::CONFLICT, &json!("sold_out"))
    );
    assert_eq!(
        c.send("GET", q, &html, None).await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        c.get("GET", "/wait/nope/queue", None).await.status,
        StatusCode::NOT_FOUND
    );
    c.send("GET", "/wait/nope/queue", &html, None).await;
    c.assert_clean();
    let documented = &c.doc["paths"]["/wait/{event_id}/queue"]["get"]["responses"];
    assert!(documented.get("200").is_none(), "{documented}");
}

/// The pages' revalidations (`304`), the files' types and a browser's `404` page are
/// documented (defect: none of it was; a `304` fell to `default`, an error body).
#[tokio::test]
async fn page_revalidations_and_html_refusals_are_documented() {
    let mut c = Conformance::new();
    c.json(
        "PUT",
        "/api/v1/admin/events/pg",
        Some("admin"),
        json!({"max_active": 1}),
    )
    .await;
    c.json(
        "PUT",
        "/api/v1/admin/events/pg2",
        Some("admin"),
        json!({"max_active": 1}),
    )
    .await;
    let html = [("accept", "text/html")];
    for page in [
        "/",
        "/admin",
        "/demo/booking",
        "/wait/pg",
        "/assets/style.css",
        "/assets/icon.svg",
    ] {
        let first = c.send("GET", page, &html, None).await;
        assert_eq!(first.status, StatusCode::OK, "{page}");
        let tag = first.headers["etag"].to_str().unwrap().to_string();
        let again = c
            .send("GET", page, &[("if-none-match", tag.as_str())], None)
            .await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{page}");
    }
    let scripts = c.doc["paths"]["/assets/{file}"]["get"]["responses"]["200"]["content"].clone();
    assert!(scripts.get("text/javascript").is_some(), "{scripts}");
    assert_eq!(
        c.send("GET", "/wait/nope", &html, None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        c.get("GET", "/wait/nope", None).await.status,
        StatusCode::NOT_FOUND
    );
    let params = c.doc["paths"]["/wait/{event_id}"]["get"]["parameters"].to_string();
    for p in ["lang", "invite", "user_token"] {
        assert!(params.contains(&format!("\"name\":\"{p}\"")), "{params}");
    }
    c.assert_clean();
}

/// A route that needs a token answers `400 MISSING_TOKEN` without one, documented; the
/// live routes take the waiting token as `Authorization: Bearer` too, so `token` is not a
/// required parameter.
#[tokio::test]
async fn a_missing_token_is_a_documented_400() {
    let mut c = Conformance::new();
    for (m, uri) in [
        ("POST", "/api/v1/session/heartbeat"),
        ("POST", "/api/v1/session/complete"),
        ("POST", "/api/v1/session/extend"),
        ("GET", "/api/v1/session/holds"),
        ("DELETE", "/api/v1/session/holds"),
        ("POST", "/api/v1/queue/verify"),
        ("GET", "/api/v1/queue/ws"),
        ("GET", "/api/v1/queue/events"),
        ("GET", "/api/v1/queue/status"),
        ("POST", "/api/v1/queue/enter"),
    ] {
        let a = c.get(m, uri, None).await;
        assert_eq!(a.json["error"]["code"], "MISSING_TOKEN", "{m} {uri}");
    }
    let a = c
        .json(
            "POST",
            "/api/v1/session/holds",
            None,
            json!({"items": ["A-1"]}),
        )
        .await;
    assert_eq!(a.json["error"]["code"], "MISSING_TOKEN");
    // The waiting token as a bearer opens the live stream.
    c.json("PUT", "/api/v1/admin/events/ev", Some("admin"), json!({}))
        .await;
    let joined = c
        .json(
            "POST",
            "/api/v1/queue/join",
            None,
            json!({"event_id": "ev"}),
        )
        .await;
    let token = joined.json["waiting_token"].as_str().unwrap().to_string();
    let a = c.get("GET", "/api/v1/queue/events", Some(&token)).await;
    assert_eq!(a.status, StatusCode::OK);
    c.assert_clean();
    for path in ["/api/v1/queue/ws", "/api/v1/queue/events"] {
        let params = &c.doc["paths"][path]["get"]["parameters"];
        assert!(
            params
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["required"] != true),
            "{path}: {params}"
        );
    }
}

/// Wrong admin tokens are limited per client (`429 RATE_LIMITED` with `Retry-After`), on
/// every admin route: each documents it.
#[tokio::test]
async fn the_admin_failure_limit_is_documented_on_every_admin_route() {
    let mut c = Conformance::new();
    let mut limited = false;
    for _ in 0..30 {
        let a = c.get("GET", "/api/v1/admin/stats", Some("wrong")).await;
        if a.status == StatusCode::TOO_MANY_REQUESTS {
            assert!(a.headers.contains_key("retry-after"));
            limited = true;
            break;
        }
    }
    assert!(limited, "no 429 after 30 wrong admin tokens");
    c.get("DELETE", "/api/v1/admin/events/ev", Some("wrong"))
        .await;
    c.assert_clean();
    for (path, item) in c.doc["paths"].as_object().unwrap() {
        if path.starts_with("/api/v1/admin/") {
            for (method, op) in item.as_object().unwrap() {
                let r = &op["responses"]["429"];
                assert!(
                    r["description"]
                        .as_str()
                        .is_some_and(|d| d.contains("RATE_LIMITED"))
                        && r["headers"].get("Retry-After").is_some(),
                    "{method} {path}: {r}"
                );
            }
        }
    }
}

/// `?format=csv` answers CSV, which the document lists beside the JSON; `format` takes
/// `json` or `csv` only.
#[tokio::test]
async fn csv_answers_are_documented() {
    let mut c = Conformance::new();
    let admin = Some("admin");
    let ev = "/api/v1/admin/events/ev";
    c.json("PUT", ev, admin, json!({})).await;
    for q in [
        "history?format=csv",
        "history?format=json",
        "history.csv",
        "history.csv?step=1",
    ] {
        c.get("GET", &format!("{ev}/{q}"), admin).await;
    }
    let a = c
        .get("GET", &format!("{ev}/history?format=csv"), admin)
        .await;
    assert!(a.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    assert_eq!(
        c.get("GET", &format!("{ev}/history?format=xml"), admin)
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    // Empty, the parameter is its default (JSON), as `?since=&step=` are.
    assert_eq!(
        c.get("GET", &format!("{ev}/history?format="), admin)
            .await
            .status,
        StatusCode::OK
    );
    c.json(
        "POST",
        &format!("{ev}/invites?format=csv"),
        admin,
        json!({"count": 1}),
    )
    .await;
    c.assert_clean();
    for q in ["invites", "invites?format=csv", "invites?limit=0"] {
        c.get("GET", &format!("{ev}/{q}"), admin).await;
    }
    c.assert_clean();
    for (path, method) in [("history", "get"), ("invites", "post"), ("invites", "get")] {
        let params = &c.doc["paths"][format!("/api/v1/admin/events/{{event_id}}/{path}")][method]
            ["parameters"];
        let format = params
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "format")
            .unwrap();
        assert_eq!(format["schema"]["enum"], json!(["json", "csv"]), "{path}");
    }
}

/// Refusals name their codes in their status's description, carry declared headers
/// (`Retry-After`, `X-Waitroom-Redirect`), and what any route may answer (405, 413) is the
/// `default` response.
#[tokio::test]
async fn refusals_name_their_codes_and_headers() {
    let mut c = Conformance::new();
    let admin = Some("admin");
    let full = c.full_and_deleted_events(admin).await;
    assert!(full.headers.contains_key("retry-after"));
    // An ended sale: `reason`; proof of work: the challenge.
    c.json("PUT", "/api/v1/admin/events/end", admin, json!({}))
        .await;
    // (The end's answer is checked in `every_answer_of_every_state_is_documented`.)
    let end = Some(json!({"reason": "cancelled"}));
    send(&c.app, "POST", "/api/v1/admin/events/end/end", admin, end).await;
    let a = c
        .json(
            "POST",
            "/api/v1/queue/join",
            None,
            json!({"event_id": "end"}),
        )
        .await;
    assert_eq!(a.json["error"]["reason"], "cancelled");
    c.json(
        "PUT",
        "/api/v1/admin/events/pw",
        admin,
        json!({"pow_difficulty": 4}),
    )
    .await;
    let a = c
        .json(
            "POST",
            "/api/v1/queue/join",
            None,
            json!({"event_id": "pw"}),
        )
        .await;
    assert!(a.json["error"]["challenge"].is_object(), "{}", a.json);
    // The gate sends the visitor to the waiting room.
    c.json(
        "PUT",
        "/api/v1/admin/events/gt",
        admin,
        json!({"paths": ["/checkout"]}),
    )
    .await;
    // (The table of gate rules a server reads at its start.)
    let s = c.state.clone();
    assert!(s.gates.refresh(s.store.as_ref(), s.clock.now()).await);
    let a = c
        .send(
            "GET",
            "/api/v1/gate",
            &[("x-original-uri", "/checkout/pay")],
            None,
        )
        .await;
    assert!(a.headers.contains_key("x-waitroom-redirect"), "{}", a.json);
    // Any route: 405, 413.
    assert_eq!(
        c.get("PATCH", "/api/v1/queue/join", None).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    let big = json!({"event_id": "x".repeat(1 << 21)});
    let a = c.json("POST", "/api/v1/queue/join", None, big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    c.assert_clean();
    let gate = &c.doc["paths"]["/api/v1/gate"]["get"]["parameters"];
    let uri = gate
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "X-Original-URI");
    assert_eq!(
        uri.map(|p| (&p["in"], &p["required"])),
        Some((&json!("header"), &json!(true))),
        "{gate}"
    );
}

/// A malformed event id (API.md: 1–64 of `[A-Za-z0-9._-]`, not only dots) is refused
/// with `400 INVALID_REQUEST` by every route that names one, and the document says so: in
/// the parameter's schema and in a documented 400.
#[tokio::test]
async fn a_malformed_event_id_is_a_documented_400_on_every_route() {
    let mut c = Conformance::new();
    let doc = c.doc.clone();
    let mut refused = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.contains("{event_id}") {
            continue;
        }
        for (method, op) in item.as_object().unwrap() {
            let param = op["parameters"]
                .as_array()
                .and_then(|ps| {
                    ps.iter()
                        .find(|p| p["name"] == "event_id" && p["in"] == "path")
                })
                .unwrap_or_else(|| panic!("{method} {path}: no event_id parameter"));
            let s = &param["schema"];
            assert_eq!(
                (&s["minLength"], &s["maxLength"]),
                (&json!(1), &json!(64)),
                "{method} {path}"
            );
            assert!(s["pattern"].is_string(), "{method} {path}: {s}");
            for bad in ["%C3%84", "..", &"e".repeat(65)] {
                let uri = path.replace("{event_id}", bad);
                let body = Some(("application/json", "{}".to_string()));
                let auth = [("authorization", "Bearer admin")];
                let a = c.send(&method.to_uppercase(), &uri, &auth, body).await;
                assert_eq!(
                    a.status,
                    StatusCode::BAD_REQUEST,
                    "{method} {uri}: {}",
                    a.json
                );
                refused += 1;
            }
        }
    }
    assert!(refused > 40, "{refused}");
    c.assert_clean();
}

/// The parameters whose rules the handlers check answer `400` when broken, documented.
#[tokio::test]
async fn broken_parameters_are_documented_400s() {
    let mut c = Conformance::new();
    let admin = Some("admin");
    let ev = "/api/v1/admin/events/ev";
    c.json("PUT", ev, admin, json!({})).await;
    for (m, uri, body) in [
        ("GET", "/api/v1/queue/info".to_string(), None),
        ("GET", format!("{ev}/queue?limit=0"), None),
        ("GET", format!("{ev}/prequeue?limit=0"), None),
        ("GET", format!("{ev}/history.csv?step=1"), None),
        ("GET", format!("{ev}/history.csv?x=1"), None),
        ("GET", "/api/v1/admin/audit?limit=0".to_string(), None),
        ("POST", format!("{ev}/pause"), Some(json!({"x": 1}))),
        ("POST", format!("{ev}/resume"), Some(json!([]))),
        ("POST", format!("{ev}/clear"), Some(json!({"x": 1}))),
    ] {
        let a = match body {
            Some(b) => c.json(m, &uri, admin, b).await,
            None => c.get(m, &uri, admin).await,
        };
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{m} {uri}: {}", a.json);
    }
    c.assert_clean();
}

/// Walks an event through its states and every route through its answers; each answer must
/// be what the document says.
#[tokio::test]
async fn every_answer_of_every_state_is_documented() {
    let mut c = Conformance::new();
    let admin = Some("admin");
    let ev = "/api/v1/admin/events/ev";
    // Settings with every kind of field set, `closes_at` among them.
    let a = c
        .json(
            "PUT",
            ev,
            admin,
            json!({"name": "Ev", "max_active": 1, "max_extensions": 1,
            "closes_at": "2031-01-01T00:00:00Z", "paths": ["/checkout"],
            "bypass_cidrs": ["10.0.0.0/8"], "title": {"en": "Ev"}, "admit_per_minute": 60,
            "rate_limits": {"joins_per_minute": 1000}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json);
    for uri in [
        "/api/v1/admin/events",
        ev,
        "/api/v1/admin/defaults",
        "/api/v1/admin/stats",
    ] {
        assert_eq!(c.get("GET", uri, admin).await.status, StatusCode::OK);
    }
    let a = c
        .json(
            "POST",
            &format!("{ev}/announcement"),
            admin,
            json!({"message": {"en": "hi"}}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json);
    c.get("GET", ev, admin).await;
    c.get("GET", "/api/v1/queue/info?event_id=ev", None).await;
    c.get("GET", "/api/v1/events", None).await;
    c.get("GET", "/api/v1/events/ev", None).await;

    // Two places: the first admitted at once, the second waiting.
    let first = c
        .json(
            "POST",
            "/api/v1/queue/join",
            None,
            json!({"event_id": "ev", "user_id": "ann"}),
        )
        .await;
    let second = c
        .json(
            "POST",
            "/api/v1/queue/join",
            None,
            json!({"event_id": "ev"}),
        )
        .await;
    let (t1, t2) = (
        first.json["waiting_token"].as_str().unwrap().to_string(),
        second.json["waiting_token"].as_str().unwrap().to_string(),
    );
    c.get("GET", &format!("/api/v1/queue/status?token={t2}"), None)
        .await;
    c.json(
        "POST",
        "/api/v1/queue/heartbeat",
        None,
        json!({"token": t2}),
    )
    .await;
    let a = c
        .json("POST", "/api/v1/queue/enter", None, json!({"token": t2}))
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    c.get("GET", "/api/v1/queue/events", Some(&t2)).await;
    let a = c
        .json(
            "POST",
            "/api/v1/queue/enter",
            None,
            json!({"waiting_token": t1}),
        )
        .await;
    let access = a.json["access_token"].as_str().unwrap().to_string();
    let token = Some(access.as_str());

    // The sale: inventory, holds, extension, verification, completion.
    c.json(
        "PUT",
        &format!("{ev}/inventory"),
        admin,
        json!({"items": ["A-1", "A-2"]}),
    )
    .await;
    c.get("GET", &format!("{ev}/inventory"), admin).await;
    c.get("POST", "/api/v1/session/heartbeat", token).await;
    c.get("GET", "/api/v1/session/holds", token).await;
    c.json(
        "POST",
        "/api/v1/session/holds",
        token,
        json!({"items": ["A-1", "A-2"]}),
    )
    .await;
    c.get("GET", &format!("{ev}/inventory"), admin).await;
    c.json(
        "DELETE",
        "/api/v1/session/holds",
        token,
        json!({"items": ["A-2"]}),
    )
    .await;
    c.get("DELETE", "/api/v1/session/holds", token).await;
    let a = c.get("POST", "/api/v1/session/extend", token).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json);
    let access = a.json["access_token"].as_str().unwrap().to_string();
    let token = Some(access.as_str());
    c.get("POST", "/api/v1/session/extend", token).await; // EXTENSION_LIMIT
    c.get("POST", "/api/v1/queue/verify?event_id=ev", token)
        .await;
    c.json(
        "POST",
        "/demo/booking/order?event=ev",
        token,
        json!({"area": "balcony"}),
    )
    .await;
    c.get("GET", "/api/v1/gate?event_id=ev", token).await; // no X-Original-URI
    let s = c.state.clone();
    assert!(s.gates.refresh(s.store.as_ref(), s.clock.now()).await);
    let bearer = format!("Bearer {access}");
    let pay = [
        ("x-original-uri", "/checkout/pay"),
        ("authorization", &bearer),
    ];
    assert_eq!(
        c.send("GET", "/api/v1/gate", &pay, None).await.status,
        StatusCode::NO_CONTENT
    );
    let a = c
        .send(
            "GET",
            "/api/v1/gate",
            &[("x-original-uri", "/checkout/pay")],
            None,
        )
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    c.get("POST", "/api/v1/session/complete", token).await;

    // The admin's reads and changes.
    for q in [
        "queue",
        "queue?limit=5",
        "prequeue",
        "history",
        "history?format=csv",
        "history.csv",
        "invites",
        "invites?format=csv&limit=1",
    ] {
        let a = c.get("GET", &format!("{ev}/{q}"), admin).await;
        assert_eq!(a.status, StatusCode::OK, "{q}: {}", a.json);
    }
    c.get("GET", "/api/v1/admin/audit", admin).await;
    c.json("POST", &format!("{ev}/invites"), admin, json!({"count": 2}))
        .await;
    c.json(
        "POST",
        &format!("{ev}/invites?format=csv"),
        admin,
        json!({"count": 2}),
    )
    .await;
    c.json("POST", &format!("{ev}/invites"), admin, json!({"count": 0}))
        .await;
    c.json("POST", &format!("{ev}/pause"), admin, json!({}))
        .await;
    c.get("POST", &format!("{ev}/resume"), admin).await;
    c.json("POST", &format!("{ev}/pause"), admin, json!({"x": 1}))
        .await;
    c.get("GET", &format!("{ev}/queue?limit=0"), admin).await;
    c.get("GET", "/api/v1/queue/info", None).await;
    c.get("DELETE", &format!("{ev}/announcement"), admin).await;
    let leave = format!("{{\"token\":\"{t2}\"}}");
    c.send(
        "POST",
        "/api/v1/queue/leave",
        &[],
        Some(("text/plain", leave)),
    )
    .await;
    c.get("DELETE", &format!("/api/v1/queue/leave?token={t2}"), None)
        .await;
    c.get("POST", &format!("{ev}/clear"), admin).await;

    // Tokens missing where one is needed.
    for (m, uri) in [
        ("POST", "/api/v1/session/heartbeat"),
        ("POST", "/api/v1/session/complete"),
        ("POST", "/api/v1/session/extend"),
        ("GET", "/api/v1/session/holds"),
        ("DELETE", "/api/v1/session/holds"),
        ("GET", "/api/v1/queue/ws"),
        ("GET", "/api/v1/queue/events"),
        ("GET", "/api/v1/queue/status"),
    ] {
        let a = c.get(m, uri, None).await;
        assert_eq!(a.json["error"]["code"], "MISSING_TOKEN", "{m} {uri}");
    }

    // The waiting room of a gated URL: admitted (303), waiting (503, a page or the place),
    // refused (another site's image: 400; after the end: 409).
    c.json(
        "PUT",
        "/api/v1/admin/events/gq",
        admin,
        json!({"max_active": 1}),
    )
    .await;
    let q = "/wait/gq/queue?return=/checkout";
    assert_eq!(c.get("GET", q, None).await.status, StatusCode::SEE_OTHER);
    let html = [("accept", "text/html")];
    assert_eq!(
        c.send("GET", q, &html, None).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let a = c
        .send("GET", q, &[("accept", "application/json")], None)
        .await;
    assert_eq!(
        (a.status, &a.json["status"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("waiting"))
    );
    let cross = [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-dest", "image"),
    ];
    assert_eq!(
        c.send("GET", q, &cross, None).await.status,
        StatusCode::BAD_REQUEST
    );
    c.json(
        "POST",
        "/api/v1/admin/events/gq/end",
        admin,
        json!({"reason": "sold_out"}),
    )
    .await;
    assert_eq!(c.get("GET", q, None).await.status, StatusCode::CONFLICT);
    assert_eq!(
        c.send("GET", q, &html, None).await.status,
        StatusCode::CONFLICT
    );
    c.get("GET", "/api/v1/admin/events/gq", admin).await;
    c.get("GET", "/api/v1/events/gq", None).await;
    c.json(
        "POST",
        "/api/v1/queue/join",
        None,
        json!({"event_id": "gq"}),
    )
    .await;
    c.get("GET", "/wait/gq", None).await;
    c.get("GET", "/wait/gq/theme.css", None).await;
    c.get("GET", "/wait/nope/queue", None).await;
    c.send("GET", "/wait/nope/queue", &html, None).await;

    c.full_and_deleted_events(admin).await;

    // Operations, and what every route may answer (405).
    for uri in [
        "/.well-known/jwks.json",
        "/healthz",
        "/readyz",
        "/api/v1/openapi.json",
        "/metrics",
    ] {
        c.get("GET", uri, None).await;
    }
    assert_eq!(
        c.get("PATCH", "/api/v1/queue/join", None).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );

    c.assert_clean();
    // Every JSON success the document describes was answered and checked.
    let mut unvisited = Vec::new();
    for (path, item) in c.doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, r) in op["responses"].as_object().unwrap() {
                let json = r["content"].get("application/json").is_some();
                let seen = c
                    .seen
                    .contains(&(method.clone(), path.clone(), status.clone()));
                if status.starts_with('2') && json && !seen {
                    unvisited.push(format!("{method} {path} {status}"));
                }
            }
        }
    }
    assert!(
        unvisited.is_empty(),
        "successes never checked against a real answer: {unvisited:?}"
    );
}

/// Every body has a model: no answer or request body is a bare `object` (a generated
/// client gets nothing to read), a body that may be left out is not `required` and does
/// not offer a JSON `null` (refused), and the bodies' rules are the handlers' own.
#[test]
fn bodies_are_typed_and_optional_where_the_server_takes_none() {
    let doc = openapi::document();
    let bare = |s: &Value| {
        let s = resolve(&doc, s);
        let object = s["type"] == "object"
            || s["type"]
                .as_array()
                .is_some_and(|t| t.contains(&json!("object")));
        object
            && s.get("properties").is_none()
            && s.get("allOf").is_none()
            && s.get("additionalProperties").is_none()
    };
    let mut untyped = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let bodies = op["responses"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(status, r)| (status.as_str(), r))
                .chain([("request", &op["requestBody"])]);
            for (what, r) in bodies {
                for media in r["content"]
                    .as_object()
                    .into_iter()
                    .flat_map(|c| c.values())
                {
                    let s = &media["schema"];
                    if bare(s) || s.get("items").is_some_and(&bare) {
                        untyped.push(format!("{method} {path} {what}"));
                    }
                    if what == "request" && s["oneOf"].to_string().contains("\"null\"") {
                        untyped.push(format!("{method} {path}: a null body offered"));
                    }
                }
            }
        }
    }
    assert!(untyped.is_empty(), "bodies without a model: {untyped:?}");
    for (path, method) in [
        ("/api/v1/queue/enter", "post"),
        ("/api/v1/queue/heartbeat", "post"),
        ("/api/v1/queue/leave", "post"),
        ("/api/v1/session/holds", "delete"),
        ("/api/v1/admin/events/{event_id}", "put"),
    ] {
        let body = &doc["paths"][path][method]["requestBody"];
        assert_eq!(body["required"], false, "{method} {path}: {body}");
    }
    let leave = &doc["paths"]["/api/v1/queue/leave"]["post"]["requestBody"]["content"];
    assert!(
        leave.get("text/plain").is_some(),
        "sendBeacon's body: {leave}"
    );
    let schemas = &doc["components"]["schemas"];
    let count = &schemas["InvitesBody"]["properties"]["count"];
    assert_eq!(
        (&count["minimum"], &count["maximum"]),
        (&json!(1), &json!(10_000))
    );
    let pow = resolve(&doc, &schemas["PowSolution"]);
    assert_eq!(pow["required"], json!(["prefix", "nonce"]), "{pow}");
    assert!(schemas["JoinBody"]["properties"]["pow"]
        .to_string()
        .contains("PowSolution"));
}
