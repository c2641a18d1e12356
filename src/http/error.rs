//! [`AppError`]: every way a request can fail, and the one place that turns a failure into
//! the contract's `{"error": {"code", "message"}}` body with its status and headers.
//!
//! Handlers and extractors return `AppError` (directly or through `?` on store and queue
//! errors), so no response of ours can escape in axum's plain-text rejection format.
//! Internal failures are logged in full and answered with a generic message, so a 500
//! never leaks details of the server; the log lines of internal errors and of a store that
//! does not answer are within a [`LogBudget`] each.

use std::time::Duration;

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::core::QueueError;
use crate::pow::{Challenge, PowError};
use crate::store::StoreError;
use crate::telemetry::budget::{log_within, LogBudget, PER_REQUEST_LINES};

/// The stable error codes of the API contract, as constants so that handlers and tests
/// cannot drift apart by a typo. Those of queue errors are the core's own
/// ([`QueueError::code`]), so a store and the API cannot name one error two ways.
pub mod code {
    use crate::core::QueueError;

    /// Declares each code as a constant and lists them all in [`ALL`], so that the list the
    /// contract tests compare with API.md and the OpenAPI document cannot miss one.
    macro_rules! codes {
        ($($name:ident = $value:expr;)*) => {
            $(pub const $name: &str = $value;)*
            /// Every code above, in declaration order.
            pub const ALL: &[&str] = &[$($name),*];
        };
    }

    codes! {
        INVALID_REQUEST = QueueError::INVALID_CODE;
        MISSING_TOKEN = "MISSING_TOKEN";
        TOKEN_INVALID = "TOKEN_INVALID";
        ACCESS_DENIED = "ACCESS_DENIED";
        UNAUTHORIZED = "UNAUTHORIZED";
        USER_TOKEN_INVALID = "USER_TOKEN_INVALID";
        USER_TOKEN_EXPIRED = "USER_TOKEN_EXPIRED";
        USER_TOKEN_REQUIRED = "USER_TOKEN_REQUIRED";
        ALREADY_JOINED = QueueError::AlreadyJoined.code();
        INVITE_REQUIRED = QueueError::InviteRequired.code();
        INVITE_INVALID = QueueError::InviteInvalid.code();
        NOT_READY = QueueError::NotReady.code();
        TOKEN_EXPIRED = QueueError::TokenExpired.code();
        TOKEN_NOT_FOUND = QueueError::TokenNotFound.code();
        EVENT_NOT_FOUND = QueueError::EventNotFound.code();
        NOT_FOUND = "NOT_FOUND";
        METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED";
        EVENT_CLOSED = QueueError::EventClosed.code();
        RATE_LIMITED = "RATE_LIMITED";
        PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE";
        QUEUE_FULL = QueueError::QueueFull.code();
        EVENT_FULL = QueueError::EventFull.code();
        UNAVAILABLE = "UNAVAILABLE";
        INTERNAL = "INTERNAL";
        POW_REQUIRED = "POW_REQUIRED";
        POW_INVALID = "POW_INVALID";
        UPSTREAM_UNAVAILABLE = "UPSTREAM_UNAVAILABLE";
        NOT_IMPLEMENTED = "NOT_IMPLEMENTED";
        HOLD_CONFLICT = QueueError::HoldConflict.code();
        ITEM_NOT_FOUND = QueueError::ItemNotFound.code();
        TOO_MANY_HOLDS = QueueError::TooManyHolds.code();
        INVENTORY_FULL = QueueError::InventoryFull.code();
        EXTENSION_LIMIT = QueueError::ExtensionLimit.code();
    }
}

