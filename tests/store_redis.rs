//! The Redis store against real servers: the same conformance suite and model-based
//! property test as the embedded store, on a standalone Redis and on a three-master
//! Cluster, plus what only Redis has (the periodic-work lease, notices across stores,
//! cost per operation).
//!
//! One server (and one Cluster) per test binary; each store gets a key prefix of its own,
//! so tests that reuse event ids never meet.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::conformance::{join, make_event, S, T0};
use support::redis::{shared, shared_cluster, unique_prefix};
use waitroom::core::{PlaceState, QueueError};
use waitroom::store::redis::{RedisOptions, RedisStore};
use waitroom::store::{Notice, Store};

fn options() -> RedisOptions {
    RedisOptions {
        key_prefix: unique_prefix(),
        ..RedisOptions::default()
    }
}

fn standalone() -> Arc<dyn Store> {
    Arc::new(RedisStore::new(&shared().url(), options()).unwrap())
}

fn cluster() -> Arc<dyn Store> {
    Arc::new(RedisStore::new(&shared_cluster().url(), options()).unwrap())
}

store_conformance!(async { standalone() });

#[test]
fn queue_rules_match_the_reference_model() {
    support::model::check_backend(standalone, 30, 80);
}

/// The EVALSHA path (a server before Redis 7, or `functions: false`): the same stories and
/// a shorter model run, so that both ways of calling the script are held to the rules.
mod with_evalsha {
    use super::*;

    fn evalsha() -> Arc<dyn Store> {
        let options = RedisOptions {
            functions: false,
            ..options()
        };
        Arc::new(RedisStore::new(&shared().url(), options).unwrap())
    }

    store_conformance!(async { evalsha() });

    #[test]
    fn queue_rules_match_the_reference_model() {
        support::model::check_backend(evalsha, 10, 60);
    }
}

mod on_a_cluster {
    use super::*;

    store_conformance!(async { cluster() });

    #[tokio::test]
    async fn talks_to_the_cluster() {
        let store = RedisStore::new(&shared_cluster().url(), options()).unwrap();
        assert!(store.is_cluster().await.unwrap());
        let store = RedisStore::new(&shared().url(), options()).unwrap();
        assert!(!store.is_cluster().await.unwrap());
    }

    #[test]
    fn queue_rules_match_the_reference_model() {
        support::model::check_backend(cluster, 10, 60);
    }
}

/// Two stores (two nodes) on one Redis: only one does an event's periodic work at a time,
/// and when it goes away the other takes over once the lease lapses.
#[tokio::test]
async fn one_lease_holder_per_event_and_takeover() {
    let opts = RedisOptions {
        lease: Duration::from_millis(600),
        ..options()
    };
    let url = shared().url();
    let a: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts.clone()).unwrap());
    let b: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts.clone()).unwrap());
    make_event(
        &a,
        "l",
        serde_json::json!({"max_active": 1, "ready_ttl_sec": 7}),
    )
    .await;
    join(&a, "l", None, T0).await;
    // a takes the lease; b is told to stand by.
    assert_eq!(a.tick("l", T0).await.unwrap(), Some(T0 + 7 * S));
    assert_eq!(b.tick("l", T0).await.unwrap(), None);
    // b stands by without asking Redis again until the lease could lapse.
    assert_eq!(b.tick("l", T0 + 8 * S).await.unwrap(), None);
    assert_eq!(
        b.get_event("l", T0).await.unwrap().figures.admitted,
        1,
        "b did no periodic work"
    );
    // a goes quiet (a crashed node renews nothing); after the lease, b does the work.
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Next: the expired place's token stops answering TOKEN_EXPIRED an hour later.
    assert_eq!(
        b.tick("l", T0 + 8 * S).await.unwrap(),
        Some(T0 + 8 * S + 3600 * S)
    );
    let f = b.get_event("l", T0 + 8 * S).await.unwrap().figures;
    assert_eq!(
        (f.admitted, f.expired),
        (0, 1),
        "b swept the lapsed admission"
    );
    // And now a is the one standing by.
    assert_eq!(a.tick("l", T0 + 8 * S).await.unwrap(), None);
    // A clean shutdown gives the lease up, so a newcomer need not wait for it to lapse.
    b.close().await.unwrap();
    let c: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts).unwrap());
    join(&c, "l", None, T0 + 9 * S).await;
    assert_eq!(c.tick("l", T0 + 9 * S).await.unwrap(), Some(T0 + 16 * S));
}

/// `wait_replicas` on a Cluster is refused at the start (defect: ignored without a word,
/// every change acknowledged at once while the operator believed replicas were waited
/// for).
#[tokio::test]
async fn waiting_for_replicas_is_refused_on_a_cluster() {
    let opts = RedisOptions {
        wait_replicas: 1,
        ..options()
    };
    let refused = RedisStore::connect(&shared_cluster().url(), opts)
        .await
        .err()
        .expect("refused on a Cluster")
        .to_string();
    assert!(
        refused.contains("redis_wait_replicas (1) is not supported on a Redis Cluster"),
        "{refused}"
    );
    // Without it, the same Cluster is taken.
    RedisStore::connect(&shared_cluster().url(), options())
        .await
        .unwrap();
}

