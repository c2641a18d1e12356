//! The end-user API (`/api/v1`): joining, polling, entering and leaving a queue, and the
//! access-token endpoints a protected site calls.
//!
//! Handlers are thin: they find and check the token (a forged or garbled waiting token is
//! refused by its MAC before the store is asked anything), make one store call with the
//! current time, and shape the answer. All queue rules live in the store.

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::admin::is_admin_token;
use super::body::{
    AnnouncementBody, Completed, Entered, Joined, Place, QueueInfo, Removed, Verified,
};
use super::error::{AppError, AppResult, PlaceResult};
use super::extract::{AppJson, AppQuery, BearerToken, NoBody, WaitingToken, WaitingTokenNoBody};
use super::guard::Caller;
use super::place_json::{JoinedAnswer, PlaceAnswer};
use super::pow::{check as check_pow, PowSolution};
use super::Shared;
use crate::app::AppState;
use crate::core::{validate_event_id, EventConfig, Millis, PlaceKey, QueueError};
use crate::store::{JoinRequest, StoreError};
use crate::tokens::{self, AccessClaims, UserTokenError};

/// Longest accepted `user_id`, in characters: room for an e-mail address or a UUID with a
/// prefix, small enough that user ids cannot bloat the store.
pub const MAX_USER_ID_CHARS: usize = 256;
/// Largest accepted `metadata`, serialized, in bytes (the contract's 4 KiB).
pub const MAX_METADATA_BYTES: usize = 4096;

/// Longest accepted `invite` code (ours are 16 characters).
pub const MAX_INVITE_CHARS: usize = 64;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct JoinBody {
    pub event_id: String,
    pub user_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    /// A JWT signed by the booking site; its `sub` is the user id, proven.
    pub user_token: Option<String>,
    /// The invite code of an invite-only event.
    pub invite: Option<String>,
    /// The solution of a proof-of-work challenge, for events that ask one.
    #[serde(default, deserialize_with = "crate::core::config::optional_object")]
    pub pow: Option<PowSolution>,
}

/// Whether the join carries the site's server key (`Authorization: Bearer <admin
/// token>`, a backend joining on a user's behalf). A wrong bearer counts as a wrong admin
/// token, limited per client like on the admin API: otherwise join would be a free oracle
/// for guessing the admin token.
fn server_key(state: &AppState, caller: &Caller, bearer: Option<&str>) -> AppResult<bool> {
    match bearer {
        Some(t) if is_admin_token(state, t) => Ok(true),
        Some(_) => {
            caller.guard.check_admin_failure(caller.ip)?;
            Err(AppError::Unauthorized)
        }
        None => Ok(false),
    }
}

/// Who the joiner is and whether that is proven: by a valid user token (its `sub`) or by
/// the site's server key (`server`). A bare `user_id` is a claim only, which the queue
/// rules treat as such.
///
/// Takes the body's `user_id` (moved into the answer rather than copied).
fn identity(
    config: &EventConfig,
    server: bool,
    body: &mut JoinBody,
    now: Millis,
) -> AppResult<(Option<String>, bool)> {
    let Some(token) = body.user_token.as_deref() else {
        if server {
            return Ok((body.user_id.take(), true));
        }
        if config.require_user_token {
            return Err(AppError::UserTokenRequired);
        }
        return Ok((body.user_id.take(), false));
    };
    let sub = tokens::verify_user_token(
        token,
        &body.event_id,
        config.user_token_secret.as_deref(),
        config.user_token_public_key.as_deref(),
        now,
    )
    .map_err(|e| match e {
        UserTokenError::Expired => AppError::UserTokenExpired,
        UserTokenError::Invalid(why) => AppError::UserTokenInvalid(why),
    })?;
    if body.user_id.as_ref().is_some_and(|u| *u != sub) {
        return Err(AppError::invalid(
            "user_id differs from the user token's sub; send either, or both equal",
        ));
    }
    Ok((Some(sub), true))
}

/// The event and place a waiting token names; no store lookup for forgeries. Verified by
/// its MAC every time, not through the gate's cache of verified tokens: a crowd's polls
/// would mostly miss it (`WaitingTokens::verify`).
fn parse_waiting(state: &AppState, token: &str) -> AppResult<(String, PlaceKey)> {
    state
        .waiting
        .verify(token)
        .map_err(|_| AppError::TokenInvalid)
}

/// The place a waiting token names, once its poll is within the place's limit.
async fn parse_polling(
    state: &AppState,
    caller: &Caller,
    token: &str,
) -> AppResult<(String, PlaceKey)> {
    let (event_id, key) = parse_waiting(state, token)?;
    caller
        .guard
        .check_poll(&state.events, state.clock.now(), &event_id, key)
        .await?;
    Ok((event_id, key))
}

