//! The embedded backend: every event's [`EventQueue`] in this process, each behind its own
//! mutex, so operations on one event are serialised (the atomicity the contract asks for)
//! while different events proceed in parallel. With a [`Journal`], every change is on disk
//! before the operation answers.
//!
//! Operations on one event take microseconds, so a plain mutex held for the whole operation
//! is both the simplest and the fastest way to make it atomic. The disk wait happens after
//! the lock is released: changes are queued to the journal under the lock (so they reach
//! the disk in order) and many requests then share one fsync.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use super::audit_file::AuditFile;
use super::journal::{Durability, Journal};
use super::{
    notices_but_moved, EventSnapshot, JoinRequest, MovedEvents, Notice, SaleEndApplied, Store,
    StoreError, StoreResult, NOTICE_BUFFER,
};
use crate::core::{
    Effect, EventConfig, EventPatch, EventQueue, HeadEntry, InventoryCounts, InventoryView,
    InviteHolder, Millis, PlaceKey, PlaceView, QueueError, SaleEnd, SessionHolds,
};
use crate::telemetry;

struct Slot {
    id: Arc<str>,
    queue: EventQueue,
    /// Set under the lock when the event is deleted, so an operation that fetched the slot
    /// just before cannot change (or write) an event that no longer exists.
    deleted: bool,
    /// Journal ticket of this event's latest queued change. A read waits for this one
    /// only, not for every other event's writes.
    last_ticket: u64,
    /// This event's effect counters, resolved once (see [`telemetry::EffectCounters`]).
    counters: telemetry::EffectCounters,
    /// The node's lost time this event has taken out of its idle periods (see `stalls`).
    forgiven: Millis,
}

impl Slot {
    fn new(id: &str, queue: EventQueue) -> Slot {
        let id: Arc<str> = id.into();
        Slot {
            counters: telemetry::EffectCounters::new(id.clone()),
            id,
            queue,
            deleted: false,
            last_ticket: 0,
            forgiven: 0,
        }
    }
}

type Shared = Arc<Mutex<Slot>>;

/// The admin audit list's file in the data dir.
pub const AUDIT_FILE: &str = "audit.jsonl";

type Events = BTreeMap<String, Shared>;

pub struct EmbeddedStore {
    /// Every request looks its event up here, so reads take no lock at all (a read lock
    /// is still a write to one shared word, which every core's requests would contend
    /// on); creating or deleting an event swaps in a new map under `events_write`.
    events: ArcSwap<Events>,
    events_write: Mutex<()>,
    /// Shared with the purges of deleted events' keys, which run on tasks of their own.
    journal: Option<Arc<Journal>>,
    /// Those purge tasks not yet ended: [`Store::close`] waits for them, so that once it
    /// returns no task holds the journal, and so fjall's lock on the directory, any more
    /// (an open of the same directory right after, as a restart in one process does,
    /// found it `Locked`).
    purges: Arc<Tasks>,
    notices: broadcast::Sender<Notice>,
    /// Only the notices about events themselves (see [`Store::subscribe_events`]): a
    /// place's notices wake the live hub alone, not every background task.
    event_notices: broadcast::Sender<Notice>,
    /// Each change's `Moved`, coalesced for the live hub (see [`MovedEvents`]).
    moved: Arc<MovedEvents>,
    /// Single-use claims (`claim_once`), in memory only: see the contract.
    claims: Mutex<Claims>,
    /// Places read back on open: a store that holds some must keep its signing key.
    restored: u64,
    /// The admin audit list (`audit.jsonl` in the data dir of a durable store).
    audit: Arc<Mutex<AuditFile>>,
    /// Time the node lost, kept out of idle periods once [`Self::watch_stalls`] is called.
    stalls: Option<Arc<super::stalls::Stalls>>,
}

