//! Live updates: what the WebSocket (`/queue/ws`) and Server-Sent Events (`/queue/events`)
//! endpoints push to one place, and the hub that turns the store's notices into those pushes.
//!
//! **Why a hub.** The store publishes a broadcast of [`Notice`]s (admitted, ended, moved),
//! relayed from every node when the backend is shared. Giving each of ~20,000 connections its
//! own broadcast receiver would make every notice cost O(connections) wake-ups and clones,
//! and a crowd moving at once would wake every connection once per move. Instead, **one**
//! task, [`Live`]'s hub, receives the notices and routes them:
//! - `Admitted` and `Ended` name one place: the hub looks it up in a map (event → seq →
//!   signal) and wakes only that place's connections, at once. Places followed by no
//!   connection on this node cost one map lookup.
//! - `Moved` says "positions in this event may have changed". The hub marks the event dirty
//!   and, at most every [`COALESCE`], bumps one `watch` per event; the connections of that
//!   event then re-read their own position (a `peek`, which renews nothing) and push an
//!   update only when it changed. A storm of a thousand moves costs each connection at most
//!   one re-read per [`COALESCE`]; a lone move is pushed at once. The embedded store
//!   reports its moves without a notice per change: it marks the event in a set
//!   ([`MovedEvents`]) that wakes the hub when it was empty, and the hub takes the set
//!   when the next sweep starts, so the joins of a burst wake it once.
//! - A lagged receiver (the hub fell more than the store's buffer behind) may have missed
//!   admissions and ends: every followed event is then treated as moved, and since a re-read
//!   also reveals admission and ends, nobody is left waiting on a lost notice.
//!
//! - `EventDeleted` ends every followed place of the event at once (`queue-cleared`), on
//!   every node, rather than leaving its followers to find out at their next refresh.
//!   `EventChanged` counts as a move: new settings may change positions' ETAs or admit.
//!   It also bumps the event's settings generation, so that each follower, at its re-read,
//!   also reads the settings and pushes `event-state` (paused, accepting joins) when they
//!   changed, and a `queue-update` even if its position did not (its ETA did).
//!
//! The hub's routing task is started by whoever runs the node ([`crate::server`], or a
//! test through [`crate::AppState::start_background`]) with [`Live::run`]; it stops with
//! the node's stop signal or when the store goes away. This module knows nothing of HTTP:
//! its errors are the store's, and the HTTP layer maps them.
//!
//! **One place, one [`Follower`].** Both transports run the same follower, which decides
//! what to send: `queue-update` on connect, on a position change, and at least every
//! [`REFRESH`]; `queue-ready` on admission; `queue-expired` / `queue-left` /
//! `queue-cleared` when the place ends, after which the stream is closed. While the client
//! shows it is there, the follower renews the place's heartbeat every third of the event's
//! `waiting_idle_sec` (at most every [`HEARTBEAT_MAX`]), on a timer rather than per
//! message, so a message storm never turns into a heartbeat storm, and once more when a
//! live client's connection drops. A connection that drops does not end the place: only
//! the lapse of its heartbeat ends it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::catalog::EventCatalog;
use crate::clock::Clock;
use crate::core::lifecycle::format_rfc3339;
use crate::core::{
    EndCause, EndReason, EventConfig, Millis, PlaceKey, PlaceState, PlaceView, QueueError,
    ShownStatus, Texts,
};
use crate::store::{MovedEvents, Notice, Store, StoreError};
use crate::tasks::{stopped, Stop};

/// Shortest time between two position refreshes of one event: "at most a few per second"
/// and "within about a second of a change" of the contract.
pub const COALESCE: Duration = Duration::from_millis(500);
/// A big event's followers are split into this many shards (by join sequence number), and
/// a refresh sweeps through them over one [`COALESCE`] window instead of waking every
/// follower at once. Waking 20,000 connections together would queue a `queue-ready` (the
/// message that matters most) behind 20,000 position refreshes; a sweep bounds that queue
/// to one shard's worth.
pub const SHARDS: usize = 16;
/// Followers per sweep slot: an event with fewer followers than this is refreshed in one
/// go (at once, for a lone change); a bigger one is spread over more slots, up to [`SHARDS`].
pub const FOLLOWERS_PER_SLOT: usize = 1000;
/// Time between two slots of a sweep.
const SLOT: Duration = Duration::from_micros(COALESCE.as_micros() as u64 / SHARDS as u64);

