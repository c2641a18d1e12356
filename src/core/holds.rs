//! Seat and inventory holds: an event's items (seats `A-1`, …), each available, held by one
//! session until a deadline, or sold to one session. Pure, like the queue: time is an
//! argument, and every change is reported as an [`Effect::Item`] so the durable store can
//! write it and a restart read it back.
//!
//! The rules, which the Redis script (`lua/holds.lua`) mirrors one for one:
//! - an item is held or sold by at most one session, ever: a hold of an item that another
//!   session holds, or that is sold, is refused whole (`HOLD_CONFLICT`, nothing changes);
//! - a session holds at most `max_holds_per_session` items (`TOO_MANY_HOLDS`);
//! - a hold lasts `hold_ttl_sec` from the call that made (or renewed) it; a lapsed hold is
//!   released lazily, by the next hold operation or inventory read of the event, before it
//!   does anything else (no answer ever shows a lapsed hold);
//! - when a session ends, in the same transition: completed, its holds become sold; any
//!   other end (idle, maximum, leave, replaced) releases them.
//!
//! Why lazily: nobody can observe a lapsed hold without an operation on the event, and
//! every such operation sweeps first, so a background sweep would only spend work.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::{Effect, EventConfig, EventPatch, Millis, QueueError};

/// Most items one event's inventory holds.
pub const MAX_ITEMS: u64 = 100_000;
/// Highest `max_holds_per_session`.
pub const MAX_HOLDS_PER_SESSION: u64 = 100;
/// Highest `max_extensions`.
pub const MAX_EXTENSIONS: u64 = 100;
/// Longest item id.
pub const MAX_ITEM_ID_LEN: usize = 64;

/// Defaults of the hold and extension settings (also handed to the Redis script).
pub const DEFAULT_HOLD_TTL_SEC: u32 = 300;
pub const DEFAULT_MAX_HOLDS_PER_SESSION: u32 = 10;
pub const DEFAULT_SESSION_EXTEND_SEC: u32 = 300;
pub const DEFAULT_MAX_EXTENSIONS: u32 = 0;

pub(crate) fn default_hold_ttl_sec() -> u32 {
    DEFAULT_HOLD_TTL_SEC
}
pub(crate) fn default_max_holds_per_session() -> u32 {
    DEFAULT_MAX_HOLDS_PER_SESSION
}
pub(crate) fn default_session_extend_sec() -> u32 {
    DEFAULT_SESSION_EXTEND_SEC
}

/// Where one item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemState {
    Available,
    /// Held by the session of place `seq` until `until` (exclusive: lapsed at `until`).
    Held {
        seq: u64,
        until: Millis,
    },
    /// Sold to the session of place `seq`.
    Sold {
        seq: u64,
    },
}

/// The admin's figures of an inventory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct InventoryCounts {
    pub total: u64,
    pub available: u64,
    pub held: u64,
    pub sold: u64,
}

/// Every item with its state, ordered by id, and the counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InventoryView {
    pub counts: InventoryCounts,
    pub items: Vec<(String, ItemState)>,
}

/// One hold of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct HeldItem {
    pub item: String,
    /// When the hold lapses (Unix ms).
    #[schema(value_type = u64)]
    pub expires_at: Millis,
}

/// What a session holds, ordered by item id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SessionHolds {
    pub holds: Vec<HeldItem>,
}

/// Checks an item id: 1-64 characters of `[A-Za-z0-9._:-]` (a seat `A-1`, `floor:B-12`).
/// No spaces: the Redis script keeps a session's items space-separated.
pub fn validate_item_id(id: &str) -> Result<(), QueueError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ITEM_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'));
    if ok {
        Ok(())
    } else {
        Err(QueueError::Invalid(format!(
            "item ids must be 1-{MAX_ITEM_ID_LEN} characters of [A-Za-z0-9._:-]: {:?}",
            id.chars().take(80).collect::<String>()
        )))
    }
}

/// Checks every id of a list (see [`validate_item_id`]) and its length.
pub fn validate_items(ids: &[String]) -> Result<(), QueueError> {
    if ids.len() as u64 > MAX_ITEMS {
        return Err(QueueError::Invalid(format!(
            "at most {MAX_ITEMS} items at once"
        )));
    }
    ids.iter().try_for_each(|id| validate_item_id(id))
}

/// The items of one event and who holds them.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    items: BTreeMap<Box<str>, ItemState>,
    /// Held items by session (place seq).
    sessions: HashMap<u64, BTreeSet<Box<str>>>,
    /// Held items by when their hold lapses.
    lapses: BTreeSet<(Millis, Box<str>)>,
    held: u64,
    sold: u64,
}