/// A node that closes gives its leases back and says so: a node standing by for one
/// takes the periodic work over at once (defect: it stood by until the lease would have
/// lapsed, up to 3 s in which paced admissions and expiries of the event stopped).
#[tokio::test]
async fn a_closing_node_hands_its_leases_to_a_node_standing_by() {
    let (url, opts) = (shared().url(), options());
    let a: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts.clone()).unwrap());
    let b: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts).unwrap());
    make_event(
        &a,
        "handover",
        serde_json::json!({"max_active": 1, "ready_ttl_sec": 7}),
    )
    .await;
    join(&a, "handover", None, T0).await;
    // b's relay listens before anything is said.
    b.ping().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.tick("handover", T0).await.unwrap(), Some(T0 + 7 * S));
    assert_eq!(b.tick("handover", T0).await.unwrap(), None, "a holds it");
    a.close().await.unwrap();
    let asked = Instant::now();
    // The lease is 3 s; b takes it well before it would have lapsed.
    loop {
        if let Some(next) = b.tick("handover", T0 + S).await.unwrap() {
            assert_eq!(next, T0 + 7 * S);
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_millis(1500),
            "b still stands by"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two nodes on one Redis, one's clock ahead of the other's: the opening the first
/// reaches holds for the second, whose clock is still before it (its status answered by
/// the script and by its replica alike), and its changes of `opens_at` are changes after
/// the opening (`conformance_schedule.rs`).
#[tokio::test]
async fn an_opening_one_node_reached_holds_for_a_node_behind() {
    let opts = options();
    let ahead: Arc<dyn Store> = Arc::new(RedisStore::new(&shared().url(), opts.clone()).unwrap());
    let behind: Arc<dyn Store> = Arc::new(RedisStore::new(&shared().url(), opts).unwrap());
    support::conformance::opening_reached_holds_for_a_clock_behind(&ahead, &behind).await;
}

/// A loopback relay to the Redis at `port` that holds the first request carrying
/// `marker` (bytes as they travel: RESP) until `release` fires, after telling `held`; all
/// else passes as it comes. The relay's port is answered.
async fn holding_relay(
    port: u16,
    marker: &'static [u8],
) -> (
    u16,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    let (held_tx, held) = tokio::sync::oneshot::channel();
    let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
    let hold = Arc::new(parking_lot::Mutex::new(Some((held_tx, release_rx))));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (client, _) = listener.accept().await.unwrap();
            let server = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            });
            let hold = hold.clone();
            tokio::spawn(async move {
                // The marker may straddle two reads: the end of the last one is kept.
                let mut seen: Vec<u8> = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(marker.len()).any(|w| w == marker) {
                        let taken = hold.lock().take();
                        if let Some((held_tx, release_rx)) = taken {
                            let _ = held_tx.send(());
                            let _ = release_rx.await;
                        }
                    }
                    let keep = seen.len().saturating_sub(marker.len());
                    seen.drain(..keep);
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (relay_port, held, release)
}

/// An `end` applied on a node whose clock is before `closes_at` while another node finds
/// the sale over by it (between the first node's read of the settings and its write)
/// keeps the closes_at instant as its moment, as API.md promises: the write finds the
/// record of the end changed, and the end is read and applied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_racing_the_close_found_by_another_node_keeps_the_close() {
    let opts = options();
    let ahead: Arc<dyn Store> = Arc::new(RedisStore::new(&shared().url(), opts.clone()).unwrap());
    // The node behind talks to Redis through a relay that holds its first settings write
    // (the script's `put`, its operation name a RESP bulk string).
    let (port, held, release) = holding_relay(shared().port, b"\r\n$3\r\nput\r\n").await;
    let behind: Arc<dyn Store> =
        Arc::new(RedisStore::new(&format!("redis://127.0.0.1:{port}"), opts).unwrap());
    let closes = T0 + 10 * S;
    make_event(
        &ahead,
        "ev",
        serde_json::json!({
            "max_active": 1,
            "closes_at": waitroom::core::lifecycle::format_rfc3339(closes),
        }),
    )
    .await;
    let end = waitroom::core::EventPatch {
        end: Some(waitroom::core::SaleEnd {
            reason: waitroom::core::EndCause::SoldOut,
            message: None,
            at: closes - 5 * S,
        }),
        ..waitroom::core::EventPatch::default()
    };
    let ending = {
        let behind = behind.clone();
        tokio::spawn(async move { behind.update_event("ev", &end, closes - 5 * S).await })
    };
    // The node behind read the settings (no end seen yet) and applied the end to them.
    held.await.unwrap();
    // The node ahead finds the sale over by closes_at: the store records it.
    let seen = ahead.get_event("ev", closes + S).await.unwrap();
    assert_eq!(seen.config.end_seen_at, Some(closes + S));
    release.send(()).unwrap();
    let ended = ending.await.unwrap().unwrap();
    assert_eq!(
        ended.ended.map(|e| e.at),
        Some(closes),
        "the close's moment"
    );
    let stored = ahead.get_event("ev", closes + 2 * S).await.unwrap();
    assert_eq!(stored.config.ended.map(|e| e.at), Some(closes));
}

/// What one node changes reaches the subscribers of another node.
#[tokio::test]
async fn notices_reach_other_nodes() {
    notices_travel(shared().url()).await;
}

/// The same across a Cluster: PUBLISH on one shard reaches a subscriber on another.
#[tokio::test]
async fn notices_reach_other_nodes_on_a_cluster() {
    notices_travel(shared_cluster().url()).await;
}

/// The relay keeps its subscription on a quiet channel: its keep-alive PING, which a
/// subscribed RESP2 connection answers as an array, is not taken for a dead link (that
/// reconnected every 5 s and told every event moved, losing what was published meanwhile).
#[tokio::test]
async fn a_quiet_relay_keeps_its_subscription() {
    let s = standalone();
    make_event(&s, "quiet", serde_json::json!({})).await;
    s.ping().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut notices = s.subscribe();
    // Past the relay's keep-alive (every 5 s of silence).
    tokio::time::sleep(Duration::from_secs(7)).await;
    let heard = notices.try_recv();
    assert!(
        matches!(
            heard,
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "a quiet store told {heard:?}"
    );
}

async fn notices_travel(url: String) {
    let opts = options();
    let a: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts.clone()).unwrap());
    let b: Arc<dyn Store> = Arc::new(RedisStore::new(&url, opts).unwrap());
    make_event(&a, "n", serde_json::json!({"max_active": 1})).await;
    // Both connected (b's relay subscribed) before anything happens.
    b.ping().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut on_b = b.subscribe();
    let first = join(&a, "n", None, T0).await;
    let second = join(&a, "n", None, T0).await;
    assert_eq!(second.status, PlaceState::Waiting);
    assert!(a.leave("n", first.key, T0 + S).await.unwrap());
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !seen.contains(&Notice::Admitted {
        event_id: "n".into(),
        seq: second.key.seq,
    }) {
        let n = tokio::time::timeout_at(deadline, on_b.recv())
            .await
            .expect("b hears a's changes")
            .unwrap();
        seen.push(n);
    }
    assert!(seen.contains(&Notice::Ended {
        event_id: "n".into(),
        seq: first.key.seq,
        reason: waitroom::core::EndReason::Left,
    }));
    assert!(seen.contains(&Notice::Moved {
        event_id: "n".into()
    }));

    // Settings changes and deletions travel too: every node wakes its scheduler, forgets
    // the event's gauges and ends its live followers.
    let paused = serde_json::from_value(serde_json::json!({"paused": true})).unwrap();
    a.update_event("n", &paused, T0 + S).await.unwrap();
    a.delete_event("n").await.unwrap();
    let mut events = Vec::new();
    while events.len() < 2 {
        let n = tokio::time::timeout_at(deadline, on_b.recv())
            .await
            .expect("b hears a's event changes")
            .unwrap();
        if matches!(n, Notice::EventChanged { .. } | Notice::EventDeleted { .. }) {
            events.push(n);
        }
    }
    assert_eq!(
        events,
        [
            Notice::EventChanged {
                event_id: "n".into()
            },
            Notice::EventDeleted {
                event_id: "n".into()
            }
        ]
    );
}

/// Differential check, stricter than the model test: the Redis store and the embedded store
/// (the reference) get the same random operations at the same times and must give the same
/// answers, field for field: views with positions and ETAs, error codes, figures, the head
/// of the queue.
mod same_as_embedded {
    use super::*;
    use proptest::prelude::*;
    use waitroom::core::{EventPatch, Millis, PlaceKey};
    use waitroom::store::embedded::EmbeddedStore;
    use waitroom::store::{JoinRequest, StoreError};

    #[derive(Debug, Clone)]
    enum Op {
        Join(Option<u8>, bool),
        Status(usize),
        Heartbeat(usize),
        Peek(usize),
        Enter(usize),
        Leave(usize),
        SessionHeartbeat(usize),
        Session(usize),
        Complete(usize),
        Clear,
        Tick,
        Head(usize),
        Advance(Millis),
        Configure(serde_json::Value),
    }