/// Claimed keys with their expiry. Expired ones are swept whenever the map has doubled
/// since the last sweep, so the cost is amortised O(1) per claim and the map holds at most
/// twice the claims that are still live.
#[derive(Default)]
struct Claims {
    until: HashMap<(Arc<str>, Box<str>), Millis>,
    sweep_at: usize,
}

impl Claims {
    fn claim(&mut self, event_id: &str, key: &str, expires_at: Millis, now: Millis) -> bool {
        if self.until.len() >= self.sweep_at {
            self.until.retain(|_, t| *t > now);
            self.sweep_at = (self.until.len() * 2).max(1024);
        }
        let k = (Arc::from(event_id), Box::from(key));
        match self.until.get(&k) {
            Some(t) if *t > now => false,
            _ => {
                self.until.insert(k, expires_at);
                true
            }
        }
    }
}

impl Default for EmbeddedStore {
    fn default() -> Self {
        EmbeddedStore {
            events: ArcSwap::default(),
            events_write: Mutex::default(),
            journal: None,
            purges: Arc::default(),
            notices: broadcast::channel(NOTICE_BUFFER).0,
            event_notices: broadcast::channel(NOTICE_BUFFER).0,
            moved: Arc::default(),
            claims: Mutex::default(),
            restored: 0,
            audit: Arc::new(Mutex::new(AuditFile::memory())),
            stalls: None,
        }
    }
}

impl EmbeddedStore {
    /// A store that keeps everything in memory only (tests, benchmarks).
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens the durable store in `dir`, restoring every event and place it holds.
    pub fn open(dir: &Path, durability: Durability, now: Millis) -> anyhow::Result<Self> {
        Self::open_with(dir, durability, now, false)
    }

    /// [`EmbeddedStore::open`]; with `repair`, a damaged journal is cut back at the damage
    /// (logging what was dropped) rather than refused.
    pub fn open_with(
        dir: &Path,
        durability: Durability,
        now: Millis,
        repair: bool,
    ) -> anyhow::Result<Self> {
        let started = std::time::Instant::now();
        let (journal, recovered) = Journal::open_with(dir, durability, now, repair)?;
        let audit = AuditFile::open(&dir.join(AUDIT_FILE))
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", dir.join(AUDIT_FILE).display()))?;
        let events = recovered
            .events
            .into_iter()
            .map(|(id, queue)| {
                let slot = Slot::new(&id, queue);
                (id, Arc::new(Mutex::new(slot)))
            })
            .collect::<BTreeMap<_, _>>();
        tracing::info!(
            events = events.len(),
            places = recovered.places,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ?durability,
            dir = %dir.display(),
            "store recovered"
        );
        Ok(EmbeddedStore {
            events: ArcSwap::from_pointee(events),
            events_write: Mutex::default(),
            journal: Some(Arc::new(journal)),
            purges: Arc::default(),
            notices: broadcast::channel(NOTICE_BUFFER).0,
            event_notices: broadcast::channel(NOTICE_BUFFER).0,
            moved: Arc::default(),
            claims: Mutex::default(),
            restored: recovered.places,
            audit: Arc::new(Mutex::new(audit)),
            stalls: None,
        })
    }

    /// From now on, time in which the node did not run, or its wall clock skipped, does
    /// not count against the places' idle periods (see `stalls`). For a store on the
    /// system clock only: a test's manual clock does not move with the system's.
    pub fn watch_stalls(&mut self) {
        self.stalls = super::stalls::Stalls::start();
    }

    /// Places read back from disk when the store was opened (0 in memory).
    pub fn restored_places(&self) -> u64 {
        self.restored
    }

    /// Bytes the durable store holds on disk (0 in memory).
    pub fn disk_space(&self) -> u64 {
        self.journal.as_deref().map_or(0, Journal::disk_space)
    }

    /// Receivers of every notice (the live hub's), as opposed to those of
    /// [`Store::subscribe_events`]: each is a task woken by every join.
    pub fn notice_receivers(&self) -> usize {
        self.notices.receiver_count()
    }

