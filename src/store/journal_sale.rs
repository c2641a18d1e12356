//! The sale's records in the embedded store's journal (beside `journal.rs`, which calls
//! these): inventory items in their own keyspace `items`, `event_id ‖ 0x00 ‖ item id` → the
//! item's state ([`ItemState`], postcard), and a session's extensions as one more record kind
//! of its place ([`KIND_EXTENDED`]: `(count, extra_ms)`), deleted with the place's other
//! records when it ends. Holds are state like any other: written in the same batch as the
//! operation that made them, so a restart finds every hold, sale and release that was
//! acknowledged.

use std::collections::BTreeMap;

use fjall::Keyspace;

use crate::core::{ItemState, Millis};

/// Record kind of a session's extensions (after joined, admitted, entered, expired).
pub(super) const KIND_EXTENDED: u8 = 4;

/// Pending writes of one batch: key → value, `None` to remove.
pub(super) type Ops = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

fn prefix(event_id: &str) -> Vec<u8> {
    let mut k = event_id.as_bytes().to_vec();
    k.push(0);
    k
}

/// Queues the write of one item's state.
pub(super) fn record_item(ops: &mut Ops, event_id: &str, id: &str, state: &ItemState) {
    let mut k = prefix(event_id);
    k.extend_from_slice(id.as_bytes());
    let v = postcard::to_stdvec(state).expect("serialising to memory does not fail");
    ops.insert(k, Some(v));
}

/// Drops a deleted event's items written earlier in the same batch (what earlier batches
/// wrote is removed by the purge's steps, `journal/purge.rs`).
pub(super) fn drop_pending_items(ops: &mut Ops, event_id: &str) {
    let p = prefix(event_id);
    let pending: Vec<Vec<u8>> = ops
        .range(p.clone()..)
        .take_while(|(k, _)| k.starts_with(&p))
        .map(|(k, _)| k.clone())
        .collect();
    for k in pending {
        ops.insert(k, None);
    }
}

/// The encoded value of an extension record.
pub(super) fn extension_value(count: u32, extra_ms: Millis) -> Vec<u8> {
    postcard::to_stdvec(&(count, extra_ms)).expect("serialising to memory does not fail")
}

/// Reads an extension record back.
pub(super) fn read_extension(v: &[u8]) -> Result<(u32, Millis), postcard::Error> {
    postcard::from_bytes(v)
}

/// Every item of one event, as written.
pub(super) fn recover_items(
    items: &Keyspace,
    event_id: &str,
) -> anyhow::Result<Vec<(Box<str>, ItemState)>> {
    let mut out = Vec::new();
    for kv in items.prefix(prefix(event_id)) {
        let (k, v) = kv.into_inner()?;
        let id = std::str::from_utf8(&k[event_id.len() + 1..])
            .map_err(|_| anyhow::anyhow!("event {event_id:?} holds a non-UTF-8 item id"))?;
        let state: ItemState = postcard::from_bytes(&v).map_err(|e| {
            anyhow::anyhow!("the record of item {id:?} in event {event_id:?} is unreadable: {e}")
        })?;
        out.push((id.into(), state));
    }
    Ok(out)
}
