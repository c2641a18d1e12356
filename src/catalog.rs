//! [`EventCatalog`]: this node's copy of every event's settings, for the checks a request
//! makes before it reaches the store (who may join, with which proof, under which limits).
//!
//! Reading the settings from the store on every join would cost a store call (on Redis a
//! round trip and a script) for a fact that changes a few times per sale. So the catalog
//! keeps what it read, and forgets an event when the store says it changed or was deleted
//! ([`Notice::EventChanged`], [`Notice::EventDeleted`], relayed from every node). A notice
//! can be lost (a pub/sub reconnect on Redis), so an entry is also re-read after
//! [`MAX_AGE`] whatever the notices say: a lost notice delays a change by that much at most.
//!
//! A read that was in flight while a notice arrived is not kept (a generation counter says
//! so), so the catalog never keeps settings older than a notice it has seen.
//!
//! Every join and every poll of every event reads here, so a read takes no lock: the map
//! is an `ArcSwap` of per-event cells (itself an `ArcSwap`), replaced only when an event
//! is first read or forgotten; the once-a-second refresh of an event swaps its cell's
//! entry. (It was one `Mutex` for all events, taken twice per poll.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::core::{EventConfig, Millis};
use crate::store::{Notice, Store, StoreError, StoreResult};
use crate::tasks::{stopped, Stop};

/// Longest an entry is trusted without a notice.
pub const MAX_AGE: Duration = Duration::from_secs(1);

struct Entry {
    config: Arc<EventConfig>,
    read_at: Instant,
}

pub struct EventCatalog {
    store: Arc<dyn Store>,
    entries: ArcSwap<HashMap<Arc<str>, Arc<ArcSwap<Entry>>>>,
    /// Serialises changes to `entries` (and their check of `generation`).
    writing: Mutex<()>,
    /// Bumped by every invalidation; a read keeps its answer only if it did not move.
    generation: AtomicU64,
}

impl EventCatalog {
    pub fn new(store: Arc<dyn Store>) -> Self {
        EventCatalog {
            store,
            entries: ArcSwap::default(),
            writing: Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    /// The event's settings: from the copy when fresh, else from the store.
    /// Errors as [`Store::get_event`] (`EventNotFound` for an unknown event; not kept, so
    /// an event created a moment later is found at once).
    pub async fn config(&self, event_id: &str, now: Millis) -> StoreResult<Arc<EventConfig>> {
        if let Some(cell) = self.entries.load().get(event_id) {
            let e = cell.load();
            if e.read_at.elapsed() < MAX_AGE {
                return Ok(e.config.clone());
            }
        }
        let generation = self.generation.load(Ordering::Acquire);
        let config = Arc::new(self.store.get_event(event_id, now).await?.config);
        let _writing = self.writing.lock();
        if self.generation.load(Ordering::Acquire) == generation {
            let entry = Arc::new(Entry {
                config: config.clone(),
                read_at: Instant::now(),
            });
            let entries = self.entries.load();
            match entries.get(event_id) {
                Some(cell) => cell.store(entry),
                None => {
                    let mut map = HashMap::clone(&entries);
                    map.insert(event_id.into(), Arc::new(ArcSwap::new(entry)));
                    self.entries.store(Arc::new(map));
                }
            }
        }
        Ok(config)
    }

    /// [`config`](Self::config) for a caller that goes on without the settings (`None`:
    /// an unknown event, or settings that cannot be read) but then asks the store itself:
    /// the store unreachable is an error at once, since that next call would wait out the
    /// same timeout a second time (`503` after twice the documented 1.5 s).
    pub async fn config_if_reachable(
        &self,
        event_id: &str,
        now: Millis,
    ) -> StoreResult<Option<Arc<EventConfig>>> {
        match self.config(event_id, now).await {
            Ok(c) => Ok(Some(c)),
            Err(e @ StoreError::Unavailable(_)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// Drops the copy of one event.
    pub fn forget(&self, event_id: &str) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let _writing = self.writing.lock();
        let entries = self.entries.load();
        if entries.contains_key(event_id) {
            let mut map = HashMap::clone(&entries);
            map.remove(event_id);
            self.entries.store(Arc::new(map));
        }
    }

    /// Drops every copy (after missed notices).
    pub fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let _writing = self.writing.lock();
        self.entries.store(Arc::default());
    }

    /// Forgets events as the store's notices say they changed, until `stop`.
    pub async fn run(self: Arc<Self>, mut notices: broadcast::Receiver<Notice>, mut stop: Stop) {
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                r = notices.recv() => match r {
                    Ok(Notice::EventChanged { event_id } | Notice::EventDeleted { event_id }) => {
                        self.forget(&event_id);
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => self.forget_all(),
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::EventPatch;
    use crate::store::embedded::EmbeddedStore;
    use crate::tasks::stop_channel;

    fn patch(name: &str) -> EventPatch {
        EventPatch {
            name: Some(name.into()),
            ..EventPatch::default()
        }
    }

    #[tokio::test]
    async fn a_change_notice_is_seen_at_once_and_unknown_events_are_not_kept() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        let catalog = Arc::new(EventCatalog::new(store.clone()));
        let (_tx, rx) = stop_channel();
        let task = tokio::spawn(catalog.clone().run(store.subscribe(), rx));

        assert!(catalog.config("e", 0).await.is_err());
        store.put_event("e", &patch("one"), 0).await.unwrap();
        assert_eq!(catalog.config("e", 0).await.unwrap().name, "one");

        store.update_event("e", &patch("two"), 0).await.unwrap();
        // The notice is handled by the task; give it a moment, far below MAX_AGE.
        let mut seen = String::new();
        for _ in 0..50 {
            seen = catalog.config("e", 0).await.unwrap().name.clone();
            if seen == "two" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(seen, "two");

        store.delete_event("e").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(catalog.config("e", 0).await.is_err());
        task.abort();
    }

    #[tokio::test]
    async fn without_notices_an_entry_is_trusted_for_max_age_only() {
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        // Nobody runs the catalog's notice task here.
        let catalog = EventCatalog::new(store.clone());
        store.put_event("e", &patch("one"), 0).await.unwrap();
        assert_eq!(catalog.config("e", 0).await.unwrap().name, "one");
        store.update_event("e", &patch("two"), 0).await.unwrap();
        assert_eq!(catalog.config("e", 0).await.unwrap().name, "one", "cached");
        tokio::time::sleep(MAX_AGE + Duration::from_millis(20)).await;
        assert_eq!(catalog.config("e", 0).await.unwrap().name, "two");
    }
}
