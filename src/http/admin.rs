//! The admin API (`/api/v1/admin`): create, inspect, pause, clear and delete events.
//!
//! Every route sits behind [`require_admin`], which runs before any extractor, so an
//! unauthenticated caller learns nothing (not even whether its body would have parsed).
//! Side effects of a change (waking the scheduler, forgetting a deleted event's gauges)
//! follow from the store's notices, on every node, not from these handlers. The one thing
//! a handler adds is the audit record of its change ([`records::audit`]): who asked is
//! known only here.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::body::{
    AdminEvent, Cleared, Deleted, EventSettings, InviteList, InviteRow, Invites, Prequeue,
    Settings, StatsRow,
};
use super::error::{AppError, AppResult};
use super::extract::{bearer, AppJson, AppPath, AppQuery, NoBody, OptionalJson};
use super::guard::Caller;
use super::records::{self, settings_object};
use crate::app::AppState;
use crate::audit::{self, Action};
use crate::core::{validate_event_id, EventConfig, EventPatch, HeadEntry, QueueError};
use crate::store::StoreError;
use crate::tokens;

/// Default and largest `limit` of `GET /events/{id}/queue`.
pub const DEFAULT_HEAD_LIMIT: usize = 10;
pub const MAX_HEAD_LIMIT: usize = 1000;

/// Compares in time independent of where the strings differ (or of their lengths, since
/// both sides are hashed to a fixed size first), so the admin token cannot be guessed
/// byte by byte from response times.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (ha, hb) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Whether `token` is the admin token (the site's server key); never with none configured.
pub fn is_admin_token(state: &AppState, token: &str) -> bool {
    !state.admin_token.is_empty() && constant_time_eq(token, &state.admin_token)
}

/// Middleware: `401 UNAUTHORIZED` unless `Authorization: Bearer <admin token>`.
/// A correct token is never limited; wrong ones are, per client (`429 RATE_LIMITED` once
/// a client has tried too many).
pub async fn require_admin(
    State(state): State<AppState>,
    caller: Caller,
    req: Request,
    next: Next,
) -> Result<Response, AppError> {
    // Admin answers hold people's ids, invite codes, the audit: no cache on the way may
    // keep them. The refusals say so too, as API.md says of every admin answer.
    let mut res = if bearer(req.headers()).is_some_and(|t| is_admin_token(&state, t)) {
        next.run(req).await
    } else {
        match caller.guard.check_admin_failure(caller.ip) {
            Ok(()) => AppError::Unauthorized.into_response(),
            Err(e) => e.into_response(),
        }
    };
    res.headers_mut()
        .insert(header::CACHE_CONTROL, super::NO_STORE.clone());
    Ok(res)
}

/// The checked event id of a path (for the admin handlers of other files).
pub(super) fn event_id_of(path: AppPath<String>) -> AppResult<String> {
    event_id(path)
}

fn event_id(AppPath(id): AppPath<String>) -> AppResult<String> {
    validate_event_id(&id)?;
    Ok(id)
}

/// The settings that are secrets, never shown: [`secrets_of`]'s order.
const SECRET_FIELDS: [&str; 2] = ["user_token_secret", "bypass_secret"];

/// An event's secrets, to tell a replaced one in the audit.
fn secrets_of(c: &crate::core::EventConfig) -> [Option<String>; 2] {
    [c.user_token_secret.clone(), c.gate.bypass_secret.clone()]
}

