//! [`AppState`]: what every request handler and background task shares.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{watch, Notify};

use crate::clock::Clock;
use crate::live::Live;
use crate::store::Store;
use crate::tokens::{AccessTokens, WaitingTokens};

#[derive(Clone)]
pub struct AppState {
    /// The queue state; the HTTP layer knows it only through the trait.
    pub store: Arc<dyn Store>,
    pub access: Arc<AccessTokens>,
    pub waiting: WaitingTokens,
    /// Bearer token of the admin API.
    pub admin_token: Arc<str>,
    pub clock: Clock,
    pub metrics: PrometheusHandle,
    /// Wakes the background scheduler early (an event was created or changed), so new
    /// deadlines and rate budgets are honoured without waiting for its next pass.
    pub wake: Arc<Notify>,
    /// Routes the store's notices to live connections (WebSocket, SSE).
    pub live: Arc<Live>,
    /// Turns `true` when the server begins to shut down. Long-lived streams watch it and
    /// close at once: otherwise they would hold the graceful shutdown until its deadline.
    /// A sender (not a receiver) so that any holder can subscribe, and so that a state made
    /// without a server (tests, embedding) never reads as "shutting down".
    pub shutdown: Arc<watch::Sender<bool>>,
}

impl AppState {
    /// A state around `store` with a fixed test key and admin token `admin`; for tests and
    /// for embedding.
    pub fn new(
        store: Arc<dyn Store>,
        signing_key: &ed25519_dalek::SigningKey,
        admin_token: &str,
        clock: Clock,
    ) -> anyhow::Result<Self> {
        let access = AccessTokens::from_signing_key(signing_key)?;
        Ok(AppState {
            store,
            waiting: access.waiting_tokens(),
            access: Arc::new(access),
            admin_token: admin_token.into(),
            clock,
            metrics: crate::telemetry::prometheus(),
            wake: Arc::new(Notify::new()),
            live: Arc::new(Live::new()),
            shutdown: Arc::new(watch::Sender::new(false)),
        })
    }
}