    fn patch() -> impl Strategy<Value = serde_json::Value> {
        (
            1u64..5,
            prop_oneof![Just(1.0), Just(1.5), Just(2.5)],
            prop::bool::weighted(0.2),
            prop_oneof![2 => Just(None), 1 => (1u64..300).prop_map(Some)],
            // (`waiting_idle_sec` starts at 3.)
            (1u64..8, 1u64..8, 2u64..15, 3u64..10),
            prop_oneof![3 => Just(None), 1 => (1u64..6).prop_map(Some)],
            prop::bool::weighted(0.9),
        )
            .prop_map(|(m, r, p, apm, (rt, si, sm, wi), mq, aj)| {
                serde_json::json!({
                    "max_active": m, "overbooking_ratio": r, "paused": p,
                    "admit_per_minute": apm, "ready_ttl_sec": rt, "session_idle_sec": si,
                    "session_max_sec": sm, "waiting_idle_sec": wi, "max_queue_length": mq,
                    "accept_joins": aj,
                })
            })
    }

    /// An operation; those on one place pick among the first `places` places joined.
    fn op(places: usize) -> impl Strategy<Value = Op> {
        let i = 0usize..places;
        prop_oneof![
            6 => (prop::option::weighted(0.6, 0u8..4), prop::bool::weighted(0.3))
                .prop_map(|(u, m)| Op::Join(u, m)),
            3 => i.clone().prop_map(Op::Status),
            2 => i.clone().prop_map(Op::Heartbeat),
            1 => i.clone().prop_map(Op::Peek),
            3 => i.clone().prop_map(Op::Enter),
            2 => i.clone().prop_map(Op::Leave),
            2 => i.clone().prop_map(Op::SessionHeartbeat),
            1 => i.clone().prop_map(Op::Session),
            2 => i.prop_map(Op::Complete),
            1 => Just(Op::Clear),
            2 => Just(Op::Tick),
            1 => (0usize..6).prop_map(Op::Head),
            4 => prop_oneof![9 => 1u64..5000, 1 => 3_000_000u64..4_000_000].prop_map(Op::Advance),
            1 => patch().prop_map(Op::Configure),
        ]
    }

    fn q<T>(r: Result<T, StoreError>) -> Result<T, waitroom::core::QueueError> {
        r.map_err(|e| match e {
            StoreError::Queue(q) => q,
            other => panic!("store failed: {other}"),
        })
    }

    fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let emb: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
        let red = standalone();
        let ev = "diff";
        let first: EventPatch = serde_json::from_value(serde_json::json!({
            "max_active": 2, "ready_ttl_sec": 3, "session_idle_sec": 3,
            "session_max_sec": 8, "waiting_idle_sec": 4
        }))
        .unwrap();
        let mut now = T0;
        rt.block_on(async {
            let a = q(emb.put_event(ev, &first, now).await);
            let b = q(red.put_event(ev, &first, now).await);
            prop_assert_eq!(a, b);
            let mut keys: Vec<PlaceKey> = Vec::new();
            let mut nonce = 0u128;
            for (step, op) in ops.into_iter().enumerate() {
                let pick = |i: usize| keys.get(i % keys.len().max(1)).copied();
                macro_rules! both {
                    ($s:ident => $call:expr) => {{
                        let a = {
                            let $s = &emb;
                            q($call.await)
                        };
                        let b = {
                            let $s = &red;
                            q($call.await)
                        };
                        prop_assert_eq!(&a, &b, "step {}: {:?}", step, op);
                        a.ok()
                    }};
                }
                match &op {
                    Op::Join(user, meta) => {
                        nonce += 1;
                        let req = JoinRequest {
                            user_id: user.map(|u| format!("user-{u}")),
                            metadata: meta.then(|| r#"{"seat":"A1"}"#.to_string()),
                            nonce: nonce * 0x9E37_79B9_7F4A_7C15_F39C,
                            // Both kinds of repeat join, proven and not.
                            proven: nonce % 3 != 0,
                            invite: None,
                        };
                        if let Some(v) = both!(s => s.join(ev, &req, now)) {
                            if !keys.contains(&v.key) {
                                keys.push(v.key);
                            }
                        }
                    }
                    Op::Status(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.status(ev, k, now));
                        }
                    }
                    Op::Heartbeat(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.heartbeat(ev, k, now));
                        }
                    }
                    Op::Peek(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.peek(ev, k, now));
                        }
                    }
                    Op::Enter(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.enter(ev, k, now));
                        }
                    }
                    Op::Leave(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.leave(ev, k, now));
                        }
                    }
                    Op::SessionHeartbeat(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.session_heartbeat(ev, k, now));
                        }
                    }
                    Op::Session(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.session(ev, k, now));
                        }
                    }
                    Op::Complete(i) => {
                        if let Some(k) = pick(*i) {
                            both!(s => s.complete(ev, k, now));
                        }
                    }
                    Op::Clear => {
                        both!(s => s.clear(ev, now));
                    }
                    Op::Head(n) => {
                        both!(s => s.queue_head(ev, *n, now));
                    }
                    Op::Tick | Op::Advance(_) => {
                        if let Op::Advance(ms) = op {
                            now += ms;
                        }
                        // The embedded store may report an earlier wake-up (a superseded
                        // deadline still on its heap, even of a place that is gone); what
                        // the tick did must be the same.
                        let a = q(emb.tick(ev, now).await).unwrap();
                        let b = q(red.tick(ev, now).await).unwrap();
                        prop_assert!(
                            b.is_none() || a.is_some_and(|a| Some(a) <= b),
                            "step {}: next tick {:?} vs {:?}",
                            step,
                            a,
                            b
                        );
                    }
                    Op::Configure(p) => {
                        let p: EventPatch = serde_json::from_value(p.clone()).unwrap();
                        both!(s => s.put_event(ev, &p, now));
                    }
                }
                let a = q(emb.get_event(ev, now).await).unwrap();
                let b = q(red.get_event(ev, now).await).unwrap();
                prop_assert_eq!(a, b, "step {}: figures after {:?}", step, op);
            }
            Ok(())
        })
    }

    #[test]
    fn answers_match_the_embedded_store() {
        let config = ProptestConfig {
            cases: 60,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest!(config, |(ops in proptest::collection::vec(op(64), 1..120))| {
            run(ops)?;
        });
    }

    /// The same over places spread across several of Redis's chunks of 32 seqs (the line,
    /// the heartbeats and the records are split by seq): 450 joins first, then operations on
    /// any of them, so leaves, expiries, admissions and clears cross chunk boundaries.
    #[test]
    fn answers_match_the_embedded_store_across_chunks() {
        let config = ProptestConfig {
            cases: 6,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest!(config, |(ops in proptest::collection::vec(op(450), 1..80))| {
            let mut all: Vec<Op> = (0..450).map(|i| Op::Join(None, i % 50 == 0)).collect();
            all.extend(ops);
            run(all)?;
        });
    }

    /// Joins interleaved with everything else, so that the line's tail chunk (kept out of
    /// Redis's Fenwick tree until the joins pass it) fills, loses places to leaves, expiries,
    /// admissions and clears, and is passed while it holds a part of the line; then every
    /// place's view (its position) is compared.
    #[test]
    fn answers_match_the_embedded_store_as_joins_cross_chunks() {
        let config = ProptestConfig {
            cases: 8,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        let steps = proptest::collection::vec((op(300), 0usize..5), 1..80);
        proptest!(config, |(prefix in 100usize..128, steps in steps)| {
            let mut all: Vec<Op> = (0..prefix).map(|_| Op::Join(None, false)).collect();
            for (op, joins) in steps {
                all.push(op);
                all.extend((0..joins).map(|_| Op::Join(None, false)));
            }
            all.extend((0..400).map(Op::Status));
            run(all)?;
        });
    }
}

/// The audit list is one for every node sharing the Redis: written on one, read on another.
#[tokio::test]
async fn the_audit_list_is_shared_by_every_node() {
    let opts = options();
    let a = RedisStore::new(&shared().url(), opts.clone()).unwrap();
    let b = RedisStore::new(&shared().url(), opts).unwrap();
    a.append_audit("from-a", 10).await.unwrap();
    b.append_audit("from-b", 10).await.unwrap();
    assert_eq!(a.audit_entries(10).await.unwrap(), ["from-b", "from-a"]);
    assert_eq!(b.audit_entries(10).await.unwrap(), ["from-b", "from-a"]);
}

/// The memory gauges: Redis's own estimate of an event's keys, which grows with its queue
/// and is sampled by the background task into `waitroom_store_memory_bytes`; the embedded
/// store does not tell, and its sampling task ends at once.
#[tokio::test]
async fn memory_use_per_event_is_sampled_into_a_gauge() {
    for store in [standalone(), cluster()] {
        make_event(&store, "mem", serde_json::json!({"max_active": 1})).await;
        let small = store.memory_usage("mem").await.unwrap().unwrap();
        assert!(small > 0, "an event's settings take room");
        for i in 0..300 {
            join(&store, "mem", Some(&format!("user-{i}")), T0).await;
        }
        let big = store.memory_usage("mem").await.unwrap().unwrap();
        assert!(
            big > small + 300 * 16,
            "300 places take room: {small} -> {big}"
        );
        assert!(matches!(
            store.memory_usage("no such id!").await,
            Err(waitroom::store::StoreError::Queue(_))
        ));
    }

    // The task, on a store of its own (a prefix of its own: its event is the only one).
    let metrics = waitroom::telemetry::prometheus();
    let store = standalone();
    make_event(&store, "mem-gauge", serde_json::json!({})).await;
    join(&store, "mem-gauge", None, T0).await;
    let expected = store.memory_usage("mem-gauge").await.unwrap().unwrap();
    let (tx, stop) = waitroom::tasks::stop_channel();
    let task = tokio::spawn(waitroom::background::sample_store_memory(
        store.clone(),
        store.subscribe(),
        Duration::from_secs(3600),
        stop,
    ));
    let gauge = |event: &str| {
        let text = metrics.render();
        let series = format!("waitroom_store_memory_bytes{{event=\"{event}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series)?.parse::<f64>().ok())
    };
    let until_set = |event: &'static str| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(v) = gauge(event) {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "no gauge for {event}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The first round, at once.
    assert_eq!(until_set("mem-gauge").await, expected as f64);
    // An event created later is sampled on its creation, not an hour later.
    make_event(&store, "mem-new", serde_json::json!({})).await;
    let new = until_set("mem-new").await;
    assert_eq!(
        new,
        store.memory_usage("mem-new").await.unwrap().unwrap() as f64
    );
    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the task stops")
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let embedded: Arc<dyn Store> = Arc::new(
        waitroom::store::embedded::EmbeddedStore::open(
            dir.path(),
            waitroom::config::Durability::Relaxed,
            T0,
        )
        .unwrap(),
    );
    make_event(&embedded, "mem", serde_json::json!({})).await;
    assert_eq!(embedded.memory_usage("mem").await.unwrap(), None);
    let (_tx, stop) = waitroom::tasks::stop_channel();
    let notices = embedded.subscribe();
    tokio::time::timeout(
        Duration::from_secs(5),
        waitroom::background::sample_store_memory(
            embedded,
            notices,
            Duration::from_secs(3600),
            stop,
        ),
    )
    .await
    .expect("a backend that does not tell ends the sampling at its first answer");
}

/// `cargo test --release --test store_redis prequeue_opening -- --ignored --nocapture`
/// (PREQUEUE_N places, default a million): docs/PERFORMANCE.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn prequeue_opening_redis() {
    let n = std::env::var("PREQUEUE_N").map_or(1_000_000, |v| v.parse().unwrap());
    support::conformance::measure_opening(standalone(), n).await;
}

/// `cargo test --release --test store_redis sale_end -- --ignored --nocapture`
/// (END_N waiting places, default 100,000): docs/PERFORMANCE.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn sale_end_redis() {
    let n = std::env::var("END_N").map_or(100_000, |v| v.parse().unwrap());
    support::conformance::measure_end(standalone(), n).await;
}

/// The places of one event span several of Redis's chunks of 32 seqs: a whole chunk left
/// empty, scattered leaves, the head of the queue across chunks, then the end of the sale
/// removing the line in batches that cross chunk boundaries, all answered as the embedded
/// store (the reference) answers them; on a standalone Redis and on the Cluster (the chunk
/// keys are not among the script's declared keys, only in its slot).
#[tokio::test]
async fn a_line_across_chunks_answers_like_the_embedded_store() {
    line_across_chunks(standalone()).await;
}

#[tokio::test]
async fn a_line_across_chunks_answers_like_the_embedded_store_on_a_cluster() {
    line_across_chunks(cluster()).await;
}

async fn line_across_chunks(red: Arc<dyn Store>) {
    use support::conformance::end_sale;
    use waitroom::core::EndCause;
    use waitroom::store::embedded::EmbeddedStore;
    let emb: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let ev = "chunks";
    let mut keys = Vec::new();
    for s in [&emb, &red] {
        make_event(s, ev, serde_json::json!({"max_active": 1})).await;
        let mut mine = Vec::new();
        for _ in 0..1300 {
            mine.push(join(s, ev, None, T0).await.key);
        }
        keys.push(mine);
    }
    // Seqs 256..384 (one whole chunk) and every fifth place leave.
    for (s, mine) in [&emb, &red].into_iter().zip(&keys) {
        for k in mine {
            if (256..384).contains(&k.seq) || k.seq % 5 == 0 {
                assert!(s.leave(ev, *k, T0 + 1).await.unwrap());
            }
        }
    }
    let view = |s: &Arc<dyn Store>, k| {
        let s = s.clone();
        async move {
            s.status(ev, k, T0 + 2)
                .await
                .ok()
                .map(|v| (v.status, v.position))
        }
    };
    for (a, b) in keys[0].iter().zip(&keys[1]) {
        assert_eq!(a.seq, b.seq);
        assert_eq!(view(&emb, *a).await, view(&red, *b).await, "seq {}", a.seq);
    }
    let head = |s: &Arc<dyn Store>| {
        let s = s.clone();
        async move { s.queue_head(ev, 1000, T0 + 2).await.unwrap() }
    };
    assert_eq!(head(&emb).await, head(&red).await);
    for s in [&emb, &red] {
        end_sale(s, ev, EndCause::SoldOut, T0 + 3).await;
    }
    loop {
        let a = emb.get_event(ev, T0 + 3).await.unwrap();
        let b = red.get_event(ev, T0 + 3).await.unwrap();
        assert_eq!(a, b);
        if a.figures.waiting == 0 {
            break;
        }
        emb.tick(ev, T0 + 3).await.unwrap();
        red.tick(ev, T0 + 3).await.unwrap();
    }
    // Nothing of the line is left in Redis's chunks: the memory figure is back to the fixed
    // keys once deleted.
    red.delete_event(ev).await.unwrap();
    assert_eq!(red.memory_usage(ev).await.unwrap(), Some(0));
}

/// A step that would admit thousands (a resume, a capacity raise, an opening) admits at
/// most `END_BATCH` places a script, and the tick, answering "at once", admits the rest:
/// Redis runs one script at a time for every event it holds, and such a step took it
/// 100-200 us a place (a second and more for thousands, past an operation's time bound).
/// In between, those not yet admitted wait with exact positions.
#[tokio::test]
async fn a_step_admitting_thousands_is_cut_into_bounded_scripts() {
    use support::conformance::patch;
    use waitroom::core::schedule::format_rfc3339;
    use waitroom::core::END_BATCH;
    const N: usize = 1_200;
    let s = standalone();
    for (ev, settings, go) in [
        (
            "resume",
            serde_json::json!({"max_active": 1, "paused": true}),
            serde_json::json!({"max_active": 2_000, "paused": false}),
        ),
        (
            "opening",
            serde_json::json!({"max_active": 2_000, "opens_at": format_rfc3339(T0 + 10 * S)}),
            serde_json::json!({}),
        ),
    ] {
        // (An opening needs the event's secret, which the HTTP layer draws.)
        let mut settings = patch(settings);
        settings.fresh_secret = Some([7; 32]);
        s.put_event(ev, &settings, T0).await.unwrap();
        let mut keys = Vec::new();
        for _ in 0..N {
            keys.push(join(&s, ev, None, T0).await.key);
        }
        // The resume is a change of settings; the opening comes with the first tick past it.
        let at = T0 + 10 * S;
        if ev == "resume" {
            s.put_event(ev, &patch(go), at).await.unwrap();
        } else {
            assert_eq!(s.tick(ev, at).await.unwrap(), Some(at + 1));
        }
        let figures = |s: Arc<dyn Store>| async move { s.get_event(ev, at).await.unwrap().figures };
        if ev == "opening" {
            // While a pre-queue is left past the opening, every operation admits from it
            // (this read too): one batch each.
            let f = figures(s.clone()).await;
            assert_eq!(
                (f.admitted, f.waiting),
                (2 * END_BATCH as u64, (N - 2 * END_BATCH) as u64)
            );
            assert_ne!(s.tick(ev, at).await.unwrap(), Some(at + 1));
            assert_eq!(figures(s.clone()).await.admitted, N as u64);
            continue;
        }
        let f = figures(s.clone()).await;
        assert_eq!(
            (f.admitted, f.waiting),
            (END_BATCH as u64, (N - END_BATCH) as u64)
        );
        // Positions are exact meanwhile: the first not yet admitted is first in line.
        let mut views = Vec::new();
        for k in &keys {
            views.push(s.status(ev, *k, at).await.unwrap());
        }
        let first = views
            .iter()
            .position(|v| v.status == PlaceState::Waiting)
            .unwrap();
        assert_eq!((first, views[first].position), (END_BATCH, Some(1)));
        assert_eq!(views[N - 1].position, Some((N - END_BATCH) as u64));
        // Each tick admits one batch more, and asks to come back at once while any is left.
        assert_eq!(s.tick(ev, at).await.unwrap(), Some(at + 1));
        assert_eq!(figures(s.clone()).await.admitted, 2 * END_BATCH as u64);
        assert_ne!(s.tick(ev, at).await.unwrap(), Some(at + 1));
        let f = figures(s.clone()).await;
        assert_eq!((f.admitted, f.waiting), (N as u64, 0));
    }
}

/// A Redis store of its own (the refreshes of thousands of events would slow the other
/// tests' server) holding `events` events with nothing to do, `idle-0`…, seen through a
/// [`FaultStore`](waitroom::store::fault::FaultStore) that counts the scheduler's calls.
async fn thousands_of_idle_events(
    events: usize,
    lease: Duration,
) -> (
    support::redis::RedisServer,
    Arc<dyn Store>,
    Arc<waitroom::store::fault::FaultStore>,
) {
    use futures_util::StreamExt as _;
    let server = support::redis::RedisServer::start();
    let opts = RedisOptions { lease, ..options() };
    let redis: Arc<dyn Store> = Arc::new(RedisStore::new(&server.url(), opts).unwrap());
    let store = Arc::new(waitroom::store::fault::FaultStore::new(redis.clone()));
    let now = waitroom::clock::Clock::system().now();
    futures_util::stream::iter(0..events)
        .for_each_concurrent(64, |i| {
            let store = store.clone();
            async move {
                let patch = support::conformance::patch(serde_json::json!({}));
                store
                    .put_event(&format!("idle-{i}"), &patch, now)
                    .await
                    .unwrap();
            }
        })
        .await;
    (server, redis, store)
}

/// Starts the scheduler over `store` on the system clock; answers its stop sender.
fn start_scheduler(
    store: &Arc<waitroom::store::fault::FaultStore>,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = waitroom::tasks::stop_channel();
    let scheduler = waitroom::scheduler::run(
        store.clone(),
        waitroom::clock::Clock::system(),
        store.subscribe_events(),
        stopped,
    );
    (stop, tokio::spawn(scheduler))
}

/// Waits (60 s at most) until `done`.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The scheduler over a Redis store holding thousands of events: the rest of a resume's
/// step comes tick after tick (500 a script), each waiting for no tick of the other events.
/// When a pass ticked every event one after another, one script round trip each, every
/// batch of the rest waited for a whole pass: a resume of 5,000 among 5,000 events took
/// 12-21 s instead of half a second. Counted in the other events' ticks meanwhile (one
/// pass between two batches is every event's), not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_of_a_step_waits_for_no_pass_over_thousands_of_events() {
    use futures_util::StreamExt as _;
    use support::conformance::patch;
    use waitroom::core::END_BATCH;
    use waitroom::store::fault::Op;
    const EVENTS: usize = 3_000;
    const WAITING: usize = 4 * END_BATCH;
    let (_server, redis, store) =
        thousands_of_idle_events(EVENTS, RedisOptions::default().lease).await;
    let clock = waitroom::clock::Clock::system();
    let now = clock.now();
    let hot = patch(serde_json::json!({"max_active": WAITING, "paused": true}));
    store.put_event("hot", &hot, now).await.unwrap();
    let hot_store: Arc<dyn Store> = store.clone();
    futures_util::stream::iter(0..WAITING)
        .for_each_concurrent(64, |_| async {
            join(&hot_store, "hot", None, now).await;
        })
        .await;

    let (stop, scheduler) = start_scheduler(&store);
    // Every event ticked once (its lease taken): the scheduler has its plan.
    wait_until("every event ticked", || store.calls(Op::Tick) > EVENTS).await;

    // The resume admits the first 500 in its own step, the scheduler's ticks the rest.
    let before = (store.calls(Op::Tick), store.ticks_of("hot"));
    let resume = patch(serde_json::json!({"paused": false}));
    store
        .update_event("hot", &resume, clock.now())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let f = redis.get_event("hot", clock.now()).await.unwrap().figures;
        if f.admitted == WAITING as u64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "admitted {}",
            f.admitted
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hot_ticks = store.ticks_of("hot") - before.1;
    let others = store.calls(Op::Tick) - before.0 - hot_ticks;
    assert!(hot_ticks >= 3, "the rest came in {hot_ticks} ticks");
    assert!(
        others < EVENTS,
        "{others} ticks of other events while the rest of the step was admitted: a pass \
         over every event between its batches"
    );
    stop.send(true).unwrap();
    scheduler.await.unwrap();
}

