//! What the pages' routes answer beyond what their `utoipa` attributes say (kept apart from
//! `openapi.rs`, which is at the size this codebase keeps a file under): the `304` of a
//! revalidation, the types of the files served, the HTML `404` a browser gets, and the
//! query parameters the waiting page reads.

use serde_json::{json, Value};

/// The routes that answer `304 Not Modified` to an `If-None-Match` naming their `ETag`
/// (API.md "Pages").
const REVALIDATED: [&str; 6] = [
    "/",
    "/admin",
    "/demo/booking",
    "/assets/{file}",
    "/branding/{file}",
    "/wait/{event_id}",
];

/// Adds the pages' answers to `doc`.
pub(super) fn pages(doc: &mut Value) {
    let paths = &mut doc["paths"];
    for path in REVALIDATED {
        let get = &mut paths[path]["get"];
        get["responses"]["304"] = json!({
            "description": "Not Modified: the `If-None-Match` named the current `ETag` (no body)",
        });
        get["responses"]["200"]["headers"]["ETag"] = json!({
            "description": "The answer's entity tag, for `If-None-Match`",
            "schema": {"type": "string"},
        });
    }
    let text = json!({"schema": {"type": "string"}});
    let binary =
        json!({"schema": {"type": "string", "contentMediaType": "application/octet-stream"}});
    paths["/assets/{file}"]["get"]["responses"]["200"]["content"] = json!({
        "text/css": text,
        "text/javascript": text,
        "image/svg+xml": text,
    });
    let mut branding = serde_json::Map::new();
    branding.insert("text/css".into(), text.clone());
    for t in ["png", "jpeg", "gif", "webp"] {
        branding.insert(format!("image/{t}"), binary.clone());
    }
    branding.insert("image/svg+xml".into(), text.clone());
    paths["/branding/{file}"]["get"]["responses"]["200"]["content"] = Value::Object(branding);
    // A browser (`Accept` naming `text/html`) gets a page saying the event is unknown.
    paths["/wait/{event_id}"]["get"]["responses"]["404"]["content"]["text/html"] = text;
    let lang = json!({"name": "lang", "in": "query", "required": false,
        "description": "The page's language, `ko` or `en` (else `Accept-Language`'s)",
        "schema": {"type": "string", "enum": ["ko", "en"]}});
    let wait = &mut paths["/wait/{event_id}"]["get"]["parameters"];
    push(wait, lang.clone());
    push(
        wait,
        json!({"name": "invite", "in": "query", "required": false,
        "description": "An invite code, passed on to `join` (invite-only events)",
        "schema": {"type": "string"}}),
    );
    push(
        wait,
        json!({"name": "user_token", "in": "query", "required": false,
        "description": "A user token, passed on to `join` (see Identity)",
        "schema": {"type": "string"}}),
    );
    push(
        &mut paths["/wait/{event_id}/queue"]["get"]["parameters"],
        lang,
    );
}

fn push(list: &mut Value, param: Value) {
    match list.as_array_mut() {
        Some(a) => a.push(param),
        None => *list = json!([param]),
    }
}
