//! The Redis backend: many stateless `waitroom` nodes share one Redis (or Redis Cluster), and
//! every node answers every request with the same rules as the embedded store.
//!
//! How it stays exact without locks:
//! - **One script per operation.** The queue rules of [`crate::core::queue`] are mirrored in
//!   Lua (`lua/rules.lua`, `lua/ops.lua`, after a prelude generated from the Rust constants
//!   by `script.rs`: Redis Functions called with FCALL, or EVALSHA on a server without
//!   them, each loaded again when missing: `call.rs`); `decode.rs` reads its answers, and
//!   the core computes views and figures from them. Redis runs a script alone, so each
//!   operation observes and changes one event as a single step, whichever node sends it;
//!   a join or heartbeat is one round trip (a status none: replica.rs).
//!   Time comes from the caller (`now`), never from Redis, as the [`Store`] contract asks.
//!   Joins, leaves and enters of an event go to Redis in batches, one script call for all
//!   that queued while the event's previous call was in flight (`batch.rs`).
//! - **One slot per event.** Every key of an event carries the hash tag `{event}`
//!   (`wr:{concert-a}:q`, …), so on a Cluster each script touches one slot and events spread
//!   over the shards. Only the list of event ids (`wr:events`) lives elsewhere; it is written
//!   before an event is created and after it is deleted, so no event is ever invisible.
//! - **Exact positions in O(log n).** Waiting places sit in a ZSET scored by their join
//!   sequence number: a position is `ZRANK + 1`. Heartbeats are ZSET scores (`ZADD XX GT`),
//!   so renewing one never rewrites a place, and a sweep is a `ZRANGEBYSCORE` up to `now`.
//!   Deadlines are kept as "last seen" and "admitted at" times rather than absolute
//!   deadlines, so a settings change re-times every place without touching any. The
//!   event's numbers (settings, counters, token bucket, a lower bound of the next deadline)
//!   are one MessagePack value, so a status poll costs four Redis calls inside its script
//!   (read the numbers, read the place, renew, rank) and writes nothing else.
//! - **Periodic work on one node.** [`Store::tick`] first takes or renews the event's lease
//!   (`SET NX PX`, value `node:epoch`) inside the same script that does the work, so a node
//!   that lost its lease can never act on it (the fencing check and the work are one atomic
//!   step). The generic scheduler calls `tick` at least every 250 ms, which renews a 3 s
//!   lease long before it lapses; a node that sees another holder waits until that lease
//!   would lapse and then tries again, so a dead node's work is taken over within the lease
//!   time. Event-driven admission (a slot freed, a join into an empty queue) needs no lease:
//!   it happens inside the script of the operation that made the room.
//! - **Notices across nodes.** Scripts answer their effects; the node counts them, hands
//!   them to its own subscribers at once, and relays them to the other nodes over Redis
//!   pub/sub ([`relay`]), batched so that a busy node sends few messages.
//! - **Outages.** Every call is bounded by [`RedisOptions::op_timeout`]; past it, or on any
//!   connection error, the operation fails with [`StoreError::Unavailable`] (503). The
//!   connection reconnects by itself in the background (redis-rs `ConnectionManager`, or
//!   the cluster client), so service resumes when Redis returns.
//!
//! Nodes sharing a Redis must also share `--signing-key`: waiting tokens are checked with a
//! MAC derived from it, so a token made on one node is only accepted by another with the
//! same key.

mod batch;
mod call;
mod checks;
mod close;
mod configure;
mod conn;
mod decode;
mod invites;
mod log_meta;
mod memory;
mod relay;
mod replica;
mod sale;
mod script;
pub mod sentinel;

pub(super) use conn::with_userinfo_encoded;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisResult;
use tokio::sync::{broadcast, mpsc, OnceCell};
use tokio::task::JoinHandle;

use conn::Conn;