/// Thousands of events keep the lease their node took: the scheduler renews each in time,
/// so none is taken again (each taking counts up the event's lease epoch, and was one
/// `took the periodic-work lease` line in the log). When a pass ticked every event one
/// after another, a pass over 5,000 events outlasted the lease on a busy host, and every
/// event's lease was taken anew at each pass: 30,000 log lines a minute. Here a lease of
/// 2 s: a pass over these events one after another outlasts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_events_keep_their_node_s_lease() {
    use waitroom::store::fault::Op;
    const EVENTS: usize = 3_000;
    let lease = Duration::from_secs(2);
    let (server, _redis, store) = thousands_of_idle_events(EVENTS, lease).await;
    let (stop, scheduler) = start_scheduler(&store);
    wait_until("every event ticked", || store.calls(Op::Tick) > EVENTS).await;
    tokio::time::sleep(5 * lease).await;
    let epochs = support::redis::raw_command(
        server.port,
        r#"EVAL "local n = 0 for _, k in ipairs(redis.call('keys', '*:m')) do n = n + tonumber(redis.call('hget', k, 'lepoch') or 0) end return n" 0"#,
    )
    .unwrap();
    let taken: usize = epochs.trim().trim_start_matches(':').parse().unwrap();
    assert!(
        taken < EVENTS + EVENTS / 10,
        "{taken} leases taken for {EVENTS} events in 5 lease lengths"
    );
    stop.send(true).unwrap();
    scheduler.await.unwrap();
}

