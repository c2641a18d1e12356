//! The accounting of `waitroom-bench`'s open-loop generator (bench/open_loop.rs), against
//! a tiny server that answers after a delay the request names:
//!
//! - latency counts from each slot's *intended* time, so the wait of slots queued behind a
//!   slow server is in it (it would not be if it were measured from the actual send);
//! - slots never sent by the deadline are still counted, with their wait, as `unsent`;
//! - while slots wait, the generator opens more connections, up to its cap;
//! - the request of every slot is the one the workload wrote for it.

#[path = "../bench/common.rs"]
mod common;
#[allow(dead_code)] // the bench reads the CPU figures
#[path = "../bench/open_loop.rs"]
mod open_loop;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;

use common::{percentiles, Target};
use open_loop::{Outcome, Plan, WriteFn};

/// A server whose `GET /sleep/MS/N` answers after MS milliseconds; answers its address and
/// how many requests it served.
async fn sleepy_server() -> (Target, Arc<AtomicU64>) {
    let served = Arc::new(AtomicU64::new(0));
    let counter = served.clone();
    let app = axum::Router::new().route(
        "/sleep/{ms}/{n}",
        get(move |Path((ms, _n)): Path<(u64, u64)>| {
            let counter = counter.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                counter.fetch_add(1, Ordering::Relaxed);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let target = Target::from_url(&format!("http://{addr}")).unwrap();
    (target, served)
}

/// Every slot asks for a wait of `delay(n)` ms.
fn sleeper(host: &str, delay: fn(u64) -> u64) -> Arc<WriteFn> {
    let host = host.to_string();
    Arc::new(move |n, _rng: &mut u64, out: &mut Vec<u8>| {
        out.clear();
        common::get_request(&host, &format!("/sleep/{}/{n}", delay(n)), out);
    })
}

fn plan(target: &Target, rate: u32, conns: usize, max: usize, threads: usize) -> Plan {
    Plan {
        target: target.clone(),
        rate,
        connections: conns,
        max_connections: max,
        threads,
        warmup: Duration::ZERO,
        dur: Duration::from_secs(1),
        give_up_after: Duration::from_secs(5),
    }
}

async fn run(plan: Plan, write: Arc<WriteFn>) -> Outcome {
    tokio::task::spawn_blocking(move || open_loop::run(&plan, None, write))
        .await
        .unwrap()
        .unwrap()
}

/// One connection, 100 slots a second for a second, every answer 30 ms late: the
/// connection sends one slot per 30 ms, so slot k goes out at ~30k ms and its wait since
/// its intended time (10k ms) grows to ~2 s for the last one. Measured from the actual
/// send, every latency would be ~30 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_counts_from_the_intended_time() {
    let (target, served) = sleepy_server().await;
    let out = run(plan(&target, 100, 1, 1, 1), sleeper(&target.host, |_| 30)).await;
    let mut t = out.tally;
    assert_eq!(t.count(), 100, "every slot of the window is counted");
    assert_eq!(t.by_status.get(&200), Some(&100));
    assert_eq!(t.unsent, 0);
    assert_eq!(out.connections, 1);
    assert_eq!(served.load(Ordering::Relaxed), 100);
    // Each sample: latency = send lag + service time (to the microsecond's rounding).
    for i in 0..t.lat_us.len() {
        let sum = u64::from(t.lag_us[i]) + u64::from(t.svc_us[i]);
        assert!(u64::from(t.lat_us[i]).abs_diff(sum) <= 1, "sample {i}");
        assert!(
            t.svc_us[i] >= 30_000,
            "the server's wait is in the service time"
        );
    }
    let lat = percentiles(&mut t.lat_us);
    let svc = percentiles(&mut t.svc_us);
    // The queue behind the one connection: ~2 s for the last slot, ~1 s at the median.
    assert!(lat.max >= 1_500_000, "latency max {} µs", lat.max);
    assert!(lat.p50 >= 500_000, "latency p50 {} µs", lat.p50);
    // What the server itself took stays its 30 ms (far below the queue's wait).
    assert!(svc.p50 < 400_000, "service p50 {} µs", svc.p50);
}

/// Some slots (every tenth) wait 80 ms at the server, with connections to spare: their
/// latency holds the wait and the others' does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_count_in_full() {
    let (target, _) = sleepy_server().await;
    let out = run(
        plan(&target, 200, 32, 32, 2),
        sleeper(&target.host, |n| if n % 10 == 0 { 80 } else { 0 }),
    )
    .await;
    let t = out.tally;
    assert_eq!(t.count(), 200);
    let slow = t.lat_us.iter().filter(|&&l| l >= 80_000).count();
    assert!((20..=40).contains(&slow), "{slow} answers of ≥ 80 ms");
}

/// One connection, 100 slots in a second, every answer 300 ms late, slots given up half a
/// second after the window: only ~5 can be sent; the rest are counted as unsent, with the
/// wait they had when given up (≥ the 0.5 s past the window for every one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_never_sent_are_counted() {
    let (target, served) = sleepy_server().await;
    let mut p = plan(&target, 100, 1, 1, 1);
    p.give_up_after = Duration::from_millis(500);
    let out = run(p, sleeper(&target.host, |_| 300)).await;
    let t = out.tally;
    let answered = t.by_status.get(&200).copied().unwrap_or(0);
    assert_eq!(
        t.count(),
        100,
        "answered and unsent slots are all in the latencies"
    );
    assert_eq!(answered + t.unsent, 100);
    assert!(t.unsent >= 85, "{} unsent", t.unsent);
    assert_eq!(t.errors(), t.unsent);
    assert_eq!(served.load(Ordering::Relaxed), answered);
    // An unsent slot's latency is its wait until given up: at least from its time to the
    // window's end plus half a second, so never below 0.5 s.
    let unsent_min = t
        .lat_us
        .iter()
        .zip(&t.svc_us)
        .filter(|(_, &svc)| svc == 0)
        .map(|(&l, _)| l)
        .min()
        .unwrap();
    assert!(
        unsent_min >= 500_000,
        "an unsent slot's wait {unsent_min} µs"
    );
}