/// Longest time without a `queue-update`: the contract's "at least every 10 s". A little
/// under it, so that timer slack never makes it late.
pub const REFRESH: Duration = Duration::from_millis(9_500);
/// Shortest period of the refresh a short ready window asks for ([`refresh_period`]).
pub const REFRESH_MIN: Duration = Duration::from_secs(1);
/// Bounds of the heartbeat renewal period (a third of the event's `waiting_idle_sec`). The
/// floor keeps a tiny idle setting from becoming a busy loop; the ceiling bounds how long
/// a silently vanished WebSocket client can go unnoticed before pings stop being answered.
pub const HEARTBEAT_MIN: Duration = Duration::from_millis(250);
pub const HEARTBEAT_MAX: Duration = Duration::from_secs(10);
/// How long a follower that found its place gone waits for the notice that says why (left,
/// cleared or completed). Notices are published once the change is durable, a few
/// milliseconds after it is visible; lost ones (a lagged hub) fall back to "left".
const END_NOTICE_WAIT: Duration = Duration::from_secs(2);

/// One message of the live contract. Serialized as `{"type": "queue-update", …}`; over SSE
/// the `type` is also the `event:` name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum LiveMessage {
    QueueUpdate {
        /// `waiting`, `admitted` or `active`: lets a client that connects after its turn came
        /// tell which screen to show (an extension of the contract's fields).
        status: ShownStatus,
        /// Present while waiting, as in `GET /queue/status`.
        #[serde(skip_serializing_if = "Option::is_none")]
        position: Option<u64>,
        /// Present while `pre-queue`, as in `GET /queue/status`.
        #[serde(skip_serializing_if = "Option::is_none")]
        opens_in_sec: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        prequeue_rank: Option<u64>,
        queue_length: u64,
        eta_sec: u64,
        /// The range of the wait, as in `GET /queue/status` (`null`: no basis yet).
        eta_low_sec: Option<u64>,
        eta_high_sec: Option<u64>,
        /// When to poll `status` if the stream drops.
        poll_after_sec: u64,
        paused: bool,
    },
    /// The event's state as a waiting page shows it: pushed when an operator pauses,
    /// resumes or changes its settings.
    EventState {
        paused: bool,
        accept_joins: bool,
    },
    QueueReady {
        enter_within_sec: u64,
    },
    QueueExpired,
    /// Left by the person, or completed (`reason` tells which).
    QueueLeft {
        reason: EndReason,
    },
    QueueCleared,
    /// The operator's latest message (`core::lifecycle`), pushed when posted or cleared
    /// (`message: null`), and on connect when there is one.
    Announcement {
        message: Option<Texts>,
        /// When it was posted (RFC 3339); `null` when cleared.
        at: Option<String>,
    },
    /// The sale ended (`closes_at`, or the admin's `end`): the place ended with it.
    Ended {
        reason: EndCause,
        message: Option<Texts>,
    },
}

impl LiveMessage {
    /// The contract's name of the message (`queue-update`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            LiveMessage::QueueUpdate { .. } => "queue-update",
            LiveMessage::EventState { .. } => "event-state",
            LiveMessage::QueueReady { .. } => "queue-ready",
            LiveMessage::QueueExpired => "queue-expired",
            LiveMessage::QueueLeft { .. } => "queue-left",
            LiveMessage::QueueCleared => "queue-cleared",
            LiveMessage::Announcement { .. } => "announcement",
            LiveMessage::Ended { .. } => "ended",
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("live messages serialize")
    }

    /// Whether the place ended with this message (the stream closes after it).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            LiveMessage::QueueExpired
                | LiveMessage::QueueLeft { .. }
                | LiveMessage::QueueCleared
                | LiveMessage::Ended { .. }
        )
    }

    fn update(v: &PlaceView) -> Self {
        LiveMessage::QueueUpdate {
            status: v.shown_status(),
            position: v.position,
            opens_in_sec: v.opens_in_sec,
            prequeue_rank: v.prequeue_rank,
            queue_length: v.queue_length,
            eta_sec: v.eta_sec.unwrap_or(0),
            eta_low_sec: v.eta_range.map(|r| r.0),
            eta_high_sec: v.eta_range.map(|r| r.1),
            poll_after_sec: v.poll_after_sec,
            paused: v.paused,
        }
    }

    /// The announcement of `config`, as pushed.
    fn announcement(config: &EventConfig) -> Self {
        let a = config.announcement.as_ref();
        LiveMessage::Announcement {
            message: a.map(|a| a.message.clone()),
            at: a.map(|a| format_rfc3339(a.at)),
        }
    }

    /// The end of the sale of `config` at `now`, if it ended.
    fn sale_end(config: &EventConfig, now: Millis) -> Option<Self> {
        config.sale_ended(now).map(|e| LiveMessage::Ended {
            reason: e.reason,
            message: e.message.cloned(),
        })
    }

    fn ended(reason: EndReason) -> Self {
        match reason {
            EndReason::Expired => LiveMessage::QueueExpired,
            // Only when the event cannot be read to tell why (`Follower::on_error`).
            EndReason::Cleared | EndReason::Closed => LiveMessage::QueueCleared,
            EndReason::Left | EndReason::Completed => LiveMessage::QueueLeft { reason },
        }
    }
}

