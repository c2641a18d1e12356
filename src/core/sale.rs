//! The sale's operations on [`EventQueue`]: inventory, holds and session extensions. Each
//! is one transition, like every queue operation: it first ends what is due (so a session
//! that lapsed has already released its holds), then sweeps lapsed holds, then acts.
//! The rules of the items themselves are in [`super::super::holds`]; how a session's end
//! releases or sells its holds is in `EventQueue::end`.

use super::{EventQueue, PlaceView};
use crate::core::holds::{InventoryCounts, InventoryView, ItemState, SessionHolds};
use crate::core::{Effect, Millis, PlaceKey, QueueError};

impl EventQueue {
    /// Adds items to the inventory (see [`crate::core::Inventory::add`]); answers how many
    /// were new and the counts after, which, like every inventory read, show no lapsed hold
    /// and none of a session that is due to end.
    pub fn put_inventory(
        &mut self,
        ids: &[String],
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<(u64, InventoryCounts), QueueError> {
        self.advance(now, fx);
        self.inventory.expire(now, fx);
        let added = self.inventory.add(ids, fx)?;
        Ok((added, self.inventory.counts()))
    }

    /// Every item with its state, after ending what is due and releasing lapsed holds.
    pub fn inventory(&mut self, now: Millis, fx: &mut Vec<Effect>) -> InventoryView {
        self.advance(now, fx);
        self.inventory.expire(now, fx);
        self.inventory.view()
    }

    /// Holds `ids` for the active session of `key` for the event's `hold_ttl_sec`, all or
    /// none, and renews the session's idle deadline (see [`EventQueue::seen_choosing`]).
    /// Errors: `NoSession`, `ItemNotFound`, `HoldConflict`, `TooManyHolds`.
    pub fn hold(
        &mut self,
        key: PlaceKey,
        ids: &[String],
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<SessionHolds, QueueError> {
        self.seen_choosing(key, now, fx)?;
        self.inventory.expire(now, fx);
        let until = now + Millis::from(self.config.hold_ttl_sec) * 1000;
        let max = self.config.max_holds_per_session;
        self.inventory.hold(key.seq, ids, until, max, fx)?;
        Ok(self.inventory.of_session(key.seq))
    }

    /// Releases the session's holds of `ids` (all with `None`) and renews the session's idle
    /// deadline (see [`EventQueue::seen_choosing`]); answers what it still holds.
    pub fn release(
        &mut self,
        key: PlaceKey,
        ids: Option<&[String]>,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<SessionHolds, QueueError> {
        self.seen_choosing(key, now, fx)?;
        self.inventory.expire(now, fx);
        self.inventory.release(key.seq, ids, fx);
        Ok(self.inventory.of_session(key.seq))
    }

    /// The active session of `key`, its idle deadline renewed as a heartbeat renews it (its
    /// maximum stays): a person holding or releasing seats is busy on the site, not idle,
    /// whatever the call answers (a seat someone else took is part of choosing).
    fn seen_choosing(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<(), QueueError> {
        let p = self.session(key, now, fx)?;
        p.last_seen = p.last_seen.max(now);
        Ok(())
    }

    /// Adds `session_extend_sec` to the active session's maximum (and renews its idle
    /// deadline: asking is a sign of life). `ExtensionLimit` past `max_extensions`, renewing
    /// nothing.
    pub fn extend(
        &mut self,
        key: PlaceKey,
        now: Millis,
        fx: &mut Vec<Effect>,
    ) -> Result<PlaceView, QueueError> {
        self.session(key, now, fx)?;
        let (count, extra) = self.extensions.get(&key.seq).copied().unwrap_or((0, 0));
        if count >= self.config.max_extensions {
            return Err(QueueError::ExtensionLimit);
        }
        let p = self.places.get_mut(&key.seq).expect("in session");
        p.last_seen = p.last_seen.max(now);
        let extra = extra + Millis::from(self.config.session_extend_sec) * 1000;
        self.extensions.insert(key.seq, (count + 1, extra));
        fx.push(Effect::Extended {
            seq: key.seq,
            count: count + 1,
            extra_ms: extra,
        });
        // The deadline moved later: the entry on file is re-timed when it comes up.
        Ok(self.view(key.seq, now))
    }

    /// Puts back items read from disk (after [`EventQueue::restore`]).
    pub fn restore_items(&mut self, items: impl IntoIterator<Item = (Box<str>, ItemState)>) {
        for (id, state) in items {
            self.inventory.restore(id, state);
        }
    }

    /// Puts back session extensions read from disk: `(seq, count, extra_ms)`.
    pub fn restore_extensions(&mut self, ext: impl IntoIterator<Item = (u64, u32, Millis)>) {
        for (seq, count, extra) in ext {
            if self.places.get(&seq).is_some() {
                self.extensions.insert(seq, (count, extra));
            }
        }
    }
}
