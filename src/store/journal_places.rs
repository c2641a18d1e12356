//! The places' records in the embedded store's journal (beside `journal.rs`, which writes
//! them in its batches and reads them back on start): keyspace `places`, `event_id ‖ 0x00 ‖
//! seq (u64 BE) ‖ kind` → the record of that kind ([`JoinRec`], or a time, or an expiry).
//!
//! Keys and values are made as fjall's own [`Slice`]s, from bytes put together on the
//! stack: a batch hands them to fjall as they are. Built as `Vec`s, each was allocated
//! twice and copied once more when the batch took it (fjall copies a `Vec` into its own
//! buffer): two of a join's allocations and about 700 instructions of its writer's work
//! (callgrind; PERFORMANCE.md, "Join's own work, seventh round"). The bytes are the same.

use std::collections::BTreeMap;

use fjall::Slice;
use serde::{Deserialize, Serialize};

use super::journal_sale::{self as sale, KIND_EXTENDED};
use crate::core::{Effect, EndReason, Millis};

pub(super) const KIND_JOINED: u8 = 0;
pub(super) const KIND_ADMITTED: u8 = 1;
pub(super) const KIND_ENTERED: u8 = 2;
pub(super) const KIND_EXPIRED: u8 = 3;

/// Pending writes to `places` of one batch: key → value, `None` to remove.
pub(super) type PlaceOps = BTreeMap<Slice, Option<Slice>>;

/// Records and keys up to this long are put together on the stack (a key is at most 74
/// bytes: event ids are at most 64); longer ones (a join with long metadata) go through a
/// `Vec`, as all did before.
const ON_STACK: usize = 160;

