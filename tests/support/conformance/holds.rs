//! Conformance stories of seat holds and session extensions (`Store::put_inventory`,
//! `inventory`, `hold`, `release`, `extend`), run on every backend with the rest.

use std::collections::HashMap;
use std::sync::Arc;

use waitroom::core::{InventoryCounts, ItemState, PlaceKey, PlaceState, QueueError};
use waitroom::store::Store;

use super::{join, make_event, patch, queue_err, S, T0};

fn seats(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("A-{i}")).collect()
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// An event with `n` seats and `sessions` active sessions, entered at T0.
async fn sale(
    store: &Arc<dyn Store>,
    ev: &str,
    n: usize,
    sessions: usize,
    settings: serde_json::Value,
) -> Vec<PlaceKey> {
    let mut s = serde_json::json!({"max_active": sessions.max(1)});
    for (k, v) in settings.as_object().unwrap() {
        s[k] = v.clone();
    }
    make_event(store, ev, s).await;
    store.put_inventory(ev, &seats(n), T0).await.unwrap();
    let mut keys = Vec::new();
    for _ in 0..sessions {
        let p = join(store, ev, None, T0).await;
        store.enter(ev, p.key, T0).await.unwrap();
        keys.push(p.key);
    }
    keys
}

async fn counts(store: &Arc<dyn Store>, ev: &str, now: u64) -> InventoryCounts {
    store.inventory(ev, now).await.unwrap().counts
}

fn held(h: &waitroom::core::SessionHolds) -> Vec<&str> {
    h.holds.iter().map(|h| h.item.as_str()).collect()
}

pub async fn holds_are_exclusive_and_all_or_nothing(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "ho",
        4,
        2,
        serde_json::json!({"max_holds_per_session": 3}),
    )
    .await;
    let (a, b) = (k[0], k[1]);
    let h = store
        .hold("ho", a, &ids(&["A-2", "A-1"]), T0 + S)
        .await
        .unwrap();
    assert_eq!(held(&h), ["A-1", "A-2"], "ordered by id");
    assert_eq!(
        h.holds[0].expires_at,
        T0 + S + 300 * S,
        "hold_ttl_sec defaults to 300"
    );
    // One of two taken: nothing is held.
    assert_eq!(
        queue_err(store.hold("ho", b, &ids(&["A-3", "A-2"]), T0 + S).await),
        QueueError::HoldConflict
    );
    assert_eq!(
        queue_err(store.hold("ho", b, &ids(&["Z-9"]), T0 + S).await),
        QueueError::ItemNotFound
    );
    let c = counts(&store, "ho", T0 + S).await;
    assert_eq!((c.total, c.available, c.held, c.sold), (4, 2, 2, 0));
    // Holding again renews, and counts once toward the limit.
    let h = store
        .hold("ho", a, &ids(&["A-1", "A-3"]), T0 + 2 * S)
        .await
        .unwrap();
    assert_eq!(held(&h), ["A-1", "A-2", "A-3"]);
    assert_eq!(h.holds[0].expires_at, T0 + 2 * S + 300 * S);
    assert_eq!(
        queue_err(store.hold("ho", a, &ids(&["A-4"]), T0 + 2 * S).await),
        QueueError::TooManyHolds
    );
    // A limit lowered under held seats: renewing them is still allowed (it adds nothing),
    // a new seat is not, and the old limit comes back for what follows.
    store
        .update_event(
            "ho",
            &patch(serde_json::json!({"max_holds_per_session": 1})),
            T0,
        )
        .await
        .unwrap();
    let h = store
        .hold("ho", a, &ids(&["A-3", "A-1"]), T0 + 2 * S)
        .await
        .unwrap();
    assert_eq!(held(&h), ["A-1", "A-2", "A-3"], "a renewal above the limit");
    assert_eq!(
        queue_err(store.hold("ho", a, &ids(&["A-1", "A-4"]), T0 + 2 * S).await),
        QueueError::TooManyHolds
    );
    store
        .update_event(
            "ho",
            &patch(serde_json::json!({"max_holds_per_session": 3})),
            T0,
        )
        .await
        .unwrap();
    let h = store
        .release("ho", a, Some(&ids(&["A-2", "A-4"])), T0 + 3 * S)
        .await
        .unwrap();
    assert_eq!(
        held(&h),
        ["A-1", "A-3"],
        "items it does not hold are ignored"
    );
    store
        .hold("ho", b, &ids(&["A-2", "A-4"]), T0 + 3 * S)
        .await
        .unwrap();
    let h = store.release("ho", a, None, T0 + 4 * S).await.unwrap();
    assert!(h.holds.is_empty());
    let view = store.inventory("ho", T0 + 4 * S).await.unwrap();
    let states: Vec<_> = view.items.iter().map(|(id, s)| (id.as_str(), *s)).collect();
    let by_b = ItemState::Held {
        seq: b.seq,
        until: T0 + 303 * S,
    };
    assert_eq!(
        states,
        [
            ("A-1", ItemState::Available),
            ("A-2", by_b),
            ("A-3", ItemState::Available),
            ("A-4", by_b)
        ]
    );
    // Adding again keeps what is known; bad ids are refused whole.
    let (added, c) = store
        .put_inventory("ho", &ids(&["A-4", "B-1"]), T0)
        .await
        .unwrap();
    assert_eq!((added, c.total, c.held), (1, 5, 2));
    assert!(matches!(
        queue_err(
            store
                .put_inventory("ho", &ids(&["C-1", "bad id"]), T0)
                .await
        ),
        QueueError::Invalid(_)
    ));
    assert_eq!(counts(&store, "ho", T0 + 4 * S).await.total, 5);
    assert_eq!(
        queue_err(store.put_inventory("nope", &ids(&["A-1"]), T0).await),
        QueueError::EventNotFound
    );
}