/// A `reject` event's join is admitted even when earlier work in the same script used up
/// the bound on admissions: with a pre-queue of 1,000 left 500 by the opening's tick, the
/// join's own pass admits those 500 first, then the join itself, which `reject` let in
/// because it need not wait. Left waiting, it would have been the queue `reject` never
/// has, and every join after it refused with room free.
#[tokio::test]
async fn a_reject_join_is_admitted_past_the_bound_on_admissions() {
    use support::conformance::patch;
    use waitroom::core::schedule::format_rfc3339;
    use waitroom::core::END_BATCH;
    let s = standalone();
    let ev = "reject-cut";
    let opens = T0 + 10 * S;
    let mut settings = patch(serde_json::json!({
        "max_active": 5_000, "queueing_method": "reject", "opens_at": format_rfc3339(opens)
    }));
    settings.fresh_secret = Some([7; 32]);
    s.put_event(ev, &settings, T0).await.unwrap();
    for _ in 0..2 * END_BATCH {
        join(&s, ev, None, T0).await;
    }
    assert_eq!(s.tick(ev, opens).await.unwrap(), Some(opens + 1));
    let view = join(&s, ev, None, opens).await;
    assert_eq!(view.status, PlaceState::Admitted, "{view:?}");
    let f = s.get_event(ev, opens).await.unwrap().figures;
    assert_eq!((f.admitted, f.waiting), (2 * END_BATCH as u64 + 1, 0));
}

/// A store on the shared Redis, and the prefix of its keys.
fn standalone_and_prefix() -> (Arc<dyn Store>, String) {
    let opts = options();
    let prefix = opts.key_prefix.clone();
    let store = Arc::new(RedisStore::new(&shared().url(), opts).unwrap());
    (store, prefix)
}

/// Cuts the meta of `ev` (its keys under `prefix`) to its first `kept` numbers, as a script
/// of an older layout wrote it.
async fn cut_meta(prefix: &str, ev: &str, kept: usize) {
    let client = redis::Client::open(shared().url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("EVAL")
        .arg(
            "local v = cmsgpack.unpack(redis.call('HGET', KEYS[1], 'n')) \
             while #v > tonumber(ARGV[1]) do table.remove(v) end \
             redis.call('HSET', KEYS[1], 'n', cmsgpack.pack(v))",
        )
        .arg(1)
        .arg(format!("{prefix}:{{{ev}}}:m"))
        .arg(kept)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// An event written before the chunked layout (its meta without the layout's number) is
/// refused with a clear error rather than misread, and can still be deleted and made again.
#[tokio::test]
async fn an_event_of_the_older_layout_is_refused_and_can_be_deleted() {
    let (store, prefix) = standalone_and_prefix();
    let ev = "old";
    make_event(&store, ev, serde_json::json!({"max_active": 1})).await;
    make_event(&store, "new", serde_json::json!({})).await;
    let held = join(&store, ev, None, T0).await;
    // The meta as the older script wrote it: its first 37 numbers, without those of the
    // chunks (the line's tree, the layout).
    cut_meta(&prefix, ev, 37).await;
    for err in [
        store.get_event(ev, T0).await.err(),
        store
            .join(ev, &support::conformance::req(None), T0)
            .await
            .err(),
        store.status(ev, held.key, T0).await.err(),
        store
            .put_event(ev, &support::conformance::patch(serde_json::json!({})), T0)
            .await
            .err(),
    ] {
        let err = err.expect("refused").to_string();
        assert!(err.contains("older waitroom"), "{err}");
    }
    // The list leaves it out, so the others are still listed: gated, scheduled, shown
    // (defect: the whole list failed, and with it the gate table, which then gated
    // nothing, the admin lists, the metrics, and a node's start).
    let listed: Vec<String> = store
        .list_events(T0)
        .await
        .expect("listed without it")
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(listed, ["new"]);
    store.delete_event(ev).await.unwrap();
    assert_eq!(store.memory_usage(ev).await.unwrap(), Some(0));
    make_event(&store, ev, serde_json::json!({"max_active": 1})).await;
    assert_eq!(join(&store, ev, None, T0).await.key.seq, 1);
}

/// An event whose meta was written before the pre-queue's latest join was kept (its
/// numbers end before it) knows none of its joins: any waiting place of its pre-queue may
/// have joined just before the opening. While that pre-queue waits, the opening may not be
/// advanced before it, whatever joins come after: a later join behind the clock of an
/// earlier one (a step back) must not pass for the latest.
#[tokio::test]
async fn a_meta_without_the_pre_queue_mark_keeps_the_opening_from_being_advanced() {
    use waitroom::core::schedule::format_rfc3339;
    let (store, prefix) = standalone_and_prefix();
    let ev = "premark";
    let opens = T0 + 100 * S;
    let at =
        |t: u64| support::conformance::patch(serde_json::json!({"opens_at": format_rfc3339(t)}));
    make_event(
        &store,
        ev,
        serde_json::json!({"opens_at": format_rfc3339(opens), "waiting_idle_sec": 100_000}),
    )
    .await;
    join(&store, ev, None, T0 + 50 * S).await;
    // The meta as the script before the mark wrote it: its first 42 numbers.
    cut_meta(&prefix, ev, 42).await;
    // The clock steps back 10 s.
    join(&store, ev, None, T0 + 41 * S).await;
    let refused = store.put_event(ev, &at(T0 + 45 * S), T0 + 42 * S).await;
    assert!(
        matches!(
            refused,
            Err(waitroom::store::StoreError::Queue(QueueError::Invalid(_)))
        ),
        "{refused:?}"
    );
    let c = store
        .put_event(ev, &at(opens + 50 * S), T0 + 42 * S)
        .await
        .unwrap();
    assert_eq!(c.opens_at, Some(opens + 50 * S));
    // Back to the first opening: after every join, as it was.
    let c = store.put_event(ev, &at(opens), T0 + 43 * S).await.unwrap();
    assert_eq!(c.opens_at, Some(opens));
    let f = store.get_event(ev, T0 + 43 * S).await.unwrap().figures;
    assert_eq!(f.waiting, 2);
}

/// A Redis that may evict keys is refused (an evicted chunk loses acknowledged places
/// silently); once the policy is `noeviction`, the same store connects.
#[tokio::test]
async fn a_redis_that_may_evict_keys_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::redis::free_port(false);
    let redis = support::redis::RedisServer::start_with(
        port,
        dir.path(),
        &["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
    );
    let store = RedisStore::new(&redis.url(), options()).unwrap();
    let e = store.ping().await.unwrap_err().to_string();
    assert!(e.contains("allkeys-lru") && e.contains("noeviction"), "{e}");
    support::redis::raw_command(port, "CONFIG SET maxmemory-policy noeviction").unwrap();
    store
        .ping()
        .await
        .expect("connects once nothing can be evicted");
    // Without a memory limit nothing is evicted, whatever the policy.
    support::redis::raw_command(port, "CONFIG SET maxmemory-policy allkeys-lru").unwrap();
    support::redis::raw_command(port, "CONFIG SET maxmemory 0").unwrap();
    let unlimited = RedisStore::new(&redis.url(), options()).unwrap();
    unlimited.ping().await.expect("no limit, no eviction");
}

/// Sends `cmd` on a connection authenticated with `password`; answers the command's reply
/// line.
fn authed(port: u16, password: &str, cmd: &str) -> String {
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(format!("AUTH {password}\r\n{cmd}\r\n").as_bytes())
        .unwrap();
    let mut r = std::io::BufReader::new(s);
    let (mut auth, mut reply) = (String::new(), String::new());
    r.read_line(&mut auth).unwrap();
    assert!(auth.starts_with("+OK"), "AUTH: {auth}");
    r.read_line(&mut reply).unwrap();
    reply
}

/// A reconnection that Redis refused for a moment (a password changed and changed back)
/// does not leave the node refused for good (defect: redis-rs reconnects only after an I/O
/// error, so every call answered the refusal, `/readyz` 503, until a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reconnection_is_tried_again() {
    refused_reconnection_on("").await;
}

/// The same over RESP3, whose `HELLO` refusal is a plain server error (the review's point).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reconnection_is_tried_again_over_resp3() {
    refused_reconnection_on("?protocol=resp3").await;
}