/// What the hub knows about one place from the notices: each flag only ever turns on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlaceSignal {
    pub admitted: bool,
    pub ended: Option<EndReason>,
}

/// The connections of one event on this node.
struct EventEntry {
    /// Bumped (coalesced, swept shard by shard) when positions in the event may have
    /// changed. A follower watches shard `seq % SHARDS`.
    moved: [watch::Sender<u64>; SHARDS],
    /// Connections following a place of this event; sizes the sweep.
    followers: usize,
    /// Bumped at once when the event's settings change; followers read it at their next
    /// re-read (the sweep above), never wait on it.
    settings: watch::Sender<u64>,
    /// Keyed by join sequence number. Notices carry no nonce, so a signal may in theory
    /// reach the place that reused a sequence number after its event was deleted and
    /// created again; followers therefore confirm every signal with a `peek`.
    places: HashMap<u64, watch::Sender<PlaceSignal>>,
}

#[derive(Default)]
struct Hub {
    /// One lock for routing and for (un)registering: both are map operations of a few
    /// hundred nanoseconds, done once per notice and once per connection.
    events: Mutex<HashMap<Arc<str>, EventEntry>>,
}

impl Hub {
    fn signal(&self, event_id: &str, seq: u64, f: impl FnOnce(&mut PlaceSignal)) {
        let events = self.events.lock();
        if let Some(tx) = events.get(event_id).and_then(|e| e.places.get(&seq)) {
            tx.send_modify(f);
        }
    }

    /// Signals every followed place of one event.
    fn signal_all(&self, event_id: &str, f: impl Fn(&mut PlaceSignal)) {
        let events = self.events.lock();
        if let Some(e) = events.get(event_id) {
            for tx in e.places.values() {
                tx.send_modify(&f);
            }
        }
    }

