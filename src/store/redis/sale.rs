//! The sale's operations on the Redis store (inventory, holds, extensions): the arguments
//! of their script entry points (`lua/holds.lua`) and the decoding of their answers.

use redis::Value;

use super::decode::{array, bytes, field, text, uint, Malformed};
use super::Inner;
use crate::core::holds::validate_items;
use crate::core::{
    HeldItem, InventoryCounts, InventoryView, ItemState, Millis, PlaceKey, PlaceView, SessionHolds,
};
use crate::store::StoreResult;

impl Inner {
    pub(super) async fn put_inventory(
        &self,
        event_id: &str,
        items: &[String],
        now: Millis,
    ) -> StoreResult<(u64, InventoryCounts)> {
        validate_items(items)?;
        let args: Vec<&[u8]> = items.iter().map(|i| i.as_bytes()).collect();
        let r = self.op(event_id, "inventory_put", now, &args, None).await?;
        let a = array(&r.payload)?;
        let n = |i| uint(field(a, i)?);
        Ok((n(0)?, counts(n(1)?, n(2)?, n(3)?)))
    }

    pub(super) async fn inventory(
        &self,
        event_id: &str,
        now: Millis,
    ) -> StoreResult<InventoryView> {
        let r = self.op(event_id, "inventory", now, &[], None).await?;
        Ok(inventory_view(&r.payload)?)
    }

    pub(super) async fn hold(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: &[String],
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        validate_items(items)?;
        let seq = key.seq.to_string();
        let nonce = key.nonce.to_be_bytes();
        let mut args: Vec<&[u8]> = vec![seq.as_bytes(), &nonce];
        args.extend(items.iter().map(|i| i.as_bytes()));
        let r = self.op(event_id, "hold", now, &args, None).await?;
        Ok(session_holds(&r.payload)?)
    }

    pub(super) async fn release(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: Option<&[String]>,
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        let seq = key.seq.to_string();
        let nonce = key.nonce.to_be_bytes();
        let all: &[u8] = if items.is_none() { b"1" } else { b"0" };
        let mut args: Vec<&[u8]> = vec![seq.as_bytes(), &nonce, all];
        args.extend(items.unwrap_or_default().iter().map(|i| i.as_bytes()));
        // (`release` names the lease's hand-over.)
        let r = self.op(event_id, "unhold", now, &args, None).await?;
        Ok(session_holds(&r.payload)?)
    }

    pub(super) async fn extend(
        &self,
        event_id: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        self.view_op(event_id, "extend", key, now).await
    }
}

fn counts(total: u64, held: u64, sold: u64) -> InventoryCounts {
    InventoryCounts {
        total,
        available: total.saturating_sub(held + sold),
        held,
        sold,
    }
}

/// `holds_of` in `holds.lua`: flat (item, until) pairs.
fn session_holds(payload: &Value) -> Result<SessionHolds, Malformed> {
    let a = array(payload)?;
    let mut holds = Vec::with_capacity(a.len() / 2);
    for pair in a.chunks(2) {
        let [item, until] = pair else {
            return Err(Malformed("hold pairs"));
        };
        holds.push(HeldItem {
            item: text(item)?.ok_or(Malformed("an item id"))?,
            expires_at: uint(until)?,
        });
    }
    // Ordered by id as the core orders them (Lua's sort follows the C locale of Redis).
    holds.sort_by(|x, y| x.item.cmp(&y.item));
    Ok(SessionHolds { holds })
}

/// `get_inventory` in `holds.lua`: the counts, then the item hash as flat (id, state) pairs.
fn inventory_view(payload: &Value) -> Result<InventoryView, Malformed> {
    let a = array(payload)?;
    let n = |i| uint(field(a, i)?);
    let flat = array(field(a, 3)?)?;
    let mut items = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        let [id, state] = pair else {
            return Err(Malformed("item pairs"));
        };
        let id = text(id)?.ok_or(Malformed("an item id"))?;
        let state = item_state(bytes(state)?.unwrap_or_default())?;
        items.push((id, state));
    }
    items.sort_by(|x, y| x.0.cmp(&y.0));
    Ok(InventoryView {
        counts: counts(n(0)?, n(1)?, n(2)?),
        items,
    })
}

/// An item's state as `K_ITEMS` keeps it: '' available, 'h<seq>:<until>', 's<seq>'.
fn item_state(b: &[u8]) -> Result<ItemState, Malformed> {
    let bad = || Malformed("an item state");
    let s = std::str::from_utf8(b).map_err(|_| bad())?;
    let num = |t: &str| t.parse::<u64>().map_err(|_| bad());
    Ok(match s.as_bytes().first() {
        None => ItemState::Available,
        Some(b'h') => {
            let (seq, until) = s[1..].split_once(':').ok_or_else(bad)?;
            ItemState::Held {
                seq: num(seq)?,
                until: num(until)?,
            }
        }
        Some(b's') => ItemState::Sold { seq: num(&s[1..])? },
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_states_read_back() {
        assert_eq!(item_state(b"").unwrap(), ItemState::Available);
        assert_eq!(
            item_state(b"h12:1700000000000").unwrap(),
            ItemState::Held {
                seq: 12,
                until: 1_700_000_000_000
            }
        );
        assert_eq!(item_state(b"s7").unwrap(), ItemState::Sold { seq: 7 });
        for bad in [&b"x"[..], b"h12", b"sx"] {
            assert!(item_state(bad).is_err());
        }
    }
}
