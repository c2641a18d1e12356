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
//! Each event has its own schedule, after mini-redis' `purge_expired_tasks` (do the work,
//! then wake at the earliest deadline the store reported): an event is ticked at the next
//! deadline its last tick reported (never sooner than [`MIN_SLEEP`] after that tick began),
//! at once when a change of its settings is noticed (the store's [`Notice::EventChanged`],
//! from any node), and in any case [`MAX_SLEEP`] after its last tick, so that a deadline the
//! store could not report (another node changed the event, the wall clock jumped, a notice
//! was lost) is still honoured within that time. The list of events is read every
//! [`MAX_SLEEP`] too.
//!
//! Ticks run concurrently, one at a time per event. On Redis each tick is one script round
//! trip: when a pass ticked every event one after another, a node holding 5,000 events took
//! over a second per pass, and an event's due admission, or the next batch of an ended sale,
//! waited for the whole pass. Here a reported deadline waits for no other event's tick, and
//! the ticks that merely look again every [`MAX_SLEEP`] (the *refreshes*, which on Redis
//! also renew the event's lease) go out several at once on the node's pipelined
//! connection. Each kind has its own bound of ticks in flight, so neither holds up the
//! other: thousands of refreshes never delay a due deadline, and events whose deadlines
//! come every few milliseconds never stop the others' refreshes. Where the refreshes cannot
//! all be made every [`MAX_SLEEP`] (on Redis, some thousands of events per node), the events
//! are refreshed in turn, the longest-waiting first, as fast as their bound allows; their
//! reported deadlines still come on time.
//!
//! It takes only what it uses: the store, the clock, the store's notices and a stop signal.
//! Asked to stop, it stops at once: ticks in flight are dropped, not waited for (with Redis
//! unreachable each would wait out its timeout).

mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt as _};
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::store::{Notice, Store};
use crate::tasks::{stopped, Stop};
use plan::{Done, Plan};

/// Longest time between two ticks of an event, whatever its deadlines say.
pub const MAX_SLEEP: Duration = Duration::from_millis(250);
/// Shortest time between two ticks of an event for a deadline, so that a deadline reported
/// in the past (a slow tick, a clock step) cannot turn the loop into a busy spin.
const MIN_SLEEP: Duration = Duration::from_millis(5);
/// Ticks in flight at once for reported deadlines and noticed changes. On Redis, calls in
/// flight together go out pipelined on the node's one multiplexed connection, and Redis
/// runs them one after another: a request of a client waits behind at most this many
/// ticks, not behind a whole pass. Few, since a tick that admits 500 places (events that
/// open or resume at one instant) holds Redis some 35–115 ms: four of them stay well
/// within the 1.5 s a client's call may wait.
const DUE_IN_FLIGHT: usize = 4;
/// Ticks in flight at once for refreshes. Small, so that the refreshes of thousands of
/// idle events take a bounded share of Redis rather than all of it; several, so that a
/// round trip's latency is not paid once per event (one at a time, 5,000 events took 0.85 s
/// on a quiet host and over 3 s, the lease's length, on a busy one).
const REFRESH_IN_FLIGHT: usize = 4;
/// Refreshes in flight at once in a round that has lasted [`ROUND_BEHIND`]. With 4, a
/// round over 5,000 events took over 3 s, the default lease's length, while the node
/// served 2,000 joins a second (each round trip waiting behind theirs): the leases lapsed
/// and were taken anew, one log line each.
const REFRESH_IN_FLIGHT_BEHIND: usize = 24;
/// How long a round of refreshes lasts before it is behind: a third of the default lease.
const ROUND_BEHIND: Duration = Duration::from_secs(1);

/// The scheduler loop: ticks every event on its own schedule (see the module doc) until
/// `stop`. Store errors are logged and retried with backoff; they never end the loop.
///
/// `notices` should be subscribed before the caller changes anything it wants honoured at
/// once: what arrives while ticks run waits in the receiver, so no change is missed.
pub async fn run(
    store: Arc<dyn Store>,
    clock: Clock,
    mut notices: broadcast::Receiver<Notice>,
    mut stop: Stop,
) {
    let store = store.as_ref();
    let mut plan = Plan::default();
    let mut jobs: FuturesUnordered<BoxFuture<'_, Done>> = FuturesUnordered::new();
    // Once the store's channel is closed, only the timers wake the loop.
    let mut listening = true;
    let sleep = tokio::time::sleep(MAX_SLEEP);
    tokio::pin!(sleep);
    loop {
        let at = Instant::now();
        if plan.list_due(at) {
            plan.listing = true;
            jobs.push(Box::pin(async move {
                let result = store.event_ids().await;
                Done::Listed {
                    started: at,
                    result,
                }
            }));
        }
        while let Some((id, kind)) = plan.take_due(at) {
            let now = clock.now();
            jobs.push(Box::pin(async move {
                let result = store.tick(&id, now).await;
                Done::Ticked {
                    id,
                    kind,
                    started: at,
                    now,
                    result,
                }
            }));
        }
        // One timer, moved only when the time to look again moved.
        let wake = plan.wake(at);
        if sleep.is_elapsed() || sleep.deadline() != wake {
            sleep.as_mut().reset(wake);
        }
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            Some(done) = jobs.next(), if !jobs.is_empty() => {
                take_in(&mut plan, done);
                // And whatever else finished meanwhile, before starting more: with thousands
                // of events, one turn of the loop per tick was most of the loop's cost.
                while let Some(Some(done)) = jobs.next().now_or_never() {
                    take_in(&mut plan, done);
                }
            }
            r = notices.recv(), if listening => match r {
                // New settings may mean new room, a new pace or new deadlines.
                Ok(Notice::EventChanged { event_id }) => plan.changed(&event_id, Instant::now()),
                Ok(Notice::EventDeleted { event_id }) => plan.forget(&event_id),
                // A lease another node gave back: this node may take it now.
                Ok(Notice::LeaseFreed { event_id }) => plan.changed(&event_id, Instant::now()),
                // Places come and go all the time; the store already acted on them.
                Ok(_) => {}
                // Missed notices may have held a change: every event, and the list, again.
                Err(broadcast::error::RecvError::Lagged(_)) => plan.lagged(),
                Err(broadcast::error::RecvError::Closed) => listening = false,
            },
            () = &mut sleep => {}
        }
    }
}