/// The items of a hold are checked in the order given and the first failure answers: the
/// limit broken by an earlier item wins over a later item that is sold, held by another
/// session or unknown, and the other way round.
pub async fn holds_are_checked_in_the_order_given(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "hc",
        4,
        2,
        serde_json::json!({"max_holds_per_session": 1}),
    )
    .await;
    let (a, b) = (k[0], k[1]);
    store.hold("hc", b, &ids(&["A-4"]), T0).await.unwrap();
    store.complete("hc", b, T0).await.unwrap();
    store.hold("hc", a, &ids(&["A-1"]), T0).await.unwrap();
    // A-2 takes `a` past the limit before A-4 (sold) or Z-9 (unknown) is reached.
    for later in ["A-4", "Z-9"] {
        assert_eq!(
            queue_err(store.hold("hc", a, &ids(&["A-1", "A-2", later]), T0).await),
            QueueError::TooManyHolds,
            "{later}"
        );
    }
    assert_eq!(
        queue_err(store.hold("hc", a, &ids(&["A-4", "A-2"]), T0).await),
        QueueError::HoldConflict
    );
    assert_eq!(
        queue_err(store.hold("hc", a, &ids(&["Z-9", "A-2"]), T0).await),
        QueueError::ItemNotFound
    );
    store.release("hc", a, None, T0).await.unwrap();
    assert_eq!(
        queue_err(
            store
                .hold("hc", a, &ids(&["A-1", "A-1", "A-2", "A-4"]), T0)
                .await
        ),
        QueueError::TooManyHolds,
        "a repeated item counts once"
    );
    let c = counts(&store, "hc", T0).await;
    assert_eq!((c.held, c.sold), (0, 1), "nothing changed");
}

pub async fn holds_need_an_active_session(store: Arc<dyn Store>) {
    make_event(&store, "hn", serde_json::json!({"max_active": 1})).await;
    store.put_inventory("hn", &seats(2), T0).await.unwrap();
    let a = join(&store, "hn", None, T0).await;
    let w = join(&store, "hn", None, T0).await;
    assert_eq!(a.status, PlaceState::Admitted);
    for key in [a.key, w.key] {
        assert_eq!(
            queue_err(store.hold("hn", key, &ids(&["A-1"]), T0).await),
            QueueError::NoSession
        );
        assert_eq!(
            queue_err(store.extend("hn", key, T0).await),
            QueueError::NoSession
        );
    }
    assert_eq!(counts(&store, "hn", T0).await.held, 0);
}

