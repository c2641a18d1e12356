//! The demo event and its simulated crowd.
//!
//! A newcomer who runs `cargo run --release` and opens the demo page should see a queue that
//! moves, not an empty one that admits them at once. So the server creates a small event
//! (three active sessions at most) and keeps a crowd of bots in it. Each bot behaves like a
//! patient person: joins as `demo-bot-N`, keeps its place alive (a status call per step,
//! which is a heartbeat), and when admitted, enters after a short pause, "books" for a few
//! seconds and completes. The crowd is topped up by at most two joins per step, to a size
//! that drifts between 10 and 20. Bots use the store directly rather than HTTP, so the
//! driver needs no address and no admin token, and their traffic does not skew the HTTP
//! metrics.
//!
//! A stopped server leaves its bots' places in a durable store, where they would hold the
//! event's slots until their idle timeouts (a minute) with nobody driving them: the queue
//! of a restarted demo would stand still. So the bots are named from a fixed set
//! (`demo-bot-1` … `demo-bot-20`, a name reused once its place ends) and join with the
//! server's own proof of identity, as a site's backend does with the server key: a proven
//! join of a name whose proven place is live gets that place back, which lets a new crowd
//! take over the places the previous one left.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::core::{EventPatch, Millis, PlaceKey, PlaceState, QueueError};
use crate::store::{JoinRequest, Store, StoreError};
use crate::tasks::{stopped, Stop};
use crate::tokens::random_u128;

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
/// durable store keeps it across restarts: their settings win). The store's change notice
/// wakes the scheduler.
pub async fn ensure_demo_event(store: &dyn Store, now: Millis) -> Result<(), StoreError> {
    match store.get_event(DEMO_EVENT, now).await {
        Ok(_) => {}
        Err(StoreError::Queue(QueueError::EventNotFound)) => {
            store
                .put_event(DEMO_EVENT, &demo_event_patch(), now)
                .await?;
        }
        Err(e) => return Err(e),
    }
    // The booking page's seat map: known seats keep their state, so this is safe on every
    // start.
    store
        .put_inventory(DEMO_EVENT, &demo_seats(), now)
        .await
        .map(|_| ())
}

/// The demo hall: rows A to D of 10 seats each (`A-1` … `D-10`).
pub fn demo_seats() -> Vec<String> {
    ('A'..='D')
        .flat_map(|row| (1..=10).map(move |n| format!("{row}-{n}")))
        .collect()
}

/// One simulated person.
struct Bot {
    /// Its number: its user id is [`bot_name`] of it.
    n: u64,
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

/// The user id of bot number `n` (1 to [`DEMO_CROWD_MAX`]).
fn bot_name(n: u64) -> String {
    format!("demo-bot-{n}")
}

/// Drives the crowd of the demo event until `stop`.
pub async fn run_demo_crowd(store: Arc<dyn Store>, clock: Clock, mut stop: Stop) {
    let mut bots = take_over_crowd(store.as_ref(), clock.now()).await;
    let mut target = (DEMO_CROWD_MIN + DEMO_CROWD_MAX) / 2;
    let mut steps: u64 = 0;
    loop {
        if steps % DEMO_REDRAW_STEPS == 0 && steps > 0 {
            target = draw((DEMO_CROWD_MIN, DEMO_CROWD_MAX));
        }
        steps += 1;
        demo_step(store.as_ref(), clock.now(), &mut bots, target).await;
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            _ = tokio::time::sleep(DEMO_STEP) => {}
        }
    }
}

/// The bots of a previous run still in the event (a restart on a durable store), taken
/// over: each name's proven join answers its live place, which the new crowd then drives
/// on (an admitted bot enters and books, an active one completes), so the slots they hold
/// free within seconds. A name without a live place gets a new one, at the back, as a
/// top-up would. Nothing is taken over in an event with no live place (a first start):
/// the crowd then grows in a trickle.
async fn take_over_crowd(store: &dyn Store, now: Millis) -> Vec<Bot> {
    let mut bots = Vec::new();
    match store.get_event(DEMO_EVENT, now).await {
        Ok(snap) if snap.figures.waiting + snap.figures.admitted + snap.figures.active > 0 => {}
        _ => return bots,
    }
    for n in 1..=DEMO_CROWD_MAX {
        match join_bot(store, n, now).await {
            Ok(bot) => bots.push(bot),
            // The store is down: the top-ups try again.
            Err(e @ StoreError::Unavailable(_)) => {
                tracing::debug!(error = %e, "demo crowd cannot take over its places");
                break;
            }
            // A name with no live place needs a new one, which a closed or full event
            // refuses: the names that still hold places are taken over all the same (a
            // proven join of a live place is answered before those checks).
            Err(e) => tracing::debug!(bot = n, error = %e, "demo bot has no place to take over"),
        }
    }
    bots
}

/// Joins as bot number `n`, with proof of being it: a live proven place of that name is
/// answered, not a new one.
async fn join_bot(store: &dyn Store, n: u64, now: Millis) -> Result<Bot, StoreError> {
    let req = JoinRequest {
        user_id: Some(bot_name(n)),
        metadata: None,
        nonce: random_u128(),
        proven: true,
        ..JoinRequest::default()
    };
    let view = store.join(DEMO_EVENT, &req, now).await?;
    Ok(Bot {
        n,
        key: view.key,
        state: view.status,
        since: now,
        linger: match view.status {
            PlaceState::Waiting => 0,
            PlaceState::Admitted => draw(DEMO_THINK_MS),
            PlaceState::Active => draw(DEMO_BOOK_MS),
        },
    })
}