/// A reconnection whose `SELECT` was refused (a password set for a moment: the node's URL
/// has none, and names database 1) does not leave the node refused for good either
/// (defect: the refusal is a server error, not an authentication one, and stuck).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_database_switch_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::redis::free_port(false);
    let _redis = support::redis::RedisServer::start_with(port, dir.path(), &[]);
    let store = RedisStore::new(&format!("redis://127.0.0.1:{port}/1"), options()).unwrap();
    store.ping().await.expect("no password yet");
    support::redis::raw_command(port, "CONFIG SET requirepass tmp-pw").unwrap();
    assert!(authed(port, "tmp-pw", "CLIENT KILL TYPE normal").starts_with(':'));
    let mut refused = false;
    for _ in 0..100 {
        if let Err(e) = store.ping().await {
            if e.to_string().contains("switch database") {
                refused = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "the reconnection was never refused");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(authed(port, "tmp-pw", "CONFIG SET requirepass \"\"").starts_with("+OK"));
    let mut back = false;
    for _ in 0..100 {
        if store.ping().await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "still refused 10 s after the password was taken off");
}

async fn refused_reconnection_on(query: &str) {
    let dir = tempfile::tempdir().unwrap();
    let port = support::redis::free_port(false);
    let _redis = support::redis::RedisServer::start_with(port, dir.path(), &[]);
    support::redis::raw_command(port, "CONFIG SET requirepass pw-one").unwrap();
    let url = format!("redis://:pw-one@127.0.0.1:{port}/{query}");
    let store = RedisStore::new(&url, options()).unwrap();
    store.ping().await.expect("the right password");
    assert!(authed(port, "pw-one", "CONFIG SET requirepass pw-two").starts_with("+OK"));
    assert!(authed(port, "pw-two", "CLIENT KILL TYPE normal").starts_with(':'));
    // The reconnection is refused (its retries spent): the calls say so.
    let mut refused = false;
    for _ in 0..100 {
        if let Err(e) = store.ping().await {
            let e = e.to_string().to_lowercase();
            if e.contains("auth") || e.contains("wrongpass") {
                refused = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "the connection was never refused");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        store.ping().await.is_err(),
        "the password is still the other one"
    );
    assert!(authed(port, "pw-two", "CONFIG SET requirepass pw-one").starts_with("+OK"));
    let mut back = false;
    for _ in 0..100 {
        if store.ping().await.is_ok() {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "still refused 10 s after the password was put back");
}

/// Many updates of one event at once all succeed: each retries its optimistic write, with
/// a short random pause, until its turn comes (at 8 attempts without a pause, 18 of 50
/// racing updates gave up as `Unavailable` while Redis was reachable).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_updates_of_one_event_all_succeed() {
    let store: Arc<dyn Store> = Arc::new(RedisStore::new(&shared().url(), options()).unwrap());
    make_event(&store, "busy", serde_json::json!({})).await;
    let updates: Vec<_> = (1..=50u64)
        .map(|k| {
            let store = store.clone();
            tokio::spawn(async move {
                let patch: waitroom::core::EventPatch =
                    serde_json::from_value(serde_json::json!({ "max_active": k })).unwrap();
                store.update_event("busy", &patch, T0).await
            })
        })
        .collect();
    for u in updates {
        u.await.unwrap().expect("every racing update lands");
    }
}

/// An event the events' list lost (its Cluster shard back empty, a failover to a replica
/// that missed it) is listed again by its next change, so the lists and every node's
/// scheduler see it again.
#[tokio::test]
async fn a_change_lists_an_event_the_list_lost() {
    let options = options();
    let events_key = format!("{}:events", options.key_prefix);
    let store: Arc<dyn Store> = Arc::new(RedisStore::new(&shared().url(), options).unwrap());
    make_event(&store, "kept", serde_json::json!({})).await;
    support::redis::raw_command(shared().port, &format!("DEL {events_key}")).unwrap();
    assert!(
        store.list_events(T0).await.unwrap().is_empty(),
        "the list lost it"
    );
    let patch: waitroom::core::EventPatch =
        serde_json::from_value(serde_json::json!({ "max_active": 3 })).unwrap();
    store.update_event("kept", &patch, T0).await.unwrap();
    let ids: Vec<String> = store
        .list_events(T0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(ids, ["kept"]);
}

/// A Cluster that lost a master refuses every command while its other nodes still answer
/// PING: the readiness check says so (`/readyz` answered 200 under `cluster_state:fail`).
#[tokio::test]
async fn a_cluster_that_lost_a_master_is_not_ready() {
    let mut cluster = support::redis::RedisCluster::start();
    let store = RedisStore::new(&cluster.url(), options()).unwrap();
    store.ping().await.expect("a whole cluster is ready");
    cluster.nodes.remove(1).kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match store.ping().await {
            Err(e) if e.to_string().contains("cluster") => break,
            _ if std::time::Instant::now() > deadline => {
                panic!("still ready 20 s after a master died")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A node started with `--store` naming a Cluster node that later leaves the Cluster
/// (`redis-cli --cluster del-node`, the process left running): the node goes on, ready and
/// serving, and its relay still hears the other nodes (it listened on the node that left,
/// which no longer hears the Cluster's messages).
#[tokio::test]
async fn a_node_whose_seed_left_the_cluster_goes_on() {
    let mut cluster = support::redis::RedisCluster::start();
    let seed = cluster.add_empty_master();
    // A master with slots when the nodes start, so they know it as one.
    cluster.move_slots(0, seed, 100);
    let opts = options();
    let a: Arc<dyn Store> =
        Arc::new(RedisStore::new(&cluster.nodes[seed].url(), opts.clone()).unwrap());
    let b: Arc<dyn Store> = Arc::new(RedisStore::new(&cluster.url(), opts).unwrap());
    make_event(&b, "left", serde_json::json!({"max_active": 1})).await;
    // A slot move spreads by gossip: a master may say `cluster_state:fail` for a moment
    // after it, so both nodes are asked until they are ready (a loaded machine took over a
    // second once).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a.ping().await.is_err() || b.ping().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "not ready before the seed left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut on_a = a.subscribe();
    cluster.move_slots(seed, 0, 100);
    let _gone = cluster.remove_node(seed);

    // Ready and serving again within the client's own slot refresh, and then for good.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut ready_in_a_row = 0;
    while ready_in_a_row < 20 {
        match a.ping().await {
            Ok(()) => ready_in_a_row += 1,
            Err(e) => {
                ready_in_a_row = 0;
                assert!(
                    std::time::Instant::now() < deadline,
                    "not ready 20 s after its seed left: {e}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = join(&a, "left", None, T0).await;
    assert_eq!(first.status, PlaceState::Admitted);

    // Another node's changes reach this node's followers again (a change made while the
    // relay was deaf is lost, as any during a gap; the relay then announces `Moved`).
    let changed = Notice::EventChanged {
        event_id: "left".into(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    'heard: for max_active in 2.. {
        let patch: waitroom::core::EventPatch =
            serde_json::from_value(serde_json::json!({ "max_active": max_active })).unwrap();
        b.update_event("left", &patch, T0).await.unwrap();
        let next = tokio::time::Instant::now() + Duration::from_millis(500);
        while let Ok(n) = tokio::time::timeout_at(next, on_a.recv()).await {
            if n.unwrap() == changed {
                break 'heard;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay did not hear the Cluster again within 20 s"
        );
    }

    // And every change of this node reaches the others: none is published to the node
    // that left (a command without a key goes to any node the client knows).
    let mut on_b = b.subscribe();
    for max_active in 100..120 {
        let patch: waitroom::core::EventPatch =
            serde_json::from_value(serde_json::json!({ "max_active": max_active })).unwrap();
        a.update_event("left", &patch, T0).await.unwrap();
        let within = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let n = tokio::time::timeout_at(within, on_b.recv())
                .await
                .unwrap_or_else(|_| panic!("change {max_active} did not reach the other node"))
                .unwrap();
            if n == changed {
                break;
            }
        }
    }
}

/// A spent proof of work stays spent for a node whose clock is behind the spending node's
/// (defect: the claim lived until the challenge's expiry by the spender's clock, so 45 s
/// behind, the same solution joined again once it had lapsed).
#[tokio::test]
async fn a_spent_proof_stays_spent_on_a_node_whose_clock_is_behind() {
    let opts = options();
    let prefix = opts.key_prefix.clone();
    let store = RedisStore::new(&shared().url(), opts).unwrap();
    let expires = T0 + 120 * S;
    // Spent by a node 45 s ahead: 75 s left by its clock.
    assert!(store
        .claim_once("pow", "c1", expires, T0 + 45 * S)
        .await
        .unwrap());
    let pttl: i64 =
        support::redis::raw_command(shared().port, &format!("PTTL {prefix}:{{pow}}:claim:c1"))
            .unwrap()
            .trim_start_matches(':')
            .trim()
            .parse()
            .unwrap();
    assert!(
        pttl > 120_000,
        "remembered for {pttl} ms: not until the expiry seen by a node 45 s behind"
    );
    assert!(!store.claim_once("pow", "c1", expires, T0).await.unwrap());
}

/// The invite codes read back from Redis's hash (Rust-side, by `HSCAN`) as the embedded
/// store lists them: unused, bound to a proven user, bound to an unproven join's place; in
/// code order, a page at a time; an unknown event is not found. On a standalone Redis and
/// on the Cluster (the hash is read under the event's hash tag).
#[tokio::test]
async fn invite_codes_are_listed_back_like_the_embedded_store() {
    invites_listed(standalone()).await;
}

#[tokio::test]
async fn invite_codes_are_listed_back_on_a_cluster() {
    invites_listed(cluster()).await;
}

async fn invites_listed(red: Arc<dyn Store>) {
    use waitroom::core::InviteHolder;
    use waitroom::store::embedded::EmbeddedStore;
    use waitroom::store::JoinRequest;
    let emb: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    let codes: Vec<String> = ["c3", "a1", "b2", "d4"].map(String::from).to_vec();
    let invited = |user: Option<&str>, proven: bool, code: &str| JoinRequest {
        user_id: user.map(String::from),
        metadata: None,
        nonce: 7,
        proven,
        invite: Some(code.into()),
    };
    let mut lists = Vec::new();
    for store in [&emb, &red] {
        make_event(store, "vip", serde_json::json!({"access": "invite"})).await;
        assert_eq!(store.add_invites("vip", &codes, T0).await.unwrap(), 4);
        store
            .join("vip", &invited(Some("alice"), true, "b2"), T0)
            .await
            .unwrap();
        let anon = store.join("vip", &invited(None, false, "c3"), T0).await;
        let bare = store
            .join("vip", &invited(Some("bob"), false, "d4"), T0)
            .await;
        let all = store.invites("vip", "", 100, T0).await.unwrap();
        assert_eq!(
            all,
            vec![
                ("a1".to_string(), None),
                ("b2".to_string(), Some(InviteHolder::User("alice".into()))),
                (
                    "c3".to_string(),
                    Some(InviteHolder::Place(anon.unwrap().key.seq))
                ),
                (
                    "d4".to_string(),
                    Some(InviteHolder::Place(bare.unwrap().key.seq))
                ),
            ]
        );
        let page = store.invites("vip", "a1", 2, T0).await.unwrap();
        assert_eq!(page, all[1..3].to_vec());
        assert!(store.invites("vip", "d4", 2, T0).await.unwrap().is_empty());
        match store.invites("nope", "", 10, T0).await {
            Err(waitroom::store::StoreError::Queue(QueueError::EventNotFound)) => {}
            other => panic!("expected EventNotFound, got {other:?}"),
        }
        lists.push(all);
    }
    assert_eq!(lists[0], lists[1]);
}
