//! Removing a deleted event's keys in steps.
//!
//! A deletion used to tombstone every key of the event in the batch that removed its
//! record: for an event of 600,000 places, one batch of over a million tombstones that held
//! the writer's flag for 2–3 s, so every other event's changes (every join of a running
//! sale) waited that long. Now the deletion's own batch removes the event's record and
//! writes a mark in the `purges` keyspace, atomically; its keys then go in steps of at
//! most [`PURGE_CHUNK`] per keyspace, each an ordinary change in ticket order, so other
//! events' changes are written between them. The last step removes the mark.
//!
//! - **Nothing is read back wrongly meanwhile**: a restart reads an event's keys only
//!   through its record (`recover`), and the record went first.
//! - **A crash mid-way**: the mark is still there, and the next open finishes the purge
//!   before reading anything ([`finish_at_open`]).
//! - **A re-creation of the same id** would find the old keys under the same prefix (its
//!   places' sequence numbers start again), so it waits until the purge is done
//!   ([`Journal::purged`]); only that request waits.
//! - **Each step reads on from where the last one stopped**: a scan from the prefix's start
//!   would walk over every tombstone written before it, quadratic in the event's size.

use std::collections::HashSet;
use std::sync::Arc;

use fjall::{Keyspace, Slice};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{event_prefix, Change, Journal};
use crate::store::StoreError;

/// Keys removed per step and keyspace: a step's batch then costs a few milliseconds, not
/// seconds (tombstones are ~40-byte keys), and an event of a million keys takes a few
/// hundred steps.
#[cfg(not(test))]
pub(super) const PURGE_CHUNK: usize = 4096;
/// Small in tests, so that a few hundred places take many steps.
#[cfg(test)]
pub(super) const PURGE_CHUNK: usize = 64;

/// How many times a purge waits for one step before it gives up (each wait is bounded by
/// the store's own durable-wait limit, a few seconds).
const STEP_WAITS: u32 = 20;

/// Which keyspace a step's keys are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    Places,
    Invites,
    Items,
}

/// The events whose keys are being removed, for [`Journal::purged`].
#[derive(Default)]
pub(super) struct Purging {
    ids: Mutex<HashSet<Arc<str>>>,
    ended: Notify,
}

impl Purging {
    pub(super) fn start(&self, event_id: &Arc<str>) {
        self.ids.lock().insert(event_id.clone());
    }

    fn end(&self, event_id: &str) {
        self.ids.lock().remove(event_id);
        self.ended.notify_waiters();
    }

    pub(super) fn contains(&self, event_id: &str) -> bool {
        self.ids.lock().contains(event_id)
    }
}

/// Up to [`PURGE_CHUNK`] keys under `prefix` in `ks`, from `from` on.
fn chunk(ks: &Keyspace, prefix: &[u8], from: &[u8]) -> fjall::Result<Vec<Slice>> {
    let mut keys = Vec::new();
    for kv in ks.range(from.to_vec()..) {
        let k = kv.key()?;
        if !k.starts_with(prefix) || keys.len() == PURGE_CHUNK {
            break;
        }
        keys.push(k);
    }
    Ok(keys)
}

/// The first key after `k` in byte order.
fn after(k: &[u8]) -> Vec<u8> {
    let mut next = k.to_vec();
    next.push(0);
    next
}

impl Journal {
    /// Removes the keys of `event_id`, deleted by a change already written (its record is
    /// gone and its mark set), in steps; the last removes the mark. Runs on a task of its
    /// own (see [`super::super::embedded`]), so that a request that goes away does not
    /// leave it half done; if the store stops first, the next open finishes it.
    pub async fn purge(&self, event_id: Arc<str>) -> Result<(), StoreError> {
        let prefix = event_prefix(&event_id);
        let parts = [
            (Part::Places, &self.places),
            (Part::Invites, &self.invites),
            (Part::Items, &self.items),
        ];
        for (part, ks) in parts {
            let mut from = prefix.clone();
            loop {
                let keys = chunk(ks, &prefix, &from)
                    .map_err(|e| StoreError::Unavailable(format!("reading the store: {e}")))?;
                let rest = keys.len() == PURGE_CHUNK;
                let last = !rest && part == Part::Items;
                if keys.is_empty() && !last {
                    break;
                }
                if let Some(k) = keys.last() {
                    from = after(k);
                }
                let ticket = self.submit(Change::Purge {
                    event_id: event_id.clone(),
                    part,
                    keys,
                    last,
                })?;
                self.wait_for_step(ticket).await?;
                if !rest {
                    break;
                }
            }
        }
        self.purging.end(&event_id);
        Ok(())
    }

