//! Gateway mode's serving model: one serving thread per worker of the runtime, each a
//! current-thread runtime with a listening socket of its own on the same address
//! (`SO_REUSEPORT`) and a gateway of its own (its own pool of connections to the origin).
//!
//! On the multi-thread runtime a proxied request's wake-ups (the client's socket, the
//! origin's) could land on either worker, and tasks were stolen between them; here a client
//! connection is accepted, served and proxied, with the origin connections it uses, on one
//! thread, as one nginx worker serves its connections in one event loop: no wake-up crosses
//! threads, no task is stolen. The kernel spreads new connections over the sockets by their
//! addresses. What the handlers share (the store, the tokens, the gates, the metrics, the
//! caps on connections) is shared as before; a task a request spawns (a joined upgrade)
//! runs on its serving thread's runtime, which is kept running until the server is done
//! (see [`Threads::release`]). Only on the embedded store: see [`for_store`].
//!
//! A thread that ends before the shutdown stops the server (an error from `run`); one that
//! blocks (a handler holding its runtime) holds its socket's share of new connections, and
//! at shutdown is waited for a bounded time only, then logged and left behind.
//!
//! Where a second socket cannot join the address (`SO_REUSEPORT` refused), the threads share
//! the one listening socket instead, each accepting from it, and `SO_REUSEPORT` is cleared
//! on it. With `SO_REUSEPORT` on, another
//! process of the same user could bind the port too and get a share of the connections, as
//! with nginx's `reuseport`: a process of the same user could already do worse.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::future::select_all;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::{ConnectionCaps, SHUTDOWN_GRACE};
use crate::config::Settings;

/// How long past [`SHUTDOWN_GRACE`] a serving thread may take to answer that it drained,
/// and how long the threads get to exit once released. A thread still busy then is blocked
/// (a handler that holds its runtime): it is logged and left behind, so that the store is
/// closed anyway and the process can end.
const THREAD_MARGIN: Duration = Duration::from_secs(2);

/// Whether gateway mode is served by serving threads of its own (this module's): on the
/// embedded store only. The Redis store's connections are driven by tasks it spawns on
/// whichever runtime first needs them (redis-rs's `ConnectionManager` reconnects with
/// `tokio::spawn` on the runtime that saw the error; the batch lanes' drains and the
/// replica followers are spawned by the request that starts them): spawned from a serving
/// thread, the connection every thread uses would be driven by that one thread's reactor,
/// and stall whenever that thread is busy or blocked. So with Redis, gateway mode is
/// served on the shared multi-thread runtime, as before the serving threads.
pub(super) fn for_store(store: &crate::config::StoreBackend) -> bool {
    matches!(store, crate::config::StoreBackend::Embedded)
}

/// Counter of the connections each serving thread accepted (label `thread`: its index).
const ACCEPTED: &str = "waitroom_gateway_thread_connections_total";

/// The serving threads, drained and waiting for [`Threads::release`].
pub(super) struct Threads {
    release: watch::Sender<bool>,
    exited: Vec<oneshot::Receiver<()>>,
}

impl Threads {
    /// Lets the threads' runtimes go (what their requests spawned is dropped with them) and
    /// waits until they have, for [`THREAD_MARGIN`] at most (a blocked thread is logged
    /// and left). Called once the server is done, after the store is closed.
    pub(super) async fn release(self) {
        self.release.send_replace(true);
        let all = futures_util::future::join_all(self.exited);
        if tokio::time::timeout(THREAD_MARGIN, all).await.is_err() {
            tracing::error!(
                margin_ms = THREAD_MARGIN.as_millis() as u64,
                "a serving thread did not exit once released; left behind"
            );
        }
    }
}

/// Builds a serving thread's runtime (the `i`th thread's): [`current_thread_runtime`]; a
/// parameter so that the tests can make one fail.
pub(super) type RuntimeBuilder = fn(usize) -> std::io::Result<tokio::runtime::Runtime>;

