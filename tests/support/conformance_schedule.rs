//! Conformance stories of the schedule (`opens_at`, the shuffled pre-queue) and the
//! queueing methods, run on every backend with the rest of the suite. The expected orders
//! are computed here with the core's functions, so the Redis script's SHA-256 and draws are
//! checked against the Rust ones.

#![allow(dead_code)] // each test binary uses the part it needs

use std::sync::Arc;

use waitroom::core::schedule::{draw, format_rfc3339, prequeue_key, EventSecret};
use waitroom::core::{EventConfig, EventPatch, Millis, PlaceKey, PlaceState, QueueError};
use waitroom::store::{Store, StoreError};

use super::conformance::{join, S, T0};

const SECRET: [u8; 32] = [0x5a; 32];
const OPENS: Millis = T0 + 100 * S;

fn patch_with_secret(json: serde_json::Value) -> EventPatch {
    let mut p: EventPatch = serde_json::from_value(json).expect("valid patch");
    p.fresh_secret = Some(SECRET);
    p
}

/// Creates `ev` at `T0` with `json` and [`SECRET`]: its settings.
async fn created(store: &Arc<dyn Store>, ev: &str, json: serde_json::Value) -> EventConfig {
    store
        .put_event(ev, &patch_with_secret(json), T0)
        .await
        .expect("event created")
}

async fn scheduled(store: &Arc<dyn Store>, ev: &str, json: serde_json::Value) {
    let mut json = json;
    json["opens_at"] = format_rfc3339(OPENS).into();
    json["waiting_idle_sec"] = 100_000.into();
    created(store, ev, json).await;
}

fn queue_err<T: std::fmt::Debug>(r: Result<T, StoreError>) -> QueueError {
    match r {
        Err(StoreError::Queue(q)) => q,
        other => panic!("expected a queue error, got {other:?}"),
    }
}

/// Leaves `key` and answers who was admitted into the freed slot.
async fn hand_on(store: &Arc<dyn Store>, ev: &str, key: PlaceKey, now: Millis) -> u64 {
    let mut notices = store.subscribe();
    assert!(store.leave(ev, key, now).await.unwrap());
    loop {
        if let waitroom::store::Notice::Admitted { seq, .. } = notices.recv().await.unwrap() {
            return seq;
        }
    }
}

/// Once the sale ended, the admin's lists of waiting places (the pre-queue's, the queue's
/// head) name none, though the tick has not removed them yet (defect: both listed the
/// ended places until their batch came).
pub async fn an_ended_prequeue_lists_nobody(store: Arc<dyn Store>) {
    scheduled(&store, "pqe", serde_json::json!({"max_active": 1})).await;
    for i in 1..=3 {
        join(&store, "pqe", None, T0 + i * S).await;
    }
    assert_eq!(
        store
            .prequeue("pqe", 0, 10, T0 + 4 * S)
            .await
            .unwrap()
            .len(),
        3
    );
    let ended =
        super::conformance::end_sale(&store, "pqe", waitroom::core::EndCause::SoldOut, T0 + 5 * S)
            .await;
    assert_eq!(ended.waiting, 3);
    let now = T0 + 5 * S;
    assert_eq!(
        store.prequeue("pqe", 0, 10, now).await.unwrap(),
        Vec::<u64>::new()
    );
    assert!(store.queue_head("pqe", 10, now).await.unwrap().is_empty());
}