impl Inventory {
    /// Moves `id` (known) to `state`, keeping every index and count in step, and reports it.
    fn set(&mut self, id: &str, state: ItemState, fx: &mut Vec<Effect>) {
        let Some(old) = self.items.get_mut(id) else {
            return;
        };
        let was = std::mem::replace(old, state);
        match was {
            ItemState::Available => {}
            ItemState::Held { seq, until } => {
                self.held -= 1;
                self.lapses.remove(&(until, id.into()));
                if let Some(s) = self.sessions.get_mut(&seq) {
                    s.remove(id);
                    if s.is_empty() {
                        self.sessions.remove(&seq);
                    }
                }
            }
            ItemState::Sold { .. } => self.sold -= 1,
        }
        match state {
            ItemState::Available => {}
            ItemState::Held { seq, until } => {
                self.held += 1;
                self.lapses.insert((until, id.into()));
                self.sessions.entry(seq).or_default().insert(id.into());
            }
            ItemState::Sold { .. } => self.sold += 1,
        }
        fx.push(Effect::Item {
            id: id.into(),
            state,
        });
    }

    /// Adds the items not known yet, available; known ones keep their state. Answers how
    /// many were new; `InventoryFull` (nothing added) past [`MAX_ITEMS`].
    pub fn add(&mut self, ids: &[String], fx: &mut Vec<Effect>) -> Result<u64, QueueError> {
        validate_items(ids)?;
        let fresh: BTreeSet<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|id| !self.items.contains_key(*id))
            .collect();
        if self.items.len() as u64 + fresh.len() as u64 > MAX_ITEMS {
            return Err(QueueError::InventoryFull);
        }
        for id in &fresh {
            self.items.insert((*id).into(), ItemState::Available);
            fx.push(Effect::Item {
                id: (*id).into(),
                state: ItemState::Available,
            });
        }
        Ok(fresh.len() as u64)
    }

    /// Releases every hold whose time is up at `now`.
    pub fn expire(&mut self, now: Millis, fx: &mut Vec<Effect>) {
        while let Some((until, id)) = self.lapses.first().cloned() {
            if until > now {
                break;
            }
            self.set(&id, ItemState::Available, fx);
        }
    }

    /// Holds `ids` for the session `seq` until `until`, all or none, checking the items in
    /// the order given (the first failure answers): an unknown item is `ItemNotFound`, one
    /// held by another session or sold `HoldConflict`, one that would take the session past
    /// `max` held at once `TooManyHolds`. Items the session holds already are renewed, and
    /// never count against `max`.
    pub fn hold(
        &mut self,
        seq: u64,
        ids: &[String],
        until: Millis,
        max: u32,
        fx: &mut Vec<Effect>,
    ) -> Result<(), QueueError> {
        let mine = self.sessions.get(&seq).map_or(0, BTreeSet::len) as u64;
        let mut fresh = 0;
        let mut wanted = BTreeSet::new();
        for id in ids {
            if !wanted.insert(id.as_str()) {
                continue;
            }
            match self.items.get(id.as_str()) {
                None => return Err(QueueError::ItemNotFound),
                // Renewing only what the session holds adds nothing, so it is never refused:
                // a limit lowered while seats are held must not make them lapse at the next
                // renewal. Only a new item can break the limit, at the item that does.
                Some(ItemState::Available) => {
                    fresh += 1;
                    if mine + fresh > u64::from(max) {
                        return Err(QueueError::TooManyHolds);
                    }
                }
                Some(ItemState::Held { seq: s, .. }) if *s == seq => {}
                Some(_) => return Err(QueueError::HoldConflict),
            }
        }
        for id in wanted {
            self.set(id, ItemState::Held { seq, until }, fx);
        }
        Ok(())
    }

    /// Releases the session's holds of `ids` (all of them with `None`); items it does not
    /// hold are left alone. Answers how many were released.
    pub fn release(&mut self, seq: u64, ids: Option<&[String]>, fx: &mut Vec<Effect>) -> u64 {
        let Some(mine) = self.sessions.get(&seq) else {
            return 0;
        };
        let chosen: Vec<Box<str>> = match ids {
            None => mine.iter().cloned().collect(),
            Some(ids) => ids
                .iter()
                .filter(|id| mine.contains(id.as_str()))
                .map(|id| id.as_str().into())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        for id in &chosen {
            self.set(id, ItemState::Available, fx);
        }
        chosen.len() as u64
    }

    /// Turns every hold of the session into a sale.
    pub fn sell(&mut self, seq: u64, fx: &mut Vec<Effect>) {
        let Some(mine) = self.sessions.get(&seq) else {
            return;
        };
        for id in mine.clone() {
            self.set(&id, ItemState::Sold { seq }, fx);
        }
    }

    /// What the session holds.
    pub fn of_session(&self, seq: u64) -> SessionHolds {
        let holds = self
            .sessions
            .get(&seq)
            .into_iter()
            .flatten()
            .filter_map(|id| match self.items.get(id) {
                Some(ItemState::Held { until, .. }) => Some(HeldItem {
                    item: id.to_string(),
                    expires_at: *until,
                }),
                _ => None,
            })
            .collect();
        SessionHolds { holds }
    }

    pub fn counts(&self) -> InventoryCounts {
        let total = self.items.len() as u64;
        InventoryCounts {
            total,
            available: total - self.held - self.sold,
            held: self.held,
            sold: self.sold,
        }
    }

    pub fn view(&self) -> InventoryView {
        InventoryView {
            counts: self.counts(),
            items: self
                .items
                .iter()
                .map(|(id, s)| (id.to_string(), *s))
                .collect(),
        }
    }

    /// Puts back an item read from disk.
    pub fn restore(&mut self, id: Box<str>, state: ItemState) {
        self.items.insert(id.clone(), ItemState::Available);
        self.set(&id, state, &mut Vec::new());
    }

    /// Checks that the indexes agree with the items; used by tests.
    pub fn check(&self) -> Result<(), String> {
        let held = self
            .items
            .values()
            .filter(|s| matches!(s, ItemState::Held { .. }))
            .count() as u64;
        let sold = self
            .items
            .values()
            .filter(|s| matches!(s, ItemState::Sold { .. }))
            .count() as u64;
        let indexed: usize = self.sessions.values().map(BTreeSet::len).sum();
        if held != self.held || sold != self.sold || indexed as u64 != held {
            return Err(format!(
                "inventory counts drifted: held {held}/{} ({indexed} indexed), sold {sold}/{}",
                self.held, self.sold
            ));
        }
        Ok(())
    }

    /// The sessions that hold something.
    pub(crate) fn holders(&self) -> impl Iterator<Item = u64> + '_ {
        self.sessions.keys().copied()
    }
}