/// Advances every bot by one step, then tops the crowd up towards `target`.
async fn demo_step(store: &dyn Store, now: Millis, bots: &mut Vec<Bot>, target: u64) {
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
                            tracing::debug!(bot = bot.n, error = %e, "demo bot could not complete");
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
        // The lowest free name: the crowd is never larger than the set of names.
        let Some(n) = (1..=DEMO_CROWD_MAX).find(|n| bots.iter().all(|b| b.n != *n)) else {
            break;
        };
        match join_bot(store, n, now).await {
            Ok(bot) => bots.push(bot),
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

    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::tasks::{spawn_task, stop_channel};

    #[tokio::test(start_paused = true)]
    async fn the_demo_crowd_keeps_the_queue_moving() {
        let clock = Clock::manual(1_000_000);
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        ensure_demo_event(store.as_ref(), clock.now())
            .await
            .unwrap();
        // A second call keeps what is there.
        ensure_demo_event(store.as_ref(), clock.now())
            .await
            .unwrap();
        let (_tx, rx) = stop_channel();
        let _h = spawn_task(
            "demo-crowd",
            run_demo_crowd(store.clone(), clock.clone(), rx),
        );
        let mut seen = VecDeque::new();
        for _ in 0..60 {
            clock.advance(1_000);
            tokio::time::sleep(DEMO_STEP).await;
            let f = store.get_event(DEMO_EVENT, clock.now()).await.unwrap();
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
        let snap = store.get_event(DEMO_EVENT, clock.now()).await.unwrap();
        assert_eq!(snap.config.name, "Demo concert");
        assert_eq!(snap.config.target_url.as_deref(), Some("/demo/booking"));
    }

    /// The demo event after a crowd ran for ten steps and stopped, as a restart finds it.
    async fn a_stopped_crowd() -> (Arc<dyn Store>, Clock) {
        let clock = Clock::manual(1_000_000);
        let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        ensure_demo_event(store.as_ref(), clock.now())
            .await
            .unwrap();
        let (tx, rx) = stop_channel();
        let first = spawn_task(
            "demo-crowd",
            run_demo_crowd(store.clone(), clock.clone(), rx),
        );
        for _ in 0..10 {
            clock.advance(1_000);
            tokio::time::sleep(DEMO_STEP).await;
        }
        tx.send(true).unwrap();
        first.await.unwrap();
        (store, clock)
    }

    /// A restart on a durable store finds the previous crowd's places holding every slot.
    /// The new crowd takes them over, so the line moves within seconds rather than after
    /// their idle timeouts (a minute); a person's place is left alone.
    #[tokio::test(start_paused = true)]
    async fn a_new_crowd_takes_over_the_places_a_stopped_one_left() {
        let (store, clock) = a_stopped_crowd().await;
        let f = store
            .get_event(DEMO_EVENT, clock.now())
            .await
            .unwrap()
            .figures;
        assert_eq!(
            f.admitted + f.active,
            3,
            "the old bots hold every slot: {f:?}"
        );
        assert!(f.waiting > 0, "{f:?}");

        // A person who joined before the restart, waiting behind the bots.
        let before = JoinRequest {
            user_id: Some("person".into()),
            nonce: random_u128(),
            ..JoinRequest::default()
        };
        let before = store.join(DEMO_EVENT, &before, clock.now()).await.unwrap();
        let (_tx, rx) = stop_channel();
        let _h = spawn_task(
            "demo-crowd",
            run_demo_crowd(store.clone(), clock.clone(), rx),
        );
        let me = JoinRequest {
            nonce: random_u128(),
            ..JoinRequest::default()
        };
        let me = store.join(DEMO_EVENT, &me, clock.now()).await.unwrap();
        let start = me.position.unwrap();
        let mut moved = false;
        // Well within the old places' timeouts: 30 s to enter, 60 s of idle session.
        for _ in 0..15 {
            clock.advance(1_000);
            tokio::time::sleep(DEMO_STEP).await;
            let now = store.status(DEMO_EVENT, me.key, clock.now()).await.unwrap();
            store
                .status(DEMO_EVENT, before.key, clock.now())
                .await
                .expect("the person's place is not taken over");
            if now.status != PlaceState::Waiting || now.position < Some(start) {
                moved = true;
                break;
            }
        }
        assert!(moved, "the line stood still at position {start}");
    }

    /// A name whose place ended needs a new place to be taken over, which an event closed
    /// to joins refuses: the names that still hold places are taken over all the same, and
    /// their slots free (bots get through) within the old places' timeouts.
    #[tokio::test(start_paused = true)]
    async fn a_closed_event_still_has_its_live_bots_taken_over() {
        let (store, clock) = a_stopped_crowd().await;
        // The first name's place ends; the others still hold the slots.
        let one = join_bot(store.as_ref(), 1, clock.now()).await.unwrap();
        assert!(store.leave(DEMO_EVENT, one.key, clock.now()).await.unwrap());
        let closed = EventPatch {
            accept_joins: Some(false),
            ..EventPatch::default()
        };
        store
            .update_event(DEMO_EVENT, &closed, clock.now())
            .await
            .unwrap();
        let held = store.get_event(DEMO_EVENT, clock.now()).await.unwrap();
        assert_eq!(held.figures.admitted + held.figures.active, 3, "{held:?}");
        let (_tx, rx) = stop_channel();
        let _h = spawn_task(
            "demo-crowd",
            run_demo_crowd(store.clone(), clock.clone(), rx),
        );
        let mut through = false;
        // Well within the old places' timeouts: 30 s to enter, 60 s of idle session.
        for _ in 0..15 {
            clock.advance(1_000);
            tokio::time::sleep(DEMO_STEP).await;
            let f = store.get_event(DEMO_EVENT, clock.now()).await.unwrap();
            if f.figures.completed > held.figures.completed {
                through = true;
                break;
            }
        }
        assert!(through, "no bot got through after the restart: {held:?}");
    }
}
