//! The scheduler: the background tick that ends lapsed places and paces rate-capped
//! admissions on time.
//!
//! Every store operation already ends the places whose deadline has passed before it
//! answers, so the tick is not what keeps answers right. It is what keeps them right *for
//! nobody in particular*: a ghost (a place whose heartbeat lapsed) stops counting in the
//! positions of everyone behind it, and its slot goes to the next person, even when no
//! request touches the event. Admissions paced by `admit_per_minute` also need a clock
//! that runs without requests.
//!
//! The loop follows mini-redis' `purge_expired_tasks`: do the work, then sleep until the
//! earliest deadline the store reported, a change of some event's settings (the store's
//! [`Notice::EventChanged`], from any node), or shutdown, whichever is first. The sleep is
//! capped at [`MAX_SLEEP`], so a deadline the store could not report (another node changed
//! the event, the wall clock jumped, a notice was lost) is still honoured within that time.
//!
//! It takes only what it uses: the store, the clock, the store's notices and a stop signal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::clock::Clock;
use crate::core::{Millis, QueueError};
use crate::store::{Notice, Store, StoreError};
use crate::tasks::{stopped, Stop};

/// Longest sleep between two passes, whatever the deadlines say.
pub const MAX_SLEEP: Duration = Duration::from_millis(250);
/// Shortest sleep between two passes, so that a deadline reported in the past (a slow pass,
/// a clock step) cannot turn the loop into a busy spin.
const MIN_SLEEP: Duration = Duration::from_millis(5);
/// First and largest pause after a failed pass (store unreachable). Doubling in between
/// keeps an outage from flooding the logs and the store with retries.
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The scheduler loop: ticks every event, then sleeps until the next deadline (at most
/// [`MAX_SLEEP`]), an event's change notice, or `stop`. Store errors are logged and retried
/// with backoff; they never end the loop.
///
/// `notices` should be subscribed before the caller changes anything it wants honoured at
/// once: what arrives while a pass runs waits in the receiver, so no change is missed.
pub async fn run(
    store: Arc<dyn Store>,
    clock: Clock,
    mut notices: broadcast::Receiver<Notice>,
    mut stop: Stop,
) {
    let mut backoff: Option<Duration> = None;
    // Once the store's channel is closed, only the timer wakes the loop.
    let mut listening = true;
    loop {
        let now = clock.now();
        let delay = match pass(store.as_ref(), now).await {
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

        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => return,
                _ = &mut sleep => break,
                r = notices.recv(), if listening => match r {
                    // New settings may mean new room, a new pace or new deadlines.
                    Ok(Notice::EventChanged { .. }) => break,
                    // Places come and go all the time; the store already acted on them.
                    Ok(_) => {}
                    // Missed notices may have held a change.
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => listening = false,
                },
            }
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

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use parking_lot::Mutex;
    use tokio::sync::watch;
    use tokio::task::JoinHandle;
    use tokio::time::Instant;

    use super::*;
    use crate::core::{EventConfig, EventPatch, HeadEntry, PlaceKey, PlaceView};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{EventSnapshot, JoinRequest, StoreResult};
    use crate::tasks::{spawn_task, stop_channel};
    use crate::tokens::random_u128;

    /// What the fake store answers to `tick`.
    #[derive(Clone, Copy)]
    enum Plan {
        /// The next deadline is this many ms after `now`.
        In(Millis),
        Never,
        Fail,
    }

    /// A store with one event whose `tick` follows a plan and records when it was called
    /// (in tokio time, which the tests pause). Nothing else is ever called; its notices are
    /// sent by hand.
    struct FakeStore {
        plan: Mutex<Plan>,
        ticks: Mutex<Vec<Instant>>,
        notices: broadcast::Sender<Notice>,
    }

    impl FakeStore {
        fn new(plan: Plan) -> Arc<Self> {
            Arc::new(FakeStore {
                plan: Mutex::new(plan),
                ticks: Mutex::new(Vec::new()),
                notices: broadcast::channel(16).0,
            })
        }

        /// Gaps between consecutive ticks, in ms.
        fn gaps(&self) -> Vec<u64> {
            let t = self.ticks.lock();
            t.windows(2)
                .map(|w| (w[1] - w[0]).as_millis() as u64)
                .collect()
        }
    }

    #[async_trait]
    impl Store for FakeStore {
        async fn tick(&self, _: &str, now: Millis) -> StoreResult<Option<Millis>> {
            self.ticks.lock().push(Instant::now());
            match *self.plan.lock() {
                Plan::In(ms) => Ok(Some(now + ms)),
                Plan::Never => Ok(None),
                Plan::Fail => Err(StoreError::Unavailable("down".into())),
            }
        }
        async fn event_ids(&self) -> StoreResult<Vec<String>> {
            Ok(vec!["e".into()])
        }
        async fn put_event(&self, _: &str, _: &EventPatch, _: Millis) -> StoreResult<EventConfig> {
            unreachable!()
        }
        async fn update_event(
            &self,
            _: &str,
            _: &EventPatch,
            _: Millis,
        ) -> StoreResult<EventConfig> {
            unreachable!()
        }
        async fn get_event(&self, _: &str, _: Millis) -> StoreResult<EventSnapshot> {
            unreachable!()
        }
        async fn list_events(&self, _: Millis) -> StoreResult<Vec<EventSnapshot>> {
            unreachable!()
        }
        async fn delete_event(&self, _: &str) -> StoreResult<()> {
            unreachable!()
        }
        async fn clear(&self, _: &str, _: Millis) -> StoreResult<u64> {
            unreachable!()
        }
        async fn queue_head(&self, _: &str, _: usize, _: Millis) -> StoreResult<Vec<HeadEntry>> {
            unreachable!()
        }
        async fn join(&self, _: &str, _: &JoinRequest, _: Millis) -> StoreResult<PlaceView> {
            unreachable!()
        }
        async fn status(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<PlaceView> {
            unreachable!()
        }
        async fn heartbeat(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<()> {
            unreachable!()
        }
        async fn peek(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<PlaceView> {
            unreachable!()
        }
        async fn enter(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<PlaceView> {
            unreachable!()
        }
        async fn leave(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<bool> {
            unreachable!()
        }
        async fn session_heartbeat(
            &self,
            _: &str,
            _: PlaceKey,
            _: Millis,
        ) -> StoreResult<PlaceView> {
            unreachable!()
        }
        async fn session(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<PlaceView> {
            unreachable!()
        }
        async fn complete(&self, _: &str, _: PlaceKey, _: Millis) -> StoreResult<()> {
            unreachable!()
        }
        async fn ping(&self) -> StoreResult<()> {
            Ok(())
        }
        fn subscribe(&self) -> broadcast::Receiver<Notice> {
            self.notices.subscribe()
        }
    }

    /// Starts the scheduler over `store` on a manual clock; answers its stop sender.
    fn start(store: Arc<FakeStore>) -> (watch::Sender<bool>, JoinHandle<()>) {
        let (tx, rx) = stop_channel();
        let notices = store.subscribe();
        let h = spawn_task(
            "scheduler",
            run(store, Clock::manual(1_000_000), notices, rx),
        );
        (tx, h)
    }

    /// Starts the scheduler over a real store.
    fn start_on(store: &Arc<dyn Store>, clock: &Clock) -> watch::Sender<bool> {
        let (tx, rx) = stop_channel();
        let notices = store.subscribe();
        spawn_task("scheduler", run(store.clone(), clock.clone(), notices, rx));
        tx
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_until_the_next_deadline() {
        let store = FakeStore::new(Plan::In(100));
        let (_tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        let gaps = store.gaps();
        assert_eq!(gaps.len(), 10, "{gaps:?}");
        assert!(gaps.iter().all(|&g| g == 100), "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn passes_at_least_every_250ms() {
        for plan in [Plan::Never, Plan::In(60_000)] {
            let store = FakeStore::new(plan);
            let (_tx, _h) = start(store.clone());
            tokio::time::sleep(Duration::from_millis(1_010)).await;
            assert_eq!(store.gaps(), vec![250; 4]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_past_deadline_does_not_spin() {
        let store = FakeStore::new(Plan::In(0));
        let (_tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(store.gaps().iter().all(|&g| g >= 5), "{:?}", store.gaps());
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_notice_runs_a_pass_at_once() {
        let store = FakeStore::new(Plan::Never);
        let (_tx, _h) = start(store.clone());
        let changed = || Notice::EventChanged {
            event_id: Arc::from("e"),
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.notices.send(changed()).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Moves do not wake it: the store already acted on them.
        store
            .notices
            .send(Notice::Moved {
                event_id: Arc::from("e"),
            })
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        store.notices.send(changed()).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(store.gaps(), vec![50, 20]);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_then_recover() {
        let store = FakeStore::new(Plan::Fail);
        let (_tx, h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(18_000)).await;
        assert_eq!(store.gaps(), vec![250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert!(!h.is_finished(), "errors never end the loop");
        *store.plan.lock() = Plan::Never;
        store.ticks.lock().clear();
        tokio::time::sleep(Duration::from_millis(5_000 + 600)).await;
        let gaps = store.gaps();
        assert_eq!(&gaps[gaps.len() - 2..], &[250, 250], "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn stops_on_the_signal_or_when_the_sender_is_gone() {
        let store = FakeStore::new(Plan::Never);
        let (tx, h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_millis(10), h)
            .await
            .expect("stopped at once")
            .unwrap();

        let (tx, h) = start(store);
        drop(tx);
        tokio::time::timeout(Duration::from_millis(10), h)
            .await
            .expect("stopped at once")
            .unwrap();
    }

    /// The expiration counter of one event, from the Prometheus text (observing it does
    /// not touch the store, so it cannot itself end anything).
    fn expirations(event: &str) -> u64 {
        let needle = format!("waitroom_expirations_total{{event=\"{event}\"}} ");
        crate::telemetry::prometheus()
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&needle))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    /// A store with event `id` (one slot, 1 s heartbeat) holding an admitted place and a
    /// waiting one.
    async fn two_places(store: &Arc<dyn Store>, now: Millis, id: &str) {
        let patch = EventPatch {
            max_active: Some(1),
            waiting_idle_sec: Some(1),
            ready_ttl_sec: Some(60),
            ..EventPatch::default()
        };
        store.put_event(id, &patch, now).await.unwrap();
        for u in ["first", "second"] {
            let req = JoinRequest {
                user_id: Some(u.into()),
                metadata: None,
                nonce: random_u128(),
            };
            store.join(id, &req, now).await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ghosts_are_swept_on_paused_time() {
        let clock = Clock::manual(1_000_000);
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        two_places(&store, clock.now(), "sched-paused").await;
        let _tx = start_on(&store, &clock);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(expirations("sched-paused"), 0);
        clock.advance(1_000);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(expirations("sched-paused"), 1, "swept with nobody polling");
    }

    /// Wall clock and real time: the waiting place of a person who went away disappears
    /// about `waiting_idle_sec` after their last heartbeat, with nobody polling.
    #[tokio::test]
    async fn ghosts_disappear_without_anyone_polling() {
        let clock = Clock::system();
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        two_places(&store, clock.now(), "sched-real").await;
        let joined = std::time::Instant::now();
        let _tx = start_on(&store, &clock);
        while expirations("sched-real") == 0 {
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
        let ev = store.get_event("sched-real", clock.now()).await;
        let f = ev.unwrap().figures;
        assert_eq!((f.waiting, f.admitted, f.expired), (0, 1, 1));
    }
}
