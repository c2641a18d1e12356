//! Decoding the Redis script's answers: the reply envelope (code, payload, effects, ETA
//! context), place views, event snapshots, queue heads and error codes. The arithmetic on
//! the decoded facts (positions to ETAs, deadlines to seconds, counts to figures) is the
//! core's own, shared with the embedded store; this module only reads values.

use redis::Value;

use super::script::FxKind;
use crate::core::{
    Effect, EventConfig, EventCounts, EventFigures, HeadEntry, Millis, Pace, PlaceFacts, PlaceKey,
    PlaceState, PlaceView, QueueError, ReadyKept, Timeouts,
};
use crate::store::{EventSnapshot, JoinRequest, StoreError};

/// One script answer: a code (`OK` or an error code), the payload, and the event's ETA
/// context. (Its effects, flat (kind, seq, at) triples, are counted and relayed as soon as
/// the answer is decoded.)
pub(super) struct Reply {
    pub(super) code: Vec<u8>,
    pub(super) payload: Value,
    pub(super) ctx: Ctx,
}

/// What the ETA and the deadlines in seconds are computed from, as the script answers it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Ctx {
    pub(super) pace: Pace,
    pub(super) timeouts: Timeouts,
}

impl Ctx {
    pub(super) fn eta(&self, position: u64, now: Millis) -> u64 {
        self.pace.eta(position, now)
    }
}

/// A malformed script answer: a bug or a foreign writer, never a user error. It is logged
/// and answered as `Unavailable` (the contract has no other server-side error).
#[derive(Debug)]
pub(super) struct Malformed(pub(super) &'static str);

impl From<Malformed> for StoreError {
    fn from(Malformed(what): Malformed) -> Self {
        tracing::error!(expected = what, "malformed answer from redis");
        StoreError::Unavailable(format!("malformed answer from redis (expected {what})"))
    }
}

/// A refused settings change (`put`'s `SCHEDULE_LOCKED`, `REOPEN_LOCKED`), with the rule's
/// own words.
pub(super) fn invalid(why: &str) -> StoreError {
    QueueError::Invalid(why.into()).into()
}

/// The error for a script code that is not `OK`: its queue error, or `Unavailable` for a
/// code this version does not know.
pub(super) fn unexpected(code: &[u8]) -> StoreError {
    match queue_error(code) {
        Some(e) => e.into(),
        None => StoreError::Unavailable(format!(
            "unexpected answer {:?} from redis",
            String::from_utf8_lossy(code)
        )),
    }
}

pub(super) fn int(v: &Value) -> Result<i64, Malformed> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Malformed("a number")),
        _ => Err(Malformed("a number")),
    }
}

pub(super) fn uint(v: &Value) -> Result<u64, Malformed> {
    u64::try_from(int(v)?).map_err(|_| Malformed("a non-negative number"))
}

pub(super) fn bytes(v: &Value) -> Result<Option<&[u8]>, Malformed> {
    match v {
        Value::BulkString(b) => Ok(Some(b)),
        Value::Nil => Ok(None),
        _ => Err(Malformed("a string")),
    }
}

pub(super) fn text(v: &Value) -> Result<Option<String>, Malformed> {
    bytes(v)?
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| Malformed("UTF-8 text")))
        .transpose()
}

pub(super) fn array(v: &Value) -> Result<&[Value], Malformed> {
    match v {
        Value::Array(a) => Ok(a),
        // An empty Lua table arrives as an empty array, but be lenient with nil.
        Value::Nil => Ok(&[]),
        _ => Err(Malformed("an array")),
    }
}

pub(super) fn field(a: &[Value], i: usize) -> Result<&Value, Malformed> {
    a.get(i).ok_or(Malformed("a missing field"))
}

/// The queue error a script's code names; `None` for `OK` and the internal codes.
pub(super) fn queue_error(code: &[u8]) -> Option<QueueError> {
    QueueError::from_code(std::str::from_utf8(code).ok()?)
}

