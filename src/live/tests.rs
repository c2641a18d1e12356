//! Unit tests of the live hub in `live.rs` (kept apart so that file stays the routing).

use super::*;
use serde_json::json;

#[test]
fn messages_have_the_contract_shape() {
    let m = LiveMessage::QueueUpdate {
        status: ShownStatus::Waiting,
        position: Some(3),
        opens_in_sec: None,
        prequeue_rank: None,
        queue_length: 118,
        eta_sec: 9,
        eta_low_sec: Some(7),
        eta_high_sec: Some(12),
        poll_after_sec: 2,
        paused: false,
    };
    assert_eq!(
        serde_json::to_value(&m).unwrap(),
        json!({"type": "queue-update", "status": "waiting", "position": 3,
               "queue_length": 118, "eta_sec": 9, "eta_low_sec": 7, "eta_high_sec": 12,
               "poll_after_sec": 2, "paused": false})
    );
    assert_eq!(
        LiveMessage::EventState {
            paused: true,
            accept_joins: true
        }
        .to_json(),
        r#"{"type":"event-state","paused":true,"accept_joins":true}"#
    );
    assert_eq!(
        serde_json::to_value(LiveMessage::QueueReady {
            enter_within_sec: 60
        })
        .unwrap(),
        json!({"type": "queue-ready", "enter_within_sec": 60})
    );
    assert_eq!(
        LiveMessage::QueueExpired.to_json(),
        r#"{"type":"queue-expired"}"#
    );
    assert_eq!(
        LiveMessage::QueueCleared.to_json(),
        r#"{"type":"queue-cleared"}"#
    );
    assert_eq!(
        serde_json::to_value(LiveMessage::ended(EndReason::Completed)).unwrap(),
        json!({"type": "queue-left", "reason": "completed"})
    );
    for m in [
        LiveMessage::QueueExpired,
        LiveMessage::QueueCleared,
        LiveMessage::ended(EndReason::Left),
    ] {
        assert!(m.is_final());
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["type"], m.kind());
    }
}

#[tokio::test]
async fn subscriptions_unregister_when_the_last_connection_goes() {
    let live = Live::new();
    let a = live.subscribe("ev", 1);
    let b = live.subscribe("ev", 1);
    let c = live.subscribe("ev", 2);
    assert_eq!(live.followers(), 3);
    drop(a);
    assert_eq!(live.followers(), 2);
    live.hub.signal("ev", 1, |s| s.admitted = true);
    assert!(b.place.as_ref().unwrap().has_changed().unwrap());
    drop(b);
    drop(c);
    assert_eq!(live.followers(), 0);
    assert!(live.hub.events.lock().is_empty());
}

/// With a routing hub running and `a`, `b` following places of events "a" and "b" (nothing
/// moved yet), `move_a` moving event "a": a lone move goes out at once, and a burst within
/// the coalescing window is one bump, at the end of the window; "b" is left alone.
async fn a_lone_move_then_a_burst(a: &mut Subscription, b: &mut Subscription, move_a: impl Fn()) {
    move_a();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(*a.moved().borrow_and_update(), 1);

    for _ in 0..3 {
        move_a();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!a.moved().has_changed().unwrap());
    tokio::time::sleep(COALESCE).await;
    assert_eq!(*a.moved().borrow_and_update(), 2);
    assert!(
        !b.moved().has_changed().unwrap(),
        "other events are untouched"
    );
}

