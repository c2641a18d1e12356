//! Conformance stories where a backend that answers `status` from a copy of the queue (the
//! Redis store's node-local replicas) could drift from the store: a status right after each
//! change of the same store, renewals of polls still queued when a later operation sweeps,
//! lapsed places before any sweep, an admitted place's window, a deleted event made again.
//! They hold for every backend; on Redis they run through the replica.

use std::sync::Arc;

use waitroom::core::{PlaceState, QueueError};
use waitroom::store::Store;

use super::{join, make_event, patch, queue_err, state, S, T0};

/// Every status right after a change of the same store shows that change.
pub async fn status_sees_each_change_at_once(store: Arc<dyn Store>) {
    make_event(&store, "rw", serde_json::json!({"max_active": 1})).await;
    let mut keys = Vec::new();
    for i in 0..6 {
        keys.push(join(&store, "rw", None, T0 + i).await.key);
    }
    let at = |i: u64| T0 + S + i;
    let pos = |v: waitroom::core::PlaceView| (v.status, v.position, v.queue_length);
    let st = |k, t| {
        let store = store.clone();
        async move { pos(store.status("rw", k, t).await.unwrap()) }
    };
    assert_eq!(st(keys[3], at(0)).await, (PlaceState::Waiting, Some(3), 5));
    assert!(store.leave("rw", keys[1], at(1)).await.unwrap());
    assert_eq!(st(keys[3], at(2)).await, (PlaceState::Waiting, Some(2), 4));
    let extra = join(&store, "rw", None, at(3)).await.key;
    assert_eq!(st(extra, at(4)).await, (PlaceState::Waiting, Some(5), 5));
    // Room for two more: the first two in line are admitted.
    store
        .update_event("rw", &patch(serde_json::json!({"max_active": 3})), at(5))
        .await
        .unwrap();
    assert_eq!(st(keys[2], at(6)).await, (PlaceState::Admitted, None, 3));
    assert_eq!(st(keys[3], at(7)).await, (PlaceState::Admitted, None, 3));
    assert_eq!(st(keys[4], at(8)).await, (PlaceState::Waiting, Some(1), 3));
    store
        .update_event("rw", &patch(serde_json::json!({"paused": true})), at(9))
        .await
        .unwrap();
    assert!(store.status("rw", keys[4], at(10)).await.unwrap().paused);
    assert_eq!(store.clear("rw", at(11)).await.unwrap(), 3);
    assert_eq!(
        queue_err(store.status("rw", keys[4], at(12)).await),
        QueueError::TokenNotFound
    );
    assert_eq!(
        st(keys[2], at(13)).await,
        (PlaceState::Admitted, None, 0),
        "clearing leaves admitted places"
    );
}

/// A poll renews its place even when a later operation of the same store is the one that
/// sweeps; a place nobody polled expires then.
pub async fn polls_outlive_a_later_sweep(store: Arc<dyn Store>) {
    make_event(
        &store,
        "pw",
        serde_json::json!({"max_active": 1, "waiting_idle_sec": 10}),
    )
    .await;
    join(&store, "pw", None, T0).await; // admitted
    let polled = join(&store, "pw", None, T0).await.key;
    let silent = join(&store, "pw", None, T0).await.key;
    let v = store.status("pw", polled, T0 + 8 * S).await.unwrap();
    assert_eq!(v.position, Some(1));
    // 12 s: the silent place's deadline (10 s) passed, the polled one's (18 s) did not.
    let late = join(&store, "pw", None, T0 + 12 * S).await;
    assert_eq!(
        late.position,
        Some(2),
        "the silent place was swept by this join"
    );
    assert_eq!(
        state(&store, "pw", silent, T0 + 12 * S).await,
        Err(QueueError::TokenExpired)
    );
    assert_eq!(
        state(&store, "pw", polled, T0 + 17 * S).await,
        Ok(PlaceState::Waiting)
    );
    // Polled again at 17 s (past the swept deadline: asked of the store itself), then not.
    assert_eq!(
        store
            .status("pw", polled, T0 + 17 * S)
            .await
            .unwrap()
            .position,
        Some(1)
    );
    assert_eq!(
        state(&store, "pw", polled, T0 + 26 * S + 999).await,
        Ok(PlaceState::Waiting)
    );
    assert_eq!(
        queue_err(store.status("pw", polled, T0 + 27 * S).await),
        QueueError::TokenExpired
    );
}

/// An admitted place shows its window shrinking, then lapses without any sweep.
pub async fn admitted_window_counts_down_then_lapses(store: Arc<dyn Store>) {
    make_event(
        &store,
        "aw",
        serde_json::json!({"max_active": 1, "ready_ttl_sec": 30}),
    )
    .await;
    let a = join(&store, "aw", None, T0).await.key;
    let v = store.status("aw", a, T0 + 10 * S).await.unwrap();
    assert_eq!(
        (v.status, v.enter_within_sec),
        (PlaceState::Admitted, Some(20))
    );
    let v = store.status("aw", a, T0 + 29 * S + 1).await.unwrap();
    assert_eq!(v.enter_within_sec, Some(1));
    assert_eq!(
        queue_err(store.status("aw", a, T0 + 30 * S).await),
        QueueError::TokenExpired
    );
}

/// A deleted event answers no status; made again under the same id, its new places (whose
/// numbers restart) answer theirs and the old tokens stay refused.
pub async fn status_after_the_event_is_made_again(store: Arc<dyn Store>) {
    make_event(&store, "re", serde_json::json!({"max_active": 1})).await;
    join(&store, "re", None, T0).await;
    let old = join(&store, "re", None, T0).await.key;
    assert_eq!(
        store.status("re", old, T0 + S).await.unwrap().position,
        Some(1)
    );
    store.delete_event("re").await.unwrap();
    assert_eq!(
        queue_err(store.status("re", old, T0 + 2 * S).await),
        QueueError::EventNotFound
    );
    make_event(&store, "re", serde_json::json!({"max_active": 1})).await;
    join(&store, "re", None, T0 + 3 * S).await;
    join(&store, "re", None, T0 + 3 * S).await;
    let new = join(&store, "re", None, T0 + 3 * S).await.key;
    assert_eq!(
        queue_err(store.status("re", old, T0 + 4 * S).await),
        QueueError::TokenNotFound
    );
    assert_eq!(
        store.status("re", new, T0 + 4 * S).await.unwrap().position,
        Some(2)
    );
}
