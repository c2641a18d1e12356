//! A fault-injecting [`Store`] double, for tests: wraps a real store (usually the in-memory
//! [`EmbeddedStore`]) and can be told to make chosen operations fail, wait, hang or panic,
//! and counts every call with the (tokio) time it was made.
//!
//! Wrapping a real store rather than scripting answers keeps tests honest: what is not made
//! to fail behaves exactly like a backend, so a test sets up its data through the same
//! contract as production code, and breaks only what it is about. It lives in the library,
//! not under `#[cfg(test)]`, so that unit tests and integration tests (`tests/`) share it.
//!
//! ```
//! # use std::sync::Arc;
//! use waitroom::store::fault::{Fault, FaultStore, Op};
//! let store = Arc::new(FaultStore::embedded());
//! store.inject(Op::Tick, Fault::unavailable());
//! store.inject_all(Fault::Hang);
//! store.heal_all();
//! assert_eq!(store.calls(Op::Tick), 0);
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use super::embedded::EmbeddedStore;
use super::{EventSnapshot, JoinRequest, Notice, SaleEndApplied, Store, StoreError, StoreResult};
use crate::core::{
    EventConfig, EventPatch, HeadEntry, InventoryCounts, InventoryView, InviteHolder, Millis,
    PlaceKey, PlaceView, SaleEnd, SessionHolds,
};

/// One operation of the [`Store`] trait (`subscribe`, which cannot fail, is not one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    PutEvent,
    UpdateEvent,
    EndSale,
    GetEvent,
    ListEvents,
    DeleteEvent,
    Clear,
    QueueHead,
    Prequeue,
    Join,
    AddInvites,
    Invites,
    Status,
    Heartbeat,
    Peek,
    Enter,
    Leave,
    SessionHeartbeat,
    Session,
    Complete,
    Tick,
    ClaimOnce,
    EventIds,
    AppendAudit,
    AuditEntries,
    Ping,
    Close,
    PutInventory,
    Inventory,
    Hold,
    Release,
    Extend,
}

/// What an operation does instead of (or before) asking the inner store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answers `StoreError::Unavailable` with this message: the backend is down.
    Unavailable(String),
    /// Waits this long (on tokio's clock, so paused-time tests can use it), then answers
    /// as the inner store does: a slow backend.
    Delay(Duration),
    /// Never answers: the backend stopped responding.
    Hang,
    /// Asks the inner store at once, then waits this long before answering: an answer read
    /// early and delivered late (only `list_events` honours it).
    Late(Duration),
    /// Panics with this message: a bug in a backend.
    Panic(String),
}

impl Fault {
    /// `Unavailable` with the message of a refused connection.
    pub fn unavailable() -> Self {
        Fault::Unavailable("connection refused".into())
    }
}

