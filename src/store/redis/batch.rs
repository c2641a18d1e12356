//! Group commit of joins, leaves and enters: a node sends each event's waiting operations to
//! Redis together, in one script call (the `batch` operation of `lua/ops.lua`), rather than
//! one call each.
//!
//! Why: one script call costs Redis far more (parsing, the call itself, loading and writing
//! back the event's numbers) than the few commands a join adds, so a busy event spent most of
//! its shard's time on overhead. A batch pays that overhead once for many operations.
//!
//! How (the "natural batching" of the embedded journal's group commit): each event has a lane,
//! a queue of waiting operations, and at most one call in flight. An operation that finds its
//! lane idle starts a drain task at once, so an idle node adds no delay; operations that
//! arrive while a call is in flight wait for it and then go together in the next one (up to
//! [`MAX_BATCH`]). A lane is one event, so one hash slot: batches work unchanged on a Cluster.
//!
//! What stays the same: the script runs the operations of a batch one after the other in
//! arrival order, each at its own time and by the same Lua functions as when sent alone, so
//! the answers are those of the same operations sent one by one in that order. Each caller
//! gets its own answer, its own error included. A batch that fails (Redis unreachable, a
//! timeout, too few replicas for `WAIT`) fails its own callers only, as `Unavailable`. With
//! `wait_replicas`, one `WAIT` covers the whole batch. An operation whose caller gave up
//! (timed out or went away) before its batch left is never sent.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use redis::Value;
use tokio::sync::oneshot;

use super::decode::{self, array, bytes, text, unexpected, Reply};
use super::script::{FxKind, FAILED, OK};
use super::Inner;
use crate::core::{Millis, PlaceKey, PlaceView};
use crate::store::{JoinRequest, StoreError, StoreResult};

/// The most operations one script call carries. Redis runs nothing else while a script runs;
/// this bounds that pause (a join takes a few microseconds of script time) while still
/// amortising the call over many operations.
pub(super) const MAX_BATCH: usize = 256;

/// An operation waiting in its event's lane.
struct Pending {
    op: &'static str,
    now: Millis,
    args: Vec<Vec<u8>>,
    /// Where its own answer (the script's reply for this operation) goes.
    tx: oneshot::Sender<StoreResult<Value>>,
}

/// The lanes of this node: per event, the operations waiting for the next call. An event
/// has an entry exactly while a drain task runs for it.
#[derive(Default)]
pub(super) struct Lanes(Mutex<HashMap<String, VecDeque<Pending>>>);

/// Removes a lane whose drain task ends early (a panic): its waiting callers are answered
/// `Unavailable` (their senders drop) instead of waiting on a lane nobody drains.
struct LaneGuard<'a> {
    inner: &'a Inner,
    event_id: &'a str,
    done: bool,
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.inner.lanes.0.lock().remove(self.event_id);
        }
    }
}

/// The script arguments of a join (after the operation's name and time). The script reads a
/// missing argument as a flag that is not set (`op_join` in ops.lua), so the trailing ones
/// that say "none" are left out: an anonymous join sends its nonce alone (each argument
/// costs the batch's script call a value to convert and copy: 5 % of a join's Redis time).
fn join_args(req: &JoinRequest) -> Vec<Vec<u8>> {
    let flag = |b: bool| vec![if b { b'1' } else { b'0' }];
    let text = |s: &Option<String>| s.as_deref().unwrap_or("").as_bytes().to_vec();
    let mut keep = 8;
    if req.invite.is_none() {
        keep = 6;
        if !req.proven {
            keep = 5;
            if req.metadata.is_none() {
                keep = 3;
                if req.user_id.is_none() {
                    keep = 1;
                }
            }
        }
    }
    let mut args = vec![
        req.nonce.to_be_bytes().to_vec(),
        flag(req.user_id.is_some()),
        text(&req.user_id),
        flag(req.metadata.is_some()),
        text(&req.metadata),
        flag(req.proven),
        flag(req.invite.is_some()),
        text(&req.invite),
    ];
    args.truncate(keep);
    args
}

impl Inner {
    /// A join, through the event's lane.
    pub(super) async fn join_batched(
        self: &Arc<Self>,
        event_id: &str,
        req: &JoinRequest,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        let r = self
            .batched(event_id, "join", now, join_args(req), Some(req))
            .await?;
        self.view(&r, now)
    }

    /// `leave` or `enter` (an operation on one place), through the event's lane.
    pub(super) async fn place_batched(
        self: &Arc<Self>,
        event_id: &str,
        op: &'static str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<Reply> {
        let args = vec![
            key.seq.to_string().into_bytes(),
            key.nonce.to_be_bytes().to_vec(),
        ];
        self.batched(event_id, op, now, args, None).await
    }