    /// Waits for a step to be written. A slow disk makes a wait give up (a request answers
    /// `503` then) while the step stays queued and is written later, in order: the purge
    /// waits again rather than stop half done, which would hold back a re-creation of the
    /// id until the next start. It stops on a failed store, or after [`STEP_WAITS`] waits
    /// (a writer that is gone answers every wait at once).
    async fn wait_for_step(&self, ticket: u64) -> Result<(), StoreError> {
        let mut waits = 1;
        loop {
            match self.wait(ticket).await {
                Ok(()) => return Ok(()),
                Err(e) if waits >= STEP_WAITS || self.synced.failed() => return Err(e),
                Err(_) => {
                    waits += 1;
                    // Given up on by the watchdog (`sync`), a step stays so until it is
                    // synced, and its next wait ends at once: wait the bound here instead,
                    // so the purge still waits about a minute in all.
                    if self.synced.late(ticket) {
                        tokio::time::sleep(super::MAX_DURABLE_WAIT).await;
                    }
                }
            }
        }
    }

    /// Waits until no purge of `event_id`'s keys is under way (see the module's comment).
    pub async fn purged(&self, event_id: &str) {
        loop {
            let ended = self.purging.ended.notified();
            if !self.purging.contains(event_id) {
                return;
            }
            ended.await;
        }
    }

    /// Whether `event_id`'s keys are still being removed.
    pub fn purging(&self, event_id: &str) -> bool {
        self.purging.contains(event_id)
    }

    /// Tests: how many keys the store holds under `event_id` (places, invites, items), and
    /// whether its purge mark is set.
    #[cfg(test)]
    pub(crate) fn keys_of(&self, event_id: &str) -> (usize, bool) {
        let prefix = event_prefix(event_id);
        let keys = [&self.places, &self.invites, &self.items]
            .iter()
            .map(|ks| ks.prefix(&prefix).count())
            .sum();
        let purges = self
            .db
            .keyspace("purges", fjall::KeyspaceCreateOptions::default);
        let marked = purges
            .expect("opened at start")
            .get(event_id)
            .expect("readable")
            .is_some();
        (keys, marked)
    }
}

/// Finishes, before anything is read, the purges a stop cut short: every event marked in
/// `purges` has its remaining keys removed, in batches of [`PURGE_CHUNK`], and its mark
/// last. Answers how many events were finished.
pub(super) fn finish_at_open(
    db: &fjall::Database,
    purges: &Keyspace,
    parts: [&Keyspace; 3],
) -> fjall::Result<usize> {
    let marked: Vec<Slice> = purges.iter().map(|kv| kv.key()).collect::<Result<_, _>>()?;
    for id in &marked {
        let mut prefix = id.to_vec();
        prefix.push(0);
        for ks in parts {
            let mut from = prefix.clone();
            loop {
                let keys = chunk(ks, &prefix, &from)?;
                let Some(k) = keys.last() else { break };
                from = after(k);
                let mut batch = db.batch();
                let rest = keys.len() == PURGE_CHUNK;
                for k in keys {
                    batch.remove(ks, k);
                }
                batch.commit()?;
                if !rest {
                    break;
                }
            }
        }
        let mut batch = db.batch();
        batch.remove(purges, id.clone());
        batch.commit()?;
        tracing::info!(
            event_id = %String::from_utf8_lossy(id),
            "finished removing a deleted event's keys"
        );
    }
    Ok(marked.len())
}
