//! Relays [`Notice`]s between the nodes that share a Redis, over pub/sub, so that a live
//! client connected to any node hears what any other node changed.
//!
//! Each node already hands its own notices to its own subscribers the moment a script
//! answers; this module only carries them to the *other* nodes:
//! - the **publisher** drains the node's outbox and sends what piled up meanwhile as one
//!   `PUBLISH` (a busy node sends a few messages per round trip, not one per request);
//! - the **subscriber** listens on the channel, drops its own node's messages, and
//!   re-broadcasts the rest locally. When its connection is lost it reconnects (to the next
//!   Cluster node, if any), and then announces `Moved` for every event, so live clients
//!   re-read what they may have missed.
//! - **Hearing itself**: a subscription can stay up while hearing nothing of the others: a
//!   Cluster node removed from the Cluster (`del-node`) but left running answers pings and
//!   keeps subscribers, but no longer hears the Cluster's messages. So an idle publisher
//!   sends a bare message every [`ECHO_EVERY`], and a subscriber that has not heard one
//!   of its own node's messages for [`DEAF_AFTER`] since one was sent moves on to the next
//!   node.
//!
//! Pub/sub is at-most-once: a notice sent while a node is disconnected is lost. That is
//! acceptable for notices (clients also refresh on their own, and the announcement after a
//! reconnect covers the gap); nothing in the queue state depends on them.
//!
//! Message format (text, one item a line):
//! `node-id`, then per event `@event-id` followed by `A<seq>` (admitted),
//! `E<seq><reason>` (ended: `l`eft, `c`ompleted, `e`xpired, cleared `x`), `C` (settings
//! changed) and `D` (deleted). Each event section also means `Moved` for that event.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionLike;
use redis::{ConnectionAddr, ConnectionInfo};
use tokio::sync::{broadcast, mpsc};

use super::Conn;
use crate::core::EndReason;
use crate::store::Notice;

/// Operations' notice lists that may wait for the publisher before new ones are dropped.
pub(super) const OUTBOX: usize = 16_384;
/// Largest message; a bigger batch (clearing a long queue) is split.
const MAX_MESSAGE: usize = 64 * 1024;
/// How often an idle subscription checks that its connection still answers.
const PING_EVERY: Duration = Duration::from_secs(5);
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often a subscription that keeps failing is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// An idle publisher sends its node's bare id this often, for its subscriber to hear.
const ECHO_EVERY: Duration = Duration::from_secs(2);
/// A subscriber that has not heard a message its node sent this long ago is deaf.
const DEAF_AFTER: Duration = Duration::from_secs(6);

/// What the publisher and the subscriber share: when the oldest of this node's messages
/// that the subscriber has not heard yet was sent (ms since `epoch`, plus one; 0: none).
pub(super) struct Echo {
    epoch: std::time::Instant,
    unheard_since: std::sync::atomic::AtomicU64,
}

