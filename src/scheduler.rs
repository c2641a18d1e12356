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
    let mut known = Vec::new();
    let mut failing = Failing::default();
    // Once the store's channel is closed, only the timer wakes the loop.
    let mut listening = true;
    loop {
        let now = clock.now();
        let was_failing = failing.any();
        let pass = pass(store.as_ref(), now, &mut known, &mut failing).await;
        if let Some(e) = &pass.failure {
            if !was_failing {
                tracing::warn!(error = %e, ticked = pass.ticked,
                    "tick failed; what failed is tried again with backoff, the rest goes on");
            } else {
                tracing::debug!(error = %e, "tick failed again");
            }
        } else if was_failing && !failing.any() {
            tracing::info!("store answers again; ticking resumed");
        }
        let mut delay = delay_until(pass.next, now);
        if let Some(at) = pass.retry_at {
            delay = delay.min(at.saturating_duration_since(tokio::time::Instant::now()));
        }

        let sleep = tokio::time::sleep(delay.max(MIN_SLEEP));
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
        // The next pass covers every change queued before it: a burst of admin changes
        // is one more pass, not one each (each reads every event).
        if listening {
            for _ in 0..notices.len() {
                if let Err(broadcast::error::TryRecvError::Closed) = notices.try_recv() {
                    listening = false;
                    break;
                }
            }
        }
    }
}

/// A call that failed, tried again only once its pause is over; the pause doubles at each
/// failure, from [`BACKOFF_START`] to [`BACKOFF_MAX`].
#[derive(Clone, Copy)]
struct Backoff {
    until: tokio::time::Instant,
    pause: Duration,
}

impl Backoff {
    fn after(previous: Option<Backoff>) -> Backoff {
        let pause = previous.map_or(BACKOFF_START, |b| (b.pause * 2).min(BACKOFF_MAX));
        Backoff {
            until: tokio::time::Instant::now() + pause,
            pause,
        }
    }
}

/// What failed lately: the list of events, and events whose tick failed. Each is paused on
/// its own, so that one that fails (on a Redis Cluster, the shard holding the list, or an
/// event's own shard, down) neither stops the others nor is asked on every pass, where
/// each try may wait out the store's timeout.
#[derive(Default)]
struct Failing {
    ids: Option<Backoff>,
    events: std::collections::HashMap<String, Backoff>,
}

impl Failing {
    fn any(&self) -> bool {
        self.ids.is_some() || !self.events.is_empty()
    }
}

/// What one pass did.
struct Pass {
    /// The earliest next deadline the ticked events reported.
    next: Option<Millis>,
    /// Events whose tick answered.
    ticked: usize,
    /// The first error, after every event was tried.
    failure: Option<StoreError>,
    /// When the first paused call is due again.
    retry_at: Option<tokio::time::Instant>,
}

