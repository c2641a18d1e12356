//! The HTTP API (axum): end-user, admin and operations routes, all answering errors in the
//! `{"error": {"code", "message"}}` shape of the API contract.
//!
//! - [`queue`]: the end-user API under `/api/v1` (join, status, enter, leave, verify, …).
//! - [`admin`]: the admin API under `/api/v1/admin`, behind the admin bearer token.
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`live`]: live updates of one place, `/queue/ws` (WebSocket) and `/queue/events` (SSE).
//! - [`records`]: the admin API's records: an event's figures over time, the audit list.
//! - [`pages`]: the embedded pages (`/`, `/wait/{event_id}`, `/demo/booking`, `/admin`) and
//!   the public event list they read (`/api/v1/events`).
//! - [`look`]: the waiting page rendered with an event's look and words, its colours, the
//!   data dir's branding files, and the `404` page of an unknown event.
//! - [`pow`]: the proof-of-work gate of `join`.
//! - [`body`]: the typed JSON bodies of every successful answer: the contract in types.
//! - [`error`]: [`AppError`], the one mapping from failures to statuses and codes.
//! - [`extract`]: extractors whose rejections are `AppError`s, so that no malformed request
//!   ever gets axum's plain-text answer.
//! - [`guard`]: per-client limits (who the client is, 429s) and the live-stream cap.
//! - [`edge`]: the one layer around every route (metrics, size check, timeout, panics).
//!
//! Around every route, from the outside in: tracing (tower-http's per-request span, only
//! when debug logging is on), then [`edge`] (metrics, a declared-size check: a
//! `Content-Length` over the limit answers `413 PAYLOAD_TOO_LARGE` before any body is read;
//! a request timeout: a stuck store answers `503 UNAVAILABLE` instead of hanging the client;
//! panic catching: a bug answers a JSON 500 instead of dropping the connection), a body
//! size limit for bodies without a declared length, and a body-read timeout (a body
//! trickled byte by byte is cut off).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware;
use axum::routing::{get, post, put};
use axum::{Extension, Router};
use tower::ServiceBuilder;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutBody};
use tower_http::trace::TraceLayer;

use crate::app::AppState;
use crate::config::RateLimitSettings;

pub mod admin;
pub mod body;
pub mod edge;
pub mod error;
pub mod extract;
pub mod guard;
pub mod live;
pub mod look;
pub mod ops;
pub mod pages;
pub mod pow;
pub mod queue;
pub mod records;
pub mod sale;

pub use error::{AppError, AppResult};

/// Limits applied to every request.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest a request may take before it is answered `503 UNAVAILABLE`. The contract
    /// promises never to hang past a few seconds when the store is gone.
    pub request_timeout: Duration,
    /// Largest accepted request body. Our largest legitimate body (a join with 4 KiB of
    /// metadata) is far below it; anything bigger is a mistake or an attack.
    pub max_body_bytes: usize,
    /// Longest a request body may take to arrive.
    pub body_timeout: Duration,
    /// The per-client limits.
    pub rate_limits: RateLimitSettings,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_timeout: Duration::from_secs(10),
            max_body_bytes: 64 * 1024,
            body_timeout: Duration::from_secs(10),
            rate_limits: RateLimitSettings::default(),
        }
    }
}

/// The whole API as one router, with the default [`Limits`].
pub fn router(state: AppState) -> Router {
    router_with_limits(state, Limits::default())
}

/// The whole API as one router.
pub fn router_with_limits(state: AppState, limits: Limits) -> Router {
    let guard = Arc::new(guard::Guard::new(limits.rate_limits.clone()));
    router_with_guard(state, limits, guard)
}

/// A path of the end-user API (`/api/v1…`), made at compile time.
macro_rules! api {
    ($path:literal) => {
        concat!("/api/v1", $path)
    };
}

/// A path of the admin API (`/api/v1/admin…`), made at compile time.
macro_rules! admin {
    ($path:literal) => {
        concat!("/api/v1/admin", $path)
    };
}

