//! [`AppState`]: what every request handler and background task shares.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Notify;

use crate::clock::Clock;
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
        })
    }
}