impl EventPatch {
    /// The hold and extension settings.
    pub(crate) fn apply_sale(&self, c: &mut EventConfig) -> Result<(), QueueError> {
        let bad = |m: String| QueueError::Invalid(m);
        let within = |field: &str, v: u64, min: u64, max: u64| {
            if (min..=max).contains(&v) {
                Ok(v as u32)
            } else {
                Err(bad(format!("{field} must be between {min} and {max}")))
            }
        };
        if let Some(v) = self.hold_ttl_sec {
            c.hold_ttl_sec = within("hold_ttl_sec", v, 1, super::config::MAX_SECONDS)?;
        }
        if let Some(v) = self.max_holds_per_session {
            c.max_holds_per_session = within("max_holds_per_session", v, 1, MAX_HOLDS_PER_SESSION)?;
        }
        if let Some(v) = self.session_extend_sec {
            c.session_extend_sec = within("session_extend_sec", v, 1, super::config::MAX_SECONDS)?;
        }
        if let Some(v) = self.max_extensions {
            c.max_extensions = within("max_extensions", v, 0, MAX_EXTENSIONS)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn holds_are_exclusive_bounded_and_lapse() {
        let mut inv = Inventory::default();
        let mut fx = Vec::new();
        assert_eq!(inv.add(&ids(&["A-1", "A-2", "A-3"]), &mut fx).unwrap(), 3);
        assert_eq!(inv.add(&ids(&["A-1"]), &mut fx).unwrap(), 0);
        inv.hold(1, &ids(&["A-1", "A-2"]), 100, 2, &mut fx).unwrap();
        assert_eq!(
            inv.hold(2, &ids(&["A-3", "A-1"]), 100, 2, &mut fx),
            Err(QueueError::HoldConflict)
        );
        assert_eq!(inv.counts().held, 2, "a refused hold changes nothing");
        assert_eq!(
            inv.hold(1, &ids(&["A-3"]), 100, 2, &mut fx),
            Err(QueueError::TooManyHolds)
        );
        assert_eq!(
            inv.hold(1, &ids(&["B-9"]), 100, 2, &mut fx),
            Err(QueueError::ItemNotFound)
        );
        // The first failure in the order given answers: here the limit, at A-3, before
        // the unknown B-9 (and the other way round).
        inv.release(1, Some(&ids(&["A-2"])), &mut fx);
        assert_eq!(
            inv.hold(1, &ids(&["A-1", "A-3", "A-2", "B-9"]), 100, 2, &mut fx),
            Err(QueueError::TooManyHolds)
        );
        assert_eq!(
            inv.hold(1, &ids(&["B-9", "A-3", "A-2"]), 100, 2, &mut fx),
            Err(QueueError::ItemNotFound)
        );
        inv.hold(1, &ids(&["A-2"]), 100, 2, &mut fx).unwrap();
        inv.expire(99, &mut fx);
        assert_eq!(inv.counts().held, 2);
        inv.expire(100, &mut fx);
        assert_eq!(inv.counts().held, 0, "lapsed at its deadline");
        inv.hold(2, &ids(&["A-1"]), 200, 2, &mut fx).unwrap();
        inv.sell(2, &mut fx);
        assert_eq!(
            inv.hold(1, &ids(&["A-1"]), 300, 2, &mut fx),
            Err(QueueError::HoldConflict)
        );
        assert_eq!(
            inv.counts(),
            InventoryCounts {
                total: 3,
                available: 2,
                held: 0,
                sold: 1
            }
        );
        inv.check().unwrap();
    }

    #[test]
    fn item_ids_are_checked() {
        for ok in ["A-1", "floor:B.12_x"] {
            validate_item_id(ok).unwrap();
        }
        for bad in ["", "A 1", "a/b", &"x".repeat(65)] {
            assert!(validate_item_id(bad).is_err(), "{bad:?}");
        }
    }
}