/// `Retry-After` of a full queue: long enough that a crowd of refused clients does not
/// hammer the server, short enough that places freed by leavers are taken up quickly.
pub const QUEUE_FULL_RETRY_AFTER_SEC: u64 = 10;
/// `Retry-After` past the live-stream cap: a stream closes when its tab does.
pub const TOO_MANY_STREAMS_RETRY_AFTER_SEC: u64 = 30;
/// `Retry-After` while the store is unreachable: a restart or failover usually takes seconds.
pub const UNAVAILABLE_RETRY_AFTER_SEC: u64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Malformed JSON, wrong types, missing fields, out-of-range values.
    #[error("{0}")]
    InvalidRequest(String),
    /// A body over the size limit; same code as other bad input, but status 413.
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("a token is required")]
    MissingToken,
    #[error("the token is malformed or was not issued by this server")]
    TokenInvalid,
    #[error("access denied: the token is invalid or expired, or its session has ended")]
    AccessDenied,
    #[error("a valid admin token is required")]
    Unauthorized,
    #[error("the place has not been admitted yet")]
    NotReady,
    #[error("the place expired")]
    TokenExpired,
    #[error("the place is gone")]
    TokenNotFound,
    #[error("unknown event")]
    EventNotFound,
    /// No route matches the path.
    #[error("no such endpoint")]
    NotFound,
    /// The path exists, the method does not.
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    #[error("the event does not accept joins now")]
    EventClosed,
    /// A `user_token` with a bad signature, garbled, for another event, or signed with a
    /// key the event does not trust.
    #[error("the user token is invalid: {0}")]
    UserTokenInvalid(&'static str),
    #[error("the user token has expired")]
    UserTokenExpired,
    #[error("this event requires a user token signed by the site")]
    UserTokenRequired,
    #[error("this user already holds a place; prove the identity (user token or server key) to get it back")]
    AlreadyJoined,
    #[error("this event is invite-only: an invite code is required")]
    InviteRequired,
    #[error("the invite code is unknown or already used")]
    InviteInvalid,
    /// A per-client limit (see [`super::guard`]).
    #[error("too many requests")]
    RateLimited(super::guard::Refusal),
    /// More live streams of one place than [`super::guard::MAX_STREAMS_PER_PLACE`].
    #[error("too many live streams for this place")]
    TooManyStreams,
    #[error("the queue is full")]
    QueueFull,
    /// A `reject` event with no room: it keeps no queue.
    #[error("the event is full and keeps no queue: try again later")]
    EventFull,
    /// The store cannot be reached or did not answer in time. The detail is logged, not sent.
    #[error("the service is temporarily unavailable")]
    Unavailable(String),
    /// A bug. The detail is logged, not sent.
    #[error("internal error")]
    Internal(String),
    /// The event asks for proof of work and the join brought none; answers a challenge.
    #[error("this event asks for proof of work: solve the challenge and join again")]
    PowRequired(Box<Challenge>),
    /// The proof of work was wrong, expired, for another event, forged, too easy, already
    /// used, or its nonce empty or over 64 bytes ([`PowError`] says which); answers a fresh
    /// challenge.
    #[error("{0}: solve the new challenge and join again")]
    PowInvalid(PowError, Box<Challenge>),
    /// A refusal of the sale's rules (holds, inventory, extensions): the queue error's own
    /// code and message ([`AppError::sale_status`]).
    #[error("{0}")]
    Sale(QueueError),
    /// `TOKEN_NOT_FOUND` or `EVENT_CLOSED` because the sale ended: the same code, status and
    /// message, plus `error.reason` (`sold_out`, `closed`, `cancelled`).
    #[error("{0}")]
    SaleEnded(Box<AppError>, &'static str),
}

impl AppError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        AppError::InvalidRequest(msg.into())
    }

    /// The status of a sale refusal: an unknown item is not found, the others conflict
    /// with the state of the sale.
    fn sale_status(e: &QueueError) -> StatusCode {
        match e {
            QueueError::ItemNotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::CONFLICT,
        }
    }

    pub fn status(&self) -> StatusCode {
        use AppError::*;
        match self {
            SaleEnded(inner, _) => inner.status(),
            InvalidRequest(_) | MissingToken => StatusCode::BAD_REQUEST,
            PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            TokenInvalid | AccessDenied | Unauthorized => StatusCode::UNAUTHORIZED,
            UserTokenInvalid(_) | UserTokenExpired | UserTokenRequired => StatusCode::UNAUTHORIZED,
            NotReady | InviteRequired | InviteInvalid => StatusCode::FORBIDDEN,
            AlreadyJoined => StatusCode::CONFLICT,
            TokenExpired | TokenNotFound | EventNotFound | NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            EventClosed => StatusCode::CONFLICT,
            RateLimited(_) | TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
            QueueFull | EventFull | Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            PowRequired(_) | PowInvalid(..) => StatusCode::PRECONDITION_REQUIRED,
            Sale(e) => Self::sale_status(e),
        }
    }

    pub fn code(&self) -> &'static str {
        use AppError::*;
        match self {
            SaleEnded(inner, _) => inner.code(),
            InvalidRequest(_) => code::INVALID_REQUEST,
            PayloadTooLarge(_) => code::PAYLOAD_TOO_LARGE,
            MissingToken => code::MISSING_TOKEN,
            TokenInvalid => code::TOKEN_INVALID,
            AccessDenied => code::ACCESS_DENIED,
            Unauthorized => code::UNAUTHORIZED,
            NotReady => code::NOT_READY,
            TokenExpired => code::TOKEN_EXPIRED,
            TokenNotFound => code::TOKEN_NOT_FOUND,
            EventNotFound => code::EVENT_NOT_FOUND,
            NotFound => code::NOT_FOUND,
            MethodNotAllowed => code::METHOD_NOT_ALLOWED,
            EventClosed => code::EVENT_CLOSED,
            UserTokenInvalid(_) => code::USER_TOKEN_INVALID,
            UserTokenExpired => code::USER_TOKEN_EXPIRED,
            UserTokenRequired => code::USER_TOKEN_REQUIRED,
            AlreadyJoined => code::ALREADY_JOINED,
            InviteRequired => code::INVITE_REQUIRED,
            InviteInvalid => code::INVITE_INVALID,
            RateLimited(_) | TooManyStreams => code::RATE_LIMITED,
            QueueFull => code::QUEUE_FULL,
            EventFull => code::EVENT_FULL,
            Unavailable(_) => code::UNAVAILABLE,
            Internal(_) => code::INTERNAL,
            PowRequired(_) => code::POW_REQUIRED,
            PowInvalid(..) => code::POW_INVALID,
            Sale(e) => e.code(),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            AppError::RateLimited(r) => Some(r.retry_after_sec),
            AppError::TooManyStreams => Some(TOO_MANY_STREAMS_RETRY_AFTER_SEC),
            AppError::QueueFull | AppError::EventFull => Some(QUEUE_FULL_RETRY_AFTER_SEC),
            AppError::Unavailable(_) => Some(UNAVAILABLE_RETRY_AFTER_SEC),
            _ => None,
        }
    }

    /// For the access-token endpoints every refusal by the store means the same thing to
    /// the protected site ("this token does not grant access"), so queue-rule errors
    /// collapse into `ACCESS_DENIED`; only an unreachable store stays distinct.
    pub fn from_session_error(e: StoreError) -> Self {
        match e {
            StoreError::Queue(_) => AppError::AccessDenied,
            StoreError::Unavailable(_) => e.into(),
        }
    }
}

