//! The sale's endpoints: an event's inventory (admin), a session's seat holds and its
//! extension (with the access token). Each handler makes one store call that is one atomic
//! transition (the seat map is two: the session's renewal, then the inventory read).

use axum::extract::State;
use axum::http::{header, HeaderName, HeaderValue};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::admin::event_id_of;
use super::error::{AppError, AppResult};
use super::extract::{AppJson, AppPath, BearerToken, NoBody, OptionalJson};
use super::guard::Caller;
use super::queue::access_claims;
use super::records;
use crate::app::AppState;
use crate::audit::Action;
use crate::core::holds::{validate_items, MAX_HOLDS_PER_SESSION};
use crate::core::{InventoryCounts, ItemState, Millis, QueueError, SessionHolds};
use crate::store::StoreError;
use crate::tokens::{self, AccessClaims};

/// `PUT /admin/events/{id}/inventory` and `POST /session/holds`: item ids.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemsBody {
    pub items: Vec<String>,
}

/// `PUT /admin/events/{id}/inventory`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InventoryAdded {
    pub added: u64,
    #[serde(flatten)]
    pub counts: InventoryCounts,
}

/// One item of `GET /admin/events/{id}/inventory`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AdminItem {
    pub id: String,
    /// `available`, `held` or `sold`.
    #[schema(value_type = String, example = "held")]
    pub state: &'static str,
    /// The place (join sequence) holding or having bought it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<u64>,
    /// While held: when the hold lapses (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub hold_expires_at: Option<Millis>,
}

/// `GET /admin/events/{id}/inventory`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AdminInventory {
    #[serde(flatten)]
    pub counts: InventoryCounts,
    pub items: Vec<AdminItem>,
}

/// One item of `GET /session/holds`: what the seat map draws.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeatItem {
    pub id: String,
    /// `available`, `mine` (held by this session), `held` (by another) or `sold`.
    #[schema(value_type = String, example = "mine")]
    pub state: &'static str,
}

/// `GET /session/holds`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeatMap {
    #[serde(flatten)]
    pub holds: SessionHolds,
    pub items: Vec<SeatItem>,
}

/// `POST /session/extend`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Extended {
    pub access_token: String,
    /// Always `"Bearer"`.
    #[schema(value_type = String, example = "Bearer")]
    pub token_type: &'static str,
    /// Seconds until the new token's `exp` (the session's new latest end in whole seconds),
    /// rounded up: at least 1, as the token is valid.
    pub expires_in: u64,
    /// That moment in Unix seconds (the new token's `exp`).
    pub expires_at: u64,
}

/// A session call's refusal: the sale's own errors as they are, any other queue error
/// (no session, unknown event, …) `ACCESS_DENIED`, as on every session endpoint.
fn session_error(e: StoreError) -> AppError {
    match e {
        StoreError::Queue(
            q @ (QueueError::HoldConflict
            | QueueError::ItemNotFound
            | QueueError::TooManyHolds
            | QueueError::ExtensionLimit),
        ) => AppError::Sale(q),
        e => AppError::from_session_error(e),
    }
}

/// `PUT /admin/events/{id}/inventory`: adds items (known ones keep their state).
pub async fn put_inventory(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    AppJson(body): AppJson<ItemsBody>,
) -> AppResult<Json<InventoryAdded>> {
    let id = event_id_of(path)?;
    validate_items(&body.items)?;
    let _one = records::one_change_at_a_time(&id).await;
    let (added, counts) = state
        .store
        .put_inventory(&id, &body.items, state.clock.now())
        .await?;
    records::audit(
        &state,
        &caller,
        Action::Inventory,
        &id,
        Vec::new(),
        Some(added),
    )
    .await;
    Ok(Json(InventoryAdded { added, counts }))
}

/// `GET /admin/events/{id}/inventory`: the counts and every item.
pub async fn get_inventory(
    State(state): State<AppState>,
    path: AppPath<String>,
) -> AppResult<Json<AdminInventory>> {
    let id = event_id_of(path)?;
    let view = state.store.inventory(&id, state.clock.now()).await?;
    let items = view
        .items
        .into_iter()
        .map(|(id, s)| {
            let (state, place, hold_expires_at) = match s {
                ItemState::Available => ("available", None, None),
                ItemState::Held { seq, until } => ("held", Some(seq), Some(until)),
                ItemState::Sold { seq } => ("sold", Some(seq), None),
            };
            AdminItem {
                id,
                state,
                place,
                hold_expires_at,
            }
        })
        .collect();
    Ok(Json(AdminInventory {
        counts: view.counts,
        items,
    }))
}

