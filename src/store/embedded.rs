//! The embedded backend: every event's [`EventQueue`] in this process, each behind its own
//! mutex, so operations on one event are serialised (the atomicity the contract asks for)
//! while different events proceed in parallel.
//!
//! Operations on one event take microseconds, so a plain mutex held for the whole operation
//! is both the simplest and the fastest way to make it atomic.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};

use super::{EventSnapshot, JoinRequest, Store, StoreResult};
use crate::core::{
    Effect, EventConfig, EventPatch, EventQueue, HeadEntry, Millis, PlaceKey, PlaceView, QueueError,
};
use crate::telemetry;

#[derive(Default)]
pub struct EmbeddedStore {
    events: RwLock<BTreeMap<String, Arc<Mutex<EventQueue>>>>,
}

impl EmbeddedStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn event(&self, event_id: &str) -> Result<Arc<Mutex<EventQueue>>, QueueError> {
        self.events
            .read()
            .get(event_id)
            .cloned()
            .ok_or(QueueError::EventNotFound)
    }

    /// Runs `f` on the event's queue under its lock and records the effects it produced.
    fn with<T>(
        &self,
        event_id: &str,
        f: impl FnOnce(&mut EventQueue, &mut Vec<Effect>) -> Result<T, QueueError>,
    ) -> StoreResult<T> {
        let ev = self.event(event_id)?;
        let mut fx = Vec::new();
        let out = {
            let mut q = ev.lock();
            f(&mut q, &mut fx)
        };
        telemetry::record_effects(event_id, &fx);
        Ok(out?)
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn put_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        let existing = self.events.read().get(event_id).cloned();
        if let Some(ev) = existing {
            let mut fx = Vec::new();
            let config = {
                let mut q = ev.lock();
                let config = patch.apply(event_id, q.config())?;
                q.set_config(config.clone(), now, &mut fx);
                config
            };
            telemetry::record_effects(event_id, &fx);
            return Ok(config);
        }
        let config = patch.apply(event_id, &EventConfig::default())?;
        let mut events = self.events.write();
        // Another request may have created it meanwhile: update that one instead.
        let ev = events
            .entry(event_id.to_string())
            .or_insert_with(|| Arc::new(Mutex::new(EventQueue::new(config.clone()))))
            .clone();
        drop(events);
        let mut fx = Vec::new();
        let config = {
            let mut q = ev.lock();
            let config = patch.apply(event_id, q.config())?;
            q.set_config(config.clone(), now, &mut fx);
            config
        };
        telemetry::record_effects(event_id, &fx);
        Ok(config)
    }

    async fn get_event(&self, event_id: &str, now: Millis) -> StoreResult<EventSnapshot> {
        self.with(event_id, |q, fx| {
            Ok(EventSnapshot {
                event_id: event_id.to_string(),
                config: q.config().clone(),
                figures: q.figures(now, fx),
            })
        })
    }

    async fn list_events(&self, now: Millis) -> StoreResult<Vec<EventSnapshot>> {
        let ids: Vec<String> = self.events.read().keys().cloned().collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            match self.get_event(&id, now).await {
                Ok(s) => out.push(s),
                Err(e) if e.queue() == Some(&QueueError::EventNotFound) => {} // deleted meanwhile
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn delete_event(&self, event_id: &str) -> StoreResult<()> {
        match self.events.write().remove(event_id) {
            Some(_) => Ok(()),
            None => Err(QueueError::EventNotFound.into()),
        }
    }

    async fn clear(&self, event_id: &str, now: Millis) -> StoreResult<u64> {
        self.with(event_id, |q, fx| Ok(q.clear(now, fx)))
    }

    async fn queue_head(
        &self,
        event_id: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<HeadEntry>> {
        self.with(event_id, |q, fx| Ok(q.head(limit, now, fx)))
    }

    async fn join(&self, event_id: &str, req: &JoinRequest, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| {
            q.join(
                req.nonce,
                req.user_id.as_deref(),
                req.metadata.as_deref(),
                now,
                fx,
            )
        })
    }

    async fn status(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.status(key, now, fx))
    }

    async fn heartbeat(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.with(event_id, |q, fx| q.heartbeat(key, now, fx))
    }

    async fn peek(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.peek(key, now, fx))
    }

    async fn enter(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.enter(key, now, fx))
    }

    async fn leave(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<bool> {
        self.with(event_id, |q, fx| q.leave(key, now, fx))
    }

    async fn session_heartbeat(
        &self,
        event_id: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.session_heartbeat(key, now, fx))
    }

    async fn session(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.session_view(key, now, fx))
    }

    async fn complete(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.with(event_id, |q, fx| q.complete(key, now, fx))
    }

    async fn tick(&self, event_id: &str, now: Millis) -> StoreResult<Option<Millis>> {
        self.with(event_id, |q, fx| Ok(q.tick(now, fx)))
    }

    async fn event_ids(&self) -> StoreResult<Vec<String>> {
        Ok(self.events.read().keys().cloned().collect())
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
}