impl From<super::guard::Refusal> for AppError {
    fn from(r: super::guard::Refusal) -> Self {
        AppError::RateLimited(r)
    }
}

impl From<QueueError> for AppError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Invalid(m) => AppError::InvalidRequest(m),
            QueueError::EventNotFound => AppError::EventNotFound,
            QueueError::EventClosed => AppError::EventClosed,
            QueueError::QueueFull => AppError::QueueFull,
            QueueError::TokenNotFound => AppError::TokenNotFound,
            QueueError::TokenExpired => AppError::TokenExpired,
            QueueError::NotReady => AppError::NotReady,
            QueueError::NoSession => AppError::AccessDenied,
            QueueError::AlreadyJoined => AppError::AlreadyJoined,
            QueueError::InviteRequired => AppError::InviteRequired,
            QueueError::InviteInvalid => AppError::InviteInvalid,
            QueueError::HoldConflict
            | QueueError::ItemNotFound
            | QueueError::TooManyHolds
            | QueueError::InventoryFull
            | QueueError::ExtensionLimit => AppError::Sale(e),
            QueueError::EventFull => AppError::EventFull,
        }
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Queue(q) => q.into(),
            StoreError::Unavailable(m) => AppError::Unavailable(m),
        }
    }
}

/// Too large is the only body failure that is not plain bad input.
pub(super) fn body_error(status: StatusCode, text: String) -> AppError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        AppError::PayloadTooLarge("the request body is too large".into())
    } else {
        AppError::InvalidRequest(text)
    }
}