impl Echo {
    pub(super) fn new() -> Arc<Echo> {
        Arc::new(Echo {
            epoch: std::time::Instant::now(),
            unheard_since: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Before a PUBLISH: notes it as unheard unless an older one is. Answers the stamp
    /// for [`Self::not_sent`].
    fn sending(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now();
        match self.unheard_since.compare_exchange(0, now, SeqCst, SeqCst) {
            Ok(_) => now,
            Err(_) => 0,
        }
    }

    /// The PUBLISH stamped `stamp` failed: nothing will be heard of it.
    fn not_sent(&self, stamp: u64) {
        use std::sync::atomic::Ordering::SeqCst;
        if stamp != 0 {
            let _ = self
                .unheard_since
                .compare_exchange(stamp, 0, SeqCst, SeqCst);
        }
    }

    /// The subscriber heard one of its node's messages (or starts afresh).
    fn heard(&self) {
        self.unheard_since
            .store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a message sent more than `DEAF_AFTER` ago is still unheard.
    fn deaf(&self) -> bool {
        let since = self.unheard_since.load(std::sync::atomic::Ordering::SeqCst);
        since != 0 && self.now().saturating_sub(since) > DEAF_AFTER.as_millis() as u64
    }
}

fn reason_char(r: EndReason) -> char {
    match r {
        EndReason::Left => 'l',
        EndReason::Completed => 'c',
        EndReason::Expired => 'e',
        EndReason::Cleared => 'x',
        EndReason::Closed => 'z',
    }
}

fn reason_of(c: u8) -> Option<EndReason> {
    Some(match c {
        b'l' => EndReason::Left,
        b'c' => EndReason::Completed,
        b'e' => EndReason::Expired,
        b'x' => EndReason::Cleared,
        b'z' => EndReason::Closed,
        _ => return None,
    })
}

/// Encodes a batch of notices as one or more messages of at most [`MAX_MESSAGE`] bytes.
pub(super) fn encode(node_id: &str, batch: &[Notice]) -> Vec<String> {
    let mut out = Vec::new();
    let mut msg = String::new();
    let mut current: Option<&str> = None;
    for n in batch {
        let (event, item) = match n {
            Notice::Admitted { event_id, seq } => (event_id, Some(format!("A{seq}"))),
            Notice::Ended {
                event_id,
                seq,
                reason,
            } => (event_id, Some(format!("E{seq}{}", reason_char(*reason)))),
            Notice::Moved { event_id } => (event_id, None),
            Notice::EventChanged { event_id } => (event_id, Some("C".to_string())),
            Notice::EventDeleted { event_id } => (event_id, Some("D".to_string())),
            Notice::LeaseFreed { event_id } => (event_id, Some("L".to_string())),
        };
        if msg.len() > MAX_MESSAGE {
            out.push(std::mem::take(&mut msg));
            current = None;
        }
        if msg.is_empty() {
            msg.push_str(node_id);
            msg.push('\n');
        }
        if current != Some(&**event) {
            msg.push('@');
            msg.push_str(event);
            msg.push('\n');
            current = Some(event);
        }
        if let Some(item) = item {
            msg.push_str(&item);
            msg.push('\n');
        }
    }
    if !msg.is_empty() {
        out.push(msg);
    }
    out
}

/// Whether a message is one of this node's own.
fn is_own(own_node: &str, msg: &[u8]) -> bool {
    msg.strip_prefix(own_node.as_bytes())
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'\n')
}

/// Decodes a message from another node; answers nothing for this node's own messages or
/// a message it cannot read.
pub(super) fn decode(own_node: &str, msg: &[u8]) -> Vec<Notice> {
    let Ok(text) = std::str::from_utf8(msg) else {
        return Vec::new();
    };
    let mut lines = text.lines();
    if lines.next().is_none_or(|origin| origin == own_node) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut event: Option<Arc<str>> = None;
    for line in lines {
        if let Some(id) = line.strip_prefix('@') {
            if let Some(e) = event.take() {
                out.push(Notice::Moved { event_id: e });
            }
            event = Some(id.into());
            continue;
        }
        let Some(event_id) = event.clone() else {
            continue;
        };
        // Only ASCII is ever published; anything else (someone else's PUBLISH) is skipped
        // rather than split inside a character.
        if !line.is_ascii() {
            continue;
        }
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "A" => {
                if let Ok(seq) = rest.parse() {
                    out.push(Notice::Admitted { event_id, seq });
                }
            }
            "C" => out.push(Notice::EventChanged { event_id }),
            "D" => out.push(Notice::EventDeleted { event_id }),
            "L" => out.push(Notice::LeaseFreed { event_id }),
            "E" if rest.len() > 1 => {
                let (seq, r) = rest.split_at(rest.len() - 1);
                if let (Ok(seq), Some(reason)) = (seq.parse(), reason_of(r.as_bytes()[0])) {
                    out.push(Notice::Ended {
                        event_id,
                        seq,
                        reason,
                    });
                }
            }
            _ => {}
        }
    }
    if let Some(e) = event {
        out.push(Notice::Moved { event_id: e });
    }
    out
}

/// The publisher: sends the outbox to the channel until the store closes it, and its
/// node's bare id when idle (see the module's notes).
pub(super) async fn publish(
    mut conn: Conn,
    channel: String,
    node_id: String,
    mut outbox: mpsc::Receiver<Vec<Notice>>,
    op_timeout: Duration,
    echo: Arc<Echo>,
) {
    let mut batch = Vec::new();
    loop {
        let msgs = match tokio::time::timeout(ECHO_EVERY, outbox.recv()).await {
            Ok(None) => return,
            Ok(Some(first)) => {
                batch.clear();
                batch.extend(first);
                // Whatever piled up while the last PUBLISH was in flight goes in this one.
                while batch.len() < 8192 {
                    match outbox.try_recv() {
                        Ok(more) => batch.extend(more),
                        Err(_) => break,
                    }
                }
                encode(&node_id, &batch)
            }
            Err(_) => vec![format!("{node_id}\n")],
        };
        for msg in msgs {
            let stamp = echo.sending();
            // Routed by the channel's slot, so to a master of the Cluster.
            let sent = tokio::time::timeout(
                op_timeout,
                redis::cmd("PUBLISH")
                    .arg(&channel)
                    .arg(msg)
                    .query_async::<i64>(&mut conn),
            )
            .await;
            if !matches!(sent, Ok(Ok(_))) {
                echo.not_sent(stamp);
                tracing::debug!("could not relay notices to the other nodes");
            }
        }
    }
}

/// What the subscriber needs.
pub(super) struct Subscriber {
    /// Nodes to listen on, tried in turn.
    pub targets: Vec<ConnectionInfo>,
    pub channel: String,
    pub node_id: String,
    pub notices: broadcast::Sender<Notice>,
    /// For the event ids announced after a reconnect.
    pub conn: Conn,
    pub events_key: String,
    pub op_timeout: Duration,
    pub echo: Arc<Echo>,
    /// This node's leases: a lease another node gave back (it closed) ends this node's
    /// standing by for it.
    pub leases: super::Leases,
}

/// The subscriber: listens until the store drops it (the task is aborted).
pub(super) async fn subscribe(mut s: Subscriber) {
    let mut target = 0;
    let mut backoff = BACKOFF_START;
    let mut missed = false;
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let info = s.targets[target % s.targets.len()].clone();
        let opened = tokio::time::timeout(s.op_timeout, async {
            let client = redis::Client::open(info)?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&s.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        match opened {
            Ok(Ok(pubsub)) => {
                backoff = BACKOFF_START;
                warned = None;
                s.echo.heard();
                if missed {
                    tracing::info!("notice relay listening again");
                    announce_all(&mut s).await;
                }
                if listen(&s, pubsub).await == Lost::Deaf {
                    tracing::warn!(
                        node = ?s.targets[target % s.targets.len()].addr(),
                        "notice relay does not hear its own messages there (a Cluster node \
                         that left the Cluster, or a connection that broke silently): \
                         listening again, on the next node if there is one"
                    );
                    target += 1;
                }
                missed = true;
            }
            failed => {
                // Said out loud, once a minute while it lasts: without the relay, other
                // nodes' changes reach this node's live followers only through its
                // replicas' polls, seconds late (an ACL user without the channel, `&wr:*`,
                // is refused here for ever).
                if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {} ms", s.op_timeout.as_millis()),
                    };
                    tracing::warn!(
                        channel = %s.channel,
                        %error,
                        "notice relay cannot subscribe: other nodes' changes reach live \
                         followers here late"
                    );
                    warned = Some(std::time::Instant::now());
                }
                target += 1;
                missed = true;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Why [`listen`] ended.
#[derive(PartialEq)]
enum Lost {
    Connection,
    /// Connected, but not hearing this node's own messages.
    Deaf,
}

/// Relays messages until the connection is lost or hears nothing.
async fn listen(s: &Subscriber, pubsub: redis::aio::PubSub) -> Lost {
    let (mut sink, mut stream) = pubsub.split();
    let mut deaf_check = tokio::time::interval(Duration::from_secs(1));
    // A deadline moved by each message, not a sleep made afresh at each turn: the deafness
    // check's tick ends a turn every second, and would keep a new 5 s sleep from ever ending.
    let ping = tokio::time::sleep(PING_EVERY);
    tokio::pin!(ping);
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else { return Lost::Connection };
                ping.as_mut().reset(tokio::time::Instant::now() + PING_EVERY);
                let payload = msg.get_payload_bytes();
                if is_own(&s.node_id, payload) {
                    s.echo.heard();
                    continue;
                }
                for n in decode(&s.node_id, payload) {
                    if let Notice::LeaseFreed { event_id } = &n {
                        if let Some(lease) = s.leases.lock().get_mut(&**event_id) {
                            lease.idle_until = None;
                        }
                    }
                    let _ = s.notices.send(n);
                }
            }
            _ = deaf_check.tick() => {
                if s.echo.deaf() {
                    return Lost::Deaf;
                }
            }
            () = ping.as_mut() => {
                // Any answer: a subscribed RESP2 connection answers `["pong", ""]`, not
                // `PONG` (read as text, that failed, and every quiet 5 s reconnected).
                let pong = tokio::time::timeout(s.op_timeout, sink.ping::<redis::Value>()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    tracing::debug!("notice relay connection stopped answering");
                    return Lost::Connection;
                }
                ping.as_mut().reset(tokio::time::Instant::now() + PING_EVERY);
            }
        }
    }
}

/// After a gap in the subscription: every event may have moved.
async fn announce_all(s: &mut Subscriber) {
    let ids = tokio::time::timeout(
        s.op_timeout,
        redis::cmd("SMEMBERS")
            .arg(&s.events_key)
            .query_async::<Vec<String>>(&mut s.conn),
    )
    .await;
    if let Ok(Ok(ids)) = ids {
        for id in ids {
            let _ = s.notices.send(Notice::Moved {
                event_id: id.into(),
            });
        }
    }
}

/// The other nodes of a Cluster (from `CLUSTER NODES`), reached like `seed`.
pub(super) async fn cluster_nodes(
    conn: &mut impl ConnectionLike,
    seed: &ConnectionInfo,
) -> Vec<ConnectionInfo> {
    let nodes: String = match redis::cmd("CLUSTER").arg("NODES").query_async(conn).await {
        Ok(n) => n,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for line in nodes.lines() {
        // `<id> <ip:port@cport[,hostname]> <flags> …`; the node asked is the seed, already
        // the first target.
        let mut fields = line.split_whitespace();
        let (Some(addr), Some(flags)) = (fields.nth(1), fields.next()) else {
            continue;
        };
        if flags.split(',').any(|f| f == "myself") {
            continue;
        }
        let addr = addr.split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let (Ok(port), false) = (port.parse::<u16>(), host.is_empty()) else {
            continue;
        };
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        out.push(seed.clone().set_addr(addr));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_own_messages_are_dropped() {
        let a: Arc<str> = "a".into();
        let b: Arc<str> = "b.2".into();
        let batch = vec![
            Notice::Admitted {
                event_id: a.clone(),
                seq: 7,
            },
            Notice::Ended {
                event_id: a.clone(),
                seq: 3,
                reason: EndReason::Cleared,
            },
            Notice::EventChanged {
                event_id: a.clone(),
            },
            Notice::Moved {
                event_id: a.clone(),
            },
            Notice::EventDeleted {
                event_id: b.clone(),
            },
            Notice::LeaseFreed {
                event_id: b.clone(),
            },
            Notice::Moved {
                event_id: b.clone(),
            },
        ];
        let msgs = encode("n1", &batch);
        assert_eq!(msgs.len(), 1);
        assert_eq!(decode("n2", msgs[0].as_bytes()), batch);
        assert!(decode("n1", msgs[0].as_bytes()).is_empty());
        assert!(decode("n2", b"\xff").is_empty());
    }

    #[test]
    fn big_batches_are_split() {
        let e: Arc<str> = "e".into();
        let batch: Vec<_> = (0..50_000u64)
            .map(|seq| Notice::Ended {
                event_id: e.clone(),
                seq,
                reason: EndReason::Cleared,
            })
            .collect();
        let msgs = encode("n", &batch);
        assert!(msgs.len() > 1);
        assert!(msgs.iter().all(|m| m.len() <= MAX_MESSAGE + 64));
        let back: Vec<_> = msgs
            .iter()
            .flat_map(|m| decode("other", m.as_bytes()))
            .filter(|n| !matches!(n, Notice::Moved { .. }))
            .collect();
        assert_eq!(back, batch);
    }
}