    /// Queues `op` in the event's lane (starting its drain task if the lane was idle), waits
    /// for its own answer, and reads it like [`Inner::op`] does.
    async fn batched(
        self: &Arc<Self>,
        event_id: &str,
        op: &'static str,
        now: Millis,
        args: Vec<Vec<u8>>,
        join: Option<&JoinRequest>,
    ) -> StoreResult<Reply> {
        let (tx, rx) = oneshot::channel();
        let pending = Pending { op, now, args, tx };
        let idle = {
            let mut lanes = self.lanes.0.lock();
            match lanes.get_mut(event_id) {
                Some(lane) => {
                    lane.push_back(pending);
                    false
                }
                None => {
                    lanes.insert(event_id.to_string(), VecDeque::from([pending]));
                    true
                }
            }
        };
        if idle {
            let inner = self.clone();
            let event_id = event_id.to_string();
            tokio::spawn(async move { inner.drain(&event_id).await });
        }
        // Within the operation timeout like any call, waiting for a batch in flight included:
        // an operation still queued when its caller gives up is dropped unsent.
        let value = match tokio::time::timeout(self.options.op_timeout, rx).await {
            Ok(Ok(answer)) => answer?,
            Ok(Err(_)) => {
                return Err(StoreError::Unavailable(
                    "redis: the batch carrying this operation was abandoned".into(),
                ))
            }
            Err(_) => {
                return Err(StoreError::Unavailable(format!(
                    "redis did not answer within {} ms",
                    self.options.op_timeout.as_millis()
                )))
            }
        };
        let (reply, fx) = decode::reply(&value, join, now)?;
        self.announce(event_id, &fx);
        match &reply.code[..] {
            OK => Ok(reply),
            FAILED => Err(StoreError::Unavailable(format!(
                "redis refused the operation: {}",
                text(&reply.payload)?.unwrap_or_default()
            ))),
            code => Err(unexpected(code)),
        }
    }

    /// Sends the lane's waiting operations, a batch at a time, until none is left; then
    /// removes the lane (under the same lock, so a newcomer either joins a batch of this task
    /// or finds no lane and starts a new task).
    async fn drain(&self, event_id: &str) {
        let mut guard = LaneGuard {
            inner: self,
            event_id,
            done: false,
        };
        loop {
            let batch: Vec<Pending> = {
                let mut lanes = self.lanes.0.lock();
                let Some(lane) = lanes.get_mut(event_id) else {
                    break;
                };
                lane.retain(|p| !p.tx.is_closed());
                if lane.is_empty() {
                    lanes.remove(event_id);
                    break;
                }
                let n = lane.len().min(MAX_BATCH);
                lane.drain(..n).collect()
            };
            match self.run_batch(event_id, &batch).await {
                Ok(answers) => {
                    for (p, a) in batch.into_iter().zip(answers) {
                        let _ = p.tx.send(Ok(a));
                    }
                }
                Err(e) => {
                    let msg = match e {
                        StoreError::Unavailable(m) => m,
                        other => other.to_string(),
                    };
                    for p in batch {
                        let _ = p.tx.send(Err(StoreError::Unavailable(msg.clone())));
                    }
                }
            }
        }
        guard.done = true;
    }

    /// One script call for the batch (and one `WAIT` with `wait_replicas`): the answer of
    /// each operation, in order.
    async fn run_batch(&self, event_id: &str, batch: &[Pending]) -> StoreResult<Vec<Value>> {
        // As before any script that may sweep: renewals the replica collected go first.
        let latest = batch.iter().map(|p| p.now).max().unwrap_or(0);
        self.renewals_before(event_id, "batch", latest).await?;
        let keys = self.keys(event_id);
        let mut conn = self.connection().await?;
        let value = self
            .bounded(self.caller.call(&mut conn, &keys, |c| {
                c.arg("batch").arg(batch[0].now);
                for p in batch {
                    c.arg(p.op).arg(p.now).arg(p.args.len());
                    for a in &p.args {
                        c.arg(&a[..]);
                    }
                }
            }))
            .await?;
        self.wait_for_replicas(&mut conn).await?;
        let items = array(&value)?;
        // An answer for the whole batch (the event does not exist): every operation's own.
        if let Some(first) = items.first() {
            if bytes(first).is_ok() {
                return Ok(vec![value.clone(); batch.len()]);
            }
        }
        let out = expand(batch, items)?;
        // Each operation was its own entry of the change log: the replica learns the
        // versions this node wrote (its read-your-writes), in order.
        for (p, answer) in batch.iter().zip(&out) {
            self.replicas.wrote(event_id, p.op, answer);
        }
        Ok(out)
    }
}