use super::{
    notices_of, EventSnapshot, JoinRequest, Notice, SaleEndApplied, Store, StoreError, StoreResult,
    NOTICE_BUFFER,
};
use crate::core::{
    validate_event_id, Access, Effect, EventConfig, EventPatch, HeadEntry, InventoryCounts,
    InventoryView, InviteHolder, Millis, PlaceKey, PlaceView, QueueError, SaleEnd, SessionHolds,
};
use crate::telemetry;
use decode::{array, field, int, invalid, queue_error, text, uint, unexpected, Malformed, Reply};
use script::{CONFLICT, KEYS, LEASED, OK, REOPEN_LOCKED, SCHEDULE_LOCKED};

/// How long a connection attempt may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long opening the store's connection may take, Cluster discovery included. (Only a
/// store built with [`RedisStore::new`] opens on a request; a server opens at startup.)
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times `put_event` re-reads and re-applies a patch that raced another update
/// (50 racing updates of one event gave up 18 times at 8 attempts without a pause).
const PUT_ATTEMPTS: usize = 64;
/// Largest `queue_head` page; the admin API asks for far fewer.
const MAX_HEAD: usize = 100_000;
/// How much longer a spent proof of work is remembered than its expiry by the spending
/// node's clock: covers nodes whose clocks are up to this far behind.
const CLAIM_CLOCK_MARGIN: Duration = Duration::from_secs(60);

/// Settings of the Redis backend beyond its URL.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prefix of every key and of the notice channel. Nodes serving the same events must
    /// use the same one; tests use a fresh one per store to stay apart on one server.
    pub key_prefix: String,
    /// How long an event's periodic-work lease lasts without renewal: the longest a dead
    /// node's expiry sweeps and paced admissions wait before another node takes them over.
    pub lease: Duration,
    /// The longest any store call may take before it answers `Unavailable`, so a request
    /// never hangs on a stopped or unreachable Redis.
    pub op_timeout: Duration,
    /// Replicas that must have an operation's writes before it is answered (`WAIT`, within
    /// `op_timeout`); 0 answers at once. Standalone and Sentinel only.
    pub wait_replicas: u32,
    /// `status` from node-local replicas, renewals batched (`replica.rs`); off: the script.
    pub replica: bool,
    /// FCALL of the script's Redis Functions where the server has them; off: EVALSHA (`call.rs`).
    pub functions: bool,
    /// After the server refused Functions (an ACL without them, a server without them),
    /// how long calls go as EVALSHA before FCALL is tried again (`call.rs`).
    pub functions_retry: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            key_prefix: "wr".into(),
            lease: Duration::from_secs(3),
            op_timeout: Duration::from_millis(1500),
            wait_replicas: 0,
            replica: true,
            functions: true,
            functions_retry: Duration::from_secs(60),
        }
    }
}

/// What this node knows of one event's periodic-work lease.
#[derive(Default)]
pub(super) struct Lease {
    /// The lease value (`node:epoch`) this node holds, if it believes it holds one.
    held: Option<String>,
    /// Another node holds the lease: no point asking Redis again before this instant, when
    /// that lease would lapse unless renewed (or until another node says the event changed:
    /// a node that closes gives its leases back and says so, see `close.rs`).
    pub(super) idle_until: Option<Instant>,
}

/// The leases this node knows of, by event; shared with the notice relay's subscriber.
pub(super) type Leases = Arc<Mutex<HashMap<String, Lease>>>;

pub struct RedisStore {
    inner: Arc<Inner>,
}

enum Target {
    Node(redis::Client),
    Sentinel(sentinel::SentinelTarget),
}