pub async fn prequeue_opens_in_shuffle_order(store: Arc<dyn Store>) {
    scheduled(&store, "pq", serde_json::json!({"max_active": 1})).await;
    let mut early = Vec::new();
    for i in 1..=6 {
        let v = join(&store, "pq", None, T0 + i * S).await;
        assert_eq!(v.status, PlaceState::Waiting);
        assert_eq!(v.position, None, "no position before the opening");
        assert_eq!(v.opens_in_sec, Some(100 - i));
        early.push(v.key);
    }
    let seqs: Vec<u64> = early.iter().map(|k| k.seq).collect();
    assert_eq!(
        store.prequeue("pq", 0, 100, T0 + 7 * S).await.unwrap(),
        seqs
    );
    assert_eq!(
        store.prequeue("pq", seqs[1], 2, T0 + 7 * S).await.unwrap(),
        seqs[2..4].to_vec()
    );
    // Nobody is admitted before the opening; the tick wakes for it.
    assert_eq!(store.tick("pq", OPENS - 1).await.unwrap(), Some(OPENS));
    assert_eq!(
        store
            .get_event("pq", OPENS - 1)
            .await
            .unwrap()
            .figures
            .admitted,
        0
    );
    store.tick("pq", OPENS).await.unwrap();
    let late = join(&store, "pq", None, OPENS + 1).await;
    assert_eq!(late.position, Some(6), "behind the whole pre-queue");
    let seed = EventSecret(SECRET).shuffle_seed();
    let mut order = seqs.clone();
    order.sort_by_key(|&s| prequeue_key(&seed, s));
    assert_ne!(
        order, seqs,
        "a seed that keeps the join order shows nothing"
    );
    // Each place of the pre-queue sees its rank; the first was admitted at the opening.
    for (i, &seq) in order.iter().enumerate() {
        let key = early[seqs.iter().position(|&s| s == seq).unwrap()];
        let v = store.peek("pq", key, OPENS + 2).await.unwrap();
        if i == 0 {
            assert_eq!(v.status, PlaceState::Admitted);
        } else {
            assert_eq!(
                (v.position, v.prequeue_rank),
                (Some(i as u64), Some(i as u64))
            );
            assert_eq!(v.opens_in_sec, None);
        }
    }
    let head = store.queue_head("pq", 10, OPENS + 2).await.unwrap();
    assert_eq!(head.len(), 6);
    // Admissions follow the shuffle, then the late arrival.
    let mut holder = early[seqs.iter().position(|&s| s == order[0]).unwrap()];
    let all: Vec<PlaceKey> = early.iter().copied().chain([late.key]).collect();
    for (t, &want) in order[1..].iter().chain([&late.key.seq]).enumerate() {
        let got = hand_on(&store, "pq", holder, OPENS + 3 + t as u64).await;
        assert_eq!(got, want);
        holder = *all.iter().find(|k| k.seq == got).unwrap();
    }
}

/// With `admit_per_minute`, the tick before the opening asks for the opening (nobody can be
/// admitted sooner), not for the next rate token, which stays due while nothing is spent:
/// the scheduler would come back every few milliseconds until the opening.
pub async fn paced_prequeue_ticks_for_the_opening(store: Arc<dyn Store>) {
    scheduled(
        &store,
        "ppq",
        serde_json::json!({"max_active": 10, "admit_per_minute": 60}),
    )
    .await;
    let v = join(&store, "ppq", None, T0 + S).await;
    assert_eq!(v.status, PlaceState::Waiting);
    for now in [T0 + 2 * S, T0 + 50 * S, OPENS - 1] {
        assert_eq!(
            store.tick("ppq", now).await.unwrap(),
            Some(OPENS),
            "at {now}"
        );
    }
    store.tick("ppq", OPENS).await.unwrap();
    assert_eq!(
        store.peek("ppq", v.key, OPENS).await.unwrap().status,
        PlaceState::Admitted
    );
}