/// `GET /session/holds`: the seat map (every item, this session's own marked `mine`) and
/// this session's holds. Renews the session's idle deadline, as the other hold calls do: a
/// person looking at the seat map is choosing.
pub async fn seat_map(
    State(state): State<AppState>,
    BearerToken(jwt): BearerToken,
) -> AppResult<Json<SeatMap>> {
    let (claims, key) = access_claims(&state, &jwt)?;
    let now = state.clock.now();
    state
        .store
        .session_heartbeat(&claims.aud, key, now)
        .await
        .map_err(AppError::from_session_error)?;
    // Shared with the requests for this event's map that arrived meanwhile, read from a
    // clock taken when the read starts (`seat_reads`).
    let store = &state.store;
    let view = state
        .seat_reads
        .inventory(&claims.aud, || {
            store.inventory(&claims.aud, state.clock.now())
        })
        .await
        .map_err(AppError::from_session_error)?;
    let mut holds = SessionHolds::default();
    let items = view
        .items
        .iter()
        .map(|(id, s)| {
            let state = match *s {
                ItemState::Available => "available",
                ItemState::Held { seq, until } if seq == key.seq => {
                    holds.holds.push(crate::core::HeldItem {
                        item: id.clone(),
                        expires_at: until,
                    });
                    "mine"
                }
                ItemState::Held { .. } => "held",
                ItemState::Sold { .. } => "sold",
            };
            SeatItem {
                id: id.clone(),
                state,
            }
        })
        .collect();
    Ok(Json(SeatMap { holds, items }))
}

fn hold_items(body: &ItemsBody) -> AppResult<()> {
    if body.items.is_empty() || body.items.len() as u64 > MAX_HOLDS_PER_SESSION {
        return Err(AppError::invalid(format!(
            "items must list 1 to {MAX_HOLDS_PER_SESSION} item ids"
        )));
    }
    Ok(validate_items(&body.items)?)
}

/// `POST /session/holds`: holds the items for the event's `hold_ttl_sec`, all or none.
pub async fn hold(
    State(state): State<AppState>,
    BearerToken(jwt): BearerToken,
    AppJson(body): AppJson<ItemsBody>,
) -> AppResult<Json<SessionHolds>> {
    let (claims, key) = access_claims(&state, &jwt)?;
    hold_items(&body)?;
    let holds = state
        .store
        .hold(&claims.aud, key, &body.items, state.clock.now())
        .await
        .map_err(session_error)?;
    Ok(Json(holds))
}

/// `DELETE /session/holds`: releases the listed items, or every hold without a body.
pub async fn release(
    State(state): State<AppState>,
    BearerToken(jwt): BearerToken,
    OptionalJson(body): OptionalJson<ItemsBody>,
) -> AppResult<Json<SessionHolds>> {
    let (claims, key) = access_claims(&state, &jwt)?;
    if let Some(b) = &body {
        hold_items(b)?;
    }
    let items = body.as_ref().map(|b| b.items.as_slice());
    let holds = state
        .store
        .release(&claims.aud, key, items, state.clock.now())
        .await
        .map_err(session_error)?;
    Ok(Json(holds))
}

/// `POST /session/extend`: `session_extend_sec` more, and an access token for the new end.
pub async fn extend(
    State(state): State<AppState>,
    BearerToken(jwt): BearerToken,
    _: NoBody,
) -> AppResult<([(HeaderName, HeaderValue); 1], Json<Extended>)> {
    let (claims, key) = access_claims(&state, &jwt)?;
    let AccessClaims { aud, sub, .. } = claims;
    let now = state.clock.now();
    let view = state
        .store
        .extend(&aud, key, now)
        .await
        .map_err(session_error)?;
    let ends_at = view
        .session_ends_at
        .ok_or_else(|| AppError::Internal("an extended session has no end".into()))?;
    // As in `enter`: no token that is dead on arrival (a session at its `session_max_sec`
    // ends within the second). Seldom reached: the token that asks was checked against the
    // system clock first, and is refused from the same whole second on.
    if tokens::expired_on_issue(now, ends_at) {
        return Err(AppError::from_session_error(StoreError::Queue(
            QueueError::TokenExpired,
        )));
    }
    debug_assert_eq!(
        tokens::parse_session_id(&tokens::session_id(key)),
        Some(key)
    );
    let access_token = state
        .access
        .sign(&aud, &sub, view.user_proven, key, now, ends_at);
    // A new access token: no cache may keep it (RFC 6749 5.1).
    Ok((
        [(header::CACHE_CONTROL, super::NO_STORE.clone())],
        Json(Extended {
            access_token,
            token_type: "Bearer",
            expires_in: tokens::expires_in(now, ends_at),
            expires_at: ends_at / 1000,
        }),
    ))
}