/// A script's whole answer `{code, payload, effects, context}`, with its effects decoded.
pub(super) fn reply(
    value: &Value,
    join: Option<&JoinRequest>,
    now: Millis,
) -> Result<(Reply, Vec<Effect>), Malformed> {
    let a = array(value)?;
    let code = bytes(field(a, 0)?)?.ok_or(Malformed("a code"))?.to_vec();
    let fx = effects(field(a, 2)?, join, now)?;
    let ctx = ctx(field(a, 3)?)?;
    let reply = Reply {
        code,
        payload: field(a, 1)?.clone(),
        ctx,
    };
    Ok((reply, fx))
}

/// The raw facts of a place as `view` in `places.lua` answers them, as the core's view.
pub(super) fn place_view(payload: &Value, ctx: &Ctx, now: Millis) -> Result<PlaceView, Malformed> {
    let a = array(payload)?;
    let seq = uint(field(a, 0)?)?;
    let nonce = bytes(field(a, 1)?)?
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .map(u128::from_be_bytes)
        .ok_or(Malformed("a nonce"))?;
    let state = match bytes(field(a, 2)?)? {
        Some(b"w") => PlaceState::Waiting,
        Some(b"a") => PlaceState::Admitted,
        Some(b"s") => PlaceState::Active,
        _ => return Err(Malformed("a state")),
    };
    let facts = PlaceFacts {
        key: PlaceKey { seq, nonce },
        state,
        user_id: text(field(a, 3)?)?,
        // Absent from older scripts: unproven, the cautious reading.
        user_proven: a.get(14).map(uint).transpose()?.unwrap_or(0) == 1,
        joined_at: uint(field(a, 4)?)?,
        admitted_at: uint(field(a, 5)?)?,
        entered_at: uint(field(a, 6)?)?,
        last_seen: uint(field(a, 7)?)?,
        position: uint(field(a, 8)?)?,
        queue_length: uint(field(a, 9)?)?,
        pre_queue: uint(field(a, 10)?)? == 1,
        opens_at: Some(uint(field(a, 11)?)?).filter(|&t| t > 0),
        lottery: uint(field(a, 12)?)? == 1,
    };
    // What the session's extensions added to its maximum (absent from older scripts).
    let mut t = ctx.timeouts;
    t.session_max_ms += a.get(13).map(uint).transpose()?.unwrap_or(0);
    // An admitted place's deadline that a lowered window kept later (places.lua `view`;
    // absent from older scripts, 0 when none): its `enter_within_sec` counts down to it.
    if let Some(kept) = a.get(15).map(uint).transpose()?.filter(|&d| d > 0) {
        t.ready_kept.floor = kept;
    }
    let mut view = PlaceView::new(facts, &t, &ctx.pace, now);
    // `join`: the place of the same user it replaced (seq, nonce), when it did.
    if let (Some(seq), Some(nonce)) = (a.get(16), a.get(17)) {
        view.replaced = Some(PlaceKey {
            seq: uint(seq)?,
            nonce: bytes(nonce)?
                .and_then(|b| <[u8; 16]>::try_from(b).ok())
                .map(u128::from_be_bytes)
                .ok_or(Malformed("a replaced nonce"))?,
        });
    }
    Ok(view)
}

/// The context `ctx` in `rules.lua` answers.
fn ctx(v: &Value) -> Result<Ctx, Malformed> {
    let a = array(v)?;
    let n = |i| uint(field(a, i)?);
    let first = int(field(a, 1)?)?;
    let rate = n(2)?;
    let session_max_ms = n(8)?;
    Ok(Ctx {
        pace: Pace {
            recent_admissions: n(0)?,
            first_admission_at: u64::try_from(first).ok(),
            admit_per_minute: (rate > 0).then_some(rate as u32),
            capacity: n(3)?,
            session_sum_ms: n(4)?,
            session_count: n(5)?,
            session_max_sec: (session_max_ms / 1000) as u32,
            paused: n(10)? != 0,
            hold_ms: n(11)?,
            hold_ends: n(12)?,
            live: n(13)?,
        },
        timeouts: Timeouts {
            ready_ttl_ms: n(6)?,
            session_idle_ms: n(7)?,
            session_max_ms,
            waiting_idle_ms: n(9)?,
            // A place's own view carries what a lowered ready window kept of it.
            ready_kept: ReadyKept::default(),
        },
    })
}