    /// Tells every receiver of notices about an event itself (created, changed, deleted).
    fn tell_event(&self, n: Notice) {
        // Nobody listening is fine.
        let _ = self.event_notices.send(n.clone());
        let _ = self.notices.send(n);
    }

    fn slot(&self, event_id: &str) -> Result<Shared, QueueError> {
        self.events
            .load()
            .get(event_id)
            .cloned()
            .ok_or(QueueError::EventNotFound)
    }

    /// Runs `f` on the slot under its lock, queues what it changed to the journal, and
    /// answers once that is durable.
    async fn run<T: Send>(
        &self,
        slot: &Shared,
        config_changed: bool,
        f: impl FnOnce(&mut EventQueue, &mut Vec<Effect>) -> Result<T, QueueError> + Send,
    ) -> StoreResult<T> {
        let mut fx = Vec::new();
        let (out, ticket, notices, moved) = {
            let mut guard = slot.lock();
            let s = &mut *guard;
            if s.deleted {
                return Err(QueueError::EventNotFound.into());
            }
            if let Some(stalls) = &self.stalls {
                stalls.apply(&mut s.forgiven, &mut s.queue);
            }
            let records = s.queue.config().records();
            let out = f(&mut s.queue, &mut fx);
            // The opening reached, or the end by `closes_at` found, is in the settings: written
            // now, so that both hold after a restart whose clock is behind them.
            let config_changed = config_changed || s.queue.config().records() != records;
            s.counters.record(&fx);
            let (mut notices, mut moved) = notices_but_moved(&s.id, &fx);
            if self.notices.receiver_count() == 0 {
                notices.clear();
            }
            // Nobody took the set's handle (no live hub runs): nothing to mark.
            moved &= Arc::strong_count(&self.moved) > 1;
            let moved = moved.then(|| s.id.clone());
            let ticket = match &self.journal {
                Some(j) if !fx.is_empty() || config_changed => {
                    let config = config_changed.then(|| s.queue.config().clone());
                    let t = j.record(&s.id, fx, s.queue.meta(), config)?;
                    s.last_ticket = t;
                    Some(t)
                }
                // Nothing changed: answer once what this read observed is durable, which
                // is at most this event's last queued change (usually already synced).
                Some(_) => Some(s.last_ticket),
                None => None,
            };
            (out, ticket, notices, moved)
        };
        if let (Some(j), Some(t)) = (&self.journal, ticket) {
            j.wait(t).await?;
        }
        for n in notices {
            let _ = self.notices.send(n); // nobody listening is fine
        }
        if let Some(id) = moved {
            self.moved.mark(&id);
        }
        Ok(out?)
    }

    /// Applies `patch` to an existing slot's settings, then tells every node.
    async fn reconfigure(
        &self,
        event_id: &str,
        slot: &Shared,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        let (config, ()) = self
            .reconfigure_after(event_id, slot, patch, now, |_, _| ())
            .await?;
        Ok(config)
    }

    /// [`Self::reconfigure`], with `first` run on the queue just before the patch, in the
    /// same step (under the slot's lock): what it reads is what the change was applied to.
    async fn reconfigure_after<T: Send>(
        &self,
        event_id: &str,
        slot: &Shared,
        patch: &EventPatch,
        now: Millis,
        first: impl FnOnce(&mut EventQueue, &mut Vec<Effect>) -> T + Send,
    ) -> StoreResult<(EventConfig, T)> {
        let out = self
            .run(slot, true, |q, fx| {
                let read = first(q, fx);
                let config = patch.apply(event_id, q.config(), now)?;
                q.check_config(&config, now)?;
                q.set_config(config.clone(), now, fx);
                Ok((config, read))
            })
            .await?;
        self.tell_event(Notice::EventChanged {
            event_id: event_id.into(),
        });
        Ok(out)
    }

