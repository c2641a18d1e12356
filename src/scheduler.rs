//! Background work: the tick that ends lapsed places and paces rate-capped admissions on
//! time, and the simulated crowd of the demo event.
//!
//! Every store operation already ends the places whose deadline has passed before it
//! answers, so the tick is not what keeps answers right. It is what keeps them right *for
//! nobody in particular*: a ghost (a place whose heartbeat lapsed) stops counting in the
//! positions of everyone behind it, and its slot goes to the next person, even when no
//! request touches the event. Admissions paced by `admit_per_minute` also need a clock
//! that runs without requests.
//!
//! The loop follows mini-redis' `purge_expired_tasks`: do the work, then sleep until the
//! earliest deadline the store reported, an explicit wake-up ([`AppState::wake`], rung when
//! an event is created or changed), or shutdown, whichever is first. The sleep is capped at
//! [`MAX_SLEEP`], so a deadline the store could not report (another node changed the event,
//! the wall clock jumped) is still honoured within that time.
//!
//! Tasks are started with [`spawn_task`], which gives each a name and a tracing span, and
//! stopped through a [`Stop`] receiver.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::app::AppState;
use crate::core::{EventPatch, Millis, PlaceKey, PlaceState, QueueError};
use crate::store::{JoinRequest, Store, StoreError};
use crate::tokens::random_u128;

/// Longest sleep between two passes, whatever the deadlines say.
pub const MAX_SLEEP: Duration = Duration::from_millis(250);
/// Shortest sleep between two passes, so that a deadline reported in the past (a slow pass,
/// a clock step) cannot turn the loop into a busy spin.
const MIN_SLEEP: Duration = Duration::from_millis(5);
/// First and largest pause after a failed pass (store unreachable). Doubling in between
/// keeps an outage from flooding the logs and the store with retries.
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Tells background tasks to stop: they end when it turns `true`, or when its sender is
/// dropped (so a forgotten sender cannot leave tasks running).
pub type Stop = watch::Receiver<bool>;

/// A fresh stop signal: send `true` (or drop the sender) to stop every task holding a receiver.
pub fn stop_channel() -> (watch::Sender<bool>, Stop) {
    watch::channel(false)
}

/// Resolves once stop was asked.
pub async fn stopped(stop: &mut Stop) {
    // An error means the sender is gone, which also means stop.
    let _ = stop.wait_for(|s| *s).await;
}

/// Spawns a background task under a tracing span named after it, so that its log lines say
/// which task wrote them, and logs its end.
pub fn spawn_task<F>(name: &'static str, task: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let span = tracing::info_span!("task", name);
    tokio::spawn(
        async move {
            tracing::debug!("started");
            task.await;
            tracing::debug!("stopped");
        }
        .instrument(span),
    )
}