    /// The settings of one event changed.
    fn settings_changed(&self, event_id: &str) {
        if let Some(e) = self.events.lock().get(event_id) {
            e.settings.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// Slot `slot` of a sweep over `ids` (every event with `None`): bumps the shards of each
    /// event that fall in this slot. An event spread over `n` slots has shards `slot`,
    /// `slot + n`, … bumped now; one with a single slot has all of them bumped in slot 0.
    fn bump_slot(&self, ids: Option<&HashSet<Arc<str>>>, slot: usize) {
        let events = self.events.lock();
        let bump = |e: &EventEntry| {
            let slots = e.followers.div_ceil(FOLLOWERS_PER_SLOT).clamp(1, SHARDS);
            if slot < slots {
                for shard in (slot..SHARDS).step_by(slots) {
                    e.moved[shard].send_modify(|g| *g = g.wrapping_add(1));
                }
            }
        };
        match ids {
            Some(ids) => ids.iter().filter_map(|id| events.get(id)).for_each(bump),
            None => events.values().for_each(bump),
        }
    }
}

/// The gauge of the connections that follow a place on this node.
const LIVE_CONNECTIONS: &str = "waitroom_live_connections";

/// The live-update hub of one node. Cheap to share (`Arc` inside [`crate::AppState`]).
#[derive(Default)]
pub struct Live {
    hub: Arc<Hub>,
}

impl Live {
    /// A hub with no follower; [`LIVE_CONNECTIONS`] is exported from now on (at zero until
    /// the first follower), not only once a live connection opens.
    pub fn new() -> Self {
        metrics::gauge!(LIVE_CONNECTIONS).increment(0.0);
        Self::default()
    }

    /// How many connections follow a place on this node (for metrics and tests).
    pub fn followers(&self) -> usize {
        self.hub
            .events
            .lock()
            .values()
            .flat_map(|e| e.places.values())
            .map(|tx| tx.receiver_count())
            .sum()
    }

    /// The hub's routing task: routes `notices` (the store's) to this node's connections
    /// until `stop` or until the store's channel closes. Run exactly one per `Live`; without
    /// it, followers hear of changes only at their periodic refresh.
    pub fn run(
        &self,
        notices: broadcast::Receiver<Notice>,
        moved: Option<Arc<MovedEvents>>,
        stop: Stop,
    ) -> impl Future<Output = ()> + Send + 'static {
        route(self.hub.clone(), notices, moved, stop)
    }

    /// Registers interest in one place (and its event's moves) before its state is read, so
    /// that no notice can fall between the read and the registration.
    fn subscribe(&self, event_id: &str, seq: u64) -> Subscription {
        let mut events = self.hub.events.lock();
        let entry = match events.get_mut(event_id) {
            Some(e) => e,
            None => events.entry(Arc::from(event_id)).or_insert(EventEntry {
                moved: std::array::from_fn(|_| watch::channel(0).0),
                followers: 0,
                settings: watch::channel(0).0,
                places: HashMap::new(),
            }),
        };
        entry.followers += 1;
        metrics::gauge!(LIVE_CONNECTIONS).increment(1.0);
        let moved = entry.moved[(seq % SHARDS as u64) as usize].subscribe();
        let settings = entry.settings.subscribe();
        let place = entry
            .places
            .entry(seq)
            .or_insert_with(|| watch::channel(PlaceSignal::default()).0)
            .subscribe();
        Subscription {
            hub: self.hub.clone(),
            event_id: Arc::from(event_id),
            seq,
            place: Some(place),
            moved: Some(moved),
            settings,
        }
    }
}

/// A refresh in progress: which events, and the next slot to bump.
struct Sweep {
    /// `None`: every event (after a lag).
    events: Option<HashSet<Arc<str>>>,
    slot: usize,
    next_at: Instant,
}

/// The hub's task: routes notices until shutdown or until the store's channel closes.
///
/// Moves are collected into a dirty set; a sweep starts at most once per [`COALESCE`] and
/// walks its slots over that window, and what turns dirty meanwhile waits for the next
/// sweep. So each follower is refreshed at most once per window, and a lone change in a
/// quiet event is pushed at once.
async fn route(
    hub: Arc<Hub>,
    mut notices: broadcast::Receiver<Notice>,
    moved: Option<Arc<MovedEvents>>,
    mut stop: Stop,
) {
    let mut dirty: HashSet<Arc<str>> = HashSet::new();
    let mut everything = false;
    let mut sweep: Option<Sweep> = None;
    // As if the last sweep were long over, so that the first change is pushed at once.
    let mut last_start = Instant::now()
        .checked_sub(COALESCE)
        .unwrap_or_else(Instant::now);
    // One timer for the task's life, moved to each new deadline. A timer made afresh at
    // every turn of the loop was registered in the runtime's timer wheel and taken out again
    // for every notice (every join's `Moved`) while something was dirty or a sweep ran;
    // this one stays registered while its deadline holds.
    let timer = tokio::time::sleep_until(last_start);
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    // The store's set of moved events has events not taken yet.
    let mut moved_marked = false;
    loop {
        // The next thing the timer must do: a slot of the running sweep, or the start of
        // the next one once something is dirty.
        let due = match &sweep {
            Some(s) => Some(s.next_at),
            None if everything || !dirty.is_empty() || moved_marked => Some(last_start + COALESCE),
            None => None,
        };
        if let Some(t) = due.filter(|t| armed != Some(*t)) {
            timer.as_mut().reset(t);
            armed = Some(t);
        }
        tokio::select! {
            // The timer before reading: under a storm of notices `recv` is always ready, and
            // the coalesced refresh must still go out on time.
            biased;
            _ = stopped(&mut stop) => break,
            () = timer.as_mut(), if due.is_some() => {
                // Fired: the next deadline, even an equal one, arms it again.
                armed = None;
                let mut s = sweep.take().unwrap_or_else(|| {
                    if let (true, Some(m)) = (std::mem::take(&mut moved_marked), &moved) {
                        // Taken before the sweep reads positions: a move marked after this
                        // marks the set again, for the next sweep.
                        dirty.extend(m.take());
                    }
                    last_start = Instant::now();
                    let events = (!everything).then(|| std::mem::take(&mut dirty));
                    dirty.clear();
                    everything = false;
                    Sweep { events, slot: 0, next_at: last_start }
                });
                hub.bump_slot(s.events.as_ref(), s.slot);
                s.slot += 1;
                s.next_at += SLOT;
                if s.slot < SHARDS {
                    sweep = Some(s);
                }
            }
            r = notices.recv() => match r {
                Ok(Notice::Admitted { event_id, seq }) => {
                    hub.signal(&event_id, seq, |s| s.admitted = true);
                }
                Ok(Notice::Ended { event_id, seq, reason }) => {
                    hub.signal(&event_id, seq, |s| s.ended = Some(reason));
                }
                Ok(Notice::EventChanged { event_id }) => {
                    hub.settings_changed(&event_id);
                    if !everything && !dirty.contains(&*event_id) {
                        dirty.insert(event_id);
                    }
                }
                Ok(Notice::Moved { event_id }) => {
                    if !everything && !dirty.contains(&*event_id) {
                        dirty.insert(event_id);
                    }
                }
                Ok(Notice::EventDeleted { event_id }) => {
                    hub.signal_all(&event_id, |s| s.ended = Some(EndReason::Cleared));
                }
                // Another node's lease: nothing for the followers.
                Ok(Notice::LeaseFreed { .. }) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "live hub lagged behind the store's notices; refreshing every follower");
                    everything = true;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            // The store's moves, coalesced where they are made (`MovedEvents`): woken when
            // the first event is marked, the hub only arms the timer; the set is taken when
            // the next sweep starts. Until then it stays non-empty, so the joins meanwhile
            // wake nobody.
            () = marked(moved.as_deref()), if !moved_marked => {
                moved_marked = true;
            }
        }
    }
}

/// Ends when `moved` has events marked; never without one (a backend whose moves come as
/// notices).
async fn marked(moved: Option<&MovedEvents>) {
    match moved {
        Some(m) => m.marked().await,
        None => std::future::pending().await,
    }
}

/// A connection's registration with the hub; unregisters on drop (the place itself stays).
struct Subscription {
    hub: Arc<Hub>,
    event_id: Arc<str>,
    seq: u64,
    /// `Option` only so that `drop` can release them before counting who is left.
    place: Option<watch::Receiver<PlaceSignal>>,
    moved: Option<watch::Receiver<u64>>,
    settings: watch::Receiver<u64>,
}

impl Subscription {
    fn place(&mut self) -> &mut watch::Receiver<PlaceSignal> {
        self.place.as_mut().expect("present until drop")
    }