/// Every end of a session releases its holds in the step that ends it; completing sells
/// them. Each end is observed through the inventory alone, with no tick in between.
pub async fn every_session_end_releases_its_holds(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "he",
        8,
        4,
        serde_json::json!({"session_idle_sec": 10, "session_max_sec": 60}),
    )
    .await;
    for (i, key) in k.iter().enumerate() {
        let mine = ids(&[&format!("A-{}", 2 * i + 1), &format!("A-{}", 2 * i + 2)]);
        store.hold("he", *key, &mine, T0 + S).await.unwrap();
    }
    assert_eq!(counts(&store, "he", T0 + S).await.held, 8);
    // Leave.
    assert!(store.leave("he", k[0], T0 + 2 * S).await.unwrap());
    assert_eq!(counts(&store, "he", T0 + 2 * S).await.held, 6);
    // Complete: sold, not released.
    store.complete("he", k[1], T0 + 3 * S).await.unwrap();
    let c = counts(&store, "he", T0 + 3 * S).await;
    assert_eq!((c.held, c.sold), (4, 2));
    // Idle: k[3] keeps its session alive, k[2] does not: its last call, the hold at
    // T0 + 1 s, renewed it until T0 + 11 s, when it lapses.
    store
        .session_heartbeat("he", k[3], T0 + 9 * S)
        .await
        .unwrap();
    assert_eq!(counts(&store, "he", T0 + 11 * S - 1).await.held, 4);
    let c = counts(&store, "he", T0 + 11 * S).await;
    assert_eq!((c.held, c.sold, c.available), (2, 2, 4));
    // Maximum: heartbeats cannot keep k[3] past 60 s.
    for t in (15..60).step_by(5) {
        store
            .session_heartbeat("he", k[3], T0 + t * S)
            .await
            .unwrap();
    }
    assert_eq!(counts(&store, "he", T0 + 59 * S).await.held, 2);
    let c = counts(&store, "he", T0 + 60 * S).await;
    assert_eq!((c.held, c.sold, c.available), (0, 2, 6));
    // A sold seat is never held again.
    let p = join(&store, "he", None, T0 + 60 * S).await;
    store.enter("he", p.key, T0 + 60 * S).await.unwrap();
    assert_eq!(
        queue_err(store.hold("he", p.key, &ids(&["A-3"]), T0 + 60 * S).await),
        QueueError::HoldConflict
    );
    store
        .hold("he", p.key, &ids(&["A-1"]), T0 + 60 * S)
        .await
        .unwrap();
}

pub async fn holds_lapse_after_their_ttl(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "hl",
        2,
        2,
        serde_json::json!({"hold_ttl_sec": 10, "session_idle_sec": 1000}),
    )
    .await;
    store.hold("hl", k[0], &ids(&["A-1"]), T0).await.unwrap();
    store
        .hold("hl", k[0], &ids(&["A-2"]), T0 + 5 * S)
        .await
        .unwrap();
    assert_eq!(
        queue_err(
            store
                .hold("hl", k[1], &ids(&["A-1"]), T0 + 10 * S - 1)
                .await
        ),
        QueueError::HoldConflict
    );
    let h = store
        .hold("hl", k[1], &ids(&["A-1"]), T0 + 10 * S)
        .await
        .unwrap();
    assert_eq!(held(&h), ["A-1"], "lapsed at its deadline");
    let h = store
        .release("hl", k[0], Some(&[]), T0 + 10 * S)
        .await
        .unwrap();
    assert_eq!(held(&h), ["A-2"]);
    // A lapsed hold is not sold by completing.
    store.complete("hl", k[0], T0 + 15 * S).await.unwrap();
    let c = counts(&store, "hl", T0 + 15 * S).await;
    assert_eq!((c.held, c.sold, c.available), (1, 0, 1));
}

