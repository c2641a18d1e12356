//! [`Gates`]: this node's table of which event gates which requests (every event's gate
//! rules, `core::gate`), read without a lock by every proxied request and every
//! `GET /api/v1/gate`, and the throttle of session renewals.
//!
//! The table is rebuilt from the store by a background task ([`run_refresh`]) whenever an
//! event is created, changed or deleted on any node (the store's notices), and every few
//! seconds in case a notice was missed.
//!
//! Renewals: each request of an admitted person renews the session's idle deadline, but a
//! store write per proxied request would make the store the gateway's bottleneck. A
//! session renewed less than [`renew_every`] ago passes on this node's word; the store is
//! asked again after that (which also notices a session ended elsewhere: completed on
//! another node, cleared by an admin), so a session's end is seen within that interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::core::{GateRules, Millis, PlaceKey};
use crate::store::{Notice, Store};
use crate::tasks::{stopped, Stop};

/// The refresh task's name.
pub const TASK: &str = "gates";
/// How often the table is rebuilt even without a notice.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5);
/// Most sessions whose last renewal this node remembers; past it the lapsed ones are
/// forgotten (and, at worst, a live one is renewed in the store a little early).
const MAX_RENEWALS: usize = 100_000;

/// One event's rules in the table.
#[derive(Debug, Clone)]
pub struct Gate {
    pub event_id: Arc<str>,
    pub rules: GateRules,
    /// The event's idle timeout, for the renewal throttle.
    pub session_idle_ms: Millis,
}

/// How long a renewal stands before the store is asked again: a quarter of the idle
/// timeout (so a session in use never lapses between two renewals), at most 10 s.
pub fn renew_every(session_idle_ms: Millis) -> Millis {
    (session_idle_ms / 4).clamp(1, 10_000)
}

/// A session this node renewed.
#[derive(Debug, Clone)]
pub struct Renewal {
    /// When the store last renewed it.
    pub at: Millis,
    /// Its hard end (`session_max_sec`), or sooner.
    pub ends_at: Millis,
    /// Its user id, or `None` for an anonymous place.
    pub user_id: Option<Arc<str>>,
}

#[derive(Default)]
pub struct Gates {
    /// Cookies are `Secure` even on plain http (the `cookie_secure` setting: TLS ends
    /// before us at a proxy we do not trust to say so).
    pub secure_cookies: bool,
    table: ArcSwap<Vec<Arc<Gate>>>,
    renewals: Mutex<HashMap<(Arc<str>, PlaceKey), Renewal>>,
}

impl Gates {
    /// A table whose session cookies are always `Secure` (the `cookie_secure` setting).
    pub fn with_secure_cookies() -> Self {
        Gates {
            secure_cookies: true,
            ..Gates::default()
        }
    }

    /// The event that gates a request to `host` and `path` (the longest matching prefix;
    /// the first event by id on a tie).
    pub fn find(&self, host: Option<&str>, path: &str) -> Option<Arc<Gate>> {
        let table = self.table.load();
        let mut best: Option<(usize, &Arc<Gate>)> = None;
        for g in table.iter() {
            if let Some(n) = g.rules.gates(host, path) {
                if best.is_none_or(|(m, _)| n > m) {
                    best = Some((n, g));
                }
            }
        }
        best.map(|(_, g)| g.clone())
    }

    /// The rules of one event, gated paths or not.
    pub fn get(&self, event_id: &str) -> Option<Arc<Gate>> {
        self.table
            .load()
            .iter()
            .find(|g| &*g.event_id == event_id)
            .cloned()
    }

    /// Whether any event gates anything (a site without gated paths skips the lookups).
    pub fn is_empty(&self) -> bool {
        self.table.load().iter().all(|g| g.rules.paths.is_empty())
    }

    /// Rebuilds the table from every event's settings.
    pub async fn refresh(&self, store: &dyn Store, now: Millis) -> bool {
        match store.list_events(now).await {
            Ok(events) => {
                let table = events
                    .into_iter()
                    .map(|e| {
                        Arc::new(Gate {
                            event_id: e.event_id.into(),
                            session_idle_ms: u64::from(e.config.session_idle_sec) * 1000,
                            rules: e.config.gate,
                        })
                    })
                    .collect();
                self.table.store(Arc::new(table));
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the events' gate rules failed");
                false
            }
        }
    }

    /// A renewal of the session that still stands at `now`.
    pub fn renewed(
        &self,
        event_id: &str,
        key: PlaceKey,
        idle_ms: Millis,
        now: Millis,
    ) -> Option<Renewal> {
        let map = self.renewals.lock();
        let r = map.get(&(Arc::<str>::from(event_id), key))?;
        (now < r.ends_at && now.saturating_sub(r.at) < renew_every(idle_ms)).then(|| r.clone())
    }

    /// Notes that the store renewed the session at `now`.
    pub fn note_renewal(&self, event_id: &str, key: PlaceKey, r: Renewal) {
        let mut map = self.renewals.lock();
        if map.len() >= MAX_RENEWALS {
            let now = r.at;
            map.retain(|_, v| v.ends_at > now && now.saturating_sub(v.at) < 10_000);
            if map.len() >= MAX_RENEWALS {
                map.clear();
            }
        }
        map.insert((event_id.into(), key), r);
    }

    /// Forgets a session (it ended here).
    pub fn forget(&self, event_id: &str, key: PlaceKey) {
        self.renewals
            .lock()
            .remove(&(Arc::<str>::from(event_id), key));
    }
}

/// Keeps `gates` in step with the store until `stop`: a rebuild on every notice that an
/// event was created, changed or deleted (or that notices were missed), and every
/// [`REFRESH_EVERY`].
pub async fn run_refresh(
    gates: Arc<Gates>,
    store: Arc<dyn Store>,
    clock: crate::clock::Clock,
    mut notices: tokio::sync::broadcast::Receiver<Notice>,
    mut stop: Stop,
) {
    use tokio::sync::broadcast::error::RecvError;
    gates.refresh(store.as_ref(), clock.now()).await;
    let mut tick = tokio::time::interval(REFRESH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stale = tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            _ = tick.tick() => true,
            n = notices.recv() => match n {
                Ok(Notice::EventChanged { .. } | Notice::EventDeleted { .. }) => true,
                Ok(_) => false,
                Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            },
        };
        if stale {
            gates.refresh(store.as_ref(), clock.now()).await;
        }
    }
}