/// `PUT /events/{event_id}`: create or update. An empty body creates with the defaults.
pub async fn put_event(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    OptionalJson(patch): OptionalJson<EventPatch>,
) -> AppResult<Json<EventSettings>> {
    let id = event_id(path)?;
    let patch = patch.unwrap_or_default();
    let _one = records::one_change_at_a_time(&id).await;
    // The settings before, for the audit's old → new. Read just before the change: an
    // update by another admin in between would show as part of this one.
    let (before, old_secrets) = match state.store.get_event(&id, state.clock.now()).await {
        Ok(snap) => {
            let secrets = secrets_of(&snap.config);
            (Some(settings_object(snap.config)), secrets)
        }
        Err(StoreError::Queue(QueueError::EventNotFound)) => (None, [None, None]),
        Err(e) => return Err(e.into()),
    };
    let config = state
        .store
        .put_event(&id, &patch, state.clock.now())
        .await?;
    state.gates.apply(&id, Some(&config));
    // This node's next join reads the new settings, not a copy the change's notice has not
    // reached yet (an operator who turns `require_user_token` on and then joins to check
    // must see it refused).
    state.events.forget(&id);
    let action = if before.is_some() {
        Action::Update
    } else {
        Action::Create
    };
    let new_secrets = secrets_of(&config);
    let mut changes = audit::changes(before.as_ref(), &settings_object(config.clone()));
    // A secret replaced by another reads `*_set: true` on both sides, so the diff has
    // nothing: say it was replaced, never with either value.
    for ((field, old), new) in SECRET_FIELDS.iter().zip(old_secrets).zip(new_secrets) {
        if old.is_some() && new.is_some() && old != new {
            changes.push(audit::Change {
                field: (*field).into(),
                old: "(a secret)".into(),
                new: "(another secret)".into(),
            });
        }
    }
    records::audit(&state, &caller, action, &id, changes, None).await;
    Ok(Json(EventSettings {
        event_id: id,
        config: config.into(),
    }))
}