pub async fn prequeue_change_of_opens_at(store: Arc<dyn Store>) {
    scheduled(&store, "pc", serde_json::json!({})).await;
    join(&store, "pc", None, T0 + S).await;
    let moved = |t: Millis| patch_with_secret(serde_json::json!({"opens_at": format_rfc3339(t)}));
    // Postponed while ahead: fine.
    let c = store
        .put_event("pc", &moved(OPENS + 50 * S), T0 + 2 * S)
        .await
        .unwrap();
    assert_eq!(c.opens_at, Some(OPENS + 50 * S));
    // Into the past, or cleared, with a place waiting: refused, settings unchanged.
    for p in [
        moved(T0),
        patch_with_secret(serde_json::json!({"opens_at": null})),
    ] {
        let e = queue_err(store.put_event("pc", &p, T0 + 3 * S).await);
        assert!(matches!(e, QueueError::Invalid(_)), "{e:?}");
    }
    let c = store.get_event("pc", T0 + 3 * S).await.unwrap().config;
    assert_eq!(c.opens_at, Some(OPENS + 50 * S));
    assert_eq!(c.event_secret, Some(EventSecret(SECRET)));

    // A node whose clock is ahead took a join after the opening (the first-come line); a
    // node still before it may not postpone the opening: the place would move into the
    // pre-queue (it did, and the event's counts went wrong: a pre-queue of -1 places, one
    // admission too many, a place never admitted).
    scheduled(&store, "skew", serde_json::json!({"max_active": 1})).await;
    join(&store, "skew", None, T0 + S).await;
    join(&store, "skew", None, T0 + S).await;
    let late = join(&store, "skew", None, OPENS + S).await;
    assert_eq!(late.prequeue_rank, None, "joined after the opening");
    let e = queue_err(
        store
            .put_event("skew", &moved(OPENS + 50 * S), OPENS - S)
            .await,
    );
    assert!(matches!(e, QueueError::Invalid(_)), "{e:?}");
    let c = store.get_event("skew", OPENS - S).await.unwrap().config;
    assert_eq!(c.opens_at, Some(OPENS));
}

/// A clock behind the joins (this node's after a step back of 30 s, or another node's)
/// advances an opening still ahead to a time at or before a pre-queue join: refused,
/// nothing changed, since which line a place is in comes from `joined_at < opens_at`
/// (defect: both times ahead and nobody in the first-come line was enough; the places were
/// taken out of the pre-queue while held there: positions past the queue's length, and at
/// the opening one place admitted again and again, later joiners at position 2^32). A new
/// time after every join is taken, and the pre-queue opens whole.
pub async fn prequeue_opening_before_a_join_is_refused(store: Arc<dyn Store>) {
    scheduled(&store, "step", serde_json::json!({"max_active": 1})).await;
    let early = [
        join(&store, "step", None, T0 + 40 * S).await,
        join(&store, "step", None, T0 + 41 * S).await,
    ];
    let moved = |t: Millis| patch_with_secret(serde_json::json!({"opens_at": format_rfc3339(t)}));
    // The clock steps back 30 s: both the opening and the new times are ahead of it.
    let back = T0 + 11 * S;
    for t in [back + 8 * S, T0 + 40 * S, T0 + 41 * S] {
        let e = queue_err(store.put_event("step", &moved(t), back).await);
        assert!(matches!(e, QueueError::Invalid(_)), "{t}: {e:?}");
    }
    let c = store.get_event("step", back).await.unwrap().config;
    assert_eq!(c.opens_at, Some(OPENS), "nothing changed");
    for v in &early {
        let v = store.status("step", v.key, back + S).await.unwrap();
        assert_eq!((v.position, v.queue_length), (None, 2));
        assert_eq!(v.opens_in_sec, Some(88), "still in the pre-queue");
    }
    // After every join: taken, and the pre-queue stays whole.
    let opens = T0 + 42 * S;
    let c = store.put_event("step", &moved(opens), back).await.unwrap();
    assert_eq!(c.opens_at, Some(opens));
    assert_eq!(c.event_secret, Some(EventSecret(SECRET)), "kept");
    for v in &early {
        let v = store.status("step", v.key, back + S).await.unwrap();
        assert_eq!((v.position, v.queue_length), (None, 2));
        assert_eq!(v.opens_in_sec, Some(30));
    }
    // The opening admits one of them, once; the other comes first after it.
    store.tick("step", opens).await.unwrap();
    let late = join(&store, "step", None, opens + S).await;
    assert_eq!((late.position, late.queue_length), (Some(2), 2));
    let mut admitted = 0;
    for v in &early {
        let v = store.status("step", v.key, opens + S).await.unwrap();
        match v.status {
            PlaceState::Admitted => admitted += 1,
            _ => assert_eq!((v.position, v.prequeue_rank), (Some(1), Some(1))),
        }
    }
    assert_eq!(admitted, 1);
    let f = store.get_event("step", opens + S).await.unwrap().figures;
    assert_eq!((f.admitted, f.waiting), (1, 2));
}

