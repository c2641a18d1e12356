//! The admin API (`/api/v1/admin`): create, inspect, pause, clear and delete events.
//!
//! Every route sits behind [`require_admin`], which runs before any extractor, so an
//! unauthenticated caller learns nothing (not even whether its body would have parsed).
//! Side effects of a change (waking the scheduler, forgetting a deleted event's gauges)
//! follow from the store's notices, on every node, not from these handlers.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::error::{AppError, AppResult};
use super::extract::{bearer, AppPath, AppQuery, OptionalJson};
use crate::app::AppState;
use crate::core::{validate_event_id, EventConfig, EventPatch};
use crate::store::EventSnapshot;

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

/// Middleware: `401 UNAUTHORIZED` unless `Authorization: Bearer <admin token>`.
pub async fn require_admin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, AppError> {
    let ok = !state.admin_token.is_empty()
        && bearer(req.headers()).is_some_and(|t| constant_time_eq(t, &state.admin_token));
    if !ok {
        return Err(AppError::Unauthorized);
    }
    Ok(next.run(req).await)
}

/// Serializes `value` (a struct) as a JSON object; our structs always are one.
fn object(value: &impl Serialize) -> AppResult<Map<String, Value>> {
    match serde_json::to_value(value) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(AppError::Internal(format!(
            "expected an object, got {other}"
        ))),
        Err(e) => Err(AppError::Internal(e.to_string())),
    }
}

/// A stored config with its id, as `PUT`, pause and resume answer it.
fn config_json(event_id: &str, config: &EventConfig) -> AppResult<Map<String, Value>> {
    let mut m = Map::new();
    m.insert("event_id".into(), json!(event_id));
    m.extend(object(config)?);
    Ok(m)
}

/// Config and figures side by side in one flat object (their field names do not overlap).
fn snapshot_json(s: &EventSnapshot) -> AppResult<Map<String, Value>> {
    let mut m = config_json(&s.event_id, &s.config)?;
    m.extend(object(&s.figures)?);
    Ok(m)
}

fn event_id(AppPath(id): AppPath<String>) -> AppResult<String> {
    validate_event_id(&id)?;
    Ok(id)
}

/// `PUT /events/{event_id}`: create or update. An empty body creates with the defaults.
pub async fn put_event(
    State(state): State<AppState>,
    path: AppPath<String>,
    OptionalJson(patch): OptionalJson<EventPatch>,
) -> AppResult<Json<Map<String, Value>>> {
    let id = event_id(path)?;
    let patch = patch.unwrap_or_default();
    let config = state
        .store
        .put_event(&id, &patch, state.clock.now())
        .await?;
    Ok(Json(config_json(&id, &config)?))
}

/// `GET /events`
pub async fn list_events(State(state): State<AppState>) -> AppResult<Json<Vec<Value>>> {
    let events = state.store.list_events(state.clock.now()).await?;
    let rows = events
        .iter()
        .map(|s| snapshot_json(s).map(Value::Object))
        .collect::<AppResult<_>>()?;
    Ok(Json(rows))
}

/// `GET /events/{event_id}`
pub async fn get_event(
    State(state): State<AppState>,
    path: AppPath<String>,
) -> AppResult<Json<Map<String, Value>>> {
    let id = event_id(path)?;
    let snap = state.store.get_event(&id, state.clock.now()).await?;
    Ok(Json(snapshot_json(&snap)?))
}

/// `DELETE /events/{event_id}`
pub async fn delete_event(
    State(state): State<AppState>,
    path: AppPath<String>,
) -> AppResult<Json<Value>> {
    let id = event_id(path)?;
    state.store.delete_event(&id).await?;
    Ok(Json(json!({"deleted": true, "event_id": id})))
}

/// Pause or resume an existing event. An update, never a creation: pausing a typo must
/// not conjure a new sale, and a pause racing a deletion must not bring the event back.
async fn set_paused(
    state: &AppState,
    id: &str,
    paused: bool,
) -> AppResult<Json<Map<String, Value>>> {
    let patch = EventPatch {
        paused: Some(paused),
        ..EventPatch::default()
    };
    let config = state
        .store
        .update_event(id, &patch, state.clock.now())
        .await?;
    Ok(Json(config_json(id, &config)?))
}

/// `POST /events/{event_id}/pause`: stop admissions; joins still queue.
pub async fn pause(
    State(state): State<AppState>,
    path: AppPath<String>,
) -> AppResult<Json<Map<String, Value>>> {
    set_paused(&state, &event_id(path)?, true).await
}

/// `POST /events/{event_id}/resume`
pub async fn resume(
    State(state): State<AppState>,
    path: AppPath<String>,
) -> AppResult<Json<Map<String, Value>>> {
    set_paused(&state, &event_id(path)?, false).await
}

/// `POST /events/{event_id}/clear`: every waiting place ends (`TOKEN_NOT_FOUND`).
pub async fn clear(State(state): State<AppState>, path: AppPath<String>) -> AppResult<Json<Value>> {
    let id = event_id(path)?;
    let n = state.store.clear(&id, state.clock.now()).await?;
    Ok(Json(json!({ "cleared": n })))
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
) -> AppResult<Json<Value>> {
    let id = event_id(path)?;
    let limit = q.limit.unwrap_or(DEFAULT_HEAD_LIMIT);
    if !(1..=MAX_HEAD_LIMIT).contains(&limit) {
        return Err(AppError::invalid(format!(
            "limit must be between 1 and {MAX_HEAD_LIMIT}"
        )));
    }
    let head = state
        .store
        .queue_head(&id, limit, state.clock.now())
        .await?;
    Ok(Json(json!(head)))
}

/// `GET /stats`: one summary row per event.
pub async fn stats(State(state): State<AppState>) -> AppResult<Json<Value>> {
    let events = state.store.list_events(state.clock.now()).await?;
    let rows: Vec<Value> = events
        .iter()
        .map(|s| {
            json!({
                "event_id": s.event_id,
                "name": s.config.name,
                "waiting_count": s.figures.waiting,
                "active_count": s.figures.active,
                "used_count": s.figures.completed,
                "average_wait_time_sec": s.figures.avg_wait_sec,
            })
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}