/// Adding items answers the counts as an inventory read does: a hold that lapsed, or whose
/// session was due to end, is released first, not counted as held.
pub async fn adding_items_counts_no_lapsed_hold(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "hp",
        3,
        2,
        serde_json::json!({"hold_ttl_sec": 10, "session_idle_sec": 5}),
    )
    .await;
    store.hold("hp", k[0], &ids(&["A-1"]), T0).await.unwrap();
    store.hold("hp", k[1], &ids(&["A-2"]), T0).await.unwrap();
    store
        .session_heartbeat("hp", k[0], T0 + 4 * S)
        .await
        .unwrap();
    // k[1]'s session was due to end (idle) at T0 + 5 s, and its hold with it.
    let (added, c) = store
        .put_inventory("hp", &ids(&["B-1"]), T0 + 6 * S)
        .await
        .unwrap();
    assert_eq!((added, c.total, c.available, c.held), (1, 4, 3, 1));
    assert_eq!(c, counts(&store, "hp", T0 + 6 * S).await);
    store
        .session_heartbeat("hp", k[0], T0 + 8 * S)
        .await
        .unwrap();
    // k[0]'s session lives on, but its hold lapsed at T0 + 10 s.
    let (added, c) = store
        .put_inventory("hp", &ids(&["B-1"]), T0 + 10 * S)
        .await
        .unwrap();
    assert_eq!((added, c.total, c.available, c.held), (0, 4, 4, 0));
    assert_eq!(c, counts(&store, "hp", T0 + 10 * S).await);
    assert!(store
        .release("hp", k[0], None, T0 + 10 * S)
        .await
        .unwrap()
        .holds
        .is_empty());
}

/// A session busy holding and releasing seats is not idle: every hold call renews its idle
/// deadline as a heartbeat does, a refused hold too, but never its maximum.
pub async fn hold_calls_keep_the_session_alive(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "hk",
        2,
        2,
        serde_json::json!({"session_idle_sec": 10, "session_max_sec": 40,
            "hold_ttl_sec": 1000}),
    )
    .await;
    let (a, b) = (k[0], k[1]);
    store
        .hold("hk", a, &ids(&["A-1"]), T0 + 8 * S)
        .await
        .unwrap();
    store
        .hold("hk", b, &ids(&["A-2"]), T0 + 5 * S)
        .await
        .unwrap();
    // Refused (b holds A-2), yet a sign of life: `a` stays past T0 + 18 s.
    assert_eq!(
        queue_err(store.hold("hk", a, &ids(&["A-2"]), T0 + 14 * S).await),
        QueueError::HoldConflict
    );
    store
        .release("hk", a, Some(&ids(&["A-2"])), T0 + 22 * S)
        .await
        .unwrap();
    // b made no call after T0 + 5 s: it ended idle, and its hold went with it.
    let h = store
        .hold("hk", a, &ids(&["A-2"]), T0 + 30 * S)
        .await
        .unwrap();
    assert_eq!(held(&h), ["A-1", "A-2"]);
    assert_eq!(
        queue_err(store.session("hk", b, T0 + 30 * S).await),
        QueueError::NoSession
    );
    // The maximum stays where it was: T0 + 40 s, though the last call was at T0 + 38 s.
    store.release("hk", a, None, T0 + 38 * S).await.unwrap();
    let v = store.session("hk", a, T0 + 39 * S).await.unwrap();
    assert_eq!(v.session_ends_at, Some(T0 + 40 * S));
    assert_eq!(
        queue_err(store.session("hk", a, T0 + 40 * S).await),
        QueueError::NoSession
    );
}

