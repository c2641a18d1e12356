//! Operations endpoints (`/healthz`, `/readyz`, `/metrics`); every request is measured by
//! [`super::edge`].
//!
//! `/healthz` says the process serves; `/readyz` says it can do useful work (the store
//! answers), so a load balancer can take a node whose store is gone out of rotation while
//! an orchestrator leaves the process running. A store that stopped for good (see
//! [`crate::store::Store::failed`]) fails both: only a restart mends it. `/metrics` refreshes the per-event gauges
//! from the store on each scrape, so they are exact at the moment they are read.

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use super::body::Health;
use super::error::{AppError, AppResult};
use super::Shared;
use crate::app::AppState;

/// How long `/readyz` waits for the store: probes run every few seconds, and an answer
/// that takes longer than this is as bad as none.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz`: `200` while the process serves; `503` once the store stopped for good
/// (the embedded store after its journal could not be written), which only a restart
/// mends: a supervisor that probes this restarts the process even if its shutdown hangs.
/// One atomic load: probes are frequent, and this is benchmarked.
pub async fn healthz(State(shared): State<Shared>) -> AppResult<Json<Health>> {
    if shared.app().store.failed() {
        return Err(AppError::Unavailable(
            "the store stopped writing; the server is shutting down to restart".into(),
        ));
    }
    Ok(Json(Health { status: "ok" }))
}

/// `GET /readyz`: `200` only when the store answers, in time, and the gate rules were read.
pub async fn readyz(State(state): State<AppState>) -> AppResult<Json<Health>> {
    match tokio::time::timeout(READY_TIMEOUT, state.store.ping()).await {
        // A node that cannot tell which requests are gated yet refuses them: not ready.
        // (Asked after the store, so that a store that is down is what `/readyz` says.)
        Ok(Ok(())) if !state.gates.is_loaded() => Err(AppError::Unavailable(
            "the gate rules are not read yet".into(),
        )),
        Ok(Ok(())) => Ok(Json(Health { status: "ready" })),
        Ok(Err(e)) => Err(AppError::Unavailable(e.to_string())),
        Err(_) => Err(AppError::Unavailable("store ping timed out".into())),
    }
}

/// `GET /metrics`: Prometheus text. A store outage must not blind the scrape (that is when
/// metrics matter most), so the gauges are then left as they were and
/// `waitroom_store_up` says why.
pub async fn metrics(State(state): State<AppState>) -> AppResult<impl IntoResponse> {
    let listed = state.store.list_events(state.clock.now()).await;
    let (gauged, handle) = (state.gauged.clone(), state.metrics.clone());
    // At thousands of events, setting their gauges and writing the text take a thread tens
    // of milliseconds (2,000 events: ~55 ms for 1 MB); on a runtime worker the requests
    // behind it waited as long (`bench/metrics_scrape.py`: a status p99.9 of 55 ms against
    // 5 ms without scrapes). A blocking thread leaves the workers to the queue.
    let body = tokio::task::spawn_blocking(move || {
        let up = match listed {
            Ok(events) => {
                gauged.record(events.iter().map(|e| (e.event_id.as_str(), &e.figures)));
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read events");
                false
            }
        };
        metrics::gauge!("waitroom_store_up").set(if up { 1.0 } else { 0.0 });
        handle.render()
    })
    .await
    .map_err(|e| AppError::Internal(format!("rendering the metrics: {e}")))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    ))
}