/// The whole API as one router, limiting through `guard` (which a test may inspect).
pub fn router_with_guard(state: AppState, limits: Limits, guard: Arc<guard::Guard>) -> Router {
    let admin = Router::new()
        .route(admin!("/events"), get(admin::list_events))
        .route(
            admin!("/events/{event_id}"),
            put(admin::put_event)
                .get(admin::get_event)
                .delete(admin::delete_event),
        )
        .route(admin!("/events/{event_id}/pause"), post(admin::pause))
        .route(admin!("/events/{event_id}/resume"), post(admin::resume))
        .route(admin!("/events/{event_id}/clear"), post(admin::clear))
        .route(
            admin!("/events/{event_id}/announcement"),
            post(sale::announce).delete(sale::clear_announcement),
        )
        .route(admin!("/events/{event_id}/end"), post(sale::end))
        .route(
            admin!("/events/{event_id}/invites"),
            post(admin::create_invites),
        )
        .route(admin!("/events/{event_id}/queue"), get(admin::queue_head))
        .route(admin!("/stats"), get(admin::stats))
        .route(admin!("/defaults"), get(admin::defaults))
        .route(admin!("/events/{event_id}/history"), get(records::history))
        .route(
            admin!("/events/{event_id}/history.csv"),
            get(records::history_csv),
        )
        .route(admin!("/audit"), get(records::audit_list))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admin::require_admin,
        ));

    let api = Router::new()
        .route(api!("/queue/join"), post(queue::join))
        .route(api!("/queue/status"), get(queue::status))
        .route(api!("/queue/heartbeat"), post(queue::heartbeat))
        .route(api!("/queue/enter"), post(queue::enter))
        .route(
            api!("/queue/leave"),
            post(queue::leave).delete(queue::leave),
        )
        .route(api!("/queue/verify"), post(queue::verify))
        .route(api!("/queue/info"), get(queue::info))
        .route(api!("/queue/ws"), get(live::ws))
        .route(api!("/queue/events"), get(live::events))
        .route(api!("/events"), get(pages::list_events))
        .route(api!("/events/{event_id}"), get(pages::get_event))
        .route(api!("/session/heartbeat"), post(queue::session_heartbeat))
        .route(api!("/session/complete"), post(queue::session_complete))
        // Merged, not nested: `nest` rewrites the URI of every request under its prefix
        // (a `format!` and an allocation per request, measured in PERFORMANCE.md).
        .merge(admin);

    // A span and two debug events per request: worth their cost only when someone reads
    // them. Without them `edge` logs the server errors the trace layer would have.
    let traced = tracing::enabled!(target: "tower_http::trace", tracing::Level::DEBUG);
    let layers = ServiceBuilder::new()
        .layer(edge::EdgeLayer::new(
            limits.max_body_bytes,
            limits.request_timeout,
            !traced,
        ))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(Extension(guard))
        .layer(RequestBodyTimeoutLayer::new(limits.body_timeout))
        // The body timeout changes the body type; the routes take axum's `Body` again. In
        // the same stack rather than a layer of its own: each `Router::layer` wraps every
        // route in one more boxed service, cloned on every request.
        .map_request(|req: Request<TimeoutBody<Body>>| req.map(Body::new));

    let router = Router::new()
        .merge(api)
        .route("/.well-known/jwks.json", get(queue::jwks))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/", get(pages::index))
        .route("/wait/{event_id}", get(look::wait))
        .route("/wait/{event_id}/theme.css", get(look::theme))
        .route("/branding/{file}", get(look::branding))
        .route("/demo/booking", get(pages::booking))
        .route("/admin", get(pages::admin))
        .route("/assets/{file}", get(pages::asset))
        // Both fallbacks before `.layer` so that they are measured and guarded too.
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(layers);
    let router = if traced {
        router.layer(TraceLayer::new_for_http())
    } else {
        router
    };
    router.with_state(state)
}

async fn not_found() -> AppError {
    AppError::NotFound
}

async fn method_not_allowed() -> AppError {
    AppError::MethodNotAllowed
}
