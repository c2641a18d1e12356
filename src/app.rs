//! [`AppState`]: what every request handler shares, and the one call that starts the
//! node's background tasks over it ([`AppState::start_background`]).

use std::path::Path;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use crate::catalog::EventCatalog;
use crate::clock::Clock;
use crate::gates::Gates;
use crate::history::History;
use crate::live::Live;
use crate::pow::{JoinRates, PowChallenges};
use crate::store::Store;
use crate::tasks::Tasks;
use crate::tokens::{AccessTokens, WaitingTokens};

#[derive(Clone)]
pub struct AppState {
    /// The queue state; the HTTP layer knows it only through the trait.
    pub store: Arc<dyn Store>,
    /// This node's copy of every event's settings, kept fresh by the store's notices: the
    /// checks made before a store call read it instead of the store.
    pub events: Arc<EventCatalog>,
    pub access: Arc<AccessTokens>,
    pub waiting: WaitingTokens,
    /// Issues and checks the proof-of-work challenges of joins.
    pub pow: PowChallenges,
    /// This node's join attempts per event, for proof of work that rises with load.
    pub join_rates: Arc<JoinRates>,
    /// Bearer token of the admin API.
    pub admin_token: Arc<str>,
    pub clock: Clock,
    pub metrics: PrometheusHandle,
    /// The events this node's scrapes set gauges for.
    pub gauged: Arc<crate::telemetry::Gauged>,
    /// Routes the store's notices to live connections (WebSocket, SSE); its routing task
    /// runs among the background tasks.
    pub live: Arc<Live>,
    /// Turns `true` when the server begins to shut down. Long-lived streams watch it and
    /// close at once: otherwise they would hold the graceful shutdown until its deadline.
    /// A sender (not a receiver) so that any holder can subscribe, and so that a state made
    /// without a server (tests, embedding) never reads as "shutting down".
    pub shutdown: Arc<watch::Sender<bool>>,
    /// The data dir's `branding/` folder, whose logos and stylesheets events may use
    /// (`/branding/{file}`); `None` serves none.
    pub branding_dir: Option<Arc<Path>>,
    /// Every event's figures over the last 24 h, sampled by a background task; in memory
    /// unless the server gave it a file (the embedded store's data dir).
    pub history: Arc<History>,
    /// Which event gates which requests in front of a site (gateway mode and
    /// `GET /api/v1/gate`), and the throttle of session renewals.
    pub gates: Arc<Gates>,
    /// Seat-map reads shared by the requests that ask for one event's at once.
    pub seat_reads: Arc<crate::store::seat_reads::SeatReads>,
}

impl AppState {
    /// A state around `store` with a fixed test key and admin token `admin`; for tests and
    /// for embedding. It starts nothing: see [`start_background`](Self::start_background).
    pub fn new(
        store: Arc<dyn Store>,
        signing_key: &ed25519_dalek::SigningKey,
        admin_token: &str,
        clock: Clock,
    ) -> anyhow::Result<Self> {
        Self::with_keys(store, std::slice::from_ref(signing_key), admin_token, clock)
    }

    /// As [`new`](Self::new), with several signing keys, oldest first (the last signs).
    pub fn with_keys(
        store: Arc<dyn Store>,
        signing_keys: &[ed25519_dalek::SigningKey],
        admin_token: &str,
        clock: Clock,
    ) -> anyhow::Result<Self> {
        let access = AccessTokens::from_signing_keys(signing_keys)?;
        Ok(AppState {
            events: Arc::new(EventCatalog::new(store.clone())),
            store,
            waiting: access.waiting_tokens(),
            pow: PowChallenges::with_older(access.pow_secrets()),
            join_rates: Arc::default(),
            access: Arc::new(access),
            admin_token: admin_token.into(),
            clock,
            metrics: crate::telemetry::prometheus(),
            gauged: Arc::default(),
            live: Arc::new(Live::new()),
            shutdown: Arc::new(watch::Sender::new(false)),
            branding_dir: None,
            history: Arc::new(History::default()),
            gates: Arc::default(),
            seat_reads: Arc::default(),
        })
    }

    /// Starts the node's background tasks over this state: the live hub (without it, live
    /// clients hear of changes only at their periodic refresh), the scheduler and the gauge
    /// upkeep (see [`crate::background`]). The server calls it once; a test that serves
    /// live updates without a server calls it too. Dropping the answer stops them.
    /// Must be called inside a tokio runtime.
    pub fn start_background(&self) -> Tasks {
        let mut tasks = crate::background::start(
            &self.store,
            &self.clock,
            &self.live,
            &self.events,
            &self.history,
        );
        tasks.spawn(
            crate::gates::TASK,
            crate::gates::run_refresh(
                self.gates.clone(),
                self.store.clone(),
                self.clock.clone(),
                self.store.subscribe_events(),
                tasks.stop_signal(),
            ),
        );
        tasks
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::AppState;
    use crate::clock::Clock;
    use crate::store::embedded::EmbeddedStore;

    /// Of the node's background tasks only the live hub hears every notice (a place's
    /// `Admitted` and `Ended`; the embedded store's moves reach it as marks, not notices);
    /// the others take only the notices about events.
    #[tokio::test]
    async fn only_the_live_hub_hears_every_notice() {
        let store = Arc::new(EmbeddedStore::new());
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let state = AppState::new(store.clone(), &key, "admin", Clock::manual(0)).unwrap();
        let _tasks = state.start_background();
        assert_eq!(store.notice_receivers(), 1);
    }
}