/// The answer of each operation of a batch, in order, from the script's answer: an
/// operation's whole answer `{code, payload, effects, context, log version}`, or a fresh
/// join's short one (`finish_join`, rules.lua), rebuilt here into the whole one. A short
/// answer is `{seq, waiting, log version, opens, method, context (14 numbers)}`, or, when
/// opens, method and the context are those of the short answer before it, its first three
/// numbers alone, flat among the answers.
fn expand(batch: &[Pending], items: &[Value]) -> StoreResult<Vec<Value>> {
    let mut out = Vec::with_capacity(batch.len());
    // Opens, method and the context of the last short answer, while no whole one followed.
    let mut last: Option<(i64, i64, Value)> = None;
    let mut k = 0;
    for p in batch {
        let n = |a: &[Value], i: usize| decode::int(decode::field(a, i)?);
        let whole = match items.get(k) {
            Some(Value::Int(_)) => {
                let a = items
                    .get(k..k + 3)
                    .ok_or(decode::Malformed("a short join answer"))?;
                k += 3;
                let (opens, method, ctx) = last
                    .as_ref()
                    .ok_or(decode::Malformed("a short answer before a flat one"))?;
                expand_join(
                    p,
                    n(a, 0)?,
                    n(a, 1)?,
                    n(a, 2)?,
                    *opens,
                    *method,
                    ctx.clone(),
                )?
            }
            Some(Value::Array(a)) if matches!(a.first(), Some(Value::Int(_))) => {
                k += 1;
                if a.len() != 19 {
                    return Err(decode::Malformed("a short join answer").into());
                }
                let (opens, method) = (n(a, 3)?, n(a, 4)?);
                let ctx = Value::Array(a[5..].to_vec());
                last = Some((opens, method, ctx.clone()));
                expand_join(p, n(a, 0)?, n(a, 1)?, n(a, 2)?, opens, method, ctx)?
            }
            Some(other) => {
                k += 1;
                last = None;
                other.clone()
            }
            None => return Err(decode::Malformed("one answer per operation of a batch").into()),
        };
        out.push(whole);
    }
    if k != items.len() {
        return Err(decode::Malformed("one answer per operation of a batch").into());
    }
    Ok(out)
}

/// The whole answer of a fresh join from its short one (see [`expand`]): the rest is the
/// join's own: its nonce and user id (its arguments, `join_args`), its time (joined at, and
/// the effect's time), the state `w`, zero times, and position = the waiting count (the
/// newest place is the last of the line).
fn expand_join(
    p: &Pending,
    seq: i64,
    waiting: i64,
    lv: i64,
    opens: i64,
    method: i64,
    ctx: Value,
) -> StoreResult<Value> {
    if p.op != "join" {
        return Err(decode::Malformed("a short answer to a join only").into());
    }
    let nonce = p.args.first().cloned().unwrap_or_default();
    let user = match (p.args.get(1), p.args.get(2)) {
        (Some(flag), Some(id)) if flag[..] == b"1"[..] => Value::BulkString(id.clone()),
        _ => Value::Nil,
    };
    // `proven` in `join` (ops.lua): a user id, and the proof flag after the metadata.
    let proven = !matches!(user, Value::Nil) && p.args.get(5).is_some_and(|f| f[..] == b"1"[..]);
    let now = Value::Int(p.now as i64);
    let zero = Value::Int(0);
    let view = vec![
        Value::Int(seq),
        Value::BulkString(nonce),
        Value::BulkString(b"w".to_vec()),
        user,
        now.clone(),
        zero.clone(),
        zero.clone(),
        zero.clone(),
        Value::Int(waiting),
        Value::Int(waiting),
        zero.clone(),
        Value::Int(opens),
        Value::Int(method),
        zero,
        Value::Int(i64::from(proven)),
    ];
    Ok(Value::Array(vec![
        Value::BulkString(OK.to_vec()),
        Value::Array(view),
        Value::Array(vec![
            Value::Int(FxKind::Joined.number()),
            Value::Int(seq),
            now,
        ]),
        ctx,
        Value::Int(lv),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(user: Option<&str>, metadata: bool, proven: bool, invite: bool) -> JoinRequest {
        JoinRequest {
            user_id: user.map(str::to_string),
            metadata: metadata.then(|| "{}".to_string()),
            nonce: 7,
            proven,
            invite: invite.then(|| "code".to_string()),
        }
    }

    #[test]
    fn a_join_leaves_out_only_the_trailing_arguments_that_say_none() {
        let n = |r: JoinRequest| join_args(&r).len();
        assert_eq!(n(req(None, false, false, false)), 1);
        // A user id that reads like a flag is still sent, with its own flag.
        let args = join_args(&req(Some("0"), false, false, false));
        assert_eq!(args[1..], [b"1".to_vec(), b"0".to_vec()]);
        assert_eq!(n(req(None, true, false, false)), 5);
        assert_eq!(n(req(Some("u"), false, true, false)), 6);
        assert_eq!(n(req(None, false, false, true)), 8);
    }
}