/// `GET /events`
pub async fn list_events(State(state): State<AppState>) -> AppResult<Response> {
    let events = state.store.list_events(state.clock.now()).await?;
    // About 1 KB of JSON an event, through serde's `flatten`: at 2,000 events a runtime
    // worker spent ~30 ms on it, and the requests behind it waited as long, each time an
    // open dashboard polled (`bench/metrics_scrape.py --path /api/v1/admin/events`).
    let body = tokio::task::spawn_blocking(move || {
        let rows: Vec<AdminEvent> = events.into_iter().map(AdminEvent::new).collect();
        serde_json::to_vec(&rows)
    })
    .await
    .map_err(|e| AppError::Internal(format!("writing the event list: {e}")))?
    .map_err(|e| AppError::Internal(format!("writing the event list: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `GET /events/{event_id}`
pub async fn get_event(
    State(state): State<AppState>,
    path: AppPath<String>,
) -> AppResult<Json<AdminEvent>> {
    let id = event_id(path)?;
    let snap = state.store.get_event(&id, state.clock.now()).await?;
    Ok(Json(AdminEvent::new(snap)))
}

/// `DELETE /events/{event_id}`
pub async fn delete_event(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    _: NoBody,
) -> AppResult<Json<Deleted>> {
    let id = event_id(path)?;
    let _one = records::one_change_at_a_time(&id).await;
    state.store.delete_event(&id).await?;
    state.gates.apply(&id, None);
    state.events.forget(&id);
    records::audit(&state, &caller, Action::Delete, &id, Vec::new(), None).await;
    Ok(Json(Deleted {
        deleted: true,
        event_id: id,
    }))
}

/// Pause or resume an existing event. An update, never a creation: pausing a typo must
/// not conjure a new sale, and a pause racing a deletion must not bring the event back.
async fn set_paused(
    state: &AppState,
    caller: &Caller,
    id: &str,
    paused: bool,
) -> AppResult<Json<EventSettings>> {
    let patch = EventPatch {
        paused: Some(paused),
        ..EventPatch::default()
    };
    let _one = records::one_change_at_a_time(id).await;
    let config = state
        .store
        .update_event(id, &patch, state.clock.now())
        .await?;
    // As after a `PUT`: this node's next join reads the change.
    state.events.forget(id);
    let action = if paused {
        Action::Pause
    } else {
        Action::Resume
    };
    records::audit(state, caller, action, id, Vec::new(), None).await;
    Ok(Json(EventSettings {
        event_id: id.to_string(),
        config: config.into(),
    }))
}

/// `POST /events/{event_id}/pause`: stop admissions; joins still queue.
pub async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    _: NoBody,
) -> AppResult<Json<EventSettings>> {
    set_paused(&state, &caller, &event_id(path)?, true).await
}

/// `POST /events/{event_id}/resume`
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    _: NoBody,
) -> AppResult<Json<EventSettings>> {
    set_paused(&state, &caller, &event_id(path)?, false).await
}

/// Most invite codes one call makes.
pub const MAX_INVITES_PER_CALL: u64 = 10_000;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InvitesBody {
    pub count: u64,
}

#[derive(Debug, Deserialize)]
pub struct InvitesQuery {
    pub format: Option<String>,
}

/// `POST /events/{event_id}/invites`: `count` fresh invite codes, stored (durably) before
/// they are answered; as JSON, or as a CSV download with `Accept: text/csv` or
/// `?format=csv`.
pub async fn create_invites(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    AppQuery(q): AppQuery<InvitesQuery>,
    headers: HeaderMap,
    AppJson(body): AppJson<InvitesBody>,
) -> AppResult<Response> {
    let id = event_id(path)?;
    let csv = wants_csv(q.format.as_deref(), &headers)?;
    if !(1..=MAX_INVITES_PER_CALL).contains(&body.count) {
        return Err(AppError::invalid(format!(
            "count must be between 1 and {MAX_INVITES_PER_CALL}"
        )));
    }
    let codes: Vec<String> = (0..body.count).map(|_| tokens::invite_code()).collect();
    let _one = records::one_change_at_a_time(&id).await;
    state
        .store
        .add_invites(&id, &codes, state.clock.now())
        .await?;
    let count = Some(codes.len() as u64);
    records::audit(&state, &caller, Action::Invites, &id, Vec::new(), count).await;
    if !csv {
        return Ok(Json(Invites { codes }).into_response());
    }
    let mut text = String::with_capacity(5 + codes.len() * 17);
    text.push_str("code\n");
    for c in &codes {
        text.push_str(c);
        text.push('\n');
    }
    Ok(csv_download(&id, text, None))
}

/// Whether an invites answer is the CSV download: `?format=` decides, else `Accept`.
fn wants_csv(format: Option<&str>, headers: &HeaderMap) -> AppResult<bool> {
    Ok(match format {
        Some("csv") => true,
        Some("json") => false,
        Some(_) => return Err(AppError::invalid("format must be json or csv")),
        // Several `Accept` lines are one list (docs/API.md); a line that is not text is
        // skipped.
        None => prefers_csv(
            &headers
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect::<Vec<_>>()
                .join(", "),
        ),
    })
}

/// The invites CSV as a download; `next` is the `Link` to the page that follows, if any.
fn csv_download(id: &str, text: String, next: Option<String>) -> Response {
    let disposition = format!("attachment; filename=\"invites-{id}.csv\"");
    let mut r = (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        text,
    )
        .into_response();
    if let Some(v) = next.and_then(|l| header::HeaderValue::try_from(l).ok()) {
        r.headers_mut().insert(header::LINK, v);
    }
    r
}

/// Most codes one page of `GET /events/{id}/invites` lists (and its default): the codes
/// of an event have no cap in total, one `POST` adds up to [`MAX_INVITES_PER_CALL`].
pub const MAX_INVITES_PAGE: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteListQuery {
    /// List the codes after this one (the previous page's `next_after`).
    pub after: Option<String>,
    pub limit: Option<usize>,
    pub format: Option<String>,
}

/// `GET /events/{event_id}/invites?after=&limit=`: the event's codes in code order, each
/// with its state, so that codes whose answer was lost can be had again; as JSON, or as a
/// CSV download negotiated as for the `POST`.
pub async fn list_invites(
    State(state): State<AppState>,
    path: AppPath<String>,
    AppQuery(q): AppQuery<InviteListQuery>,
    headers: HeaderMap,
) -> AppResult<Response> {
    let id = event_id(path)?;
    let csv = wants_csv(q.format.as_deref(), &headers)?;
    let limit = q.limit.unwrap_or(MAX_INVITES_PAGE);
    if !(1..=MAX_INVITES_PAGE).contains(&limit) {
        return Err(AppError::invalid(format!(
            "limit must be between 1 and {MAX_INVITES_PAGE}"
        )));
    }
    // One more than the page, to know whether another follows (as `prequeue`).
    let after = q.after.unwrap_or_default();
    let mut page = state
        .store
        .invites(&id, &after, limit + 1, state.clock.now())
        .await?;
    let more = page.len() > limit;
    page.truncate(limit);
    let next_after = more.then(|| page.last().map(|(c, _)| c.clone())).flatten();
    let invites: Vec<InviteRow> = page.into_iter().map(InviteRow::from).collect();
    if !csv {
        return Ok(Json(InviteList {
            invites,
            next_after,
        })
        .into_response());
    }
    let mut text = String::with_capacity(20 + invites.len() * 24);
    text.push_str("code,state,user_id\n");
    for row in &invites {
        text.push_str(&row.code);
        text.push(',');
        text.push_str(row.state.as_str());
        text.push(',');
        if let Some(u) = &row.user_id {
            text.push_str(&csv_field(u));
        }
        text.push('\n');
    }
    // Codes are URL-safe base64, so they go into the query as they are.
    let next = next_after.map(|a| {
        format!(
            "</api/v1/admin/events/{id}/invites?format=csv&after={a}&limit={limit}>; rel=\"next\""
        )
    });
    Ok(csv_download(&id, text, next))
}

/// A CSV field: quoted when it holds a separator, a quote or a line break (RFC 4180); one
/// a spreadsheet would take for a formula gets a leading `'` (user ids are the caller's
/// own text).
fn csv_field(v: &str) -> String {
    let v = if v.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{v}")
    } else {
        v.to_string()
    };
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v
    }
}