/// A current-thread runtime with I/O and timers: what each serving thread runs.
pub(super) fn current_thread_runtime(_: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// What each serving thread is given: everything but its listener and its gateway.
pub(super) struct Shared {
    pub app: axum::Router,
    pub settings: Settings,
    pub caps: ConnectionCaps,
    pub streams_stop: Arc<watch::Sender<bool>>,
    pub runtime: RuntimeBuilder,
}

/// Serves `listener`'s address on `count` threads (see the module's comment) until
/// `shutdown`; each thread gets the gateway `gateway` makes for it. Answers once every
/// thread has drained its connections (as [`super::serve`] does), or [`THREAD_MARGIN`]
/// after the drain's own bound, with the threads, whose runtimes still run what requests
/// spawned until released. A thread that ends before `shutdown` (its runtime could not
/// start, its accept loop panicked) ends them all: the answer is then an error, as the
/// address would otherwise be served by fewer threads, or by none, with no one told.
pub(super) async fn serve(
    listener: TcpListener,
    count: usize,
    gateway: impl Fn() -> Arc<crate::gateway::Gateway>,
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (anyhow::Result<()>, Threads) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (release_tx, release_rx) = watch::channel(false);
    let mut threads = Threads {
        release: release_tx,
        exited: Vec::new(),
    };
    let listeners = match listeners(listener, count.max(1)) {
        Ok(l) => l,
        Err(e) => return (Err(e), threads),
    };
    let mut done = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let (done_tx, done_rx) = oneshot::channel();
        let (exited_tx, exited_rx) = oneshot::channel();
        let (gateway, app) = (gateway(), shared.app.clone());
        let (settings, caps) = (shared.settings.clone(), shared.caps.clone());
        let (streams_stop, mut stop, mut release) = (
            shared.streams_stop.clone(),
            stop_rx.clone(),
            release_rx.clone(),
        );
        let build = shared.runtime;
        let spawned = std::thread::Builder::new()
            .name(format!("waitroom-serve-{i}"))
            .spawn(move || {
                let runtime = match build(i) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = done_tx
                            .send(Err(anyhow::Error::new(e)
                                .context("starting a serving thread's runtime")));
                        return;
                    }
                };
                // Counted per thread: how the kernel spreads connections over the sockets.
                let accepted = metrics::counter!(ACCEPTED, "thread" => i.to_string());
                runtime.block_on(async move {
                    let stopped = async move {
                        let _ = stop.wait_for(|s| *s).await;
                    };
                    let served = match TcpListener::from_std(listener) {
                        Ok(l) => {
                            super::serve(
                                l,
                                app,
                                Some(gateway),
                                &settings,
                                caps,
                                stopped,
                                streams_stop,
                                accepted,
                            )
                            .await
                        }
                        Err(e) => Err(anyhow::Error::new(e).context("registering a listener")),
                    };
                    let _ = done_tx.send(served);
                    // Still running what the requests spawned (an upgraded connection)
                    // while the server stops its tasks and the store.
                    let _ = release.wait_for(|r| *r).await;
                });
                drop(runtime);
                let _ = exited_tx.send(());
            });
        if let Err(e) = spawned {
            stop_tx.send_replace(true);
            return (
                Err(anyhow::Error::new(e).context("starting a serving thread")),
                threads,
            );
        }
        done.push(Box::pin(async move {
            done_rx
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the thread ended (it panicked)")))
        }));
        threads.exited.push(exited_rx);
    }
    // Until the shutdown, a thread that finishes has failed: it no longer serves its
    // share of the connections (its socket's are refused), and the others are stopped.
    let early = tokio::select! {
        () = shutdown => None,
        (served, i, rest) = select_all(done.iter_mut()) => {
            let e = served.err().unwrap_or_else(|| anyhow::anyhow!("it stopped serving"));
            let failed = e.context(format!("serving thread {i} ended early"));
            drop(rest);
            Some((i, failed))
        }
    };
    stop_tx.send_replace(true);
    let failed = early.as_ref().map(|(i, _)| *i);
    let mut result = Ok(());
    if let Some((_, e)) = early {
        tracing::error!(error = %format!("{e:#}"), "stopping the server");
        result = Err(e);
    }
    // The drain is bounded on each thread by `SHUTDOWN_GRACE`: a thread that takes longer
    // than that and a margin is blocked (its runtime does not run), and is left behind.
    let mut busy: BTreeSet<usize> = (0..done.len()).filter(|&i| Some(i) != failed).collect();
    let mut waiting: FuturesUnordered<_> = done
        .into_iter()
        .enumerate()
        .filter(|&(i, _)| Some(i) != failed)
        .map(|(i, d)| async move { (i, d.await) })
        .collect();
    let drained = async {
        while let Some((i, served)) = waiting.next().await {
            busy.remove(&i);
            if result.is_ok() {
                result = served;
            }
        }
    };
    let bound = SHUTDOWN_GRACE + THREAD_MARGIN;
    if tokio::time::timeout(bound, drained).await.is_err() {
        let stuck: Vec<String> = busy.iter().map(|i| format!("waitroom-serve-{i}")).collect();
        tracing::error!(
            ?stuck,
            bound_ms = bound.as_millis() as u64,
            "serving threads still busy after the drain's bound (blocked?): stopping without them"
        );
    }
    (result, threads)
}

