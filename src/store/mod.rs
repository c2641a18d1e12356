//! The store contract: everything the HTTP layer may ask of the queue state, backend-neutral.
//!
//! Every operation is **atomic per event**: it observes and changes one event's state as a
//! single step, with no interleaving of another operation on the same event, on any node.
//! Every operation that takes `now` first ends the places whose deadline is at or before
//! `now` and hands their slots on, so answers never count ghosts. Time is passed in (rather
//! than read inside) so the conformance suite drives the store with a fake clock.
//!
//! Backends: [`embedded::EmbeddedStore`] (in-process). One conformance suite
//! (`tests/support/conformance.rs`) and one model-based property test
//! (`tests/support/model.rs`) run against every backend. [`fault::FaultStore`] wraps any
//! backend to make chosen operations fail, wait or hang in tests.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::core::{
    Effect, EndReason, EventConfig, EventFigures, EventPatch, HeadEntry, InventoryCounts,
    InventoryView, InviteHolder, Millis, PlaceKey, PlaceView, QueueError, SaleEnd, SessionHolds,
};

pub mod audit_file;
mod background;
pub mod embedded;
pub mod fault;
mod group_commit;
pub mod journal;
mod journal_events;
mod journal_files;
mod journal_places;
mod journal_sale;
mod journal_sync;
pub mod redis;
pub mod seat_reads;
pub mod stalls;
mod synced;
pub mod watermark;
mod zero_ahead;

/// Why a store operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The request was refused by the queue rules.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The backend cannot be reached or did not answer in time. Maps to `503 UNAVAILABLE`.
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// The queue-rule error, if that is what this is.
    pub fn queue(&self) -> Option<&QueueError> {
        match self {
            StoreError::Queue(q) => Some(q),
            StoreError::Unavailable(_) => None,
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A change that live clients may need to hear about, published by the store after the
/// operation that made it is durable. With several nodes, each node's store also relays
/// the notices of the others (Redis pub/sub), so a client connected anywhere hears them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The place's turn came: it may enter now.
    Admitted { event_id: Arc<str>, seq: u64 },
    /// The place ended (left, completed, expired or cleared).
    Ended {
        event_id: Arc<str>,
        seq: u64,
        reason: EndReason,
    },
    /// Positions in the event's queue may have changed (someone joined, left, was admitted
    /// or expired). Live clients re-read their position, coalesced.
    Moved { event_id: Arc<str> },
    /// The event was created or its settings changed (`put_event`, `update_event`): the
    /// scheduler's plan (deadlines, rate budget) may be stale.
    EventChanged { event_id: Arc<str> },
    /// The event and every place in it were removed (`delete_event`). Every node forgets
    /// the event's gauges and ends its live followers.
    EventDeleted { event_id: Arc<str> },
    /// Another node gave back the event's periodic-work lease as it closed (Redis): a node
    /// standing by for it takes it at its next tick, which its scheduler makes at once,
    /// rather than when the lease would have lapsed.
    LeaseFreed { event_id: Arc<str> },
}

/// How many notices may queue for a slow subscriber before it is told it lagged (and then
/// re-reads everything it follows).
pub const NOTICE_BUFFER: usize = 8192;

/// Turns an operation's effects into notices (at most one `Moved` per operation).
pub fn notices_of(event_id: &Arc<str>, fx: &[Effect]) -> Vec<Notice> {
    let (mut out, moved) = notices_but_moved(event_id, fx);
    if moved {
        out.push(Notice::Moved {
            event_id: event_id.clone(),
        });
    }
    out
}

/// [`notices_of`] without the `Moved`: answers whether there would be one.
pub fn notices_but_moved(event_id: &Arc<str>, fx: &[Effect]) -> (Vec<Notice>, bool) {
    let mut out = Vec::new();
    let mut moved = false;
    for e in fx {
        match e {
            Effect::Admitted { seq, .. } => {
                out.push(Notice::Admitted {
                    event_id: event_id.clone(),
                    seq: *seq,
                });
                moved = true;
            }
            Effect::Ended { seq, reason, .. } => {
                out.push(Notice::Ended {
                    event_id: event_id.clone(),
                    seq: *seq,
                    reason: *reason,
                });
                moved = true;
            }
            Effect::Joined { .. } => moved = true,
            Effect::Entered { .. }
            | Effect::Forgotten { .. }
            | Effect::Invited { .. }
            | Effect::InviteBound { .. }
            | Effect::Item { .. }
            | Effect::Extended { .. } => {}
        }
    }
    (out, moved)
}

/// The events whose positions moved since the live hub last took them: the embedded
/// store's `Moved`, coalesced where it is made ([`Store::moved_events`]).
///
/// As a notice, every join's `Moved` was a broadcast send and a wake-up of the hub's task,
/// which only marks the event dirty and pushes the refresh once per coalescing window;
/// under a burst of joins that was one message and one task switch per join for one
/// refresh (docs/PERFORMANCE.md, "Moves coalesced where they are made": a build without
/// these notices served 3–8 % more `sync` joins). Here a change adds its event to a set,
/// which wakes the hub only when it was empty; the hub takes the whole set when its next
/// sweep starts, so the joins meanwhile wake nobody. Nothing is lost: the set cannot
/// overflow (one entry per event at most), and an event added after the take wakes the
/// hub again.
#[derive(Default)]
pub struct MovedEvents {
    pending: parking_lot::Mutex<std::collections::HashSet<Arc<str>>>,
    wake: tokio::sync::Notify,
}

impl MovedEvents {
    /// Positions in `event_id` may have changed.
    pub fn mark(&self, event_id: &Arc<str>) {
        let mut pending = self.pending.lock();
        if pending.contains(event_id) {
            return;
        }
        let first = pending.is_empty();
        pending.insert(event_id.clone());
        drop(pending);
        if first {
            // A permit if the hub is not waiting: its next wait ends at once.
            self.wake.notify_one();
        }
    }

    /// The events marked since the last take.
    pub fn take(&self) -> std::collections::HashSet<Arc<str>> {
        std::mem::take(&mut *self.pending.lock())
    }

    /// Ends once an event was marked into an empty set (perhaps before this call).
    pub async fn marked(&self) {
        self.wake.notified().await;
    }
}

/// An event's settings with its current figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventSnapshot {
    pub event_id: String,
    pub config: EventConfig,
    pub figures: EventFigures,
}