/// `POST /events/{event_id}/clear`: every waiting place ends (`TOKEN_NOT_FOUND`).
pub async fn clear(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    _: NoBody,
) -> AppResult<Json<Cleared>> {
    let id = event_id(path)?;
    let _one = records::one_change_at_a_time(&id).await;
    let n = state.store.clear(&id, state.clock.now()).await?;
    records::audit(&state, &caller, Action::Clear, &id, Vec::new(), Some(n)).await;
    Ok(Json(Cleared { cleared: n }))
}

#[derive(Debug, Deserialize)]
pub struct HeadQuery {
    pub limit: Option<usize>,
}

/// `GET /events/{event_id}/queue?limit=`: the head of the queue.
pub async fn queue_head(
    State(state): State<AppState>,
    path: AppPath<String>,
    AppQuery(q): AppQuery<HeadQuery>,
) -> AppResult<Json<Vec<HeadEntry>>> {
    let id = event_id(path)?;
    let limit = q.limit.unwrap_or(DEFAULT_HEAD_LIMIT);
    if !(1..=MAX_HEAD_LIMIT).contains(&limit) {
        return Err(AppError::invalid(format!(
            "limit must be between 1 and {MAX_HEAD_LIMIT}"
        )));
    }
    let now = state.clock.now();
    let mut head = state.store.queue_head(&id, limit, now).await?;
    // Before the opening the head is the pre-queue, whose order is drawn at the opening:
    // each place is told the time to the opening (`GET /queue/status`), not the estimate
    // of a rank it may not get.
    if !head.is_empty() {
        let config = state.store.get_event(&id, now).await?.config;
        // At `opens_at` itself the sale is open (`before_opening` is `now < opens_at`), and
        // so it is once an operation recorded the opening reached, whatever this clock says.
        let opens_in = config.opening_ahead(now).and_then(|t| t.checked_sub(now));
        if let Some(opens_in) = opens_in.filter(|&ms| ms > 0) {
            for entry in &mut head {
                entry.eta_sec = opens_in.div_ceil(1000);
            }
        }
    }
    Ok(Json(head))
}