/// `POST /queue/join`. Borrows the routes' state (`Shared`) rather than clone an
/// `AppState` (a dozen reference counts, shared by every worker, bumped and dropped per
/// join), and reads only the bearer token of the head rather than a copy of all of it.
pub async fn join(
    State(shared): State<Shared>,
    bearer: Option<BearerToken>,
    caller: Caller,
    // A `Result`: a body refused is an answer about one place too (`no-store`, PlaceError).
    body: Result<AppJson<JoinBody>, AppError>,
) -> PlaceResult<JoinedAnswer> {
    let AppJson(mut body) = body?;
    let state = shared.app();
    validate_event_id(&body.event_id)?;
    if body
        .invite
        .as_ref()
        .is_some_and(|c| c.chars().count() > MAX_INVITE_CHARS)
    {
        return Err(AppError::invalid(format!(
            "invite must be at most {MAX_INVITE_CHARS} characters"
        ))
        .into());
    }
    let now = state.clock.now();
    let server = server_key(state, &caller, bearer.as_ref().map(|b| b.0.as_str()))?;
    // The event must exist before anything is keyed on its id (see `check_join`).
    let config = state.events.config(&body.event_id, now).await?;
    // A backend holding the server key joins for many users from one address: the
    // per-client limit is for anonymous clients.
    if !server {
        (caller.guard).check_join_in(&config, caller.ip, &body.event_id)?;
    }
    let (user_id, proven) = match identity(&config, server, &mut body, now) {
        Ok(who) => who,
        // After the end a join is refused as closed whatever its proof of identity (as a
        // proof of work or an invite is): a visitor with an old link, or none, is told the
        // sale is over, not to ask the organiser for a new link.
        Err(e) => {
            return Err(match config.sale_ended(now) {
                Some(end) => {
                    AppError::SaleEnded(Box::new(AppError::EventClosed), end.reason.as_str())
                }
                None => e,
            }
            .into())
        }
    };
    if let Some(u) = &user_id {
        let n = u.chars().count();
        if n == 0 || n > MAX_USER_ID_CHARS {
            return Err(AppError::invalid(format!(
                "user_id must be 1-{MAX_USER_ID_CHARS} characters"
            ))
            .into());
        }
        // It reaches the admin's queue list, history and CSV exports as it is.
        if u.chars().any(char::is_control) {
            return Err(AppError::invalid("user_id must not contain control characters").into());
        }
    }
    let metadata = match &body.metadata {
        None => None,
        Some(m) => {
            let raw = serde_json::to_string(m).map_err(|e| AppError::Internal(e.to_string()))?;
            if raw.len() > MAX_METADATA_BYTES {
                return Err(AppError::invalid(format!(
                    "metadata must be at most {MAX_METADATA_BYTES} bytes of JSON"
                ))
                .into());
            }
            Some(raw)
        }
    };
    check_pow(state, &config, &body.event_id, body.pow.as_ref()).await?;
    let req = JoinRequest {
        user_id,
        metadata,
        nonce: tokens::random_u128(),
        proven,
        invite: body.invite,
    };
    let view = match state.store.join(&body.event_id, &req, now).await {
        Ok(v) => v,
        Err(e) => {
            return Err(super::lifecycle::explain(state, &body.event_id, e.into())
                .await
                .into())
        }
    };
    if let Some(old) = view.replaced {
        // The unproven place this join replaced ended as at a `leave`: its session must not
        // pass this node's gate on a renewal noted before (`leave` does the same).
        state.gates.forget(&body.event_id, old, now);
    }
    let mut place = Place::new(body.event_id, &view);
    place.announcement = config.announcement.as_ref().map(AnnouncementBody::new);
    Ok(JoinedAnswer(Joined {
        waiting_token: state.waiting.issue(&place.event_id, view.key),
        place,
    }))
}

/// `GET /queue/status`: counts as a heartbeat. Every waiting page polls it, so it borrows
/// the routes' state (`Shared`) rather than cloning an `AppState` (a dozen reference
/// counts bumped and dropped), and reads the event's settings once, for both the poll
/// limit and the announcement.
pub async fn status(
    State(shared): State<Shared>,
    // A `Result`: its refusal is an answer about one place (`no-store`, PlaceError).
    token: Result<WaitingTokenNoBody, AppError>,
) -> PlaceResult<PlaceAnswer> {
    let WaitingTokenNoBody(token) = token?;
    let state = shared.app();
    let (event_id, key) = parse_waiting(state, &token)?;
    let now = state.clock.now();
    // From this node's catalog: no store call on a warm path, at most a second old.
    let config = state.events.config_if_reachable(&event_id, now).await?;
    shared
        .guard()
        .check_poll_in(config.as_deref(), &event_id, key)?;
    let view = match state.store.status(&event_id, key, now).await {
        Ok(v) => v,
        Err(e) => {
            return Err(super::lifecycle::explain(state, &event_id, e.into())
                .await
                .into())
        }
    };
    let mut place = Place::new(event_id, &view);
    // The operator's message, for clients that poll rather than follow the live stream.
    place.announcement = config
        .as_ref()
        .and_then(|c| c.announcement.as_ref())
        .map(AnnouncementBody::new);
    Ok(PlaceAnswer(place))
}