    async fn with<T: Send>(
        &self,
        event_id: &str,
        f: impl FnOnce(&mut EventQueue, &mut Vec<Effect>) -> Result<T, QueueError> + Send,
    ) -> StoreResult<T> {
        let slot = self.slot(event_id)?;
        self.run(&slot, false, f).await
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
        // Validate before creating anything, so a refused patch leaves no trace.
        let existing = self.events.load().get(event_id).cloned();
        let slot = match existing {
            Some(s) => s,
            None => loop {
                let config = patch.apply(event_id, &EventConfig::default(), now)?;
                // A deleted event of the same id whose keys are still being removed: its
                // keys would be read back as the new event's (`journal/purge.rs`).
                if let Some(j) = &self.journal {
                    j.purged(event_id).await;
                }
                let _write = self.events_write.lock();
                let mut events = Events::clone(&self.events.load());
                match events.get(event_id) {
                    Some(s) => break s.clone(), // created meanwhile: update that one
                    // Deleted again meanwhile (under this lock, so checked here for good).
                    None if self.journal.as_ref().is_some_and(|j| j.purging(event_id)) => {
                        continue;
                    }
                    None => {
                        // The new event's record is queued to the journal before the event
                        // becomes visible, under the map's lock (as deletions are), so its
                        // changes can never reach the disk ahead of it, and a creation and
                        // a deletion of the same id reach it in the order they happened.
                        let mut slot = Slot::new(event_id, EventQueue::new(config.clone()));
                        if let Some(j) = &self.journal {
                            slot.last_ticket =
                                j.record(&slot.id, Vec::new(), slot.queue.meta(), Some(config))?;
                        }
                        let slot = Arc::new(Mutex::new(slot));
                        events.insert(event_id.to_string(), slot.clone());
                        self.events.store(Arc::new(events));
                        break slot;
                    }
                }
            },
        };
        self.reconfigure(event_id, &slot, patch, now).await
    }