/// Takes in a finished call, logging when ticking starts or stops failing.
fn take_in(plan: &mut Plan, done: Done) {
    let was_failing = plan.failing();
    match plan.done(done) {
        Some(e) if !was_failing => tracing::warn!(error = %e,
            "tick failed; what failed is tried again with backoff, the rest goes on"),
        Some(e) => tracing::debug!(error = %e, "tick failed again"),
        None if was_failing && !plan.failing() => {
            tracing::info!("store answers again; ticking resumed");
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;
    use tokio::task::JoinHandle;

    use super::*;
    use crate::core::config::MIN_WAITING_IDLE_SEC;
    use crate::core::{EndCause, EventPatch, Millis, SaleEnd, END_BATCH};
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

    /// Asked to stop, it stops at once, ticks in flight or not (with Redis frozen, each
    /// waits out its timeout; one after another, a pass over thousands of events took hours).
    #[tokio::test(start_paused = true)]
    async fn stops_at_once_while_ticks_hang() {
        let store = Arc::new(FaultStore::embedded());
        for i in 0..100 {
            let id = format!("e{i}");
            store
                .put_event(&id, &EventPatch::default(), T)
                .await
                .unwrap();
        }
        store.inject(Op::Tick, Fault::Hang);
        let (tx, h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(store.calls(Op::Tick) > 0);
        tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_millis(10), h)
            .await
            .expect("stopped at once")
            .unwrap();
    }

    /// `n` events with nothing to do, `idle-0`…, and ticks that take 1 ms each (on Redis,
    /// a round trip each).
    async fn idle_events_with_slow_ticks(store: &FaultStore, n: usize) {
        for i in 0..n {
            let id = format!("idle-{i}");
            store
                .put_event(&id, &EventPatch::default(), T)
                .await
                .unwrap();
        }
        store.inject(Op::Tick, Fault::Delay(Duration::from_millis(1)));
    }

    /// A deadline's tick waits for no other event's: the four batches of an ended sale of
    /// 2,000 come 5 ms apart beside 2,000 idle events whose ticks take 1 ms (one after
    /// another, each batch waited for a pass of 2 s).
    #[tokio::test(start_paused = true)]
    async fn a_due_tick_waits_for_no_other_event() {
        let store = Arc::new(FaultStore::embedded());
        idle_events_with_slow_ticks(&store, 2_000).await;
        let patch = EventPatch {
            paused: Some(true),
            ..EventPatch::default()
        };
        store.put_event("sale", &patch, T).await.unwrap();
        for _ in 0..4 * END_BATCH {
            let req = JoinRequest {
                nonce: random_u128(),
                ..JoinRequest::default()
            };
            store.inner().join("sale", &req, T).await.unwrap();
        }
        let (_tx, _h) = start(store.clone());
        tokio::time::sleep(Duration::from_millis(600)).await;
        let end = SaleEnd {
            reason: EndCause::SoldOut,
            message: None,
            at: T,
        };
        store.inner().end_sale("sale", end, T).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let f = store.inner().get_event("sale", T).await.unwrap().figures;
        assert_eq!(f.waiting, 0, "four batches within 50 ms");
    }

    /// Events are refreshed in turn, several at once: 2,000 events whose ticks take 1 ms
    /// are each ticked twice in two rounds of 2,000 / REFRESH_IN_FLIGHT ms, MAX_SLEEP
    /// apart (one after another, once in 2 s: on Redis, a 3 s lease then lapsed on a busy
    /// host).
    #[tokio::test(start_paused = true)]
    async fn thousands_of_events_are_each_refreshed_in_turn() {
        let store = Arc::new(FaultStore::embedded());
        idle_events_with_slow_ticks(&store, 2_000).await;
        let (_tx, _h) = start(store.clone());
        let round = 2_000 / REFRESH_IN_FLIGHT as u64;
        tokio::time::sleep(
            Duration::from_millis(2 * round) + MAX_SLEEP + Duration::from_millis(50),
        )
        .await;
        let ticks = (0..2_000).map(|i| store.ticks_of(&format!("idle-{i}")));
        assert_eq!(ticks.min(), Some(2));
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