/// A slow server and one connection to start with: slots wait, so the generator opens
/// more, one at a time, up to its cap (here 8 over two threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_connections_while_slots_wait() {
    let (target, _) = sleepy_server().await;
    let out = run(plan(&target, 200, 2, 8, 2), sleeper(&target.host, |_| 40)).await;
    assert!(
        (3..=8).contains(&out.connections),
        "{} connections",
        out.connections
    );
    assert_eq!(out.tally.count(), 200);
    assert_eq!(out.tally.by_status.get(&200), Some(&200));
}

/// Each slot is sent once, with the request written for its own number (two threads
/// share the schedule by turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_is_sent_once() {
    let (target, served) = sleepy_server().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let host = target.host.clone();
    let log = seen.clone();
    let write: Arc<WriteFn> = Arc::new(move |n, _rng: &mut u64, out: &mut Vec<u8>| {
        log.lock().unwrap().push(n);
        out.clear();
        common::get_request(&host, &format!("/sleep/0/{n}"), out);
    });
    let out = run(plan(&target, 500, 4, 4, 2), write).await;
    assert_eq!(out.tally.count(), 500);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..500).collect::<Vec<u64>>());
    assert_eq!(served.load(Ordering::Relaxed), 500);
}

/// Idle connections are taken in turn: at a rate one connection could carry alone, every
/// one of them still sends (none sits unused until the server's header timeout closes it,
/// which would show as an error when a burst finally takes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_is_used_in_turn() {
    use std::collections::HashSet;
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;

    let peers: Arc<std::sync::Mutex<HashSet<SocketAddr>>> = Arc::default();
    let seen = peers.clone();
    let app = axum::Router::new().route(
        "/sleep/{ms}/{n}",
        get(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
            seen.lock().unwrap().insert(peer);
            async { "ok" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    let target = Target::from_url(&format!("http://{addr}")).unwrap();
    let out = run(plan(&target, 50, 6, 6, 1), sleeper(&target.host, |_| 0)).await;
    assert_eq!(out.tally.by_status.get(&200), Some(&50));
    assert_eq!(peers.lock().unwrap().len(), 6, "every connection sent");
}