struct Inner {
    /// What the URL names: a node (the only one for a standalone Redis, the seed for a
    /// Cluster), or the sentinels of a monitored master.
    target: Target,
    options: RedisOptions,
    /// Random per process: the lease holder's name and the origin of relayed notices.
    node_id: String,
    events_key: String,
    /// The admin audit list, shared by every node (newest first, capped).
    audit_key: String,
    channel: String,
    /// Opened on first use, in the runtime of that use (tests build a store outside any
    /// runtime, and the connection's driver task must live in the one that uses it).
    conn: OnceCell<Conn>,
    notices: broadcast::Sender<Notice>,
    /// Notices for the other nodes, to the relay's publisher; taken at `close`.
    outbox: Mutex<Option<mpsc::Sender<Vec<Notice>>>>,
    leases: Leases,
    /// Joins, leaves and enters waiting to go to Redis together (`batch.rs`).
    lanes: batch::Lanes,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The relay's publisher, apart from `tasks`: `close` lets it drain its queue.
    publisher: Mutex<Option<JoinHandle<()>>>,
    replicas: replica::Replicas, // of the events this node answers `status` for
    /// FCALL or EVALSHA (`call.rs`).
    caller: call::Caller,
    /// This node's record of its signing keys, written back should Redis lose it (`checks.rs`).
    kept_keys: Mutex<Option<checks::KeptKeys>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().drain(..) {
            t.abort();
        }
        if let Some(t) = self.publisher.get_mut().take() {
            t.abort();
        }
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

/// Whether the script refused an event written before the chunked layout (its error
/// `LAYOUT …`, `rules.lua`'s `OLD_LAYOUT_ERROR`).
fn is_old_layout(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(m) if m.contains("LAYOUT") && m.contains("older waitroom"))
}

impl RedisStore {
    /// A store for `url` (`redis://[user:password@]host:port[/db]` or `rediss://…`) that
    /// connects on first use. Fails only on a URL that redis-rs cannot read.
    pub fn new(url: &str, options: RedisOptions) -> anyhow::Result<Self> {
        let target = match sentinel::SentinelTarget::from_url(url) {
            Some(t) => Target::Sentinel(t?),
            None => Target::Node(redis::Client::open(&*with_userinfo_encoded(url))?),
        };
        let prefix = options.key_prefix.clone();
        let caller = call::Caller::new(options.functions, options.functions_retry);
        if options.replica {
            replica::register_metrics();
        }
        Ok(RedisStore {
            inner: Arc::new(Inner {
                target,
                options,
                node_id: format!("{:032x}", crate::tokens::random_u128()),
                events_key: format!("{prefix}:events"),
                audit_key: format!("{prefix}:audit"),
                channel: format!("{prefix}:notices"),
                conn: OnceCell::new(),
                notices: broadcast::channel(NOTICE_BUFFER).0,
                outbox: Mutex::new(None),
                leases: Leases::default(),
                lanes: batch::Lanes::default(),
                tasks: Mutex::new(Vec::new()),
                publisher: Mutex::new(None),
                replicas: replica::Replicas::default(),
                caller,
                kept_keys: Mutex::new(None),
            }),
        })
    }

    /// A store for `url`, connected: fails when Redis cannot be reached within a few
    /// seconds, so that a misconfigured node stops at startup rather than serving 503s.
    pub async fn connect(url: &str, options: RedisOptions) -> anyhow::Result<Self> {
        let store = Self::new(url, options)?;
        match store.inner.connection().await {
            // Refused rather than ignored: an operator who asked for it believes that a
            // failover loses nothing acknowledged, and on a Cluster nothing waits for a
            // shard's replicas (`WAIT` is not sent there).
            Ok(Conn::Cluster(_)) if store.inner.options.wait_replicas > 0 => Err(anyhow::anyhow!(
                "redis_wait_replicas ({}) is not supported on a Redis Cluster: no change \
                     would wait for a shard's replicas, and a failover could lose \
                     acknowledged changes. Set it to 0, or use a standalone Redis with \
                     replicas (under Sentinel)",
                store.inner.options.wait_replicas
            )),
            Ok(_) => Ok(store),
            Err(e) => Err(anyhow::anyhow!("cannot connect to Redis: {e}")),
        }
    }

    /// Whether the URL's server is a Cluster node (the store then talks to the Cluster).
    pub async fn is_cluster(&self) -> StoreResult<bool> {
        let conn = self.inner.connection().await?;
        Ok(matches!(conn, Conn::Cluster(_)))
    }
}