/// `count` listening sockets on `listener`'s address: `listener` itself, made to share its
/// address (`SO_REUSEPORT` set on it, which lets sockets bound afterwards join it: the
/// kernel then spreads new connections over all of them), and `count - 1` new ones. If a
/// new socket cannot join, every thread accepts from `listener` instead.
fn listeners(listener: TcpListener, count: usize) -> anyhow::Result<Vec<std::net::TcpListener>> {
    let first = listener
        .into_std()
        .context("taking the listener off the runtime")?;
    let addr = first
        .local_addr()
        .context("reading the listening address")?;
    let mut all = vec![first];
    let joined = (1..count).try_fold(Vec::new(), |mut more, _| {
        if more.is_empty() {
            socket2::SockRef::from(&all[0]).set_reuse_port(true)?;
        }
        more.push(reuse_port_listener(addr)?);
        Ok::<_, std::io::Error>(more)
    });
    match joined {
        Ok(more) => {
            all.extend(more);
            Ok(all)
        }
        Err(e) => {
            tracing::warn!(error = %e, %addr, "no SO_REUSEPORT: the serving threads share one listening socket");
            let first = all.swap_remove(0);
            share_one(first, count)
        }
    }
}

/// `count` handles of the one listening socket `first`, from which every thread accepts.
/// `SO_REUSEPORT` (set on it before the new sockets failed to join) is cleared: no other
/// process (of the same user) can then join the address and take a share.
fn share_one(
    first: std::net::TcpListener,
    count: usize,
) -> anyhow::Result<Vec<std::net::TcpListener>> {
    socket2::SockRef::from(&first)
        .set_reuse_port(false)
        .context("clearing SO_REUSEPORT")?;
    let mut all = Vec::with_capacity(count);
    for _ in 1..count {
        all.push(first.try_clone().context("sharing the listener")?);
    }
    all.insert(0, first);
    Ok(all)
}