/// The opening, once reached by one clock, holds for a clock behind it: a node whose
/// clock lags (another store on the same data, `b`), or the same node's after a step back.
pub async fn opening_reached_stays_reached(store: Arc<dyn Store>) {
    opening_reached_holds_for_a_clock_behind(&store, &store).await;
}

/// `a` reaches the opening, `b` is used only at times before it. Nobody may then be put
/// into the pre-queue again, its seed stays published, and a change of `opens_at` is one
/// after the opening: refused while places wait, and a new secret for a new opening ahead
/// (defect: with clocks 3 s apart, a node behind postponed an opening another had reached,
/// keeping the published seed as the new commitment, so a bot could pick the first rank).
pub async fn opening_reached_holds_for_a_clock_behind(a: &Arc<dyn Store>, b: &Arc<dyn Store>) {
    const SECOND: [u8; 32] = [0x77; 32];
    scheduled(a, "back", serde_json::json!({"max_active": 1})).await;
    let early: Vec<PlaceKey> = {
        let mut v = Vec::new();
        for i in 1..=3 {
            v.push(join(a, "back", None, T0 + i * S).await.key);
        }
        v
    };
    // `a` reaches the opening: it admits the first of the shuffle.
    a.tick("back", OPENS).await.unwrap();
    let after = join(a, "back", None, OPENS + S).await;
    assert_eq!(after.position, Some(3));
    // From here on, only times before the opening.
    let back = OPENS - 10 * S;
    let snap = b.get_event("back", back).await.unwrap();
    assert_eq!(snap.figures.admitted, 1);
    assert_eq!(
        snap.config.opening_ahead(back),
        None,
        "the seed stays published (no commitment again)"
    );
    let mut ranks = Vec::new();
    for &key in &early {
        // Several reads: the first goes to the script, later ones may come from a copy.
        for _ in 0..3 {
            let v = b.status("back", key, back).await.unwrap();
            assert_eq!(v.opens_in_sec, None, "no countdown again");
            if v.status == PlaceState::Waiting {
                assert!(v.position.is_some(), "{v:?}");
                ranks.push(v.prequeue_rank);
            }
        }
    }
    assert_eq!(ranks.len(), 6, "two of the pre-queue wait");
    assert!(ranks.iter().all(|r| r.is_some()));
    let late = join(b, "back", None, back).await;
    assert_eq!(late.opens_in_sec, None);
    assert_eq!(
        late.prequeue_rank, None,
        "a join now is not in the pre-queue"
    );
    assert_eq!(late.joined_at, OPENS, "dated at the opening");
    assert_eq!(
        late.position,
        Some(4),
        "behind who joined after the opening"
    );
    assert_eq!(b.prequeue("back", 0, 10, back).await.unwrap().len(), 2);
    assert_ne!(b.tick("back", back).await.unwrap(), Some(OPENS));
    // Moving the opening ahead again with places waiting: refused, nothing changed.
    let moved = |t: Millis, secret: [u8; 32]| {
        let mut p: EventPatch =
            serde_json::from_value(serde_json::json!({"opens_at": format_rfc3339(t)})).unwrap();
        p.fresh_secret = Some(secret);
        p
    };
    let e = queue_err(
        b.put_event("back", &moved(OPENS + 15 * S, SECOND), back)
            .await,
    );
    assert!(matches!(e, QueueError::Invalid(_)), "{e:?}");
    let c = b.get_event("back", back).await.unwrap().config;
    assert_eq!(c.opens_at, Some(OPENS));
    assert_eq!(c.event_secret, Some(EventSecret(SECRET)));
    assert_eq!(c.opening_ahead(back), None);
    // With nobody waiting it may move ahead: a second opening, with a new secret (the old
    // seed was published), whose pre-queue takes joins again.
    b.clear("back", back).await.unwrap();
    let c = b
        .put_event("back", &moved(OPENS + 15 * S, SECOND), back)
        .await
        .unwrap();
    assert_eq!(
        c.event_secret,
        Some(EventSecret(SECOND)),
        "a new commitment"
    );
    assert_eq!(c.opening_ahead(back), Some(OPENS + 15 * S));
    let c = a.get_event("back", back + 1).await.unwrap().config;
    assert_eq!(c.event_secret, Some(EventSecret(SECOND)));
    assert_eq!(c.opening_ahead(back + 1), Some(OPENS + 15 * S));
    let pre = join(b, "back", None, back + 2).await;
    assert_eq!(pre.opens_in_sec, Some(25), "the new pre-queue");
}