/// Decodes the effect triples of a script answer. `now` is the operation's time: when the
/// script noticed what it ended.
fn effects(v: &Value, join: Option<&JoinRequest>, now: Millis) -> Result<Vec<Effect>, Malformed> {
    let a = array(v)?;
    let mut out = Vec::with_capacity(a.len() / 3);
    for t in a.chunks(3) {
        let [kind, seq, at] = t else {
            return Err(Malformed("effect triples"));
        };
        let (kind, seq, at) = (int(kind)?, uint(seq)?, uint(at)?);
        out.push(match FxKind::from_number(kind) {
            Some(FxKind::Joined) => Effect::Joined {
                seq,
                nonce: join.map_or(0, |j| j.nonce),
                user_id: join.and_then(|j| j.user_id.as_deref().map(Into::into)),
                proven: join.is_some_and(|j| j.proven && j.user_id.is_some()),
                metadata: join.and_then(|j| j.metadata.as_deref().map(Into::into)),
                at,
            },
            Some(FxKind::Admitted) => Effect::Admitted { seq, at },
            Some(FxKind::Entered) => Effect::Entered { seq, at },
            // Nothing downstream of a store reads the nonce of an ended place (telemetry
            // and notices go by seq), so the scripts do not send it back.
            Some(FxKind::Ended(reason)) => Effect::Ended {
                seq,
                nonce: 0,
                reason,
                at,
                noticed_at: now,
            },
            Some(FxKind::Forgotten) => Effect::Forgotten { seq },
            None => return Err(Malformed("an effect kind")),
        });
    }
    Ok(out)
}

/// The answer of `get`: the config as JSON, then the event's counts.
pub(super) fn snapshot(event_id: &str, payload: &Value) -> Result<EventSnapshot, Malformed> {
    let a = array(payload)?;
    let cfg = text(field(a, 0)?)?.ok_or(Malformed("a config"))?;
    let mut config: EventConfig =
        serde_json::from_str(&cfg).map_err(|_| Malformed("a config in JSON"))?;
    let n = a[1..].iter().map(uint).collect::<Result<Vec<_>, _>>()?;
    let [waiting, admitted, active, completed, left, expired, capacity, wait_sum_ms, admissions, recent_admissions, joins, opened, seen] =
        n[..]
    else {
        return Err(Malformed("eleven figures, the opening and the end"));
    };
    // The records of the opening and of the end by closes_at live in the meta's numbers
    // (the scripts write them), not in the settings' JSON.
    config.opening_reached = (opened > 0).then_some(opened);
    config.end_seen_at = (seen > 0).then_some(seen);
    let figures: EventFigures = EventCounts {
        waiting,
        admitted,
        active,
        completed,
        left,
        expired,
        capacity,
        wait_sum_ms,
        recent_admissions,
        joins,
        admissions,
    }
    .into();
    Ok(EventSnapshot {
        event_id: event_id.to_string(),
        config,
        figures,
    })
}

/// The answer of `head`: (user id, joined at, seq) triples in queue order.
pub(super) fn head(payload: &Value, ctx: &Ctx, now: Millis) -> Result<Vec<HeadEntry>, Malformed> {
    let a = array(payload)?;
    let mut out = Vec::with_capacity(a.len() / 3);
    for (i, row) in a.chunks(3).enumerate() {
        let [user, joined, seq] = row else {
            return Err(Malformed("head triples"));
        };
        let position = i as u64 + 1;
        out.push(HeadEntry {
            position,
            place_id: uint(seq)?,
            user_id: text(user)?,
            joined_at: uint(joined)?,
            eta_sec: ctx.eta(position, now),
        });
    }
    Ok(out)
}