impl From<JsonRejection> for AppError {
    fn from(r: JsonRejection) -> Self {
        // axum answers 415 for a missing JSON content type and 422 for wrong types; the
        // contract folds both into 400 INVALID_REQUEST.
        body_error(r.status(), r.body_text())
    }
}

impl From<BytesRejection> for AppError {
    fn from(r: BytesRejection) -> Self {
        body_error(r.status(), r.body_text())
    }
}

impl From<QueryRejection> for AppError {
    fn from(r: QueryRejection) -> Self {
        AppError::InvalidRequest(r.body_text())
    }
}

impl From<PathRejection> for AppError {
    fn from(r: PathRejection) -> Self {
        AppError::InvalidRequest(r.body_text())
    }
}

/// The one error body of the contract: `{"error": {"code", "message"}}`, plus the
/// challenge of a proof-of-work refusal.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    pub code: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge: Option<&'a Challenge>,
    /// Why the sale ended, on `TOKEN_NOT_FOUND` and `EVENT_CLOSED` after its end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The request's trace id (32 hex digits), only when tracing export is on: what an
    /// operator searches the traces and logs for when a user reports this error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        // Each kind within its own budget: in an outage every request fails alike.
        static INTERNAL: LogBudget = LogBudget::new(PER_REQUEST_LINES, Duration::from_secs(1));
        static UNAVAILABLE: LogBudget = LogBudget::new(PER_REQUEST_LINES, Duration::from_secs(1));
        match &self {
            AppError::Internal(detail) => log_within!(INTERNAL, error, %detail, "internal error"),
            AppError::Unavailable(detail) => {
                log_within!(UNAVAILABLE, warn, %detail, "store unavailable")
            }
            _ => {}
        }
        let status = self.status();
        let challenge = match &self {
            AppError::PowRequired(c) | AppError::PowInvalid(_, c) => Some(&**c),
            _ => None,
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
                challenge,
                reason: match &self {
                    AppError::SaleEnded(_, r) => Some(r),
                    _ => None,
                },
                trace_id: crate::telemetry::otel::current_trace_id(),
            },
        };
        let mut res = (status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after() {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let AppError::RateLimited(r) = &self {
            r.write_headers(res.headers_mut());
        }
        if matches!(self, AppError::Unauthorized) {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        let inner = match &self {
            AppError::SaleEnded(inner, _) => inner,
            e => e,
        };
        if matches!(inner, AppError::QueueFull | AppError::EventFull) {
            res.extensions_mut().insert(super::edge::NotAFailure);
        }
        res
    }
}

pub type AppResult<T> = Result<T, AppError>;

/// An error of a route whose answers are about one place (join, status, the live stream):
/// sent with `Cache-Control: no-store` as their answers are, so a shared cache cannot hand
/// one person's `TOKEN_EXPIRED` or `ALREADY_JOINED` to the next one asking (API.md, Admin
/// API).
pub struct PlaceError(pub AppError);

impl<E: Into<AppError>> From<E> for PlaceError {
    fn from(e: E) -> Self {
        PlaceError(e.into())
    }
}

impl IntoResponse for PlaceError {
    fn into_response(self) -> Response {
        let mut res = self.0.into_response();
        res.headers_mut()
            .insert(header::CACHE_CONTROL, super::NO_STORE.clone());
        res
    }
}

/// The result of a route whose answers are about one place ([`PlaceError`]).
pub type PlaceResult<T> = Result<T, PlaceError>;