pub async fn sessions_extend_up_to_the_limit(store: Arc<dyn Store>) {
    make_event(
        &store,
        "ex",
        serde_json::json!({"session_max_sec": 30, "session_idle_sec": 1000,
            "session_extend_sec": 20, "max_extensions": 2}),
    )
    .await;
    let p = join(&store, "ex", None, T0).await;
    let s = store.enter("ex", p.key, T0).await.unwrap();
    assert_eq!(s.session_ends_at, Some(T0 + 30 * S));
    let v = store.extend("ex", p.key, T0 + 10 * S).await.unwrap();
    assert_eq!(v.session_ends_at, Some(T0 + 50 * S));
    let v = store.extend("ex", p.key, T0 + 20 * S).await.unwrap();
    assert_eq!(v.session_ends_at, Some(T0 + 70 * S));
    assert_eq!(v.session_expires_in_sec, Some(50));
    assert_eq!(
        queue_err(store.extend("ex", p.key, T0 + 21 * S).await),
        QueueError::ExtensionLimit
    );
    // The store keeps the session to its new end, then ends it.
    let v = store.session("ex", p.key, T0 + 69 * S).await.unwrap();
    assert_eq!(v.session_ends_at, Some(T0 + 70 * S));
    assert_eq!(
        queue_err(store.session("ex", p.key, T0 + 70 * S).await),
        QueueError::NoSession
    );
    // Off by default; a refused extension renews nothing (the idle deadline stays).
    make_event(&store, "ex0", serde_json::json!({"session_idle_sec": 10})).await;
    let p = join(&store, "ex0", None, T0).await;
    store.enter("ex0", p.key, T0).await.unwrap();
    assert_eq!(
        queue_err(store.extend("ex0", p.key, T0 + 5 * S).await),
        QueueError::ExtensionLimit
    );
    assert_eq!(
        queue_err(store.session("ex0", p.key, T0 + 10 * S).await),
        QueueError::NoSession
    );
}

/// Many sessions race for few seats at once: every seat ends with at most one holder, each
/// success is exactly what the inventory shows, and nothing is sold twice.
pub async fn racing_holds_never_share_a_seat(store: Arc<dyn Store>) {
    let k = sale(
        &store,
        "hr",
        10,
        24,
        serde_json::json!({"max_holds_per_session": 2}),
    )
    .await;
    let mut tasks = Vec::new();
    for (i, key) in k.iter().enumerate() {
        let (store, key) = (store.clone(), *key);
        tasks.push(tokio::spawn(async move {
            let want = ids(&[
                &format!("A-{}", i % 10 + 1),
                &format!("A-{}", (i * 7) % 10 + 1),
            ]);
            (key, store.hold("hr", key, &want, T0 + S).await)
        }));
    }
    let mut won: HashMap<String, u64> = HashMap::new();
    for t in tasks {
        let (key, r) = t.await.unwrap();
        match r {
            Ok(h) => {
                for item in h.holds {
                    assert!(
                        won.insert(item.item.clone(), key.seq).is_none(),
                        "{} held twice",
                        item.item
                    );
                }
            }
            Err(e) => assert_eq!(e.queue(), Some(&QueueError::HoldConflict)),
        }
    }
    let view = store.inventory("hr", T0 + S).await.unwrap();
    for (id, s) in &view.items {
        match s {
            ItemState::Held { seq, .. } => assert_eq!(won.get(id), Some(seq)),
            _ => assert!(!won.contains_key(id)),
        }
    }
    assert_eq!(view.counts.held, won.len() as u64);
    // Every session completes at once: each seat is sold to its one holder.
    let mut tasks = Vec::new();
    for key in k {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            store.complete("hr", key, T0 + 2 * S).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let view = store.inventory("hr", T0 + 2 * S).await.unwrap();
    for (id, s) in &view.items {
        match s {
            ItemState::Sold { seq } => assert_eq!(won.get(id), Some(seq)),
            _ => assert!(!won.contains_key(id)),
        }
    }
    assert_eq!((view.counts.sold, view.counts.held), (won.len() as u64, 0));
}

/// Deleting an event removes its inventory with it.
pub async fn delete_event_removes_inventory(store: Arc<dyn Store>) {
    let k = sale(&store, "hd", 3, 1, serde_json::json!({})).await;
    store.hold("hd", k[0], &ids(&["A-1"]), T0).await.unwrap();
    store.delete_event("hd").await.unwrap();
    make_event(&store, "hd", serde_json::json!({})).await;
    let c = counts(&store, "hd", T0).await;
    assert_eq!((c.total, c.held), (0, 0));
}