    fn moved(&mut self) -> &mut watch::Receiver<u64> {
        self.moved.as_mut().expect("present until drop")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Under the lock, so that a connection subscribing at the same moment either sees
        // the entry (and keeps it) or makes a new one.
        metrics::gauge!(LIVE_CONNECTIONS).decrement(1.0);
        let mut events = self.hub.events.lock();
        self.place = None;
        self.moved = None;
        if let Some(e) = events.get_mut(&*self.event_id) {
            e.followers = e.followers.saturating_sub(1);
            if e.places
                .get(&self.seq)
                .is_some_and(|tx| tx.receiver_count() == 0)
            {
                e.places.remove(&self.seq);
            }
            if e.places.is_empty() {
                events.remove(&*self.event_id);
            }
        }
    }
}

/// What woke a follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The place's own signal changed (admitted or ended).
    Place,
    /// Positions in the event may have changed.
    Moved,
    /// A heartbeat or refresh deadline came.
    Timer,
    /// The server is shutting down.
    Shutdown,
}

/// What the transport should do after a [`Follower::step`].
#[derive(Debug, Default)]
pub struct Step {
    /// Messages to send, in order.
    pub messages: Vec<LiveMessage>,
    /// A heartbeat period began: a WebSocket transport sends a ping now, and the client's
    /// answer (or any message) is what lets the next period renew the heartbeat.
    pub ping: bool,
    /// The client's liveness was used up by a heartbeat renewal; the transport must see a
    /// new sign of life before the next one counts.
    pub liveness_used: bool,
}

/// The live state of one connection following one place. Transport-neutral: the
/// WebSocket and SSE handlers loop on [`wait`](Follower::wait) and [`step`](Follower::step).
pub struct Follower {
    store: Arc<dyn Store>,
    /// This node's copy of the settings (re-read within a second whatever the notices
    /// say): the periodic refresh compares it with what was told.
    catalog: Arc<EventCatalog>,
    clock: Clock,
    event_id: Arc<str>,
    key: PlaceKey,
    sub: Subscription,
    shutdown: Stop,
    /// The last state seen; heartbeats are renewed only while waiting.
    status: PlaceState,
    /// What the last `queue-update` said (position, queue length, status): unchanged ones are
    /// not pushed again before the refresh is due.
    last: Option<(Option<u64>, u64, ShownStatus)>,
    ready_sent: bool,
    /// The event state last told (or known at connect): paused, accepting joins.
    state: (bool, bool),
    /// When the announcement last told was posted (`None`: none).
    announced: Option<Millis>,
    done: bool,
    /// The client showed a sign of life since the last renewal (a WebSocket's answers;
    /// always, for an open SSE stream): a stream that ends so is renewed once at its end.
    alive: bool,
    heartbeat_every: Duration,
    next_heartbeat: Instant,
    /// How often the place is re-read without a notice ([`refresh_period`]).
    refresh_every: Duration,
    next_refresh: Instant,
    /// When the figures are next pushed even if unchanged ([`REFRESH`] after the last push).
    next_forced: Instant,
}