/// What [`Store::end_sale`] found and did, all read in the one step that ended the sale.
#[derive(Debug, Clone, PartialEq)]
pub struct SaleEndApplied {
    /// The settings just before the end (what it replaced, if the sale had ended already).
    pub before: EventConfig,
    /// The settings with the end.
    pub config: EventConfig,
    /// The places the end ended: those waiting just before it (once what was due had
    /// ended), or 0 when the sale had ended already, as its places were over then (removed
    /// by the sweep or not).
    pub waiting: u64,
}

/// A request to join an event's queue.
#[derive(Debug, Clone, Default)]
pub struct JoinRequest {
    /// `None` for anonymous places, which are never deduplicated.
    pub user_id: Option<String>,
    /// Raw JSON, already size-checked by the caller.
    pub metadata: Option<String>,
    /// Fresh 128-bit randomness from the caller; becomes the place's nonce if a new place
    /// is made.
    pub nonce: u128,
    /// The caller proved it is `user_id` (a user token or the server key): only then does a
    /// repeat join get the user's live place back, otherwise it is `AlreadyJoined`.
    pub proven: bool,
    /// The invite code, for an invite-only event.
    pub invite: Option<String>,
}

impl JoinRequest {
    /// The proof part, as the queue rules take it.
    pub fn proof(&self) -> crate::core::JoinProof<'_> {
        crate::core::JoinProof {
            proven: self.proven,
            invite: self.invite.as_deref(),
        }
    }
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates the event with `patch` over the defaults, or updates it with `patch` over its
    /// stored settings; validates the result as a whole. Capacity or pace changes take
    /// effect at once (waiting places are admitted into new room before this returns).
    /// Publishes [`Notice::EventChanged`] (to every node).
    async fn put_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig>;

    /// Updates an existing event with `patch` over its stored settings, as `put_event`
    /// does, but never creates one: `EventNotFound` if the event does not exist. Atomic
    /// against `delete_event`: a deletion that lands first is never undone (the event
    /// does not come back with default settings), one that lands after removes the
    /// updated event.
    async fn update_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig>;

    /// Ends the sale with `end`, as `update_event` with that patch does (never creates:
    /// `EventNotFound`), and answers the settings before and after and how many waiting
    /// places it ended, read in the same atomic step as the end itself: a join that lands
    /// before it is counted (and ended), one after it is refused. Publishes
    /// [`Notice::EventChanged`] (to every node).
    async fn end_sale(
        &self,
        event_id: &str,
        end: SaleEnd,
        now: Millis,
    ) -> StoreResult<SaleEndApplied>;

    /// Settings and figures of one event; `EventNotFound` if unknown.
    async fn get_event(&self, event_id: &str, now: Millis) -> StoreResult<EventSnapshot>;

    /// Every event, ordered by id.
    async fn list_events(&self, now: Millis) -> StoreResult<Vec<EventSnapshot>>;

    /// Removes the event and every place in it. Its tokens then answer `TOKEN_NOT_FOUND`
    /// (or `EVENT_NOT_FOUND`). `EventNotFound` if unknown. Publishes
    /// [`Notice::EventDeleted`] (to every node).
    async fn delete_event(&self, event_id: &str) -> StoreResult<()>;

    /// Ends every waiting place (they answer `TOKEN_NOT_FOUND`); admitted and active places
    /// stay. Answers how many were removed.
    async fn clear(&self, event_id: &str, now: Millis) -> StoreResult<u64>;

    /// The first `limit` waiting places in order.
    async fn queue_head(
        &self,
        event_id: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<HeadEntry>>;

    /// The pre-queue's waiting places (`opens_at`), as sequence numbers in join order:
    /// those after `after`, at most `limit`. Whoever has the list and the published
    /// shuffle seed can recompute the order of admission (docs/API.md).
    async fn prequeue(
        &self,
        event_id: &str,
        after: u64,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<u64>>;

    /// Joins the queue. Idempotent per (`event_id`, `user_id`) for a proven caller
    /// (`req.proven`): a user holding a live place gets that place back (heartbeat
    /// renewed), even under concurrent calls; an unproven caller gets `AlreadyJoined` and
    /// the place is not touched. A new place is admitted at once when there is room, rate
    /// budget, the event is not paused and nobody waits ahead. On an invite-only event the
    /// invite is checked first (`InviteRequired`, `InviteInvalid`) and a new place binds an
    /// unused code to its user (or to itself, without a user id) in the same atomic step.
    /// Errors: `EventNotFound`, `EventClosed`, `QueueFull`, `AlreadyJoined`,
    /// `InviteRequired`, `InviteInvalid`.
    async fn join(&self, event_id: &str, req: &JoinRequest, now: Millis) -> StoreResult<PlaceView>;

    /// Adds unused invite codes to the event (codes it already knows keep their binding).
    /// Answers how many were new. `EventNotFound` if unknown. Durable before it answers.
    async fn add_invites(&self, event_id: &str, codes: &[String], now: Millis) -> StoreResult<u64>;

    /// The event's invite codes after `after` in byte order, at most `limit`, each with
    /// what it is bound to (`None`: unused). `EventNotFound` if unknown. A read: it
    /// changes nothing.
    async fn invites(
        &self,
        event_id: &str,
        after: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<(String, Option<InviteHolder>)>>;

    /// The place's status with its exact position; renews its heartbeat.
    /// Errors: `TokenExpired` (ended by a deadline), `TokenNotFound` (any other end).
    async fn status(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView>;

    /// Renews the heartbeat of a waiting place (or an active session) without computing a
    /// position. Errors as `status`.
    async fn heartbeat(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()>;

    /// The place's status without renewing anything. Errors as `status`.
    async fn peek(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView>;

    /// Moves an admitted place to active; for an already active place answers the same
    /// session. Errors: `NotReady` while waiting, and those of `status`.
    async fn enter(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView>;

    /// Ends the place whatever its state and hands its slot on at once. `Ok(false)` if it
    /// had already ended.
    async fn leave(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<bool>;

    /// Renews an active session's idle deadline. `NoSession` unless active.
    async fn session_heartbeat(
        &self,
        event_id: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView>;

    /// The active session, renewing nothing. `NoSession` unless active.
    async fn session(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView>;

    /// Ends an active session as used and hands its slot on at once. `NoSession` unless active.
    async fn complete(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()>;

    /// Periodic work for one event: expiries and rate-paced admissions up to `now`.
    /// Answers when it next needs to run, if ever.
    async fn tick(&self, event_id: &str, now: Millis) -> StoreResult<Option<Millis>>;

    /// Claims `key` within `event_id` once: `true` for the first claim on any node, `false`
    /// for every later one until `expires_at`; after it the key is forgotten (so the memory
    /// for claims is bounded by their lifetime: the caller refuses what has expired before
    /// it asks). Independent of the event's existence and state. Spends proof-of-work
    /// challenges. The embedded store keeps claims in memory only: a restart forgets them
    /// (see docs/API.md).
    async fn claim_once(
        &self,
        event_id: &str,
        key: &str,
        expires_at: Millis,
        now: Millis,
    ) -> StoreResult<bool>;

    /// Appends `entry` (one line of text; the store does not read it) to the admin audit
    /// list and keeps only the newest `keep` entries. Durable before it answers on a durable
    /// backend; on Redis one list (capped) shared by every node.
    async fn append_audit(&self, entry: &str, keep: usize) -> StoreResult<()>;

    /// The newest `limit` entries of the admin audit list, newest first.
    async fn audit_entries(&self, limit: usize) -> StoreResult<Vec<String>>;

    /// Ids of every event.
    async fn event_ids(&self) -> StoreResult<Vec<String>>;

    /// Answers when the backend is reachable (for `/readyz`).
    async fn ping(&self) -> StoreResult<()>;

    /// Whether the backend stopped for good: it refuses every change until the process
    /// restarts (the embedded store once writing its journal failed). `/healthz` asks at
    /// every probe, so it must cost one atomic load. `false` (the default) for a backend
    /// that recovers on its own, as Redis does when it is reachable again.
    fn failed(&self) -> bool {
        false
    }

    /// Resolves once [`Store::failed`] turns `true` (at once if it is already); never for a
    /// backend that cannot fail for good. The server waits on it to shut down.
    async fn until_failed(&self) {
        std::future::pending::<()>().await
    }

    /// Adds items (seat ids) to the event's inventory, available; ids it knows keep their
    /// state. Answers how many were new and the counts after, which, as `inventory`'s, are
    /// read after ending what is due and releasing lapsed holds. Errors: `EventNotFound`,
    /// `Invalid` (an id that is not 1-64 of `[A-Za-z0-9._:-]`), `InventoryFull` (nothing
    /// added) past `core::holds::MAX_ITEMS`. Durable before it answers.
    async fn put_inventory(
        &self,
        event_id: &str,
        items: &[String],
        now: Millis,
    ) -> StoreResult<(u64, InventoryCounts)>;

    /// Every item with its state (ordered by id) and the counts, after ending what is due
    /// and releasing lapsed holds. `EventNotFound` if unknown.
    async fn inventory(&self, event_id: &str, now: Millis) -> StoreResult<InventoryView>;

    /// Holds `items` for the active session of `key` until `now + hold_ttl_sec`, all or
    /// none, in one atomic step: no item is ever held or sold by two sessions. Items the
    /// session holds already are renewed. The session's idle deadline is renewed as by
    /// `session_heartbeat`, whether or not the items are held. Answers everything the
    /// session holds. Errors: `NoSession`, `ItemNotFound`, `HoldConflict` (held by another
    /// session, or sold), `TooManyHolds` (past `max_holds_per_session`), as the first
    /// failing check says.
    /// Every end of the session releases its holds in the step that ends it, except
    /// `complete`, which sells them.
    async fn hold(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: &[String],
        now: Millis,
    ) -> StoreResult<SessionHolds>;

    /// Releases the session's holds of `items` (every hold with `None`); items it does not
    /// hold are ignored. Renews the session's idle deadline as `session_heartbeat` does.
    /// Answers what it still holds. `NoSession` unless active.
    async fn release(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: Option<&[String]>,
        now: Millis,
    ) -> StoreResult<SessionHolds>;

    /// Adds `session_extend_sec` to the active session's maximum and renews its idle
    /// deadline; answers the session with its new end. Errors: `NoSession`,
    /// `ExtensionLimit` (already extended `max_extensions` times).
    async fn extend(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView>;

    /// Notices of changes on any node (live updates, the scheduler's wake-ups, gauges of
    /// deleted events). Every call answers a new receiver.
    fn subscribe(&self) -> broadcast::Receiver<Notice>;

    /// The notices about events themselves ([`Notice::EventChanged`],
    /// [`Notice::EventDeleted`]), for the tasks that need no others (the scheduler, the
    /// catalog, the gates, the history, the gauges): a place's notices (`Moved` of every
    /// join, `Admitted`, `Ended`) are only the live hub's, and each receiver of a notice is
    /// a task woken. A backend may answer every notice here (the default, as
    /// [`Store::subscribe`]); receivers ignore the others. Every call answers a new
    /// receiver.
    fn subscribe_events(&self) -> broadcast::Receiver<Notice> {
        self.subscribe()
    }

    /// Where this backend reports its `Moved` instead of as notices, coalesced (see
    /// [`MovedEvents`]); `None` (the default): every `Moved` comes through
    /// [`Store::subscribe`].
    fn moved_events(&self) -> Option<Arc<MovedEvents>> {
        None
    }

    /// Makes everything acknowledged durable and releases the backend; called once at
    /// shutdown, after the server stopped taking requests.
    async fn close(&self) -> StoreResult<()> {
        Ok(())
    }

    /// Bytes the backend spends on one event's data, as the backend itself estimates them,
    /// for the `waitroom_store_memory_bytes` gauge. `None`: this backend does not tell (the
    /// embedded store shares one process heap and one journal among every event).
    async fn memory_usage(&self, event_id: &str) -> StoreResult<Option<u64>> {
        let _ = event_id;
        Ok(None)
    }
}