/// The scheduler loop: ticks every event, sleeps until the next deadline (at most
/// [`MAX_SLEEP`]), a wake-up, or `stop`. Store errors are logged and retried with backoff;
/// they never end the loop.
pub async fn run(state: AppState, mut stop: Stop) {
    let mut backoff: Option<Duration> = None;
    loop {
        // Registered before the pass, so that a wake-up rung during the pass is not lost
        // (`Notify::notify_waiters` only reaches futures that already wait).
        let wake = state.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();

        let now = state.clock.now();
        let delay = match pass(state.store.as_ref(), now).await {
            Ok(next) => {
                if backoff.take().is_some() {
                    tracing::info!("store answers again; ticking resumed");
                }
                delay_until(next, now)
            }
            Err(e) => {
                let b = backoff.map_or(BACKOFF_START, |b| (b * 2).min(BACKOFF_MAX));
                backoff = Some(b);
                tracing::warn!(error = %e, retry_in_ms = b.as_millis() as u64, "tick failed");
                b
            }
        };

        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            _ = &mut wake => {}
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One pass over every event; answers the earliest next deadline. An event whose tick fails
/// does not stop the others; the first error is answered after all were tried.
async fn pass(store: &dyn Store, now: Millis) -> Result<Option<Millis>, StoreError> {
    let mut next: Option<Millis> = None;
    let mut failure = None;
    for id in store.event_ids().await? {
        match store.tick(&id, now).await {
            Ok(Some(t)) => next = Some(next.map_or(t, |n| n.min(t))),
            Ok(None) => {}
            // Deleted between listing and ticking: nothing to do.
            Err(StoreError::Queue(QueueError::EventNotFound)) => {}
            Err(e) => {
                tracing::debug!(event = %id, error = %e, "tick of one event failed");
                failure.get_or_insert(e);
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(next),
    }
}

/// How long to sleep for a next deadline `next` seen at `now`.
fn delay_until(next: Option<Millis>, now: Millis) -> Duration {
    match next {
        Some(t) => Duration::from_millis(t.saturating_sub(now)).clamp(MIN_SLEEP, MAX_SLEEP),
        None => MAX_SLEEP,
    }
}

// ---------------------------------------------------------------------------------------
// The demo event and its simulated crowd.
//
// A newcomer who runs `cargo run --release` and opens the demo page should see a queue that
// moves, not an empty one that admits them at once. So the server creates a small event
// (three active sessions at most) and keeps a crowd of bots in it. Each bot behaves like a
// patient person: joins as `demo-bot-N`, keeps its place alive (a status call per step,
// which is a heartbeat), and when admitted, enters after a short pause, "books" for a few
// seconds and completes. The crowd is topped up by at most two joins per step, to a size
// that drifts between 10 and 20. Bots use the store directly rather than HTTP, so the
// driver needs no address and no admin token, and their traffic does not skew the HTTP
// metrics.
// ---------------------------------------------------------------------------------------

/// Id of the demo event.
pub const DEMO_EVENT: &str = "demo";
/// Time between two steps of the crowd.
const DEMO_STEP: Duration = Duration::from_secs(1);
/// Crowd size bounds; the target is redrawn within them every [`DEMO_REDRAW_STEPS`] steps.
const DEMO_CROWD_MIN: u64 = 10;
const DEMO_CROWD_MAX: u64 = 20;
const DEMO_REDRAW_STEPS: u64 = 20;
/// New bots per step at most, so the queue grows in a trickle rather than jumps.
const DEMO_JOINS_PER_STEP: u64 = 2;
/// How long a bot waits before entering once admitted, and how long it "books" once
/// active, in milliseconds (drawn uniformly). Together about 3 to 9 s per slot, so with
/// three slots a newcomer behind a dozen bots waits well under a minute.
const DEMO_THINK_MS: (Millis, Millis) = (1_000, 3_000);
const DEMO_BOOK_MS: (Millis, Millis) = (2_000, 6_000);

/// Settings of the demo event. Its booking page (`/demo/booking`) is served by the server.
pub fn demo_event_patch() -> EventPatch {
    EventPatch {
        name: Some("Demo concert".into()),
        max_active: Some(3),
        overbooking_ratio: Some(1.0),
        admit_per_minute: Some(None),
        ready_ttl_sec: Some(30),
        session_idle_sec: Some(60),
        session_max_sec: Some(120),
        waiting_idle_sec: Some(60),
        target_url: Some(Some("/demo/booking".into())),
        ..EventPatch::default()
    }
}

/// Creates the demo event unless it exists (an operator may have changed it, and a
/// durable store keeps it across restarts: their settings win).
pub async fn ensure_demo_event(state: &AppState) -> Result<(), StoreError> {
    let now = state.clock.now();
    match state.store.get_event(DEMO_EVENT, now).await {
        Ok(_) => Ok(()),
        Err(StoreError::Queue(QueueError::EventNotFound)) => {
            state
                .store
                .put_event(DEMO_EVENT, &demo_event_patch(), now)
                .await?;
            state.wake.notify_one();
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// One simulated person.
struct Bot {
    user_id: String,
    key: PlaceKey,
    /// The state it was in at the last step, and since when (by the state clock).
    state: PlaceState,
    since: Millis,
    /// How long it stays in its current state before acting (entering or completing).
    linger: Millis,
}

/// A uniform draw in `[lo, hi]`.
fn draw((lo, hi): (Millis, Millis)) -> Millis {
    lo + (random_u128() % u128::from(hi - lo + 1)) as Millis
}

/// Drives the crowd of the demo event until `stop`.
pub async fn run_demo_crowd(state: AppState, mut stop: Stop) {
    let mut bots: Vec<Bot> = Vec::new();
    let mut next_bot: u64 = 1;
    let mut target = (DEMO_CROWD_MIN + DEMO_CROWD_MAX) / 2;
    let mut steps: u64 = 0;
    loop {
        if steps % DEMO_REDRAW_STEPS == 0 && steps > 0 {
            target = draw((DEMO_CROWD_MIN, DEMO_CROWD_MAX));
        }
        steps += 1;
        demo_step(&state, &mut bots, &mut next_bot, target).await;
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            _ = tokio::time::sleep(DEMO_STEP) => {}
        }
    }
}

/// Advances every bot by one step, then tops the crowd up towards `target`.
async fn demo_step(state: &AppState, bots: &mut Vec<Bot>, next_bot: &mut u64, target: u64) {
    let store = state.store.as_ref();
    let now = state.clock.now();
    let mut kept = Vec::with_capacity(bots.len());
    for mut bot in bots.drain(..) {
        match store.status(DEMO_EVENT, bot.key, now).await {
            Ok(view) => {
                if view.status != bot.state {
                    bot.state = view.status;
                    bot.since = now;
                    bot.linger = match view.status {
                        PlaceState::Waiting => 0,
                        PlaceState::Admitted => draw(DEMO_THINK_MS),
                        PlaceState::Active => draw(DEMO_BOOK_MS),
                    };
                }
                let due = now.saturating_sub(bot.since) >= bot.linger;
                match bot.state {
                    PlaceState::Admitted if due => {
                        if store.enter(DEMO_EVENT, bot.key, now).await.is_ok() {
                            bot.state = PlaceState::Active;
                            bot.since = now;
                            bot.linger = draw(DEMO_BOOK_MS);
                        }
                        kept.push(bot);
                    }
                    PlaceState::Active if due => {
                        // Done booking; its slot goes to the next in line at once.
                        if let Err(e) = store.complete(DEMO_EVENT, bot.key, now).await {
                            tracing::debug!(bot = %bot.user_id, error = %e, "demo bot could not complete");
                        }
                    }
                    _ => kept.push(bot),
                }
            }
            // The store is unreachable for now: keep the bot and try again next step.
            Err(StoreError::Unavailable(_)) => kept.push(bot),
            // Its place ended (cleared, expired) or the event was deleted: forget it.
            Err(_) => {}
        }
    }
    *bots = kept;

    let missing = target.saturating_sub(bots.len() as u64);
    for _ in 0..missing.min(DEMO_JOINS_PER_STEP) {
        let user_id = format!("demo-bot-{next_bot}");
        *next_bot += 1;
        let req = JoinRequest {
            user_id: Some(user_id.clone()),
            metadata: None,
            nonce: random_u128(),
        };
        match store.join(DEMO_EVENT, &req, now).await {
            Ok(view) => bots.push(Bot {
                user_id,
                key: view.key,
                state: view.status,
                since: now,
                linger: match view.status {
                    PlaceState::Waiting => 0,
                    PlaceState::Admitted => draw(DEMO_THINK_MS),
                    PlaceState::Active => draw(DEMO_BOOK_MS),
                },
            }),
            // Deleted, closed or full: an operator's choice; the crowd waits until it changes.
            Err(e) => {
                tracing::debug!(error = %e, "demo crowd cannot join");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use super::*;
    use crate::clock::Clock;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::fault::{Fault, FaultStore, Op};

    fn state(store: Arc<dyn Store>, clock: Clock) -> AppState {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        AppState::new(store, &key, "admin", clock).unwrap()
    }

    /// The manual clock of the loop tests. It never moves, so a deadline the store reports
    /// stays the same distance ahead on every pass.
    const T: Millis = 1_000_000;

    /// A store with one event, `e`, whose tick reports a next deadline `due_in` ms after
    /// [`T`] (`None`: no deadline at all). The event is paused, so its one place waits and
    /// its only deadline is the place's heartbeat, renewed by nobody: joined at
    /// `T + due_in - waiting_idle`.
    async fn store_due_in(due_in: Option<Millis>) -> Arc<FaultStore> {
        let store = Arc::new(FaultStore::embedded());
        let Some(due_in) = due_in else {
            store
                .put_event("e", &EventPatch::default(), T)
                .await
                .unwrap();
            return store;
        };
        let idle_sec = due_in.div_ceil(1000).max(1);
        let joined = T + due_in - idle_sec * 1000;
        let patch = EventPatch {
            paused: Some(true),
            waiting_idle_sec: Some(idle_sec),
            ..EventPatch::default()
        };
        store.put_event("e", &patch, joined).await.unwrap();
        let req = JoinRequest {
            nonce: random_u128(),
            ..JoinRequest::default()
        };
        store.join("e", &req, joined).await.unwrap();
        assert_eq!(store.tick("e", T).await.unwrap(), Some(T + due_in));
        store.forget_calls();
        store
    }

    /// Gaps between consecutive ticks, in ms.
    fn gaps(store: &FaultStore) -> Vec<u64> {
        store
            .call_times(Op::Tick)
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis() as u64)
            .collect()
    }

    /// Starts the scheduler over `store` on a manual clock; answers its stop sender.
    fn start(store: Arc<FaultStore>) -> (AppState, watch::Sender<bool>, JoinHandle<()>) {
        let st = state(store, Clock::manual(T));
        let (tx, rx) = stop_channel();
        let h = spawn_task("scheduler", run(st.clone(), rx));
        (st, tx, h)
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_until_the_next_deadline() {
        let store = store_due_in(Some(100)).await;
        let (_st, _tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        let gaps = gaps(&store);
        assert_eq!(gaps.len(), 10, "{gaps:?}");
        assert!(gaps.iter().all(|&g| g == 100), "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn passes_at_least_every_250ms() {
        for due_in in [None, Some(60_000)] {
            let store = store_due_in(due_in).await;
            let (_st, _tx, _h) = start(store.clone());
            tokio::time::sleep(Duration::from_millis(1_010)).await;
            assert_eq!(gaps(&store), vec![250; 4]);
        }
    }

    /// A deadline due at once (here the next admission of a fast rate cap whose burst is
    /// spent, 1 ms ahead on a clock that does not move) must not turn the loop into a spin.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_due_at_once_does_not_spin() {
        let store = Arc::new(FaultStore::embedded());
        let patch = EventPatch {
            max_active: Some(10_000),
            // One admission per ms, in bursts of 1000.
            admit_per_minute: Some(Some(60_000)),
            ..EventPatch::default()
        };
        store.put_event("e", &patch, T).await.unwrap();
        for _ in 0..1001 {
            let req = JoinRequest {
                nonce: random_u128(),
                ..JoinRequest::default()
            };
            store.join("e", &req, T).await.unwrap();
        }
        assert_eq!(store.tick("e", T).await.unwrap(), Some(T + 1));
        store.forget_calls();
        let (_st, _tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(gaps(&store).iter().all(|&g| g >= 5), "{:?}", gaps(&store));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_runs_a_pass_at_once() {
        let store = store_due_in(None).await;
        let (st, _tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        st.wake.notify_waiters();
        tokio::time::sleep(Duration::from_millis(10)).await;
        st.wake.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(gaps(&store), vec![50, 10]);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_then_recover() {
        let store = store_due_in(None).await;
        store.inject(Op::Tick, Fault::Unavailable("down".into()));
        let (_st, _tx, h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(18_000)).await;
        assert_eq!(gaps(&store), vec![250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert!(!h.is_finished(), "errors never end the loop");
        store.heal(Op::Tick);
        store.forget_calls();
        tokio::time::sleep(Duration::from_millis(5_000 + 600)).await;
        let gaps = gaps(&store);
        assert_eq!(&gaps[gaps.len() - 2..], &[250, 250], "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn stops_on_the_signal_or_when_the_sender_is_gone() {
        let store = store_due_in(None).await;
        let (_st, tx, h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_millis(10), h)
            .await
            .expect("stopped at once")
            .unwrap();

        let (_st, tx, h) = start(store);
        drop(tx);
        tokio::time::timeout(Duration::from_millis(10), h)
            .await
            .expect("stopped at once")
            .unwrap();
    }

    /// The expiration counter of one event, from the Prometheus text (observing it does
    /// not touch the store, so it cannot itself end anything).
    fn expirations(st: &AppState, event: &str) -> u64 {
        let needle = format!("waitroom_expirations_total{{event=\"{event}\"}} ");
        st.metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&needle))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    /// A store with event `id` (one slot, 1 s heartbeat) holding an admitted place and a
    /// waiting one.
    async fn two_places(st: &AppState, id: &str) {
        let patch = EventPatch {
            max_active: Some(1),
            waiting_idle_sec: Some(1),
            ready_ttl_sec: Some(60),
            ..EventPatch::default()
        };
        let now = st.clock.now();
        st.store.put_event(id, &patch, now).await.unwrap();
        for u in ["first", "second"] {
            let req = JoinRequest {
                user_id: Some(u.into()),
                metadata: None,
                nonce: random_u128(),
            };
            st.store.join(id, &req, now).await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ghosts_are_swept_on_paused_time() {
        let clock = Clock::manual(1_000_000);
        let st = state(Arc::new(EmbeddedStore::new()), clock.clone());
        two_places(&st, "sched-paused").await;
        let (_tx, rx) = stop_channel();
        let _h = spawn_task("scheduler", run(st.clone(), rx));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(expirations(&st, "sched-paused"), 0);
        clock.advance(1_000);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            expirations(&st, "sched-paused"),
            1,
            "swept with nobody polling"
        );
    }

    /// Wall clock and real time: the waiting place of a person who went away disappears
    /// about `waiting_idle_sec` after their last heartbeat, with nobody polling.
    #[tokio::test]
    async fn ghosts_disappear_without_anyone_polling() {
        let st = state(Arc::new(EmbeddedStore::new()), Clock::system());
        two_places(&st, "sched-real").await;
        let joined = std::time::Instant::now();
        let (_tx, rx) = stop_channel();
        let _h = spawn_task("scheduler", run(st.clone(), rx));
        while expirations(&st, "sched-real") == 0 {
            assert!(
                joined.elapsed() < Duration::from_secs(4),
                "the ghost was not swept"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let took = joined.elapsed();
        assert!(took >= Duration::from_millis(990), "swept early: {took:?}");
        // Due at 1 s, swept within one pass (≤ 250 ms) of it; the rest is slack for a
        // loaded 2-core CI machine.
        assert!(took < Duration::from_millis(2_500), "swept late: {took:?}");
        let ev = st.store.get_event("sched-real", st.clock.now()).await;
        let f = ev.unwrap().figures;
        assert_eq!((f.waiting, f.admitted, f.expired), (0, 1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_demo_crowd_keeps_the_queue_moving() {
        let clock = Clock::manual(1_000_000);
        let st = state(Arc::new(EmbeddedStore::new()), clock.clone());
        ensure_demo_event(&st).await.unwrap();
        // A second call keeps what is there.
        ensure_demo_event(&st).await.unwrap();
        let (_tx, rx) = stop_channel();
        let _h = spawn_task("demo-crowd", run_demo_crowd(st.clone(), rx));
        let mut seen = VecDeque::new();
        for _ in 0..60 {
            clock.advance(1_000);
            tokio::time::sleep(DEMO_STEP).await;
            let f = st.store.get_event(DEMO_EVENT, clock.now()).await.unwrap();
            let f = f.figures;
            assert!(f.admitted + f.active <= 3);
            seen.push_back(f);
        }
        let last = seen.back().unwrap();
        let crowd = last.waiting + last.admitted + last.active;
        assert!((5..=DEMO_CROWD_MAX).contains(&crowd), "crowd of {crowd}");
        assert!(last.waiting >= 3, "people wait: {last:?}");
        assert!(last.completed >= 10, "bots get through: {last:?}");
        assert_eq!(last.expired, 0, "bots keep their places alive");
        let snap = st.store.get_event(DEMO_EVENT, clock.now()).await.unwrap();
        assert_eq!(snap.config.name, "Demo concert");
        assert_eq!(snap.config.target_url.as_deref(), Some("/demo/booking"));
    }
}