impl Inner {
    /// The connection, opened on first use (within [`OPEN_TIMEOUT`]). Once open it stays:
    /// it reconnects by itself, so later calls only clone a handle.
    async fn connection(&self) -> StoreResult<Conn> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        match tokio::time::timeout(OPEN_TIMEOUT, self.conn.get_or_try_init(|| self.open())).await {
            Ok(Ok(c)) => Ok(c.clone()),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not answer within {} s",
                OPEN_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Opens the connection (standalone or Cluster, told apart by `INFO cluster`) and
    /// starts the notice relay.
    async fn open(&self) -> RedisResult<Conn> {
        let client = match &self.target {
            Target::Node(c) => c.clone(),
            Target::Sentinel(t) => t.master().await?,
        };
        let mut probe = client
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(self.options.op_timeout)),
            )
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut probe)
            .await?;
        let cluster = info.contains("cluster_enabled:1");
        checks::check_eviction(&mut probe).await?;
        if !cluster {
            // Not refused: replicas may be attached after the node starts (`/readyz` answers
            // 503 until they are), but a node that serves only 503s should say why.
            if let Some(why) =
                checks::missing_replicas(&mut probe, self.options.wait_replicas).await?
            {
                tracing::warn!("{why}");
            }
        }
        let conn = if cluster {
            let info = client.get_connection_info().clone();
            let client = redis::cluster::ClusterClientBuilder::new(vec![info])
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(self.options.op_timeout)
                .retries(2)
                .min_retry_wait(50)
                .max_retry_wait(500)
                .build()?;
            Conn::Cluster(client.get_async_connection().await?)
        } else {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(self.options.op_timeout))
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            let manager =
                ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
            let manager = conn::Healing::new(client.clone(), config.clone(), manager);
            match &self.target {
                Target::Node(_) => Conn::Single(manager),
                Target::Sentinel(t) => {
                    let following = sentinel::Following::new(&client, manager);
                    let watcher = tokio::spawn(sentinel::watch(
                        t.clone(),
                        following.clone(),
                        config,
                        self.options.op_timeout,
                    ));
                    self.tasks.lock().push(watcher);
                    Conn::Sentinel(following)
                }
            }
        };
        // Not fatal: a call that finds the library missing loads it (`call.rs`).
        if let Err(e) = self.caller.load(&mut conn.clone()).await {
            tracing::warn!(error = %e, "could not load the script's function library yet");
        }
        // Every node of a Cluster relays PUBLISH to all others, so the subscriber may listen
        // on any of them; it moves on to the next when one fails.
        let mut targets = vec![client.get_connection_info().clone()];
        if cluster {
            targets.extend(relay::cluster_nodes(&mut probe, client.get_connection_info()).await);
        }
        if let Target::Sentinel(t) = &self.target {
            // PUBLISH on the master reaches subscribers on its replicas too, so after a
            // failover the subscriber moves on to one of them.
            let replicas = t.replicas().await;
            targets.extend(replicas.iter().map(|r| r.get_connection_info().clone()));
        }
        let echo = relay::Echo::new();
        let (tx, rx) = mpsc::channel(relay::OUTBOX);
        *self.outbox.lock() = Some(tx);
        let publisher = tokio::spawn(relay::publish(
            conn.clone(),
            self.channel.clone(),
            self.node_id.clone(),
            rx,
            self.options.op_timeout,
            echo.clone(),
        ));
        let subscriber = tokio::spawn(relay::subscribe(relay::Subscriber {
            targets,
            channel: self.channel.clone(),
            node_id: self.node_id.clone(),
            notices: self.notices.clone(),
            conn: conn.clone(),
            events_key: self.events_key.clone(),
            op_timeout: self.options.op_timeout,
            echo,
            leases: self.leases.clone(),
        }));
        *self.publisher.lock() = Some(publisher);
        self.tasks.lock().push(subscriber);
        tracing::info!(cluster, node = %self.node_id, "connected to redis");
        Ok(conn)
    }

    /// Runs `fut` within the operation timeout; any failure is `Unavailable`.
    async fn bounded<T>(&self, fut: impl Future<Output = RedisResult<T>>) -> StoreResult<T> {
        match tokio::time::timeout(self.options.op_timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(StoreError::Unavailable(format!(
                "redis did not answer within {} ms",
                self.options.op_timeout.as_millis()
            ))),
        }
    }

    fn keys(&self, event_id: &str) -> [String; KEYS.len()] {
        let base = format!("{}:{{{}}}:", self.options.key_prefix, event_id);
        KEYS.map(|(suffix, _)| format!("{base}{suffix}"))
    }

    /// Runs the script's operation `op` on one event; counts and relays its effects.
    async fn run(
        &self,
        event_id: &str,
        op: &str,
        now: Millis,
        args: &[&[u8]],
        join: Option<&JoinRequest>,
    ) -> StoreResult<Reply> {
        self.renewals_before(event_id, op, now).await?;
        let keys = self.keys(event_id);
        let mut conn = self.connection().await?;
        let value = self
            .bounded(self.caller.call(&mut conn, &keys, |c| {
                c.arg(op).arg(now);
                for a in args {
                    c.arg(*a);
                }
            }))
            .await?;
        self.wait_for_replicas(&mut conn).await?;
        self.replicas.wrote(event_id, op, &value);
        let (reply, fx) = decode::reply(&value, join, now)?;
        self.announce(event_id, &fx);
        Ok(reply)
    }

    /// With `wait_replicas`, holds the answer until that many replicas have this
    /// connection's writes so far (`WAIT` covers every earlier command on the connection,
    /// so the operation just run is among them). Fewer in time: `Unavailable`, because the
    /// change, though applied on the master, could still be lost with it.
    async fn wait_for_replicas(&self, conn: &mut Conn) -> StoreResult<()> {
        let want = self.options.wait_replicas;
        if want == 0 || matches!(conn, Conn::Cluster(_)) {
            return Ok(());
        }
        let budget = (self.options.op_timeout / 2).as_millis() as u64;
        let got: i64 = self
            .bounded(redis::cmd("WAIT").arg(want).arg(budget).query_async(conn))
            .await?;
        if got < i64::from(want) {
            return Err(StoreError::Unavailable(format!(
                "redis: the change reached {got} of {want} replicas within {budget} ms"
            )));
        }
        Ok(())
    }

    /// Counts what an operation changed, tells this node's subscribers, and queues the
    /// notices for the other nodes.
    fn announce(&self, event_id: &str, fx: &[Effect]) {
        if fx.is_empty() {
            return;
        }
        telemetry::record_effects(event_id, fx);
        let id: Arc<str> = event_id.into();
        self.tell(notices_of(&id, fx));
    }

    /// Hands notices to this node's subscribers and queues them for the other nodes.
    fn tell(&self, notices: Vec<Notice>) {
        if notices.is_empty() {
            return;
        }
        if self.notices.receiver_count() > 0 {
            for n in &notices {
                let _ = self.notices.send(n.clone());
            }
        }
        if let Some(tx) = self.outbox.lock().as_ref() {
            // Full only while Redis is unreachable for long: notices are best effort
            // (live clients re-read on their own at least every few seconds).
            let _ = tx.try_send(notices);
        }
    }

    /// Runs `op` and maps its code: `OK` answers the reply, an error code its error.
    async fn op(
        &self,
        event_id: &str,
        op: &str,
        now: Millis,
        args: &[&[u8]],
        join: Option<&JoinRequest>,
    ) -> StoreResult<Reply> {
        let reply = self.run(event_id, op, now, args, join).await?;
        if reply.code == OK {
            Ok(reply)
        } else {
            Err(unexpected(&reply.code))
        }
    }

    async fn place_op(
        &self,
        event_id: &str,
        op: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<Reply> {
        let seq = key.seq.to_string();
        let nonce = key.nonce.to_be_bytes();
        self.op(event_id, op, now, &[seq.as_bytes(), &nonce], None)
            .await
    }

    async fn view_op(
        &self,
        event_id: &str,
        op: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        let r = self.place_op(event_id, op, key, now).await?;
        self.view(&r, now)
    }

    fn view(&self, r: &Reply, now: Millis) -> StoreResult<PlaceView> {
        Ok(decode::place_view(&r.payload, &r.ctx, now)?)
    }

    async fn snapshot(&self, event_id: &str, now: Millis) -> StoreResult<EventSnapshot> {
        let r = self.op(event_id, "get", now, &[], None).await?;
        Ok(decode::snapshot(event_id, &r.payload)?)
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn put_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        Ok(self
            .inner
            .configure(event_id, patch, now, true)
            .await?
            .config)
    }

    async fn update_event(
        &self,
        event_id: &str,
        patch: &EventPatch,
        now: Millis,
    ) -> StoreResult<EventConfig> {
        Ok(self
            .inner
            .configure(event_id, patch, now, false)
            .await?
            .config)
    }

    async fn end_sale(
        &self,
        event_id: &str,
        end: SaleEnd,
        now: Millis,
    ) -> StoreResult<SaleEndApplied> {
        let patch = EventPatch {
            end: Some(end),
            ..EventPatch::default()
        };
        let c = self.inner.configure(event_id, &patch, now, false).await?;
        Ok(SaleEndApplied {
            before: c.before,
            config: c.config,
            waiting: c.waiting,
        })
    }

    async fn get_event(&self, event_id: &str, now: Millis) -> StoreResult<EventSnapshot> {
        self.inner.snapshot(event_id, now).await
    }

    async fn list_events(&self, now: Millis) -> StoreResult<Vec<EventSnapshot>> {
        let mut out = Vec::new();
        for id in self.event_ids().await? {
            match self.inner.snapshot(&id, now).await {
                Ok(s) => out.push(s),
                // Listed but deleted meanwhile (or listed just before being created).
                Err(StoreError::Queue(QueueError::EventNotFound)) => {}
                // An event of a layout this version cannot read: left out, named in the log,
                // so that the others are still gated, scheduled and listed (one such event
                // failed every list: the gate table then gated nothing, and a node could
                // not start to delete it).
                Err(e) if is_old_layout(&e) => {
                    tracing::warn!(event = %id, error = %e, "an event this version cannot read is left out of the lists; delete it and create it again");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn delete_event(&self, event_id: &str) -> StoreResult<()> {
        let s = &self.inner;
        s.op(event_id, "delete", 0, &[], None).await?;
        s.leases.lock().remove(event_id);
        s.tell(vec![Notice::EventDeleted {
            event_id: event_id.into(),
        }]);
        let meta = &s.keys(event_id)[0];
        let mut conn = s.connection().await?;
        s.bounded(async {
            redis::cmd("SREM")
                .arg(&s.events_key)
                .arg(event_id)
                .query_async::<i64>(&mut conn)
                .await?;
            // Created again by another node between the delete and the SREM: list it again.
            let back: bool = redis::cmd("EXISTS")
                .arg(meta)
                .query_async(&mut conn)
                .await?;
            if back {
                redis::cmd("SADD")
                    .arg(&s.events_key)
                    .arg(event_id)
                    .query_async::<i64>(&mut conn)
                    .await?;
            }
            Ok(())
        })
        .await
    }

    async fn clear(&self, event_id: &str, now: Millis) -> StoreResult<u64> {
        let r = self.inner.op(event_id, "clear", now, &[], None).await?;
        Ok(uint(&r.payload)?)
    }

    async fn queue_head(
        &self,
        event_id: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<HeadEntry>> {
        let limit = limit.min(MAX_HEAD).to_string();
        let r = self
            .inner
            .op(event_id, "head", now, &[limit.as_bytes()], None)
            .await?;
        Ok(decode::head(&r.payload, &r.ctx, now)?)
    }

    async fn prequeue(
        &self,
        event_id: &str,
        after: u64,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<u64>> {
        let (after, limit) = (after.to_string(), limit.to_string());
        let r = self
            .inner
            .op(
                event_id,
                "prequeue",
                now,
                &[after.as_bytes(), limit.as_bytes()],
                None,
            )
            .await?;
        Ok(array(&r.payload)?
            .iter()
            .map(uint)
            .collect::<Result<_, _>>()?)
    }

    async fn join(&self, event_id: &str, req: &JoinRequest, now: Millis) -> StoreResult<PlaceView> {
        self.inner.join_batched(event_id, req, now).await
    }

    async fn add_invites(&self, event_id: &str, codes: &[String], now: Millis) -> StoreResult<u64> {
        let args: Vec<&[u8]> = codes.iter().map(|c| c.as_bytes()).collect();
        let r = self.inner.op(event_id, "invite", now, &args, None).await?;
        Ok(uint(&r.payload)?)
    }

    async fn invites(
        &self,
        event_id: &str,
        after: &str,
        limit: usize,
        now: Millis,
    ) -> StoreResult<Vec<(String, Option<InviteHolder>)>> {
        self.inner.invites(event_id, after, limit, now).await
    }

    async fn status(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        if let Some(view) = replica::status(&self.inner, event_id, key, now).await {
            return Ok(view);
        }
        self.inner.view_op(event_id, "status", key, now).await
    }

    async fn heartbeat(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        if replica::heartbeat(&self.inner, event_id, key, now).await {
            return Ok(());
        }
        self.inner
            .place_op(event_id, "heartbeat", key, now)
            .await
            .map(|_| ())
    }

    async fn peek(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.inner.view_op(event_id, "peek", key, now).await
    }

    async fn enter(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        let r = self
            .inner
            .place_batched(event_id, "enter", key, now)
            .await?;
        self.inner.view(&r, now)
    }

    async fn leave(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<bool> {
        let r = self
            .inner
            .place_batched(event_id, "leave", key, now)
            .await?;
        Ok(uint(&r.payload)? == 1)
    }

    async fn session_heartbeat(
        &self,
        event_id: &str,
        key: PlaceKey,
        now: Millis,
    ) -> StoreResult<PlaceView> {
        self.inner
            .view_op(event_id, "session_heartbeat", key, now)
            .await
    }

    async fn session(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.inner.view_op(event_id, "session", key, now).await
    }

    async fn complete(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<()> {
        self.inner
            .place_op(event_id, "complete", key, now)
            .await
            .map(|_| ())
    }

    // The sale's operations: `sale.rs`.
    async fn put_inventory(
        &self,
        event_id: &str,
        items: &[String],
        now: Millis,
    ) -> StoreResult<(u64, InventoryCounts)> {
        self.inner.put_inventory(event_id, items, now).await
    }

    async fn inventory(&self, event_id: &str, now: Millis) -> StoreResult<InventoryView> {
        self.inner.inventory(event_id, now).await
    }

    async fn hold(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: &[String],
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        self.inner.hold(event_id, key, items, now).await
    }

    async fn release(
        &self,
        event_id: &str,
        key: PlaceKey,
        items: Option<&[String]>,
        now: Millis,
    ) -> StoreResult<SessionHolds> {
        self.inner.release(event_id, key, items, now).await
    }

    async fn extend(&self, event_id: &str, key: PlaceKey, now: Millis) -> StoreResult<PlaceView> {
        self.inner.extend(event_id, key, now).await
    }

    /// Periodic work, on the lease holder only (see the module doc). A node that does not
    /// hold the lease answers `None`: the holder reports its own deadlines.
    async fn tick(&self, event_id: &str, now: Millis) -> StoreResult<Option<Millis>> {
        let s = &self.inner;
        let held = {
            let leases = s.leases.lock();
            let lease = leases.get(event_id);
            if lease
                .and_then(|l| l.idle_until)
                .is_some_and(|t| Instant::now() < t)
            {
                return Ok(None);
            }
            lease.and_then(|l| l.held.clone()).unwrap_or_default()
        };
        let lease_ms = s.options.lease.as_millis() as u64;
        let lease_arg = lease_ms.to_string();
        let args: [&[u8]; 3] = [held.as_bytes(), s.node_id.as_bytes(), lease_arg.as_bytes()];
        let r = s.run(event_id, "tick", now, &args, None).await?;
        match &r.code[..] {
            OK => {}
            LEASED => {
                // Ask again when that lease would lapse unless its holder renews it.
                let pttl = int(&r.payload)?.clamp(1, lease_ms as i64) as u64;
                let idle_until = Instant::now() + Duration::from_millis(pttl);
                let mut leases = s.leases.lock();
                let lease = leases.entry(event_id.to_string()).or_default();
                if lease.held.take().is_some() {
                    tracing::warn!(event = event_id, "lost the periodic-work lease");
                }
                lease.idle_until = Some(idle_until);
                return Ok(None);
            }
            code => {
                if queue_error(code) == Some(QueueError::EventNotFound) {
                    s.leases.lock().remove(event_id);
                }
                return Err(unexpected(code));
            }
        }
        let a = array(&r.payload)?;
        let next = int(field(a, 0)?)?;
        let mine = text(field(a, 1)?)?;
        if mine.as_deref() != Some(held.as_str()) {
            tracing::info!(event = event_id, lease = ?mine, "took the periodic-work lease");
        }
        s.leases.lock().insert(
            event_id.to_string(),
            Lease {
                held: mine,
                idle_until: None,
            },
        );
        Ok(u64::try_from(next).ok())
    }

    /// `SET NX PX` under the event's hash tag: atomic across nodes, and Redis forgets the
    /// key [`CLAIM_CLOCK_MARGIN`] after its expiry by this node's clock: a node whose clock
    /// is behind still takes the challenge as valid after that instant (a claim kept only
    /// until then let one solution join twice across nodes 45 s apart).
    async fn claim_once(
        &self,
        event_id: &str,
        key: &str,
        expires_at: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        if expires_at <= now {
            return Ok(true); // already expired: nothing to remember (the caller refuses it)
        }
        let s = &self.inner;
        let name = format!("{}:{{{}}}:claim:{}", s.options.key_prefix, event_id, key);
        let mut conn = s.connection().await?;
        let set: Option<String> = s
            .bounded(
                redis::cmd("SET")
                    .arg(&name)
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(expires_at - now + CLAIM_CLOCK_MARGIN.as_millis() as u64)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(set.is_some())
    }

    async fn append_audit(&self, entry: &str, keep: usize) -> StoreResult<()> {
        let s = &self.inner;
        let mut conn = s.connection().await?;
        // One transaction: the list never holds more than `keep` for any reader.
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("LPUSH")
            .arg(&s.audit_key)
            .arg(entry)
            .ignore()
            .cmd("LTRIM")
            .arg(&s.audit_key)
            .arg(0)
            .arg(keep.max(1) as i64 - 1)
            .ignore();
        s.bounded(pipe.query_async::<()>(&mut conn)).await
    }

    async fn audit_entries(&self, limit: usize) -> StoreResult<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let s = &self.inner;
        let mut conn = s.connection().await?;
        s.bounded(
            redis::cmd("LRANGE")
                .arg(&s.audit_key)
                .arg(0)
                .arg(limit as i64 - 1)
                .query_async(&mut conn),
        )
        .await
    }

    async fn event_ids(&self) -> StoreResult<Vec<String>> {
        let s = &self.inner;
        let mut conn = s.connection().await?;
        let mut ids: Vec<String> = s
            .bounded(
                redis::cmd("SMEMBERS")
                    .arg(&s.events_key)
                    .query_async(&mut conn),
            )
            .await?;
        ids.sort();
        // Every node's scheduler lists the events several times a second: the cheapest
        // place to notice that Redis lost the signing-key record.
        s.restore_signing_keys(&conn);
        Ok(ids)
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.inner.connection().await?;
        checks::ready(&self.inner, &mut conn).await
    }

    fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.inner.notices.subscribe()
    }

    /// The sum of `MEMORY USAGE` over the event's keys (`memory.rs`).
    async fn memory_usage(&self, event_id: &str) -> StoreResult<Option<u64>> {
        validate_event_id(event_id)?;
        self.inner.memory_usage(event_id).await.map(Some)
    }

    /// Sends the renewals still queued, gives up this node's leases (so another node takes
    /// the periodic work over at once) and sends the notices still queued for the other
    /// nodes, each step bounded (`close.rs`).
    async fn close(&self) -> StoreResult<()> {
        self.inner.close().await;
        Ok(())
    }
}