/// The double. Share it as an `Arc<FaultStore>` and hand a clone to the code under test as
/// `Arc<dyn Store>`; the test keeps its own handle to steer and observe it.
pub struct FaultStore {
    inner: Arc<dyn Store>,
    /// Faults by operation; `all` applies to operations without their own.
    faults: Mutex<Faults>,
    /// Every call, in order, with the time it was made.
    calls: Mutex<Vec<(Op, Instant)>>,
    /// Ticks made, by event.
    ticks: Mutex<HashMap<String, usize>>,
    /// Set by [`FaultStore::fail_for_good`]: the backend stopped for good.
    failed: AtomicBool,
    on_fail: Notify,
    /// Something that must outlive the inner store, such as the temporary directory a
    /// durable store writes into. Declared after `inner`, so it is dropped after it.
    _keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

#[derive(Default)]
struct Faults {
    by_op: HashMap<Op, Fault>,
    all: Option<Fault>,
}

impl FaultStore {
    /// Wraps `inner`; nothing fails until told to.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultStore {
            inner,
            faults: Mutex::new(Faults::default()),
            calls: Mutex::new(Vec::new()),
            ticks: Mutex::new(HashMap::new()),
            failed: AtomicBool::new(false),
            on_fail: Notify::new(),
            _keep: None,
        }
    }

    /// Wraps `inner` and keeps `keep` alive until after `inner` is dropped (a durable
    /// store's temporary directory must not go while the store still writes into it).
    pub fn owning(inner: Arc<dyn Store>, keep: impl std::any::Any + Send + Sync) -> Self {
        FaultStore {
            _keep: Some(Box::new(keep)),
            ..Self::new(inner)
        }
    }

    /// Wraps a fresh in-memory [`EmbeddedStore`].
    pub fn embedded() -> Self {
        Self::new(Arc::new(EmbeddedStore::new()))
    }

    /// Stops the backend for good, as the embedded store stops once its journal cannot be
    /// written: [`Store::failed`] answers `true` and [`Store::until_failed`] ends. Every
    /// operation then answers `Unavailable`.
    pub fn fail_for_good(&self) {
        self.inject_all(Fault::Unavailable("the store's writer stopped".into()));
        self.failed.store(true, SeqCst);
        self.on_fail.notify_waiters();
    }

    /// The wrapped store, to set up or inspect data behind the faults' back.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// From now on, `op` does `fault`.
    pub fn inject(&self, op: Op, fault: Fault) {
        self.faults.lock().by_op.insert(op, fault);
    }

    /// From now on, every operation without a fault of its own does `fault`.
    pub fn inject_all(&self, fault: Fault) {
        self.faults.lock().all = Some(fault);
    }

    /// `op` answers normally again (unless a fault for all operations applies).
    pub fn heal(&self, op: Op) {
        self.faults.lock().by_op.remove(&op);
    }

    /// Every operation answers normally again.
    pub fn heal_all(&self) {
        *self.faults.lock() = Faults::default();
    }

    /// How many times `op` was called (failed calls included).
    pub fn calls(&self, op: Op) -> usize {
        self.calls.lock().iter().filter(|(o, _)| *o == op).count()
    }

    /// When `op` was called, in order (tokio time).
    pub fn call_times(&self, op: Op) -> Vec<Instant> {
        let calls = self.calls.lock();
        calls
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|&(_, t)| t)
            .collect()
    }

    /// How many times `tick` was called for `event_id` (failed calls included).
    pub fn ticks_of(&self, event_id: &str) -> usize {
        self.ticks.lock().get(event_id).copied().unwrap_or(0)
    }

    /// Forgets the calls made so far.
    pub fn forget_calls(&self) {
        self.calls.lock().clear();
        self.ticks.lock().clear();
    }

    /// Records the call, then applies the fault of `op`, if any. `Ok` means: ask the inner
    /// store.
    async fn gate(&self, op: Op) -> StoreResult<()> {
        self.calls.lock().push((op, Instant::now()));
        let fault = {
            let f = self.faults.lock();
            f.by_op.get(&op).or(f.all.as_ref()).cloned()
        };
        match fault {
            None => Ok(()),
            Some(Fault::Unavailable(m)) => Err(StoreError::Unavailable(m)),
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Panic(m)) => panic!("{m}"),
            Some(Fault::Late(_)) => Ok(()),
        }
    }

    /// After the inner store answered: the wait of a `Late` fault of `op`, if any.
    async fn late(&self, op: Op) {
        let late = match self.faults.lock().by_op.get(&op) {
            Some(Fault::Late(d)) => Some(*d),
            _ => None,
        };
        if let Some(d) = late {
            tokio::time::sleep(d).await;
        }
    }
}