/// One pass over every event. An event whose tick fails does not stop the others; nor
/// does a failure to list them (on a Redis Cluster the list lives on one shard, the
/// events on all): then the events `known` from the last listing are ticked.
async fn pass(
    store: &dyn Store,
    now: Millis,
    known: &mut Vec<String>,
    failing: &mut Failing,
) -> Pass {
    let mut p = Pass {
        next: None,
        ticked: 0,
        failure: None,
        retry_at: None,
    };
    let started = tokio::time::Instant::now();
    let due = |b: Option<&Backoff>| b.is_none_or(|b| b.until <= started);
    if due(failing.ids.as_ref()) {
        match store.event_ids().await {
            Ok(ids) => {
                *known = ids;
                failing.ids = None;
                failing.events.retain(|id, _| known.contains(id));
            }
            Err(e) => {
                failing.ids = Some(Backoff::after(failing.ids));
                p.failure = Some(e);
            }
        }
    }
    let mut retry = failing.ids.map(|b| b.until);
    for id in known.iter() {
        let paused = failing.events.get(id).copied();
        if let Some(b) = paused.filter(|b| b.until > started) {
            retry = Some(retry.map_or(b.until, |r| r.min(b.until)));
            continue;
        }
        match store.tick(id, now).await {
            Ok(t) => {
                p.ticked += 1;
                failing.events.remove(id);
                if let Some(t) = t {
                    p.next = Some(p.next.map_or(t, |n| n.min(t)));
                }
            }
            // Deleted between listing and ticking: nothing to do.
            Err(StoreError::Queue(QueueError::EventNotFound)) => {
                failing.events.remove(id);
            }
            Err(e) => {
                tracing::debug!(event = %id, error = %e, "tick of one event failed");
                let b = Backoff::after(paused);
                retry = Some(retry.map_or(b.until, |r| r.min(b.until)));
                failing.events.insert(id.clone(), b);
                p.failure.get_or_insert(e);
            }
        }
    }
    p.retry_at = retry;
    p
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
    use tokio::sync::watch;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::core::config::MIN_WAITING_IDLE_SEC;
    use crate::core::EventPatch;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::fault::{Fault, FaultStore, Op};
    use crate::store::JoinRequest;
    use crate::tasks::{spawn_task, stop_channel};
    use crate::tokens::random_u128;

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
        let idle_sec = due_in.div_ceil(1000).max(MIN_WAITING_IDLE_SEC);
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
    fn start(store: Arc<FaultStore>) -> (watch::Sender<bool>, JoinHandle<()>) {
        let (tx, rx) = stop_channel();
        let notices = store.subscribe();
        let h = spawn_task("scheduler", run(store, Clock::manual(T), notices, rx));
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
        let store = store_due_in(Some(100)).await;
        let (_tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        let gaps = gaps(&store);
        assert_eq!(gaps.len(), 10, "{gaps:?}");
        assert!(gaps.iter().all(|&g| g == 100), "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn passes_at_least_every_250ms() {
        for due_in in [None, Some(60_000)] {
            let store = store_due_in(due_in).await;
            let (_tx, _h) = start(store.clone());
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
        let (_tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(gaps(&store).iter().all(|&g| g >= 5), "{:?}", gaps(&store));
    }

    /// A change of settings (on any node: it is a store notice) runs a pass at once; a mere
    /// move of the queue does not, since the store already acted on it.
    #[tokio::test(start_paused = true)]
    async fn a_change_notice_runs_a_pass_at_once() {
        let store = store_due_in(None).await;
        let (_tx, _h) = start(store.clone());
        let pause = |paused| EventPatch {
            paused: Some(paused),
            ..EventPatch::default()
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        store
            .inner()
            .update_event("e", &pause(true), T)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A join into the paused event: a `Moved` notice only.
        let req = JoinRequest {
            nonce: random_u128(),
            ..JoinRequest::default()
        };
        store.inner().join("e", &req, T).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        store
            .inner()
            .update_event("e", &pause(true), T)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(gaps(&store), vec![50, 20]);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_then_recover() {
        let store = store_due_in(None).await;
        store.inject(Op::Tick, Fault::Unavailable("down".into()));
        let (_tx, h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(18_000)).await;
        assert_eq!(gaps(&store), vec![250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert!(!h.is_finished(), "errors never end the loop");
        store.heal(Op::Tick);
        store.forget_calls();
        tokio::time::sleep(Duration::from_millis(5_000 + 600)).await;
        let gaps = gaps(&store);
        assert_eq!(&gaps[gaps.len() - 2..], &[250, 250], "{gaps:?}");
    }

    /// The list of events unreadable (the shard holding it down) while the events answer:
    /// they are ticked from the last list, at their own pace, not after a backoff; the list
    /// itself is asked again only with backoff (each try may wait out a timeout).
    #[tokio::test(start_paused = true)]
    async fn events_tick_on_while_their_list_cannot_be_read() {
        let store = store_due_in(None).await;
        let (_tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(600)).await;
        store.inject(Op::EventIds, Fault::Unavailable("down".into()));
        store.forget_calls();
        tokio::time::sleep(Duration::from_millis(3_100)).await;
        assert_eq!(gaps(&store), vec![250; 11], "ticks went on");
        let asked = store.calls(Op::EventIds);
        assert!(
            (3..=5).contains(&asked),
            "the list was asked {asked} times in 3 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stops_on_the_signal_or_when_the_sender_is_gone() {
        let store = store_due_in(None).await;
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

    /// A store with event `id` (one slot, 3 s heartbeat: the least) holding an admitted
    /// place and a waiting one.
    async fn two_places(store: &Arc<dyn Store>, now: Millis, id: &str) {
        let patch = EventPatch {
            max_active: Some(1),
            waiting_idle_sec: Some(MIN_WAITING_IDLE_SEC),
            ready_ttl_sec: Some(60),
            ..EventPatch::default()
        };
        store.put_event(id, &patch, now).await.unwrap();
        for u in ["first", "second"] {
            let req = JoinRequest {
                user_id: Some(u.into()),
                metadata: None,
                nonce: random_u128(),
                ..JoinRequest::default()
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
        clock.advance(3_000);
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
                joined.elapsed() < Duration::from_secs(6),
                "the ghost was not swept"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let took = joined.elapsed();
        assert!(
            took >= Duration::from_millis(2_990),
            "swept early: {took:?}"
        );
        // Due at 3 s, swept within one pass (≤ 250 ms) of it; the rest is slack for a
        // loaded 2-core CI machine.
        assert!(took < Duration::from_millis(4_500), "swept late: {took:?}");
        let ev = store.get_event("sched-real", clock.now()).await;
        let f = ev.unwrap().figures;
        assert_eq!((f.waiting, f.admitted, f.expired), (0, 1, 1));
    }
}