/// A non-blocking listening socket on `addr`, with `SO_REUSEPORT`.
fn reuse_port_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    // tokio's `TcpListener::bind` uses the same backlog.
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the threads share one socket, its `SO_REUSEPORT` (set while trying to add
    /// sockets beside it) is cleared: no other socket can join the address afterwards.
    #[tokio::test]
    async fn a_shared_listener_lets_no_other_socket_join() {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        first.set_nonblocking(true).unwrap();
        let addr = first.local_addr().unwrap();
        socket2::SockRef::from(&first).set_reuse_port(true).unwrap();
        // (No socket joins before: one that had would leave the kernel's port bucket open
        // to others whatever the first socket's flag says.)
        let all = share_one(first, 3).unwrap();
        assert_eq!(all.len(), 3);
        for l in &all {
            assert_eq!(l.local_addr().unwrap(), addr);
            assert!(!socket2::SockRef::from(l).reuse_port().unwrap());
        }
        let joined = reuse_port_listener(addr);
        assert!(
            joined.is_err(),
            "another socket joined the shared listener's address"
        );
    }

    /// A router whose `/api/v1/block` blocks its thread (not its task: the runtime stops)
    /// until `unblock` sends, after saying on `entered` that it has begun.
    fn blocking_app() -> (
        axum::Router,
        tokio::sync::mpsc::UnboundedReceiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel();
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let blocked = Arc::new(parking_lot::Mutex::new(blocked));
        let app = axum::Router::new().route(
            "/api/v1/block",
            axum::routing::get(move || {
                let (entered, blocked) = (entered_tx.clone(), blocked.clone());
                async move {
                    let _ = entered.send(());
                    let _ = blocked.lock().recv();
                    "unblocked"
                }
            }),
        );
        (app, entered, unblock)
    }

    fn shared(
        app: axum::Router,
        runtime: RuntimeBuilder,
    ) -> (Shared, impl Fn() -> Arc<crate::gateway::Gateway>) {
        let store = Arc::new(crate::store::embedded::EmbeddedStore::new());
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let state = crate::app::AppState::new(store, &key, "admin", crate::clock::Clock::manual(0))
            .unwrap();
        let guard = Arc::new(crate::http::guard::Guard::new(Default::default()));
        let up = crate::config::Upstream::parse("http://127.0.0.1:9").unwrap();
        let settings = Settings::default();
        let shared = Shared {
            app,
            caps: ConnectionCaps::new(&settings),
            settings,
            streams_stop: Arc::new(watch::channel(false).0),
            runtime,
        };
        let gateway = move || {
            let gw = crate::gateway::Gateway::new(state.clone(), guard.clone(), up.clone());
            Arc::new(gw)
        };
        (shared, gateway)
    }

    /// A handler that blocks its serving thread holds neither the shutdown nor the
    /// release: both answer within their bounds, the blocked thread left behind (the
    /// server then closes the store and the process can end).
    #[tokio::test]
    async fn a_blocked_serving_thread_does_not_hold_the_shutdown() {
        let (app, mut entered, unblock) = blocking_app();
        let (shared, gateway) = shared(app, current_thread_runtime);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let client = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt as _;
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /api/v1/block HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            entered.recv().await.unwrap();
            stop.send(()).unwrap();
            s
        });
        let started = std::time::Instant::now();
        let bound = SHUTDOWN_GRACE + THREAD_MARGIN + Duration::from_secs(3);
        let serving = serve(listener, 2, gateway, shared, async {
            let _ = stopped.await;
        });
        let (served, threads) = tokio::time::timeout(bound, serving)
            .await
            .expect("the shutdown waited for a blocked thread");
        served.unwrap();
        assert!(
            started.elapsed() >= SHUTDOWN_GRACE,
            "the drain was not waited for"
        );
        tokio::time::timeout(THREAD_MARGIN + Duration::from_secs(2), threads.release())
            .await
            .expect("the release waited for a blocked thread");
        let _conn = client.await.unwrap();
        let _ = unblock.send(());
    }

    /// A serving thread that ends before the shutdown (here its runtime cannot start)
    /// stops the others and makes `serve` answer an error, without waiting for the
    /// shutdown.
    #[tokio::test]
    async fn a_serving_thread_ending_early_stops_the_server() {
        fn second_fails(i: usize) -> std::io::Result<tokio::runtime::Runtime> {
            if i == 1 {
                return Err(std::io::Error::other("no runtime for this one"));
            }
            current_thread_runtime(i)
        }
        let (app, _entered, _unblock) = blocking_app();
        let (shared, gateway) = shared(app, second_fails);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = serve(listener, 2, gateway, shared, std::future::pending());
        let (served, threads) = tokio::time::timeout(Duration::from_secs(5), serving)
            .await
            .expect("an early end went unnoticed");
        let e = format!("{:#}", served.unwrap_err());
        assert!(e.contains("serving thread 1 ended early"), "{e}");
        assert!(e.contains("no runtime for this one"), "{e}");
        tokio::time::timeout(Duration::from_secs(5), threads.release())
            .await
            .unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "the other thread still listens"
        );
    }

    /// The first listener (bound without `SO_REUSEPORT`, as `main` and the tests bind it)
    /// and the ones bound beside it all accept: the kernel spreads connections from many
    /// client ports over every socket, not over the first one only.
    #[tokio::test]
    async fn connections_are_spread_over_every_listener() {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = first.local_addr().unwrap();
        let all = listeners(first, 2).unwrap();
        assert_eq!(all.len(), 2);
        for l in &all {
            assert_eq!(l.local_addr().unwrap(), addr);
        }
        let clients: Vec<_> = (0..64)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut accepted = Vec::new();
        for l in &all {
            let mut n = 0;
            while l.accept().is_ok() {
                n += 1;
            }
            accepted.push(n);
        }
        assert_eq!(
            accepted.iter().sum::<usize>(),
            clients.len(),
            "{accepted:?}"
        );
        assert!(
            accepted.iter().all(|&n| n > 0),
            "every listener accepts some: {accepted:?}"
        );
    }
}
