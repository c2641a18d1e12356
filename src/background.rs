//! The node's background tasks, started together by [`start`]: the live hub, the scheduler,
//! the gauge upkeep, the store's memory gauges (Redis), the event catalog's upkeep and the figures' history. The server adds the demo crowd when asked, and stops and joins them
//! all by name at shutdown; tests that build an [`crate::AppState`] without a server start
//! the same set with [`crate::AppState::start_background`].
//!
//! Each task reacts to the store's [`Notice`]s, which the store publishes for changes made
//! on any node, so a side effect of a change (waking the scheduler, forgetting a deleted
//! event's gauges, ending its live followers) happens on every node, not only on the one
//! that served the request.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::catalog::EventCatalog;
use crate::clock::Clock;
use crate::history::{self, History};
use crate::live::Live;
use crate::scheduler;
use crate::store::{Notice, Store};
use crate::tasks::{stopped, Stop, Tasks};
use crate::telemetry;

/// Task names, as logs and shutdown warnings show them.
pub const LIVE_HUB: &str = "live-hub";
pub const SCHEDULER: &str = "scheduler";
pub const GAUGES: &str = "gauges";
pub const CATALOG: &str = "catalog";
pub const HISTORY: &str = "history";
pub const STORE_MEMORY: &str = "store-memory";

/// How often each node samples the store's memory per event. Low: a gauge of memory is read
/// for trends, and each sample is one Redis round trip per event.
pub const STORE_MEMORY_EVERY: Duration = Duration::from_secs(30);

/// Starts the live hub, the scheduler and the gauge upkeep over `store`. Each subscribes to
/// the store's notices here, before this returns, so nothing published afterwards is
/// missed. Must be called inside a tokio runtime.
pub fn start(
    store: &Arc<dyn Store>,
    clock: &Clock,
    live: &Live,
    catalog: &Arc<EventCatalog>,
    history: &Arc<History>,
) -> Tasks {
    let mut tasks = Tasks::new();
    let stop = tasks.stop_signal();
    tasks.spawn(
        LIVE_HUB,
        live.run(store.subscribe(), store.moved_events(), stop.clone()),
    );
    tasks.spawn(
        SCHEDULER,
        scheduler::run(
            store.clone(),
            clock.clone(),
            store.subscribe_events(),
            stop.clone(),
        ),
    );
    tasks.spawn(
        CATALOG,
        catalog.clone().run(store.subscribe_events(), stop.clone()),
    );
    tasks.spawn(
        HISTORY,
        history::run(
            history.clone(),
            store.clone(),
            clock.clone(),
            store.subscribe_events(),
            stop.clone(),
        ),
    );
    tasks.spawn(
        STORE_MEMORY,
        sample_store_memory(
            store.clone(),
            store.subscribe_events(),
            STORE_MEMORY_EVERY,
            stop.clone(),
        ),
    );
    tasks.spawn(
        GAUGES,
        forget_deleted_events(store.subscribe_events(), stop),
    );
    tasks
}

/// Sets `waitroom_store_memory_bytes` of every event from the store's own estimate, every
/// `every` (the first time at once), and of an event as soon as it is created or its
/// settings change (so a new event shows on dashboards at once; admin changes are rare),
/// until `stop`. A backend that does not tell ([`Store::memory_usage`] answers `None`, as
/// the embedded store does) ends the task at its first answer. A failed sample keeps the
/// last figure and is tried again next time.
pub async fn sample_store_memory(
    store: Arc<dyn Store>,
    mut notices: broadcast::Receiver<Notice>,
    every: Duration,
    mut stop: Stop,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ids = tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            _ = tick.tick() => match store.event_ids().await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::debug!(error = %e, "store memory sample skipped");
                    continue;
                }
            },
            r = notices.recv() => match r {
                Ok(Notice::EventChanged { event_id }) => vec![event_id.to_string()],
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => break,
            },
        };
        for id in ids {
            // One call per event: with thousands of events and the store away (each call
            // waiting out its timeout), a round must not hold up the node's shutdown.
            let sampled = tokio::select! {
                biased;
                _ = stopped(&mut stop) => return,
                r = store.memory_usage(&id) => r,
            };
            match sampled {
                Ok(Some(bytes)) => telemetry::record_store_memory(&id, bytes),
                Ok(None) => return,
                // Deleted meanwhile, or the store is away: the next round will tell.
                Err(e) => tracing::debug!(event = %id, error = %e, "store memory sample failed"),
            }
        }
    }
}

/// Zeroes the gauges of every event the store says was deleted, until `stop`.
pub async fn forget_deleted_events(mut notices: broadcast::Receiver<Notice>, mut stop: Stop) {
    loop {
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            r = notices.recv() => match r {
                Ok(Notice::EventDeleted { event_id }) => telemetry::forget_event(&event_id),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "gauge upkeep lagged; a deleted event's gauges may linger");
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
        }
    }
}