#[async_trait]
impl Store for FaultStore {
    async fn put_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        self.gate(Op::PutEvent).await?;
        self.inner.put_event(event_id, patch, now).await
    }

    async fn update_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        self.gate(Op::UpdateEvent).await?;
        self.inner.update_event(event_id, patch, now).await
    }

    async fn end_sale(
        &self,
        event_id: &str,
        end: SaleEnd,
        now: Millis,
    ) -> StoreResult<SaleEndApplied> {
        self.gate(Op::EndSale).await?;
        self.inner.end_sale(event_id, end, now).await
    }

    async fn get_event(&self, event_id: &str, now: Millis) -> StoreResult<EventSnapshot> {
        self.gate(Op::GetEvent).await?;
        self.inner.get_event(event_id, now).await
    }

    async fn list_events(&self, now: Millis) -> StoreResult<Vec<EventSnapshot>> {
        self.gate(Op::ListEvents).await?;
        let listed = self.inner.list_events(now).await;
        self.late(Op::ListEvents).await;
        listed
    }

    async fn delete_event(&self, event_id: &str) -> StoreResult<()> {
        self.gate(Op::DeleteEvent).await?;
        self.inner.delete_event(event_id).await
    }

    async fn clear(&self, event_id: &str, now: Millis) -> StoreResult<u64> {
        self.gate(Op::Clear).await?;
        self.inner.clear(event_id, now).await
    }

    async fn queue_head(
        &self,
        event_id: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<HeadEntry>> {
        self.gate(Op::QueueHead).await?;
        self.inner.queue_head(event_id, limit, now).await
    }

    async fn prequeue(
        &self,
        event_id: &str,
        after: u64,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<u64>> {
        self.gate(Op::Prequeue).await?;
        self.inner.prequeue(event_id, after, limit, now).await
    }

    async fn join(&self, event_id: &str, req: &JoinRequest, now: Millis) -> StoreResult<PlaceView> {
        self.gate(Op::Join).await?;
        self.inner.join(event_id, req, now).await
    }

    async fn add_invites(&self, event_id: &str, codes: &[String], now: Millis) -> StoreResult<u64> {
        self.gate(Op::AddInvites).await?;
        self.inner.add_invites(event_id, codes, now).await
    }

    async fn invites(
        &self,
        event_id: &str,
        after: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<(String, Option<InviteHolder>)>> {
        self.gate(Op::Invites).await?;
        self.inner.invites(event_id, after, limit, now).await
    }

    async fn status(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.gate(Op::Status).await?;
        self.inner.status(event_id, key, now).await
    }

    async fn heartbeat(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.gate(Op::Heartbeat).await?;
        self.inner.heartbeat(event_id, key, now).await
    }

    async fn peek(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.gate(Op::Peek).await?;
        self.inner.peek(event_id, key, now).await
    }

    async fn enter(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.gate(Op::Enter).await?;
        self.inner.enter(event_id, key, now).await
    }

    async fn leave(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<bool> {
        self.gate(Op::Leave).await?;
        self.inner.leave(event_id, key, now).await
    }

    async fn session_heartbeat(
        &self,
        event_id: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        self.gate(Op::SessionHeartbeat).await?;
        self.inner.session_heartbeat(event_id, key, now).await
    }

    async fn session(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.gate(Op::Session).await?;
        self.inner.session(event_id, key, now).await
    }

    async fn complete(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.gate(Op::Complete).await?;
        self.inner.complete(event_id, key, now).await
    }

    async fn tick(&self, event_id: &str, now: Millis) -> StoreResult<Option<Millis>> {
        *self.ticks.lock().entry(event_id.to_string()).or_default() += 1;
        self.gate(Op::Tick).await?;
        self.inner.tick(event_id, now).await
    }

    async fn put_inventory(
        &self,
        event_id: &str,
        items: &[String],
        now: Millis,
    ) -> StoreResult<(u64, InventoryCounts)> {
        self.gate(Op::PutInventory).await?;
        self.inner.put_inventory(event_id, items, now).await
    }

    async fn inventory(&self, event_id: &str, now: Millis) -> StoreResult<InventoryView> {
        self.gate(Op::Inventory).await?;
        self.inner.inventory(event_id, now).await
    }

    async fn hold(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: &[String],
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        self.gate(Op::Hold).await?;
        self.inner.hold(event_id, key, items, now).await
    }

    async fn release(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: Option<&[String]>,
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        self.gate(Op::Release).await?;
        self.inner.release(event_id, key, items, now).await
    }

    async fn extend(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.gate(Op::Extend).await?;
        self.inner.extend(event_id, key, now).await
    }

    async fn claim_once(
        &self,
        event_id: &str,
        key: &str,
        expires_at: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        self.gate(Op::ClaimOnce).await?;
        self.inner.claim_once(event_id, key, expires_at, now).await
    }

    async fn event_ids(&self) -> StoreResult<Vec<String>> {
        self.gate(Op::EventIds).await?;
        self.inner.event_ids().await
    }

    async fn append_audit(&self, entry: &str, keep: usize) -> StoreResult<()> {
        self.gate(Op::AppendAudit).await?;
        self.inner.append_audit(entry, keep).await
    }

    async fn audit_entries(&self, limit: usize) -> StoreResult<Vec<String>> {
        self.gate(Op::AuditEntries).await?;
        self.inner.audit_entries(limit).await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.gate(Op::Ping).await?;
        self.inner.ping().await
    }

    fn failed(&self) -> bool {
        self.failed.load(SeqCst) || self.inner.failed()
    }

    async fn until_failed(&self) {
        let told = self.on_fail.notified();
        let mut told = std::pin::pin!(told);
        // Registered before the flag is read, so a failure after the read still wakes it.
        told.as_mut().enable();
        if self.failed.load(SeqCst) {
            return;
        }
        tokio::select! {
            () = told => {}
            () = self.inner.until_failed() => {}
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.inner.subscribe()
    }

    fn subscribe_events(&self) -> broadcast::Receiver<Notice> {
        self.inner.subscribe_events()
    }

    fn moved_events(&self) -> Option<std::sync::Arc<crate::store::MovedEvents>> {
        self.inner.moved_events()
    }

    /// Not gated: only the memory gauges ask, and no test injects faults into them.
    async fn memory_usage(&self, event_id: &str) -> StoreResult<Option<u64>> {
        self.inner.memory_usage(event_id).await
    }

    async fn close(&self) -> StoreResult<()> {
        self.gate(Op::Close).await?;
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn faults_apply_to_their_operations_and_heal() {
        let s = FaultStore::embedded();
        s.put_event("e", &EventPatch::default(), 0).await.unwrap();
        s.inject(Op::GetEvent, Fault::unavailable());
        assert!(matches!(
            s.get_event("e", 0).await,
            Err(StoreError::Unavailable(m)) if m == "connection refused"
        ));
        assert_eq!(s.event_ids().await.unwrap(), vec!["e".to_string()]);

        // A fault for every operation gives way to an operation's own.
        s.inject_all(Fault::Unavailable("down".into()));
        assert!(s.ping().await.is_err());
        s.heal(Op::GetEvent);
        assert!(
            s.get_event("e", 0).await.is_err(),
            "the fault for all applies"
        );
        s.heal_all();
        assert!(s.get_event("e", 0).await.is_ok());

        s.inject(Op::Ping, Fault::Delay(Duration::from_secs(3)));
        let t = Instant::now();
        s.ping().await.unwrap();
        assert_eq!(t.elapsed(), Duration::from_secs(3));

        s.inject(Op::Ping, Fault::Hang);
        let hung = tokio::time::timeout(Duration::from_secs(60), s.ping()).await;
        assert!(hung.is_err(), "a hung call never answers");

        assert_eq!(s.calls(Op::GetEvent), 3);
        assert_eq!(s.call_times(Op::Ping).len(), 3);
        s.forget_calls();
        assert_eq!(s.calls(Op::Ping), 0);
    }

    #[tokio::test]
    #[should_panic(expected = "the store blew up")]
    async fn a_panic_fault_panics() {
        let s = FaultStore::embedded();
        s.inject_all(Fault::Panic("the store blew up".into()));
        let _ = s.ping().await;
    }
}