/// Most pre-queue place ids one page of `GET /events/{id}/prequeue` lists.
pub const MAX_PREQUEUE_PAGE: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrequeueQuery {
    /// List the places after this id (the previous page's `next_after`).
    pub after: Option<u64>,
    pub limit: Option<usize>,
}

/// `GET /events/{event_id}/prequeue?after=&limit=`: the pre-queue's waiting place ids in
/// join order, a page at a time: with the published `shuffle_seed` anyone can recompute
/// the order of admission from it.
pub async fn prequeue(
    State(state): State<AppState>,
    path: AppPath<String>,
    AppQuery(q): AppQuery<PrequeueQuery>,
) -> AppResult<Json<Prequeue>> {
    let id = event_id(path)?;
    let limit = q.limit.unwrap_or(MAX_PREQUEUE_PAGE);
    if !(1..=MAX_PREQUEUE_PAGE).contains(&limit) {
        return Err(AppError::invalid(format!(
            "limit must be between 1 and {MAX_PREQUEUE_PAGE}"
        )));
    }
    // One more than the page, to know whether another follows: a full last page must
    // answer `next_after: null`, not send the caller for an empty one.
    let mut ids = state
        .store
        .prequeue(&id, q.after.unwrap_or(0), limit + 1, state.clock.now())
        .await?;
    let more = ids.len() > limit;
    ids.truncate(limit);
    let next_after = more.then(|| ids.last().copied()).flatten();
    Ok(Json(Prequeue {
        event_id: id,
        place_ids: ids,
        next_after,
    }))
}

/// `GET /defaults`: the settings a new event gets for every field its `PUT` leaves out, so
/// the dashboard's form can show them.
pub async fn defaults() -> Json<Settings> {
    Json(EventConfig::default().into())
}

/// `GET /stats`: one summary row per event.
pub async fn stats(State(state): State<AppState>) -> AppResult<Json<Vec<StatsRow>>> {
    let events = state.store.list_events(state.clock.now()).await?;
    Ok(Json(events.into_iter().map(StatsRow::new).collect()))
}

/// Whether an `Accept` value asks for CSV rather than the default JSON (RFC 9110 12.5.1):
/// `text/csv` (any case) with a `q` above 0 and at least that of `application/json`.
/// Wildcards choose nothing: JSON is what a client that names neither gets.
fn prefers_csv(accept: &str) -> bool {
    let (mut csv, mut json) = (0u16, 0u16);
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let range = parts.next().unwrap_or("").trim();
        // q in thousandths: "0.8" → 800; absent or unreadable counts as 1.
        let q = parts
            .find_map(|p| {
                let p = p.trim();
                p.strip_prefix("q=").or(p.strip_prefix("Q="))
            })
            .and_then(|q| q.trim().parse::<f32>().ok())
            .map_or(1000, |q| (q.clamp(0.0, 1.0) * 1000.0).round() as u16);
        if range.eq_ignore_ascii_case("text/csv") {
            csv = csv.max(q);
        } else if range.eq_ignore_ascii_case("application/json") {
            json = json.max(q);
        }
    }
    csv > 0 && csv >= json
}

#[cfg(test)]
mod tests {
    use super::prefers_csv;

    #[test]
    fn csv_is_chosen_by_what_accept_ranks() {
        for csv in [
            "text/csv",
            "TEXT/CSV",
            "text/csv; charset=utf-8",
            "application/json;q=0.5, text/csv",
            "text/csv, */*;q=0.1",
        ] {
            assert!(prefers_csv(csv), "{csv}");
        }
        for json in [
            "",
            "*/*",
            "application/json",
            "text/csvx",
            "text/csv;q=0",
            "text/csv;q=0, application/json",
            "application/json, text/csv;q=0.1",
        ] {
            assert!(!prefers_csv(json), "{json}");
        }
    }
}