    async fn update_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        // Never creates: a slot deleted after this lookup is refused under its lock by
        // `run`, and the deletion is journaled after this change (it takes the same lock).
        let slot = self.slot(event_id)?;
        self.reconfigure(event_id, &slot, patch, now).await
    }

    async fn end_sale(
        &self,
        event_id: &str,
        end: SaleEnd,
        now: Millis,
    ) -> StoreResult<SaleEndApplied> {
        let slot = self.slot(event_id)?;
        let patch = EventPatch {
            end: Some(end),
            ..EventPatch::default()
        };
        let (config, (before, waiting)) = self
            .reconfigure_after(event_id, &slot, &patch, now, |q, fx| {
                // The figures bring the event up to `now` first: a place that was due to
                // end has ended, and is not counted.
                let waiting = q.figures(now, fx).waiting;
                let before = q.config().clone();
                let waiting = if before.sale_ended(now).is_some() {
                    0
                } else {
                    waiting
                };
                (before, waiting)
            })
            .await?;
        Ok(SaleEndApplied {
            before,
            config,
            waiting,
        })
    }

    async fn get_event(&self, event_id: &str, now: Millis) -> StoreResult<EventSnapshot> {
        self.with(event_id, |q, fx| {
            // The figures first: they bring the event up to `now` (an opening reached is
            // recorded in the settings answered).
            let figures = q.figures(now, fx);
            Ok(EventSnapshot {
                event_id: event_id.to_string(),
                config: q.config().clone(),
                figures,
            })
        })
        .await
    }

    async fn list_events(&self, now: Millis) -> StoreResult<Vec<EventSnapshot>> {
        let ids: Vec<String> = self.events.load().keys().cloned().collect();
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
        // Under the map's lock, so that a re-creation of the same id is journaled after
        // this deletion (see `put_event`).
        let ticket = {
            let _write = self.events_write.lock();
            let mut events = Events::clone(&self.events.load());
            let slot = events.remove(event_id).ok_or(QueueError::EventNotFound)?;
            self.events.store(Arc::new(events));
            let mut s = slot.lock();
            s.deleted = true;
            match &self.journal {
                Some(j) => Some(j.delete(&s.id)?),
                None => None,
            }
        };
        if let (Some(j), Some(t)) = (&self.journal, ticket) {
            j.wait(t).await?;
            // The keys go in steps on a task of its own, so that the answer does not wait
            // for them and a request that goes away cannot leave them half removed.
            // Weak: a store dropped before the task ran is not kept open by it (the next
            // open finishes the purge).
            let (j, id) = (Arc::downgrade(j), Arc::<str>::from(event_id));
            let running = self.purges.start();
            tokio::spawn(async move {
                // Declared first, so ended last: after the journal's handle below.
                let _running = running;
                let Some(j) = j.upgrade() else { return };
                if let Err(e) = j.purge(id.clone()).await {
                    tracing::warn!(event_id = %id, error = %e,
                        "removing a deleted event's keys stopped; the next start finishes it");
                }
            });
        }
        self.tell_event(Notice::EventDeleted {
            event_id: event_id.into(),
        });
        Ok(())
    }

    async fn clear(&self, event_id: &str, now: Millis) -> StoreResult<u64> {
        self.with(event_id, |q, fx| Ok(q.clear(now, fx))).await
    }

    async fn queue_head(
        &self,
        event_id: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<HeadEntry>> {
        self.with(event_id, |q, fx| Ok(q.head(limit, now, fx)))
            .await
    }

    async fn prequeue(
        &self,
        event_id: &str,
        after: u64,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<u64>> {
        self.with(event_id, |q, fx| Ok(q.prequeue_now(after, limit, now, fx)))
            .await
    }

    async fn join(&self, event_id: &str, req: &JoinRequest, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| {
            q.join(
                req.nonce,
                req.user_id.as_deref(),
                req.metadata.as_deref(),
                req.proof(),
                now,
                fx,
            )
        })
        .await
    }

    async fn add_invites(
        &self,
        event_id: &str,
        codes: &[String],
        _now: Millis,
    ) -> StoreResult<u64> {
        self.with(event_id, |q, fx| Ok(q.add_invites(codes, fx)))
            .await
    }

    async fn invites(
        &self,
        event_id: &str,
        after: &str,
        limit: usize,
        _now: Millis,
    ) -> StoreResult<Vec<(String, Option<InviteHolder>)>> {
        self.with(event_id, |q, _| {
            Ok(q.invite_page(after, limit)
                .into_iter()
                .map(|(c, h)| (c.into(), h))
                .collect())
        })
        .await
    }

    async fn status(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.status(key, now, fx)).await
    }

    async fn heartbeat(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.with(event_id, |q, fx| q.heartbeat(key, now, fx)).await
    }

    async fn peek(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.peek(key, now, fx)).await
    }

    async fn enter(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.enter(key, now, fx)).await
    }

    async fn leave(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<bool> {
        self.with(event_id, |q, fx| q.leave(key, now, fx)).await
    }

    async fn session_heartbeat(
        &self,
        event_id: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.session_heartbeat(key, now, fx))
            .await
    }

    async fn session(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.session_view(key, now, fx))
            .await
    }

    async fn complete(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.with(event_id, |q, fx| q.complete(key, now, fx)).await
    }

    async fn tick(&self, event_id: &str, now: Millis) -> StoreResult<Option<Millis>> {
        self.with(event_id, |q, fx| Ok(q.tick(now, fx))).await
    }

    async fn claim_once(
        &self,
        event_id: &str,
        key: &str,
        expires_at: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        Ok(self.claims.lock().claim(event_id, key, expires_at, now))
    }

    async fn event_ids(&self) -> StoreResult<Vec<String>> {
        Ok(self.events.load().keys().cloned().collect())
    }

    async fn append_audit(&self, entry: &str, keep: usize) -> StoreResult<()> {
        let audit = self.audit.clone();
        let entry = entry.to_string();
        // An fsync: off the async workers.
        tokio::task::spawn_blocking(move || audit.lock().append(&entry, keep))
            .await
            .map_err(|e| StoreError::Unavailable(format!("audit writer: {e}")))?
            .map_err(|e| StoreError::Unavailable(format!("writing the audit list: {e}")))
    }

    async fn audit_entries(&self, limit: usize) -> StoreResult<Vec<String>> {
        Ok(self.audit.lock().newest(limit))
    }

    async fn ping(&self) -> StoreResult<()> {
        match &self.journal {
            Some(j) if !j.is_healthy() => Err(StoreError::Unavailable(
                "the store cannot write to disk".into(),
            )),
            // A stalled disk: every change answers 503 until it confirms again, so a load
            // balancer should send the node nothing meanwhile.
            Some(j) if j.is_stalled() => Err(StoreError::Unavailable(
                "the disk has not confirmed a write for over 3 s".into(),
            )),
            _ => Ok(()),
        }
    }

    fn failed(&self) -> bool {
        self.journal.as_ref().is_some_and(|j| !j.is_healthy())
    }

    async fn until_failed(&self) {
        match &self.journal {
            Some(j) => j.until_failed().await,
            // In memory: nothing to write, so nothing fails.
            None => std::future::pending().await,
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    fn subscribe_events(&self) -> broadcast::Receiver<Notice> {
        self.event_notices.subscribe()
    }

    fn moved_events(&self) -> Option<Arc<MovedEvents>> {
        Some(self.moved.clone())
    }

    async fn put_inventory(
        &self,
        event_id: &str,
        items: &[String],
        now: Millis,
    ) -> StoreResult<(u64, InventoryCounts)> {
        self.with(event_id, |q, fx| q.put_inventory(items, now, fx))
            .await
    }

    async fn inventory(&self, event_id: &str, now: Millis) -> StoreResult<InventoryView> {
        self.with(event_id, |q, fx| Ok(q.inventory(now, fx))).await
    }

    async fn hold(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: &[String],
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        self.with(event_id, |q, fx| q.hold(key, items, now, fx))
            .await
    }

    async fn release(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: Option<&[String]>,
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        self.with(event_id, |q, fx| q.release(key, items, now, fx))
            .await
    }

    async fn extend(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.with(event_id, |q, fx| q.extend(key, now, fx)).await
    }

    async fn close(&self) -> StoreResult<()> {
        if let Some(j) = &self.journal {
            j.close();
        }
        // A purge meets the closed journal at its next step and ends.
        self.purges.ended().await;
        Ok(())
    }
}

/// Tasks running, and a way to wait until none is.
#[derive(Default)]
struct Tasks {
    running: std::sync::atomic::AtomicUsize,
    none: tokio::sync::Notify,
}

/// One running task of [`Tasks`], until dropped.
struct Running(Arc<Tasks>);

impl Tasks {
    /// Counts a task from before it is spawned (one that has not started yet counts too).
    fn start(self: &Arc<Self>) -> Running {
        self.running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running(self.clone())
    }

    async fn ended(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        loop {
            let none = self.none.notified();
            tokio::pin!(none);
            // Registered before the look, so a last task ending in between still wakes us.
            none.as_mut().enable();
            if self.running.load(SeqCst) == 0 {
                return;
            }
            none.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self
            .0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.none.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Claims, EmbeddedStore};
    use crate::core::EventPatch;
    use crate::store::journal::Durability;
    use crate::store::{JoinRequest, Notice, Store};

    /// A join's `Moved` goes to the set of moved events (the live hub's), not to any
    /// receiver of notices; an event's creation, change and deletion go to both kinds of
    /// receiver.
    #[tokio::test]
    async fn place_notices_reach_only_the_receivers_of_every_notice() {
        let store = EmbeddedStore::new();
        let mut all = store.subscribe();
        let mut events = store.subscribe_events();
        let moved = store
            .moved_events()
            .expect("the embedded store coalesces its moves");
        let patch = EventPatch {
            paused: Some(true), // nobody admitted: the join's only notice is `Moved`
            ..EventPatch::default()
        };
        store.put_event("ev", &patch, 0).await.unwrap();
        assert!(moved.take().is_empty(), "creating an event moves nobody");
        let join = JoinRequest {
            nonce: 7,
            ..JoinRequest::default()
        };
        store.join("ev", &join, 1).await.unwrap();
        let taken = moved.take();
        assert_eq!(taken.len(), 1);
        assert!(taken.contains("ev"));
        store.delete_event("ev").await.unwrap();
        let changed = Notice::EventChanged {
            event_id: "ev".into(),
        };
        let deleted = Notice::EventDeleted {
            event_id: "ev".into(),
        };
        for want in [&changed, &deleted] {
            assert_eq!(&all.try_recv().unwrap(), want);
        }
        assert!(all.try_recv().is_err(), "nothing more: no `Moved` notice");
        for want in [&changed, &deleted] {
            assert_eq!(&events.try_recv().unwrap(), want);
        }
        assert!(events.try_recv().is_err(), "no place's notice");
    }

    /// Joins into an event whose move is not taken yet mark nothing more and wake nobody;
    /// one after the take wakes the taker again.
    #[tokio::test]
    async fn moves_are_marked_once_until_taken() {
        let store = EmbeddedStore::new();
        let moved = store.moved_events().unwrap();
        store
            .put_event("ev", &EventPatch::default(), 0)
            .await
            .unwrap();
        let join = |nonce| JoinRequest {
            nonce,
            ..JoinRequest::default()
        };
        store.join("ev", &join(1), 1).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), moved.marked())
            .await
            .expect("the first mark wakes");
        // The set is not taken: more joins mark nothing new, and wake nobody (a notify
        // per mark would leave a permit here).
        for nonce in 2..=50 {
            store.join("ev", &join(nonce), 1).await.unwrap();
        }
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), moved.marked())
                .await
                .is_err(),
            "49 more joins marked nothing new"
        );
        assert_eq!(moved.take().len(), 1);
        store.join("ev", &join(51), 2).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), moved.marked())
            .await
            .expect("a move after the take wakes again");
        assert!(moved.take().contains("ev"));
    }

    #[test]
    fn spent_claims_are_bounded_by_their_lifetime() {
        let mut c = Claims::default();
        // A flood of claims, each living 100 ms, over 100 s: only the live ones (and at
        // most as many again, between sweeps) are held.
        for i in 0..100_000u64 {
            let now = i; // one claim per millisecond
            assert!(c.claim("ev", &i.to_string(), now + 100, now));
            assert!(
                c.until.len() <= 2 * 1024 + 100,
                "{} held at {i}",
                c.until.len()
            );
        }
        assert!(
            !c.claim("ev", "99999", 100_099, 100_000),
            "a live claim holds"
        );
    }

    /// Settings under which places wait (nobody is admitted).
    fn paused() -> EventPatch {
        EventPatch {
            paused: Some(true),
            ..EventPatch::default()
        }
    }

    /// A store in `dir` with `big` holding `n` waiting places and `other` empty.
    async fn with_big_event(dir: &std::path::Path, n: u64) -> EmbeddedStore {
        let store = EmbeddedStore::open(dir, Durability::Relaxed, 0).unwrap();
        for id in ["big", "other"] {
            store.put_event(id, &paused(), 0).await.unwrap();
        }
        for nonce in 0..n {
            let join = JoinRequest {
                nonce: nonce.into(),
                ..JoinRequest::default()
            };
            store.join("big", &join, 1).await.unwrap();
        }
        store
    }

    /// The deletion's own batch removes the record only; the keys go in later steps, with
    /// other events' changes written between them (they no longer wait for one batch of
    /// every tombstone: seconds for a large event).
    #[tokio::test]
    async fn a_deletion_leaves_the_keys_to_steps_that_other_changes_come_between() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_big_event(dir.path(), 300).await;
        let journal = store.journal.clone().unwrap();
        assert_eq!(journal.keys_of("big"), (300, false));
        store.delete_event("big").await.unwrap();
        // The purge's task has not run yet (this runtime has one thread, not yielded to).
        assert_eq!(
            journal.keys_of("big"),
            (300, true),
            "the deletion wrote no tombstone"
        );
        assert!(journal.purging("big"));
        let join = JoinRequest {
            nonce: 1,
            ..JoinRequest::default()
        };
        assert_eq!(
            store.join("other", &join, 2).await.unwrap().position,
            Some(1)
        );
        journal.purged("big").await;
        assert_eq!(
            journal.keys_of("big"),
            (0, false),
            "every key and the mark are gone"
        );
        assert!(store.get_event("big", 3).await.is_err());
    }

    /// A stop before the purge ended leaves its mark; the next open removes the rest before
    /// reading anything, and a new event of the same id starts empty.
    #[tokio::test]
    async fn a_purge_cut_short_is_finished_by_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_big_event(dir.path(), 300).await;
        store.delete_event("big").await.unwrap();
        store.close().await.unwrap(); // before the purge's task ran
        assert_eq!(store.journal.as_ref().unwrap().keys_of("big"), (300, true));
        drop(store);
        let store = EmbeddedStore::open(dir.path(), Durability::Relaxed, 10).unwrap();
        assert_eq!(store.journal.as_ref().unwrap().keys_of("big"), (0, false));
        store.put_event("big", &paused(), 11).await.unwrap();
        let snap = store.get_event("big", 12).await.unwrap();
        assert_eq!(
            snap.figures.waiting, 0,
            "nothing of the deleted event came back"
        );
    }

    /// A store closed while a purge runs can be opened again at once: the purge's task no
    /// longer holds the journal (and fjall's lock) once `close` returned.
    #[tokio::test]
    async fn a_store_closed_during_a_purge_opens_again_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = with_big_event(dir.path(), 12_000).await;
        for round in 0..3 {
            store.delete_event("big").await.unwrap();
            // One thread: the purge's task starts here and waits for its first step's
            // write, holding the journal, when the store is closed.
            tokio::task::yield_now().await;
            assert!(store.journal.as_ref().unwrap().purging("big"));
            store.close().await.unwrap();
            drop(store);
            store = match EmbeddedStore::open(dir.path(), Durability::Relaxed, 10) {
                Ok(s) => s,
                Err(e) => panic!("round {round}: {e}"),
            };
            store.put_event("big", &paused(), 11).await.unwrap();
            for nonce in 0..4_000u64 {
                let join = JoinRequest {
                    nonce: nonce.into(),
                    ..JoinRequest::default()
                };
                store.join("big", &join, 12).await.unwrap();
            }
        }
    }

    /// A re-creation of a deleted id waits until the old keys are gone: they lie under the
    /// same prefix, and a restart would read them back as the new event's places.
    #[tokio::test]
    async fn a_recreated_event_does_not_inherit_the_deleted_ones_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = with_big_event(dir.path(), 300).await;
        store.delete_event("big").await.unwrap();
        store.put_event("big", &paused(), 5).await.unwrap();
        let join = JoinRequest {
            nonce: 10_000,
            ..JoinRequest::default()
        };
        store.join("big", &join, 6).await.unwrap();
        store.close().await.unwrap();
        drop(store);
        let store = EmbeddedStore::open(dir.path(), Durability::Relaxed, 10).unwrap();
        let snap = store.get_event("big", 11).await.unwrap();
        assert_eq!(snap.figures.waiting, 1, "only the new event's place");
    }
}