/// `POST /queue/heartbeat`
pub async fn heartbeat(
    State(state): State<AppState>,
    caller: Caller,
    // A `Result`: its refusal is an answer about one place (`no-store`, PlaceError).
    token: Result<WaitingToken, AppError>,
) -> PlaceResult<StatusCode> {
    let WaitingToken(token) = token?;
    let (event_id, key) = parse_polling(&state, &caller, &token).await?;
    // After the end of the sale the place is gone: say why, as `status` does.
    if let Err(e) = state
        .store
        .heartbeat(&event_id, key, state.clock.now())
        .await
    {
        return Err(super::lifecycle::explain(&state, &event_id, e.into())
            .await
            .into());
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /queue/enter`: admitted → active, with a signed access token. Repeating it for an
/// active place signs a fresh token for the same session.
pub async fn enter(
    State(state): State<AppState>,
    caller: Caller,
    // A `Result`: its refusal is an answer about one place (`no-store`, PlaceError).
    token: Result<WaitingToken, AppError>,
) -> PlaceResult<([(header::HeaderName, HeaderValue); 1], Json<Entered>)> {
    let WaitingToken(token) = token?;
    let (event_id, key) = parse_polling(&state, &caller, &token).await?;
    let now = state.clock.now();
    let view = match state.store.enter(&event_id, key, now).await {
        Ok(v) => v,
        Err(e) => {
            return Err(super::lifecycle::explain(&state, &event_id, e.into())
                .await
                .into())
        }
    };
    let ends_at = view
        .session_ends_at
        .ok_or_else(|| AppError::Internal("an entered place has no session end".into()))?;
    // Past the last whole second before the session's end (its last `end % 1000` ms), the
    // token would be dead on arrival: its `exp` is the end in whole seconds, rounded down,
    // and it is refused from that second on. The session is over for the person, and the
    // answer says so, as it does once the store ends it.
    if tokens::expired_on_issue(now, ends_at) {
        return Err(QueueError::TokenExpired.into());
    }
    let session_id = tokens::session_id(view.key);
    // Anonymous places have no user id; the session id names them uniquely instead.
    let subject = view.user_id.as_deref().unwrap_or(&session_id);
    let jwt = state
        .access
        .sign(&event_id, subject, view.user_proven, view.key, now, ends_at);
    // The answer carries the access token: no cache may keep it (RFC 6749 5.1).
    let no_store = [(header::CACHE_CONTROL, super::NO_STORE.clone())];
    Ok((
        no_store,
        Json(Entered {
            admission: "granted",
            access_token: jwt,
            token_type: "Bearer",
            session_id,
            expires_in: tokens::expires_in(now, ends_at),
            expires_at: ends_at / 1000,
            event_id,
        }),
    ))
}

/// `POST /queue/leave` and `DELETE /queue/leave`. A place that is already gone, even with
/// its whole event, is simply not removed: a beacon sent on page unload must not error.
pub async fn leave(
    State(state): State<AppState>,
    // A `Result`: its refusal is an answer about one place (`no-store`, PlaceError).
    token: Result<WaitingToken, AppError>,
) -> PlaceResult<Json<Removed>> {
    let WaitingToken(token) = token?;
    let (event_id, key) = parse_waiting(&state, &token)?;
    let left = state.store.leave(&event_id, key, state.clock.now()).await;
    // As at `complete`: the gate must not let a session that left pass on its word.
    state.gates.forget(&event_id, key, state.clock.now());
    let removed = match left {
        Ok(r) => r,
        Err(StoreError::Queue(QueueError::EventNotFound)) => false,
        Err(e) => return Err(e.into()),
    };
    Ok(Json(Removed { removed }))
}

/// The claims of a valid access token and the place its session names. Any flaw is
/// `ACCESS_DENIED`: a protected site needs a yes or a no, not a diagnosis.
pub(super) fn access_claims(state: &AppState, jwt: &str) -> AppResult<(AccessClaims, PlaceKey)> {
    let claims = state
        .access
        .verify(jwt)
        .map_err(|_| AppError::AccessDenied)?;
    let key = tokens::parse_session_id(&claims.sid).ok_or(AppError::AccessDenied)?;
    Ok((claims, key))
}

#[derive(Debug, Deserialize)]
pub struct VerifyQuery {
    pub event_id: Option<String>,
    /// Other parameters (a cache buster) are ignored, but not a misspelt `event_id`
    /// ([`misspelt_event_id`]).
    #[serde(flatten)]
    pub other: std::collections::BTreeMap<String, String>,
}

/// A parameter that is `event_id` spelt another way (`eventId`, `event-id`, `event`): read
/// as "no event asked", it would skip the event check the site meant to make, and answer
/// `valid` for another event's token.
fn misspelt_event_id(name: &str) -> bool {
    let folded: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    // `aud`: the access token's own name for the event.
    folded == "eventid" || folded == "event" || folded == "aud"
}

/// `POST /queue/verify`: for protected sites. Checks the signature and expiry, the event
/// when asked, and that the session is still active in the store (so a completed or
/// lapsed session is refused even before its token expires).
pub async fn verify(
    State(state): State<AppState>,
    AppQuery(q): AppQuery<VerifyQuery>,
    BearerToken(jwt): BearerToken,
    // The event is asked in the query only: a body naming one (`{"event_id": …}`, a form)
    // is refused rather than read past, so the site's event check is never skipped
    // without a word.
    _: NoBody,
) -> AppResult<Json<Verified>> {
    // `?event_id=` with nothing after it is a site's bug (an unset variable), not "any
    // event": refuse it rather than skip the check the site meant to make.
    if q.event_id.as_deref().is_some_and(str::is_empty) {
        return Err(AppError::invalid("event_id must not be empty"));
    }
    if let Some(name) = q.other.keys().find(|k| misspelt_event_id(k)) {
        return Err(AppError::invalid(format!(
            "unknown parameter {name:?}: the event is asked with event_id"
        )));
    }
    let (claims, key) = access_claims(&state, &jwt)?;
    if let Some(ev) = q.event_id.as_deref() {
        if ev != claims.aud {
            return Err(AppError::AccessDenied);
        }
    }
    let now = state.clock.now();
    let view = state
        .store
        .session(&claims.aud, key, now)
        .await
        .map_err(AppError::from_session_error)?;
    Ok(Json(Verified {
        valid: true,
        // Anonymous places have no user id; their subject (the session) stands in.
        user_id: view.user_id.unwrap_or_else(|| claims.sub.clone()),
        event_id: claims.aud,
        user_verified: claims.user_verified,
        sub: claims.sub,
        session_id: claims.sid,
        expires_at: claims.exp,
        session_expires_in_sec: view.session_expires_in_sec,
    }))
}

/// `POST /session/heartbeat`
pub async fn session_heartbeat(
    State(state): State<AppState>,
    BearerToken(jwt): BearerToken,
    _: NoBody,
) -> AppResult<StatusCode> {
    let (claims, key) = access_claims(&state, &jwt)?;
    state
        .store
        .session_heartbeat(&claims.aud, key, state.clock.now())
        .await
        .map_err(AppError::from_session_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /session/complete`: the user is done; the slot goes to the next in line at once.
pub async fn session_complete(
    State(state): State<AppState>,
    BearerToken(jwt): BearerToken,
    _: NoBody,
) -> AppResult<Json<Completed>> {
    let (claims, key) = access_claims(&state, &jwt)?;
    let done = state
        .store
        .complete(&claims.aud, key, state.clock.now())
        .await;
    // This node's gate lets a renewed session through on its own word for a few seconds:
    // a session that ends here must stop passing at once (forgotten after the store's
    // answer, so a renewal racing the completion is not kept).
    state.gates.forget(&claims.aud, key, state.clock.now());
    done.map_err(AppError::from_session_error)?;
    Ok(Json(Completed { completed: true }))
}

#[derive(Debug, Deserialize)]
pub struct InfoQuery {
    pub event_id: String,
}

/// `GET /queue/info`: public figures of one event, no user data.
pub async fn info(
    State(state): State<AppState>,
    AppQuery(q): AppQuery<InfoQuery>,
) -> AppResult<Json<QueueInfo>> {
    validate_event_id(&q.event_id)?;
    let snap = state
        .store
        .get_event(&q.event_id, state.clock.now())
        .await?;
    Ok(Json(QueueInfo::new(snap, state.clock.now())))
}

/// `GET /.well-known/jwks.json`: cacheable for a while; keys change only on redeploys.
pub async fn jwks(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "public, max-age=300")],
        Json(state.access.jwks()),
    )
}