/// A stream that ends while its client was still there (it dropped, or went away)
/// renews the place once more, at its end: the open stream counted as a heartbeat until
/// then, and a renewal only every third of `waiting_idle_sec` would otherwise date the
/// place's last sign of life up to a third of it before the drop, and end it that much
/// sooner than the same client's last poll would have. Not at the stream's own end (the
/// place ended, the node stops), nor for a socket that stopped answering.
impl Drop for Follower {
    fn drop(&mut self) {
        if self.done || !self.alive || self.status != PlaceState::Waiting {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, event_id, key) = (self.store.clone(), self.event_id.clone(), self.key);
        let at = self.clock.now();
        // An ended place refuses it (`TOKEN_EXPIRED`): nothing is revived.
        runtime.spawn(async move {
            let _ = store.heartbeat(&event_id, key, at).await;
        });
    }
}

/// How often a follower renews its place's heartbeat: a third of the event's idle time,
/// so two renewals may be lost before the place lapses.
fn heartbeat_period(config: &EventConfig) -> Duration {
    let idle = Duration::from_secs(u64::from(config.waiting_idle_sec.max(1)));
    (idle / 3).clamp(HEARTBEAT_MIN, HEARTBEAT_MAX)
}

/// How often a follower re-reads its place without a notice: [`REFRESH`], or a third of
/// the event's ready window if that is shorter (at least [`REFRESH_MIN`]). Notices can be
/// lost (on Redis, a node killed between its change and its `PUBLISH`); a place admitted
/// unheard is then told at this refresh, with two thirds of its window to enter left,
/// rather than after a window of a few seconds had lapsed.
fn refresh_period(config: &EventConfig) -> Duration {
    let ready = Duration::from_secs(u64::from(config.ready_ttl_sec.max(1)));
    (ready / 3).clamp(REFRESH_MIN, REFRESH)
}

impl Follower {
    /// Starts following one place (its waiting token already checked by the caller):
    /// refuses ended places with the error `GET /queue/status` would answer, renews the
    /// heartbeat (the connection is a sign of life), and answers the first messages to send.
    /// `shutdown` closes the stream when it fires.
    pub async fn start(
        live: &Live,
        store: Arc<dyn Store>,
        catalog: Arc<EventCatalog>,
        clock: Clock,
        shutdown: Stop,
        event_id: &str,
        key: PlaceKey,
    ) -> Result<(Follower, Vec<LiveMessage>), StoreError> {
        // Subscribe first: an admission between the read below and a later subscription
        // would otherwise be missed.
        let sub = live.subscribe(event_id, key.seq);
        let now = clock.now();
        let snapshot = store.get_event(event_id, now).await?;
        let view = store.status(event_id, key, now).await?;
        let heartbeat_every = heartbeat_period(&snapshot.config);
        let refresh_every = refresh_period(&snapshot.config);
        let t = Instant::now();
        let mut f = Follower {
            store,
            catalog,
            clock,
            event_id: Arc::from(event_id),
            key,
            sub,
            shutdown,
            status: view.status,
            last: None,
            ready_sent: false,
            state: (snapshot.config.paused, snapshot.config.accept_joins),
            announced: snapshot.config.announcement.as_ref().map(|a| a.at),
            done: false,
            alive: true,
            heartbeat_every,
            next_heartbeat: t + heartbeat_every,
            refresh_every,
            next_refresh: t + refresh_every,
            next_forced: t + REFRESH,
        };
        // Whatever the signals said before this point is reflected in `view`.
        f.sub.place().mark_unchanged();
        f.sub.moved().mark_unchanged();
        f.sub.settings.mark_unchanged();
        let mut first = Vec::new();
        f.observe(&view, true, &mut first);
        if f.announced.is_some() {
            first.push(LiveMessage::announcement(&snapshot.config));
        }
        Ok((f, first))
    }

    /// Whether the client has shown a sign of life since the last renewal (a WebSocket
    /// transport's view; an SSE stream is alive while open).
    pub fn set_alive(&mut self, alive: bool) {
        self.alive = alive;
    }

    /// The place's event id.
    pub fn event_id(&self) -> &str {
        &self.event_id
    }

    /// How often the follower renews the heartbeat (and a WebSocket pings).
    pub fn heartbeat_every(&self) -> Duration {
        self.heartbeat_every
    }

    /// True once the place ended (its final message was handed out) or shutdown began:
    /// the transport closes the stream.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Waits until there is something to do. Cancel-safe, so transports can `select!` it
    /// against reading the client.
    pub async fn wait(&mut self) -> Wake {
        let deadline = self.next_heartbeat.min(self.next_refresh);
        let Subscription { place, moved, .. } = &mut self.sub;
        let place = place.as_mut().expect("present until drop");
        let moved = moved.as_mut().expect("present until drop");
        tokio::select! {
            biased;
            _ = stopped(&mut self.shutdown) => Wake::Shutdown,
            r = place.changed() => match r {
                Ok(()) => Wake::Place,
                // The hub dropped the entry: cannot happen while we hold a receiver, but
                // a shutdown is the only sane reading if it did.
                Err(_) => Wake::Shutdown,
            },
            r = moved.changed() => match r {
                Ok(()) => Wake::Moved,
                Err(_) => Wake::Shutdown,
            },
            _ = tokio::time::sleep_until(deadline) => Wake::Timer,
        }
    }

