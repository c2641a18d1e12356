//! waitroom: a virtual waiting room. People join a per-event queue, see their exact
//! position, and are let through at a pace the protected site can bear, each with a signed
//! access token.
//!
//! How the pieces fit:
//! - [`core`]: the queue rules, pure (time is an argument): states, capacity, pace, ETA,
//!   exact positions, expiry.
//! - [`store`]: the [`store::Store`] contract (atomic per event) and its backends; the
//!   conformance suite that every backend passes.
//! - [`tokens`]: waiting tokens (random + MAC) and access tokens (Ed25519 JWT).
//! - [`http`]: the axum router: end-user, admin and operations API, JSON errors.
//! - [`live`]: live updates of one place over WebSocket or SSE, fed by one hub that routes
//!   the store's notices (coalesced position refreshes, instant admissions).
//! - [`http::pages`]: the embedded pages: waiting room, landing, demo booking, dashboard.
//! - [`scheduler`]: background work: expiries and rate-paced admissions, on time.
//! - [`server`]: startup: config to a running server, graceful shutdown.
//! - [`config`]: layered settings (defaults, TOML, environment, flags).
//! - [`telemetry`]: Prometheus metrics and `tracing` logs.

pub mod app;
pub mod clock;
pub mod config;
pub mod core;
pub mod http;
pub mod live;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tokens;

pub use app::AppState;
pub use clock::Clock;
