//! waitroom: a virtual waiting room. People join a per-event queue, see their exact
//! position, and are let through at a pace the protected site can bear, each with a signed
//! access token.
//!
//! How the pieces fit, from the bottom up (a module imports only from modules above it in
//! this list, never from one below):
//! - [`core`]: the queue rules, pure (time is an argument): states, capacity, pace, ETA,
//!   exact positions, expiry. Imports nothing from the crate.
//! - [`clock`], [`tasks`], [`tokens`], [`telemetry`]: the time source; the stop signal and
//!   named background tasks; waiting tokens (random + MAC) and access tokens (Ed25519 JWT);
//!   Prometheus metrics and `tracing` logs.
//! - [`pow`]: proof-of-work challenges for joins (stateless, MAC'd) and their check.
//! - [`store`]: the [`store::Store`] contract (atomic per event) and its backends; the
//!   conformance suite that every backend passes. Every change is also a [`store::Notice`],
//!   relayed to every node.
//! - [`audit`]: the admin audit (a log line and a bounded list in the store per change).
//! - [`history`]: each event's figures every 10 s for 24 h, sampled by a background task.
//! - [`catalog`]: this node's copy of every event's settings, kept fresh by notices.
//! - [`gates`]: which event gates which requests in front of a site; session renewals.
//! - [`config`]: layered settings (defaults, TOML, environment, flags).
//! - [`scheduler`]: the tick that ends lapsed places and paces admissions, on time.
//! - [`live`]: live updates of one place, fed by one hub that routes the store's notices
//!   (coalesced position refreshes, instant admissions and ends).
//! - [`demo`]: the demo event and its simulated crowd.
//! - [`background`]: starts the node's background tasks (live hub, scheduler, gauge upkeep),
//!   each reacting to the store's notices.
//! - [`app`]: [`AppState`], what every request handler shares.
//! - [`http`]: the axum router: end-user, admin and operations API, live endpoints, the
//!   embedded pages ([`http::pages`]), JSON errors.
//! - [`gateway`]: gateway mode: the reverse proxy in front of a site, queueing gated paths.
//! - [`server`]: startup: config to a running server, background tasks started and joined
//!   by name, graceful shutdown.

pub mod alloc;
pub mod app;
pub mod audit;
pub mod background;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod core;
pub mod demo;
pub mod gates;
pub mod gateway;
pub mod history;
pub mod http;
pub mod live;
pub mod pow;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod tokens;

pub use app::AppState;
pub use clock::Clock;
