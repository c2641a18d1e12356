//! A `tower` layer for a site behind waitroom: every request must carry a waitroom access
//! token (`Authorization: Bearer`), verified offline against waitroom's JWKS (fetched,
//! cached, refreshed when a token names an unknown `kid`, at most once per interval: 1 s by
//! default, and such a token that comes sooner waits for that next fetch). The
//! token's [`AccessClaims`] go into the request's extensions, and with the `axum` feature
//! are an extractor. A refused request answers `401` (`503` when no key could ever be
//! fetched) with waitroom's error shape, `{"error": {"code": "ACCESS_DENIED", "message"}}`.
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use waitroom_guard::{AccessClaims, GuardLayer, Verifier};
//!
//! async fn book(claims: AccessClaims) -> String {
//!     format!("booked for {} at {}", claims.user_id(), claims.event_id())
//! }
//!
//! let verifier = Verifier::from_url("http://127.0.0.1:8080/.well-known/jwks.json".parse().unwrap());
//! let app: Router = Router::new()
//!     .route("/book", post(book))
//!     .layer(GuardLayer::new(verifier).event("concert-a"));
//! ```
//!
//! What this checks is the token alone: signature, issuer, event and expiry. Whether the
//! session was ended early (`session/complete`, idle timeout) only waitroom knows; a site
//! that must know asks `POST /api/v1/queue/verify`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Request, Response, StatusCode};

mod verifier;

pub use verifier::{
    AccessClaims, FnJwks, HttpJwks, JwksSource, Refresh, Refusal, Verifier, ISSUER,
};

/// Reads the event a request names (from its path or query).
pub type EventOf = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;

/// Which event a request's token must be for.
#[derive(Clone)]
pub enum EventRule {
    /// None chosen yet: [`GuardLayer::new`]'s, which the layer refuses to be built with.
    Unset,
    /// Any event (the claims still name it: the handler decides), chosen explicitly with
    /// [`GuardLayer::any_event`].
    Any,
    /// This event.
    Is(Arc<str>),
    /// The event a request names (from its path or query); `None` refuses the request.
    From(Arc<EventOf>),
}

/// The layer; see the crate's documentation.
#[derive(Clone)]
pub struct GuardLayer {
    verifier: Verifier,
    event: EventRule,
    query_param: Option<Arc<str>>,
}

impl GuardLayer {
    /// A layer that must still be told which event's tokens it takes: [`event`](Self::event),
    /// [`event_from`](Self::event_from) or, explicitly, [`any_event`](Self::any_event).
    /// Building a service without one panics: taking any event's token by default let a
    /// token of a quiet event with no line (handed out at once) pass a busy event's site.
    pub fn new(verifier: Verifier) -> Self {
        GuardLayer {
            verifier,
            event: EventRule::Unset,
            query_param: None,
        }
    }

    /// Tokens of any event on the server: the handler reads [`AccessClaims::event_id`] and
    /// decides. Only for a site that serves every event itself.
    pub fn any_event(mut self) -> Self {
        self.event = EventRule::Any;
        self
    }

    /// Only tokens issued for `event_id`.
    pub fn event(mut self, event_id: &str) -> Self {
        self.event = EventRule::Is(event_id.into());
        self
    }

    /// Only tokens for the event `f` reads from the request.
    pub fn event_from(
        mut self,
        f: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.event = EventRule::From(Arc::new(f));
        self
    }

    /// Also take the token from this query parameter (e.g. `waitroom_token`, which the
    /// waiting room appends to `target_url`) when there is no `Authorization` header.
    pub fn query_param(mut self, name: &str) -> Self {
        self.query_param = Some(name.into());
        self
    }
}

impl<S> tower_layer::Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        assert!(
            !matches!(self.event, EventRule::Unset),
            "waitroom_guard::GuardLayer needs the event whose tokens it takes: \
             .event(id), .event_from(f), or .any_event() for a site serving every event"
        );
        Guard {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`GuardLayer`] makes.
#[derive(Clone)]
pub struct Guard<S> {
    inner: S,
    layer: GuardLayer,
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for Guard<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was made ready goes with this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let checked = match token_of(&parts, layer.query_param.as_deref()) {
                None => Err(Refusal::Missing),
                Some(token) => {
                    let event = match &layer.event {
                        EventRule::Any => Ok(None),
                        // `layer` refuses to build with it; were it reached, refused.
                        EventRule::Unset => Err(Refusal::WrongEvent),
                        EventRule::Is(e) => Ok(Some(e.to_string())),
                        EventRule::From(f) => f(&parts).map(Some).ok_or(Refusal::WrongEvent),
                    };
                    match event {
                        Ok(event) => layer.verifier.verify(&token, event.as_deref()).await,
                        Err(r) => Err(r),
                    }
                }
            };
            match checked {
                Ok(claims) => {
                    parts.extensions.insert(claims);
                    inner.call(Request::from_parts(parts, body)).await
                }
                Err(refusal) => Ok(refusal_response(refusal)),
            }
        })
    }
}

/// The access token: the first `Authorization: Bearer` credential (other schemes, such as
/// a staging site's `Basic`, are passed over), else the query parameter the route was
/// told of.
fn token_of(parts: &http::request::Parts, query_param: Option<&str>) -> Option<String> {
    let bearer = parts
        .headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .find_map(|v| {
            let line = v.as_bytes().trim_ascii();
            let at = line.iter().position(|&b| b == b' ')?;
            let (scheme, token) = (&line[..at], line[at..].trim_ascii());
            if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
                return None;
            }
            // A token that is not text is a wrong one (refused), as waitroom reads it,
            // not none (which would fall through to the query parameter).
            Some(String::from_utf8_lossy(token).into_owned())
        });
    if bearer.is_some() {
        return bearer;
    }
    let name = query_param?;
    parts.uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        // Tokens are base64url and dots: nothing to percent-decode.
        (k == name && !v.is_empty()).then(|| v.to_string())
    })
}

/// The answer to a refused request, in waitroom's error shape.
pub fn refusal_response<B: From<String>>(refusal: Refusal) -> Response<B> {
    let (status, code) = match refusal {
        Refusal::KeysUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        _ => (StatusCode::UNAUTHORIZED, "ACCESS_DENIED"),
    };
    let body = serde_json::json!({"error": {"code": code, "message": refusal.message()}});
    let mut res = Response::new(B::from(body.to_string()));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::UNAUTHORIZED {
        h.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer error=\"invalid_token\""),
        );
    } else {
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    res
}

#[cfg(feature = "axum")]
mod extract {
    use axum_core::extract::FromRequestParts;
    use axum_core::response::{IntoResponse, Response};

    use super::{refusal_response, AccessClaims, Refusal};

    /// The claims the layer put there; without the layer in front, every request is refused
    /// (a route left unguarded by mistake fails closed).
    impl<S: Send + Sync> FromRequestParts<S> for AccessClaims {
        type Rejection = Response;

        async fn from_request_parts(
            parts: &mut http::request::Parts,
            _: &S,
        ) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<AccessClaims>()
                .cloned()
                .ok_or_else(|| {
                    refusal_response::<axum_core::body::Body>(Refusal::Missing).into_response()
                })
        }
    }
}