/// `parts`, one after the other, as one slice.
fn concat(parts: &[&[u8]]) -> Slice {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > ON_STACK {
        return Slice::from(parts.concat());
    }
    let mut buf = [0u8; ON_STACK];
    let mut at = 0;
    for p in parts {
        buf[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    Slice::new(&buf[..len])
}

/// `value` in postcard, then `trailer`.
fn encoded(value: &impl Serialize, trailer: &[u8]) -> Slice {
    let mut buf = [0u8; ON_STACK];
    if let Ok(used) = postcard::to_slice(value, &mut buf[..ON_STACK - trailer.len()]) {
        let n = used.len();
        buf[n..n + trailer.len()].copy_from_slice(trailer);
        return Slice::new(&buf[..n + trailer.len()]);
    }
    let mut out = postcard::to_stdvec(value).expect("serialising to memory does not fail");
    out.extend_from_slice(trailer);
    Slice::from(out)
}

/// A place's key.
pub(super) fn place_key(event_id: &str, seq: u64, kind: u8) -> Slice {
    concat(&[event_id.as_bytes(), &[0], &seq.to_be_bytes(), &[kind]])
}

/// A place's join record: the postcard fields below, then one byte of flags
/// ([`JOIN_PROVEN`]). Records written before the flags byte existed end after `joined_at`
/// and read as flags 0: their places count as unproven, so the user's next proven join
/// replaces them rather than adopt a place whose maker we cannot know. (A prefix marker, as
/// event records have, cannot tell the shapes apart here: the first field is the random
/// nonce, whose varint may start with any byte. The end of the record can.)
#[derive(Serialize, Deserialize)]
pub(super) struct JoinRec {
    pub nonce: u128,
    pub user_id: Option<String>,
    pub metadata: Option<String>,
    pub joined_at: Millis,
}

/// Join record flag: the joiner proved it is the place's user.
const JOIN_PROVEN: u8 = 1;

impl JoinRec {
    pub(super) fn encode(&self, proven: bool) -> Slice {
        encoded(self, &[if proven { JOIN_PROVEN } else { 0 }])
    }

    /// The record and whether its place is proven.
    pub(super) fn decode(bytes: &[u8]) -> Result<(Self, bool), postcard::Error> {
        let (rec, rest): (JoinRec, _) = postcard::take_from_bytes(bytes)?;
        match rest {
            [] => Ok((rec, false)),
            [flags] => Ok((rec, flags & JOIN_PROVEN != 0)),
            _ => Err(postcard::Error::DeserializeBadEncoding),
        }
    }
}

/// Queues the writes of one effect on a place (the `invites` and `items` keyspaces' are
/// `journal.rs`'s and `journal_sale.rs`'s).
pub(super) fn apply_effect(ops: &mut PlaceOps, ev: &str, fx: Effect) {
    match fx {
        Effect::Joined {
            seq,
            nonce,
            user_id,
            proven,
            metadata,
            at,
        } => {
            let rec = JoinRec {
                nonce,
                user_id: user_id.map(String::from),
                metadata: metadata.map(String::from),
                joined_at: at,
            };
            ops.insert(place_key(ev, seq, KIND_JOINED), Some(rec.encode(proven)));
        }
        Effect::Admitted { seq, at } => {
            ops.insert(place_key(ev, seq, KIND_ADMITTED), Some(encoded(&at, &[])));
        }
        Effect::Entered { seq, at } => {
            ops.insert(place_key(ev, seq, KIND_ENTERED), Some(encoded(&at, &[])));
        }
        Effect::Ended {
            seq,
            nonce,
            reason,
            noticed_at,
            ..
        } => {
            for kind in [KIND_JOINED, KIND_ADMITTED, KIND_ENTERED, KIND_EXTENDED] {
                ops.insert(place_key(ev, seq, kind), None);
            }
            if reason == EndReason::Expired {
                // Retention counts from when the expiry was noticed, as in memory.
                ops.insert(
                    place_key(ev, seq, KIND_EXPIRED),
                    Some(encoded(&(nonce, noticed_at), &[])),
                );
            }
        }
        Effect::Forgotten { seq } => {
            ops.insert(place_key(ev, seq, KIND_EXPIRED), None);
        }
        Effect::Extended {
            seq,
            count,
            extra_ms,
        } => {
            ops.insert(
                place_key(ev, seq, KIND_EXTENDED),
                Some(Slice::from(sale::extension_value(count, extra_ms))),
            );
        }
        // Written to the `invites` and `items` keyspaces by `Writer::write`.
        Effect::Invited { .. } | Effect::InviteBound { .. } | Effect::Item { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc<T: Serialize>(v: &T) -> Vec<u8> {
        postcard::to_stdvec(v).unwrap()
    }

    fn old_key(event_id: &str, seq: u64, kind: u8) -> Vec<u8> {
        let mut k = event_id.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(&seq.to_be_bytes());
        k.push(kind);
        k
    }

    #[test]
    fn a_join_record_keeps_its_proof_and_an_old_one_reads_as_unproven() {
        let rec = || JoinRec {
            nonce: u128::MAX - 7,
            user_id: Some("alice".into()),
            metadata: Some("{}".into()),
            joined_at: 42,
        };
        for proven in [false, true] {
            let (back, p) = JoinRec::decode(&rec().encode(proven)).unwrap();
            assert_eq!(p, proven);
            assert_eq!((back.nonce, back.joined_at), (u128::MAX - 7, 42));
            assert_eq!(back.user_id.as_deref(), Some("alice"));
        }
        // A record written before the flags byte: exactly the postcard fields.
        let (back, proven) = JoinRec::decode(&enc(&rec())).unwrap();
        assert!(!proven, "a place of unknown proof reads as unproven");
        assert_eq!(back.metadata.as_deref(), Some("{}"));
        let mut long = rec().encode(true).to_vec();
        long.push(0);
        assert!(
            JoinRec::decode(&long).is_err(),
            "unknown trailing bytes are damage"
        );
    }

    /// Built on the stack or through a `Vec`, the bytes are what they were when every key
    /// and record was a `Vec`: the fields in postcard, then the flags; the id, 0, the
    /// sequence number big-endian, the kind. Lengths around the stack buffer's included.
    #[test]
    fn records_and_keys_are_the_bytes_they_were() {
        for len in [
            0,
            1,
            20,
            100,
            ON_STACK - 30,
            ON_STACK - 2,
            ON_STACK,
            ON_STACK + 1,
            4000,
        ] {
            let rec = JoinRec {
                nonce: u128::MAX / 3,
                user_id: Some("u".repeat(len.min(255))),
                metadata: Some("m".repeat(len)),
                joined_at: 1_700_000_000_000,
            };
            for proven in [false, true] {
                let mut old = enc(&rec);
                old.push(u8::from(proven));
                assert_eq!(&*rec.encode(proven), &old[..], "{len}");
            }
            let id = "e".repeat(len.min(200));
            for kind in [KIND_JOINED, KIND_EXPIRED, KIND_EXTENDED] {
                let key = place_key(&id, u64::MAX - len as u64, kind);
                assert_eq!(&*key, &old_key(&id, u64::MAX - len as u64, kind)[..]);
            }
            let at: Millis = len as u64 * 1_000_003;
            assert_eq!(&*encoded(&at, &[]), &enc(&at)[..]);
            assert_eq!(&*encoded(&(rec.nonce, at), &[]), &enc(&(rec.nonce, at))[..]);
        }
    }
}