/// The store's coalesced moves (`MovedEvents`) reach followers as `Moved` notices do:
/// a lone move at once, a burst as one bump at the end of the window, and a move marked
/// during a sweep at the next one.
#[tokio::test(start_paused = true)]
async fn marked_moves_are_pushed_like_notices() {
    let hub = Arc::new(Hub::default());
    let live = Live { hub: hub.clone() };
    let mut a = live.subscribe("a", 1);
    let mut b = live.subscribe("b", 1);
    let (_tx, rx) = broadcast::channel::<Notice>(4);
    let moved = Arc::new(MovedEvents::default());
    let (stop_tx, stop_rx) = crate::tasks::stop_channel();
    let task = tokio::spawn(route(hub, rx, Some(moved.clone()), stop_rx));
    let a_id: Arc<str> = Arc::from("a");

    a_lone_move_then_a_burst(&mut a, &mut b, || moved.mark(&a_id)).await;

    // Marked again after the sweep took the set: pushed in the next window.
    moved.mark(&Arc::from("b"));
    tokio::time::sleep(COALESCE + Duration::from_millis(1)).await;
    assert_eq!(*b.moved().borrow_and_update(), 1);
    assert!(!a.moved().has_changed().unwrap());

    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn moves_are_coalesced_and_lag_refreshes_everyone() {
    let hub = Arc::new(Hub::default());
    let live = Live { hub: hub.clone() };
    let mut a = live.subscribe("a", 1);
    let mut b = live.subscribe("b", 1);
    let (tx, rx) = broadcast::channel(4);
    let (stop_tx, stop_rx) = crate::tasks::stop_channel();
    let task = tokio::spawn(route(hub, rx, None, stop_rx));
    let moved = |id: &str| Notice::Moved {
        event_id: Arc::from(id),
    };

    a_lone_move_then_a_burst(&mut a, &mut b, || {
        tx.send(moved("a")).unwrap();
    })
    .await;

    // Overflowing the buffer: every event counts as moved.
    for _ in 0..10 {
        tx.send(moved("a")).unwrap();
    }
    tokio::time::sleep(COALESCE * 2).await;
    assert!(b.moved().has_changed().unwrap());

    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_deleted_event_ends_its_followers_at_once() {
    let hub = Arc::new(Hub::default());
    let live = Live { hub: hub.clone() };
    let mut a = live.subscribe("gone", 1);
    let mut b = live.subscribe("gone", 2);
    let mut other = live.subscribe("stays", 1);
    let (tx, rx) = broadcast::channel(4);
    let (stop_tx, stop_rx) = crate::tasks::stop_channel();
    let task = tokio::spawn(route(hub, rx, None, stop_rx));
    tx.send(Notice::EventDeleted {
        event_id: Arc::from("gone"),
    })
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    for s in [&mut a, &mut b] {
        assert_eq!(
            s.place().borrow_and_update().ended,
            Some(EndReason::Cleared)
        );
    }
    assert!(!other.place().has_changed().unwrap());
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_big_event_is_refreshed_shard_by_shard() {
    let hub = Arc::new(Hub::default());
    let live = Live { hub: hub.clone() };
    // 3,000 followers: three slots, so shards 0, 3, 6, … go first, then 1, 4, … .
    let mut subs: Vec<Subscription> = (0..3000).map(|seq| live.subscribe("big", seq)).collect();
    let (tx, rx) = broadcast::channel(4);
    let (stop_tx, stop_rx) = crate::tasks::stop_channel();
    let task = tokio::spawn(route(hub, rx, None, stop_rx));
    tx.send(Notice::Moved {
        event_id: Arc::from("big"),
    })
    .unwrap();

    let changed =
        |subs: &mut Vec<Subscription>, seq: usize| subs[seq].moved().has_changed().unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(changed(&mut subs, 0) && changed(&mut subs, 3) && changed(&mut subs, 16));
    assert!(!changed(&mut subs, 1) && !changed(&mut subs, 2));
    tokio::time::sleep(SLOT).await;
    assert!(changed(&mut subs, 1) && changed(&mut subs, 4));
    assert!(!changed(&mut subs, 2));
    tokio::time::sleep(SLOT).await;
    assert!(changed(&mut subs, 2) && changed(&mut subs, 5));
    assert!(
        subs.iter_mut().all(|s| s.moved().has_changed().unwrap()),
        "everyone is refreshed within one window"
    );

    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

/// A follower over a fresh embedded store with no routing hub running, so every notice is
/// lost; the place `waiting` is second behind `first` in an event of one slot with a ready
/// window of 3 s.
async fn a_follower_hearing_no_notice() -> (
    Follower,
    Arc<dyn Store>,
    PlaceKey,
    tokio::sync::watch::Sender<bool>,
) {
    a_follower_hearing_no_notice_with(3).await
}

/// As [`a_follower_hearing_no_notice`], with a ready window of `ready_ttl_sec`.
async fn a_follower_hearing_no_notice_with(
    ready_ttl_sec: u32,
) -> (
    Follower,
    Arc<dyn Store>,
    PlaceKey,
    tokio::sync::watch::Sender<bool>,
) {
    use crate::store::embedded::EmbeddedStore;
    use crate::store::JoinRequest;
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let clock = Clock::manual(1_000_000);
    let patch =
        serde_json::from_value(json!({"max_active": 1, "ready_ttl_sec": ready_ttl_sec})).unwrap();
    store.put_event("ev", &patch, clock.now()).await.unwrap();
    let req = |nonce| JoinRequest {
        user_id: None,
        metadata: None,
        nonce,
        proven: false,
        invite: None,
    };
    let first = store.join("ev", &req(1), clock.now()).await.unwrap().key;
    let waiting = store.join("ev", &req(2), clock.now()).await.unwrap().key;
    let catalog = Arc::new(crate::catalog::EventCatalog::new(store.clone()));
    let (stop_tx, stop) = crate::tasks::stop_channel();
    let live = Live::new();
    let (f, first_messages) =
        Follower::start(&live, store.clone(), catalog, clock, stop, "ev", waiting)
            .await
            .unwrap();
    assert!(
        matches!(first_messages[..], [LiveMessage::QueueUpdate { .. }]),
        "{first_messages:?}"
    );
    (f, store, first, stop_tx)
}

/// Runs the follower until a message `want` says yes to, for at most `within`.
async fn told_within(
    f: &mut Follower,
    within: Duration,
    want: impl Fn(&LiveMessage) -> bool,
) -> bool {
    tokio::time::timeout(within, async {
        loop {
            let wake = f.wait().await;
            if f.step(wake, true).await.messages.iter().any(&want) {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// An admission whose notice is lost (on Redis, the node that admitted killed before it
/// published) is told at the follower's next refresh, a third of a short ready window
/// later (defect: only at the 9.5 s refresh, after a 5 s window had lapsed: the place was
/// lost while its page was open and connected).
#[tokio::test]
async fn an_admission_heard_of_by_no_notice_is_told_within_the_ready_window() {
    let (mut f, store, first, _stop) = a_follower_hearing_no_notice().await;
    store.leave("ev", first, 1_000_000).await.unwrap();
    assert!(
        told_within(&mut f, Duration::from_millis(2_500), |m| matches!(
            m,
            LiveMessage::QueueReady { .. }
        ))
        .await,
        "not told of its admission within its ready window"
    );
}

/// A settings change whose notice is lost (a new announcement) is told at a refresh: the
/// follower compares this node's copy of the settings (re-read within a second) with what
/// it told (defect: it re-read the settings only when `paused` differed, so the
/// announcement never came).
#[tokio::test]
async fn an_announcement_heard_of_by_no_notice_is_told() {
    let (mut f, store, _first, _stop) = a_follower_hearing_no_notice().await;
    let patch = crate::core::EventPatch {
        announcement: Some(Some(crate::core::lifecycle::Announcement {
            message: crate::core::look::Texts {
                ko: None,
                en: Some("Doors at 8".into()),
            },
            at: 1_000_000,
        })),
        ..Default::default()
    };
    store.update_event("ev", &patch, 1_000_000).await.unwrap();
    assert!(
        told_within(&mut f, Duration::from_secs(4), |m| matches!(
            m,
            LiveMessage::Announcement { .. }
        ))
        .await,
        "the announcement was never told"
    );
}

/// Both notices lost, the admission's and then the sale's end: the refresh tells the
/// admission, and the end (which leaves admitted places be) ends nothing (defect: the
/// settings were compared before the place was re-read, so the follower, still taking its
/// place for waiting, pushed `ended` and closed the stream of someone who could enter).
#[tokio::test]
async fn an_admission_then_an_end_heard_of_by_no_notice_leaves_the_place_admitted() {
    let (mut f, store, first, _stop) = a_follower_hearing_no_notice().await;
    store.leave("ev", first, 1_000_000).await.unwrap();
    let end = crate::core::EventPatch {
        end: Some(crate::core::SaleEnd {
            reason: crate::core::EndCause::SoldOut,
            message: None,
            at: 1_000_000,
        }),
        ..Default::default()
    };
    store.update_event("ev", &end, 1_000_000).await.unwrap();
    let mut told = Vec::new();
    let _ = tokio::time::timeout(Duration::from_millis(2_500), async {
        loop {
            let wake = f.wait().await;
            told.extend(f.step(wake, true).await.messages);
        }
    })
    .await;
    assert!(
        told.iter()
            .any(|m| matches!(m, LiveMessage::QueueReady { .. })),
        "{told:?}"
    );
    assert!(
        !told.iter().any(|m| matches!(m, LiveMessage::Ended { .. })),
        "{told:?}"
    );
    assert!(!f.is_done());
}

/// A short ready window re-reads the place more often, but pushes unchanged figures only
/// every REFRESH, as before (a push a second to every waiting client would be the load).
#[tokio::test]
async fn a_short_ready_window_pushes_no_more_unchanged_figures() {
    let (mut f, _store, _first, _stop) = a_follower_hearing_no_notice().await;
    let told = told_within(&mut f, Duration::from_millis(2_500), |m| {
        matches!(m, LiveMessage::QueueUpdate { .. })
    })
    .await;
    assert!(!told, "unchanged figures pushed again before REFRESH");
}

/// Unchanged figures are pushed at least every REFRESH whatever the re-read period
/// (defect: a period of 6.7 s, a third of a 20 s window, pushed them every 13.3 s, past
/// the contract's "at least every 10 s").
#[tokio::test(start_paused = true)]
async fn unchanged_figures_are_pushed_every_refresh_whatever_the_period() {
    let (mut f, _store, _first, _stop) = a_follower_hearing_no_notice_with(20).await;
    let mut last = Instant::now();
    for _ in 0..3 {
        let pushed = told_within(&mut f, Duration::from_secs(30), |m| {
            matches!(m, LiveMessage::QueueUpdate { .. })
        })
        .await;
        assert!(pushed);
        let gap = last.elapsed();
        assert!(gap <= Duration::from_secs(10), "{gap:?} between two pushes");
        last = Instant::now();
    }
}