/// `opens_at` at the epoch itself (`1970-01-01T00:00:00Z`) is an opening long past, like
/// any other, on every backend: nobody waits in a pre-queue, and with places waiting it
/// can neither be set nor cleared (either would count as moving places into or out of
/// the pre-queue, as for any time after the opening). (On Redis the script once read
/// that instant as "no opening time", and took both changes.)
pub async fn opens_at_the_epoch_has_opened(store: Arc<dyn Store>) {
    let json = serde_json::json!({"max_active": 1, "opens_at": "1970-01-01T00:00:00Z"});
    let c = created(&store, "ep", json).await;
    assert_eq!(c.opens_at, Some(0));
    let first = join(&store, "ep", None, T0).await;
    assert_eq!(first.status, PlaceState::Admitted);
    let second = join(&store, "ep", None, T0).await;
    assert_eq!(
        (second.position, second.opens_in_sec, second.prequeue_rank),
        (Some(1), None, None)
    );
    let cleared = patch_with_secret(serde_json::json!({"opens_at": null}));
    let e = queue_err(store.put_event("ep", &cleared, T0 + S).await);
    assert!(matches!(e, QueueError::Invalid(_)), "{e:?}");
    let c = store.get_event("ep", T0 + S).await.unwrap().config;
    assert_eq!(c.opens_at, Some(0));

    // An event without an opening, places waiting: the epoch cannot be set either.
    created(&store, "none", serde_json::json!({"max_active": 1})).await;
    join(&store, "none", None, T0).await;
    join(&store, "none", None, T0).await;
    let set = patch_with_secret(serde_json::json!({"opens_at": "1970-01-01T00:00:00Z"}));
    let e = queue_err(store.put_event("none", &set, T0 + S).await);
    assert!(matches!(e, QueueError::Invalid(_)), "{e:?}");
    let c = store.get_event("none", T0 + S).await.unwrap().config;
    assert_eq!(c.opens_at, None);
}

pub async fn queueing_methods(store: Arc<dyn Store>) {
    let make = |ev: &'static str, method: &str| {
        let json = serde_json::json!({"max_active": 1, "queueing_method": method});
        created(&store, ev, json)
    };
    // passthrough: no cap.
    make("pass", "passthrough").await;
    for _ in 0..4 {
        assert_eq!(
            join(&store, "pass", None, T0).await.status,
            PlaceState::Admitted
        );
    }
    // reject: no queue.
    make("rej", "reject").await;
    let first = join(&store, "rej", None, T0).await;
    assert_eq!(first.status, PlaceState::Admitted);
    let refused = store.join("rej", &fresh(), T0).await;
    assert_eq!(queue_err(refused), QueueError::EventFull);
    assert_eq!(store.get_event("rej", T0).await.unwrap().figures.waiting, 0);
    assert!(store.leave("rej", first.key, T0 + 1).await.unwrap());
    assert_eq!(
        join(&store, "rej", None, T0 + 2).await.status,
        PlaceState::Admitted
    );
    // random: the admitted place is the lottery's draw, the same on every backend.
    make("lot", "random").await;
    let holder = join(&store, "lot", None, T0).await;
    let mut waiting = Vec::new();
    for _ in 0..7 {
        let v = join(&store, "lot", None, T0 + 1).await;
        assert_eq!(v.position, None, "a lottery has no positions");
        waiting.push(v.key.seq);
    }
    let admissions = store
        .get_event("lot", T0 + 1)
        .await
        .unwrap()
        .figures
        .admissions;
    let k = draw(&EventSecret(SECRET).lottery_key(), admissions, 7);
    let got = hand_on(&store, "lot", holder.key, T0 + 2).await;
    assert_eq!(got, waiting[k as usize]);
}

