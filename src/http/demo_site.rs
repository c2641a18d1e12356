//! The demo booking page's own server route, `POST /demo/booking/order`: what a real booking
//! site would put behind waitroom. It is guarded by the origin library
//! (`crates/waitroom-guard`), as a site's routes would be: the access token is verified
//! offline against the JWKS (here read from this process's own keys rather than fetched
//! over HTTP, the one difference from a separate site), and the handler reads the claims.

use axum::body::Bytes;
use axum::Json;
use serde::{Deserialize, Serialize};
use waitroom_guard::{AccessClaims, FnJwks, GuardLayer, Verifier};

use super::error::{AppError, AppResult};
use super::extract::AppJson;
use super::{route, Around, Routes};
use crate::app::AppState;
use crate::demo::DEMO_EVENT;

/// Path of the order route.
pub const ORDER_PATH: &str = "/demo/booking/order";

/// Body of `POST /demo/booking/order`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// `floor` or `balcony`.
    pub area: String,
}

/// The booked order: who booked, for which event and session.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub booked: bool,
    pub event_id: String,
    pub user_id: String,
    pub session_id: String,
    pub area: String,
}

/// The route, behind the guard layer. The event a token must be for is the page's
/// `?event=` (the booking page serves any event whose `target_url` points at it), the demo
/// event by default.
pub fn routes(state: &AppState, around: &Around) -> Routes<GuardLayer> {
    let access = state.access.clone();
    let verifier = Verifier::new(FnJwks(move || {
        Bytes::from(serde_json::to_vec(&access.jwks()).expect("the JWKS serializes"))
    }));
    let guard = GuardLayer::new(verifier).event_from(|parts| {
        let query = parts.uri.query().unwrap_or("");
        let event = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "event")
            .map(|(_, v)| v.into_owned());
        match event {
            Some(e) if e.is_empty() => None,
            Some(e) => Some(e),
            None => Some(DEMO_EVENT.to_string()),
        }
    });
    let mut site = Routes::new(around).inner(guard);
    route!(site, ORDER_PATH, post(order));
    site
}

/// `POST /demo/booking/order`: books the chosen area for the token's holder.
pub async fn order(
    claims: AccessClaims,
    AppJson(req): AppJson<OrderRequest>,
) -> AppResult<Json<Order>> {
    if req.area != "floor" && req.area != "balcony" {
        return Err(AppError::invalid("area must be floor or balcony"));
    }
    Ok(Json(Order {
        booked: true,
        event_id: claims.aud,
        user_id: claims.sub,
        session_id: claims.sid,
        area: req.area,
    }))
}