    /// Handles one wake-up. `alive`: the client showed a sign of life since the last
    /// heartbeat renewal (always true for SSE, where an open stream is the sign).
    pub async fn step(&mut self, wake: Wake, alive: bool) -> Step {
        let mut out = Step::default();
        if self.done {
            return out;
        }
        match wake {
            Wake::Shutdown => self.done = true,
            Wake::Place => {
                let signal = *self.sub.place().borrow_and_update();
                if signal.admitted || signal.ended.is_some() {
                    self.refresh(false, &mut out.messages).await;
                }
            }
            Wake::Moved => {
                self.sub.moved().mark_unchanged();
                let settings = self.sub.settings.has_changed().unwrap_or(false);
                if settings {
                    self.sub.settings.mark_unchanged();
                    self.event_state(&mut out.messages).await;
                }
                if !self.done {
                    self.refresh(settings, &mut out.messages).await;
                }
            }
            Wake::Timer => {
                let now = Instant::now();
                if now >= self.next_heartbeat {
                    self.next_heartbeat = now + self.heartbeat_every;
                    out.ping = true;
                    if alive && self.status == PlaceState::Waiting {
                        out.liveness_used = true;
                        let at = self.clock.now();
                        if let Err(e) = self.store.heartbeat(&self.event_id, self.key, at).await {
                            self.on_error(e, &mut out.messages).await;
                        }
                    }
                }
                if !self.done && now >= self.next_refresh {
                    // The figures are pushed unchanged only every REFRESH (the contract's
                    // "at least every 10 s"), however often a short ready window asks for
                    // the place to be re-read.
                    let force = now >= self.next_forced;
                    // Re-read at the next period even when nothing is pushed (a push, or
                    // an opening due sooner, moves it), and when the forced push is due if
                    // that comes first (a period that does not divide REFRESH would push
                    // the figures up to twice as far apart). Never sooner than
                    // REFRESH_MIN: after a failed read the forced push stays due.
                    let period = now + self.refresh_every;
                    self.next_refresh = if force {
                        period
                    } else {
                        period.min(self.next_forced.max(now + REFRESH_MIN))
                    };
                    self.refresh(force, &mut out.messages).await;
                    // Then, with the place's state just read (an admission whose notice
                    // was lost is seen first: a sale's end does not end an admitted
                    // place), the settings as this node knows them (re-read within a
                    // second, no store call per follower) against what was told: a change
                    // whose notice was lost (a new announcement, the end of the sale).
                    // Read from the store, as the notice would have, and tell what changed
                    // (the copy may also be the older one, for up to a second: then
                    // nothing).
                    let at = self.clock.now();
                    if !self.done {
                        if let Ok(config) = self.catalog.config(&self.event_id, at).await {
                            if self.untold(&config, at) {
                                self.event_state(&mut out.messages).await;
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Re-reads the place (renewing nothing) and pushes what changed; `force` pushes the
    /// figures even when unchanged (the periodic refresh).
    async fn refresh(&mut self, force: bool, out: &mut Vec<LiveMessage>) {
        let now = self.clock.now();
        match self.store.peek(&self.event_id, self.key, now).await {
            Ok(view) => {
                // Paused or resumed without this follower hearing of it (a notice lost to a
                // lagging hub): tell the state now, and the estimate it changed.
                let stale = view.status == PlaceState::Waiting && view.paused != self.state.0;
                if stale {
                    self.event_state(out).await;
                    if self.done {
                        return;
                    }
                }
                self.observe(&view, force || stale, out);
            }
            Err(e) => self.on_error(e, out).await,
        }
    }

    /// Reads the event's settings and pushes `event-state` when what a waiting page shows
    /// of them changed.
    async fn event_state(&mut self, out: &mut Vec<LiveMessage>) {
        match self.store.get_event(&self.event_id, self.clock.now()).await {
            Ok(s) => self.settings(&s.config, out),
            Err(e) => self.on_error(e, out).await,
        }
    }

    /// Whether `config` says something a waiting page shows that was not told.
    fn untold(&self, config: &EventConfig, now: Millis) -> bool {
        config.announcement.as_ref().map(|a| a.at) != self.announced
            || (config.paused, config.accept_joins) != self.state
            || (self.status == PlaceState::Waiting && config.sale_ended(now).is_some())
    }

    /// Pushes what changed in the settings since they were last told.
    fn settings(&mut self, config: &EventConfig, out: &mut Vec<LiveMessage>) {
        // A shorter idle time applies to the place at once, counted from its last
        // renewal, which the old period may have left too far back: renew at the next
        // wake-up, then at the new period.
        let every = heartbeat_period(config);
        if every < self.heartbeat_every {
            self.next_heartbeat = Instant::now();
        }
        self.heartbeat_every = every;
        let refresh = refresh_period(config);
        if refresh < self.refresh_every {
            self.next_refresh = self.next_refresh.min(Instant::now() + refresh);
        }
        self.refresh_every = refresh;
        let announced = config.announcement.as_ref().map(|a| a.at);
        if announced != self.announced {
            self.announced = announced;
            out.push(LiveMessage::announcement(config));
        }
        if let Some(end) = LiveMessage::sale_end(config, self.clock.now()) {
            // Waiting places end with the sale; a session may finish.
            if self.status == PlaceState::Waiting {
                out.push(end);
                self.done = true;
                return;
            }
        }
        let state = (config.paused, config.accept_joins);
        if state != self.state {
            self.state = state;
            out.push(LiveMessage::EventState {
                paused: state.0,
                accept_joins: state.1,
            });
        }
    }

    fn observe(&mut self, view: &PlaceView, force: bool, out: &mut Vec<LiveMessage>) {
        self.status = view.status;
        // The status shown too: under `random` the opening gives no position, and when it
        // admits nobody the figures stay as they were (defect: followers learnt of it up
        // to REFRESH late, while `status` said `waiting` at once).
        let figures = (view.position, view.queue_length, view.shown_status());
        if force || self.last != Some(figures) {
            // After the turn came, only the first update (on connect) is worth sending:
            // the figures of others no longer concern this place.
            if view.status == PlaceState::Waiting || self.last.is_none() {
                out.push(LiveMessage::update(view));
            }
            self.last = Some(figures);
            let now = Instant::now();
            self.next_refresh = now + self.refresh_every;
            self.next_forced = now + REFRESH;
        }
        // In the pre-queue, the opening changes the place (a position, then `waiting`)
        // even when nobody is admitted at it, which moves nobody: refresh then, not up
        // to REFRESH later. `opens_in_sec` is rounded up, so this lands within a second
        // after the opening.
        if let Some(n) = view
            .opens_in_sec
            .filter(|_| view.status == PlaceState::Waiting)
        {
            let at = Instant::now() + Duration::from_secs(n.max(1));
            self.next_refresh = self.next_refresh.min(at);
        }
        if view.status != PlaceState::Waiting && !self.ready_sent {
            self.ready_sent = true;
            if view.status == PlaceState::Admitted {
                out.push(LiveMessage::QueueReady {
                    enter_within_sec: view.enter_within_sec.unwrap_or(0),
                });
            }
        }
    }

    /// Pushes `ended` (and ends the stream) if the event's sale ended; answers whether.
    async fn sale_end(&mut self, out: &mut Vec<LiveMessage>) -> bool {
        let now = self.clock.now();
        let Ok(s) = self.store.get_event(&self.event_id, now).await else {
            return false;
        };
        match LiveMessage::sale_end(&s.config, now) {
            Some(m) => {
                out.push(m);
                self.done = true;
                true
            }
            None => false,
        }
    }

    /// A read failed: the place ended (its final message), or the store is unreachable
    /// (nothing to say; the next timer tries again).
    async fn on_error(&mut self, e: StoreError, out: &mut Vec<LiveMessage>) {
        let q = match e {
            StoreError::Unavailable(detail) => {
                tracing::debug!(%detail, "live follower cannot read its place; retrying later");
                return;
            }
            StoreError::Queue(q) => q,
        };
        let reason = match q {
            QueueError::TokenExpired => EndReason::Expired,
            // Deleted event: every place in it was removed by an operator.
            QueueError::EventNotFound => EndReason::Cleared,
            // Gone with the sale: say why, with the operator's message.
            QueueError::TokenNotFound
                if self.status == PlaceState::Waiting && self.sale_end(out).await =>
            {
                return
            }
            // Gone, but the store's answer cannot tell a place that left from one that was
            // cleared or completed; the notice can. It follows the change once that is
            // durable, so a read may see the end first: wait for it briefly.
            _ => {
                let place = self.sub.place();
                match tokio::time::timeout(END_NOTICE_WAIT, place.wait_for(|s| s.ended.is_some()))
                    .await
                {
                    Ok(Ok(s)) => s.ended.unwrap_or(EndReason::Left),
                    _ => EndReason::Left,
                }
            }
        };
        out.push(LiveMessage::ended(reason));
        self.done = true;
    }
}

#[cfg(test)]
mod tests;