/// A settings change that switches an event without a secret to `random` and makes room
/// draws the places it admits, even when the same change first ends a lapsed admission
/// under the old settings (whose slot goes to the head of the line, as under `fifo`).
/// (On Redis the draws of such a change once read the secrets as they were before it,
/// none, and took the head of the line instead.)
pub async fn a_switch_to_random_draws_at_once(store: Arc<dyn Store>) {
    let json = serde_json::json!({"max_active": 1, "ready_ttl_sec": 10});
    created(&store, "sw", json).await;
    let c = store.get_event("sw", T0).await.unwrap().config;
    assert_eq!(c.event_secret, None, "no secret before the switch");
    let holder = join(&store, "sw", None, T0).await;
    assert_eq!(holder.status, PlaceState::Admitted);
    let mut line = Vec::new();
    for _ in 0..7 {
        line.push(join(&store, "sw", None, T0 + S).await.key);
    }
    // The holder's ready window lapsed at T0 + 10 s; nothing swept it yet.
    let at = T0 + 11 * S;
    let change = serde_json::json!({"max_active": 4, "queueing_method": "random"});
    store
        .put_event("sw", &patch_with_secret(change), at)
        .await
        .unwrap();
    // Under the old settings: the lapse, and the head of the line in the holder's slot
    // (the second admission). Then three draws among the rest, numbered by the admissions
    // so far.
    let key = EventSecret(SECRET).lottery_key();
    let mut rest: Vec<u64> = line[1..].iter().map(|k| k.seq).collect();
    let head: Vec<u64> = rest[..3].to_vec();
    let mut want = vec![line[0].seq];
    for n in 2..5 {
        let k = draw(&key, n, rest.len() as u64);
        want.push(rest.remove(k as usize));
    }
    assert_ne!(want[1..], head[..], "draws that take the head show nothing");
    let mut got = Vec::new();
    for k in &line {
        if store.peek("sw", *k, at).await.unwrap().status == PlaceState::Admitted {
            got.push(k.seq);
        }
    }
    want.sort_unstable();
    assert_eq!(got, want);
    let f = store.get_event("sw", at).await.unwrap().figures;
    assert_eq!((f.admitted, f.waiting, f.expired), (4, 3, 1), "{f:?}");
}

fn fresh() -> waitroom::store::JoinRequest {
    waitroom::store::JoinRequest {
        user_id: None,
        metadata: None,
        nonce: waitroom::tokens::random_u128(),
        proven: false,
        invite: None,
    }
}

/// Measures the opening of a pre-queue of `n` places (the `#[ignore]`d `prequeue_opening_*`
/// tests, docs/PERFORMANCE.md): the time of the joins, of the opening (the tick at
/// `opens_at`, which admits `max_active` = 100), and of a status read of a pre-queue place
/// after it (its rank in the shuffle). Printed, not asserted: timings are not tests.
pub async fn measure_opening(store: Arc<dyn Store>, n: u64) {
    use std::time::Instant;
    scheduled(&store, "big", serde_json::json!({"max_active": 100})).await;
    let t = Instant::now();
    let workers = 32;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            for _ in (w..n).step_by(workers as usize) {
                keys.push(join(&store, "big", None, T0 + S).await.key);
            }
            keys
        }));
    }
    let mut keys = Vec::new();
    for t in tasks {
        keys.extend(t.await.unwrap());
    }
    let joins = t.elapsed();
    let t = Instant::now();
    store.tick("big", OPENS).await.unwrap();
    let opening = t.elapsed();
    let f = store.get_event("big", OPENS).await.unwrap().figures;
    assert_eq!((f.admitted, f.waiting), (100, n - 100));
    let t = Instant::now();
    let mut ranked = 0;
    for k in keys.iter().take(1000) {
        if let Ok(v) = store.peek("big", *k, OPENS).await {
            ranked += u64::from(v.prequeue_rank.is_some());
        }
    }
    let peeks = t.elapsed();
    println!(
        "pre-queue of {n}: joins {:.1} s ({:.0} µs each, 32 at a time), opening (tick admitting 100) {:.2} ms, \
         status of a pre-queue place after it {:.0} µs ({ranked} ranked of 1000)",
        joins.as_secs_f64(),
        joins.as_micros() as f64 / n as f64,
        opening.as_secs_f64() * 1000.0,
        peeks.as_micros() as f64 / 1000.0,
    );
}
