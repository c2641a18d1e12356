//! Startup and shutdown: from [`Settings`] and a bound listener to a serving process, and
//! back to a clean exit.
//!
//! [`run`] takes the listener and the shutdown future as arguments (as mini-redis and atuin
//! do), so tests start real servers on port 0 and stop them when they like, and `main` only
//! parses settings, binds and waits for a signal.
//!
//! What the process prints to **stdout** is part of the command-line contract (scripts and
//! the end-to-end tests read it), one line each:
//! - `admin token: T` when no admin token was configured and one was generated;
//! - `listening on http://ADDR` once the server accepts requests (ADDR is the bound
//!   address, so `--listen 127.0.0.1:0` reveals the port it got).
//!
//! Logs go to stderr through `tracing`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};

use crate::app::AppState;
use crate::clock::Clock;
use crate::config::{generate_admin_token, Settings, StoreBackend};
use crate::demo;
use crate::history::{self, History};
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::Store;
use crate::telemetry::budget::{log_within, LogBudget};
use crate::tokens;
use activity::{Activity, Closing, Tracked};

mod activity;
mod caps;
mod descriptors;
mod threads;

use caps::{ConnectionCaps, HeldStream};
#[cfg(test)]
use descriptors::default_for;
use descriptors::{
    check_descriptor_room, default_max_connections, open_descriptors, raise_descriptor_limit,
};

/// How long in-flight requests and open connections get to finish after the shutdown
/// signal. Long-lived streams (WebSocket, SSE) would otherwise hold the process forever;
/// it stays under the 10 s that container runtimes wait before killing.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long background tasks get to stop, all together, once the server is done.
const TASK_GRACE: Duration = Duration::from_secs(2);
/// How long a start waits for the gate table before serving (see `run`).
const FIRST_GATES_WAIT: Duration = Duration::from_secs(2);
/// Name of the demo crowd's task.
const DEMO_CROWD: &str = "demo-crowd";

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting, lets
/// in-flight requests finish (for at most [`SHUTDOWN_GRACE`]), stops the background tasks
/// (the live hub, the scheduler, the gauge upkeep and the demo crowd; those that did not
/// stop in time are logged by name) and answers `Ok`. A store that stopped for good
/// ([`Store::failed`]) shuts the server down the same way and answers an error, so the
/// process exits for its supervisor to restart it. Startup problems (an unusable data dir or signing key, an unavailable
/// backend) are errors before anything is served.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(?settings, "starting");
    // The metrics recorder first: what the store registers as it opens is then exported.
    crate::telemetry::prometheus();
    // Every file the process creates (the store's, the key's) is its owner's only.
    #[cfg(unix)]
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
    crate::store::journal::create_private_dir(&settings.data_dir).with_context(|| {
        format!(
            "cannot create or narrow the data directory {}",
            settings.data_dir.display()
        )
    })?;
    let mut places = 0;
    let mut redis_store = None;
    // Held until `run` returns: the lock file is unlocked when it is closed.
    let mut _data_dir_lock = None;
    let store: Arc<dyn Store> = match &settings.store {
        StoreBackend::Embedded => {
            // First, before the journal is even read: a second process on the same data
            // dir must not check (let alone `--repair`) a journal that another one writes.
            _data_dir_lock = Some(lock_data_dir(&settings.data_dir)?);
            let dir = settings.data_dir.join("store");
            let now = crate::clock::system_now();
            let mut store =
                EmbeddedStore::open_with(&dir, settings.durability, now, settings.repair)?;
            store.watch_stalls();
            places = store.restored_places();
            Arc::new(store)
        }
        StoreBackend::Redis { url } => {
            let options = RedisOptions {
                wait_replicas: settings.redis_wait_replicas,
                replica: settings.redis_replica,
                ..RedisOptions::default()
            };
            let store = Arc::new(
                RedisStore::connect(url.expose(), options)
                    .await
                    .with_context(|| format!("opening the store at {}", settings.store))?,
            );
            redis_store = Some(store.clone());
            store
        }
    };
    if matches!(settings.store, StoreBackend::Redis { .. }) && settings.signing_keys.is_empty() {
        // A key generated per node would make every token one node issued invalid on the
        // others (waiting-token MACs and access-token signatures both derive from it).
        anyhow::bail!(
            "with a Redis store every node must use the same --signing-key FILE \
             (generate one with `openssl genpkey -algorithm ed25519 -out key.pem`)"
        );
    }
    let keys = tokens::load_key_for_store(
        &settings.signing_keys,
        &settings.data_dir,
        places,
        settings.repair,
    )?;
    if let Some(redis) = &redis_store {
        check_redis_keys(redis, &keys, &settings.store, settings.repair).await?;
    }

    let admin_token = match &settings.admin_token {
        Some(t) => t.expose().clone(),
        None => {
            let (t, path) = load_or_generate_admin_token(&settings.data_dir)?;
            // stdout, not the log: a newcomer reads it from the terminal, and a log
            // collector should not keep the secret. Where it is kept is no secret.
            crate::telemetry::stdout_line(format_args!("admin token: {t}"));
            tracing::info!(path = %path.display(), "admin token kept in the data dir (delete the file for a new one)");
            t
        }
    };
    let mut state = AppState::with_keys(store, &keys, &admin_token, Clock::system())?;
    // Before the background tasks start: the gate table's refresh holds this one.
    state_gates_secure(&mut state, &settings);
    state.branding_dir = Some(settings.data_dir.join("branding").into());
    if matches!(settings.store, StoreBackend::Embedded) {
        // Kept beside the store: a restart keeps the charts. (On Redis each node keeps its
        // own in memory: see `history`.)
        state.history = Arc::new(History::open(&settings.data_dir.join(history::FILE)));
    }

    // Before anything can change the store, so that no notice is missed.
    // The gate table is read before the first request is served, so that the first
    // requests are told apart (gated or not), not refused as unknown; a store slow to
    // answer leaves it to the background task, and gated requests answer `503` meanwhile.
    let first = state.gates.refresh(state.store.as_ref(), state.clock.now());
    let _ = tokio::time::timeout(FIRST_GATES_WAIT, first).await;
    let mut tasks = state.start_background();
    if settings.demo {
        demo::ensure_demo_event(state.store.as_ref(), state.clock.now())
            .await
            .context("creating the demo event")?;
        let stop = tasks.stop_signal();
        tasks.spawn(
            DEMO_CROWD,
            demo::run_demo_crowd(state.store.clone(), state.clock.clone(), stop),
        );
    }

    let addr = listener
        .local_addr()
        .context("reading the listening address")?;
    let store = state.store.clone();
    let streams_stop = state.shutdown.clone();
    let limits = crate::http::Limits {
        body_timeout: settings.connections.body_timeout,
        rate_limits: settings.rate_limits.clone(),
        ..crate::http::Limits::default()
    };
    let guard = Arc::new(crate::http::guard::Guard::new(limits.rate_limits.clone()));
    let app = crate::http::router_with_guard(state.clone(), limits, guard.clone());
    let descriptors = raise_descriptor_limit();
    let caps = ConnectionCaps::new(&settings);
    if let Some(limit) = descriptors {
        check_descriptor_room(caps.total, limit, open_descriptors());
    }
    tracing::info!(%addr, store = %settings.store, demo = settings.demo,
        max_connections = caps.total, max_connections_per_client = caps.per_client,
        descriptor_limit = ?descriptors, "serving");
    crate::telemetry::stdout_line(format_args!("listening on http://{addr}"));

    // Gateway mode: the API's routes in front of the proxy to the site, served by one
    // thread per worker, each with its own listening socket and origin connections
    // (`threads`; each counts the connections it accepts), on the embedded store only; the API alone, and gateway mode on a Redis
    // store, are served on the runtime.
    let upstream = settings.upstream.clone();
    if upstream.is_some() && !threads::for_store(&settings.store) {
        tracing::info!(
            "gateway mode on a Redis store: served on the runtime, without serving threads"
        );
    }
    // A store that stopped for good refuses every change until the process restarts: stop
    // serving and exit with an error, so that the supervisor restarts it and the restart
    // recovers everything acknowledged from the journal.
    let shutdown = shutdown_or_store_failure(store.clone(), shutdown);
    let (served, threads) = match upstream {
        Some(up) if threads::for_store(&settings.store) => {
            tracing::info!(upstream = %up, "gateway mode: proxying to the site");
            let count = tokio::runtime::Handle::current().metrics().num_workers();
            let gateway = || {
                let (state, guard, up) = (state.clone(), guard.clone(), up.clone());
                let gw = crate::gateway::Gateway::with_pools(state, guard, up, count);
                Arc::new(gw)
            };
            let shared = threads::Shared {
                app,
                settings: settings.clone(),
                caps,
                streams_stop,
                runtime: threads::current_thread_runtime,
            };
            let (served, threads) =
                threads::serve(listener, count, gateway, shared, shutdown).await;
            (served, Some(threads))
        }
        upstream => {
            if let Some(up) = &upstream {
                tracing::info!(upstream = %up, "gateway mode: proxying to the site");
            }
            let gateway =
                upstream.map(|up| Arc::new(crate::gateway::Gateway::new(state.clone(), guard, up)));
            let served = serve(
                listener,
                app,
                gateway,
                &settings,
                caps,
                shutdown,
                streams_stop,
                metrics::Counter::noop(),
            );
            (served.await, None)
        }
    };

    // Each one that did not stop in time is logged by name.
    tasks.stop(TASK_GRACE).await;
    // Last, once nothing can change the state any more: make what was acknowledged durable.
    let closed = store.close().await.context("closing the store");
    if let Some(threads) = threads {
        threads.release().await;
    }
    tracing::info!("stopped");
    if store.failed() {
        anyhow::bail!(
            "the store in {} stopped writing (the error is logged above: a full or failing \
             disk?); restart the server once the disk is fixed: it recovers every \
             acknowledged change the journal holds (in `relaxed`, what the OS had not yet \
             written when the disk failed may be lost, as in a machine crash)",
            settings.data_dir.join("store").display()
        );
    }
    served.and(closed)
}

/// Session cookies are `Secure` always when the settings say so.
fn state_gates_secure(state: &mut AppState, settings: &Settings) {
    if settings.cookie_secure {
        state.gates = Arc::new(crate::gates::Gates::with_secure_cookies());
    }
}

/// Ends when `shutdown` does, or when the store stops for good ([`Store::until_failed`]):
/// what [`run`] stops serving on.
pub async fn shutdown_or_store_failure(
    store: Arc<dyn Store>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        () = shutdown => {}
        () = store.until_failed() => tracing::error!(
            "the store cannot write any more; shutting down, to be restarted"
        ),
    }
}

/// Serves `app` on `listener` through the server's own connection handling (the caps and
/// timeouts of `settings`, `TCP_NODELAY`, HTTP/1 and HTTP/2) until `shutdown`. The load
/// generator serves its reference route through it, so that its ceiling differs from the
/// server in the route stack only.
pub async fn serve_router(
    listener: TcpListener,
    app: axum::Router,
    settings: &Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let caps = ConnectionCaps::new(settings);
    let streams_stop = Arc::new(tokio::sync::watch::channel(false).0);
    let accepted = metrics::Counter::noop();
    serve(
        listener,
        app,
        None,
        settings,
        caps,
        shutdown,
        streams_stop,
        accepted,
    )
    .await
}

/// Accepts connections and serves each with hyper-util's connection builder (HTTP/1 and
/// HTTP/2, with upgrades for WebSocket) until `shutdown`; then stops accepting and lets
/// the open connections finish, for [`SHUTDOWN_GRACE`] at most.
///
/// `axum::serve` does the same but exposes no timeouts: here HTTP/1's
/// `header_read_timeout` bounds both the wait for a request head (a request line or
/// headers trickled a line at a time) and the idle wait between keep-alive requests (in
/// hyper 1.x the timer starts whenever the connection is ready to read a head). HTTP/2 has
/// no such timer (its keep-alive pings only prove the peer alive), so every connection
/// also counts its requests in flight ([`Activity`], until the response body ends) and is
/// shut down gracefully once none has been in flight for the header timeout. A
/// connection over a cap is closed at once, before anything is read.
// Eight: the serving threads' counter of accepted connections came last; the others are
// what every caller has at hand already, and a struct of them would be built once per call.
#[allow(clippy::too_many_arguments)]
async fn serve(
    listener: TcpListener,
    app: axum::Router,
    gateway: Option<Arc<crate::gateway::Gateway>>,
    settings: &Settings,
    caps: ConnectionCaps,
    shutdown: impl Future<Output = ()> + Send + 'static,
    streams_stop: Arc<tokio::sync::watch::Sender<bool>>,
    accepted: metrics::Counter,
) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt as _;

    let mut builder = auto::Builder::new(TokioExecutor::new());
    // No timer for HTTP/1: hyper's header-read timeout boxes a `Sleep` and registers it in
    // the runtime's timer wheel at every request head (~900 instructions per proxied request,
    // ~1,950 per `/healthz`).
    // The connection's own closer below bounds an idle keep-alive wait and a trickled
    // head instead, with one timer per connection. (`None` explicitly: hyper's default of
    // 30 s without a timer would only log a warning per connection.)
    builder.http1().header_read_timeout(None);
    builder
        .http2()
        // nginx's `http2_max_concurrent_streams`, where hyper's default is 200: each stream
        // a client holds without reading its answer (a window never opened) keeps its
        // answer, and in gateway mode a connection to the site, for as long as it likes.
        .max_concurrent_streams(128)
        .timer(TokioTimer::new())
        .keep_alive_interval(settings.connections.header_timeout)
        .keep_alive_timeout(settings.connections.header_timeout);
    // Resolved once, which also exports it at zero before the first refusal.
    let refused = metrics::counter!("waitroom_connections_refused_total");
    // Each connection's task holds a sender: once the last one is dropped, all are done.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // wait a little rather than spin, as `axum::serve` does. (Said once
                    // in a while: out of descriptors, this fails at every retry.)
                    static FAILED: LogBudget = LogBudget::new(1, Duration::from_secs(10));
                    log_within!(FAILED, warn, error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        accepted.increment(1);
        let Some(slot) = caps.admit(peer.ip()) else {
            refused.increment(1);
            continue; // dropped: closed at once
        };
        // No Nagle delay: live frames written back to back must not wait for ACKs.
        let _ = tcp.set_nodelay(true);
        let activity = Activity::new();
        let svc = {
            let activity = activity.clone();
            app.clone()
                .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    req
                })
                .map_future(move |answer| {
                    // Counted from the call to the end of the response body (a live
                    // stream's body lasts as long as the stream).
                    let busy = activity.busy();
                    async move {
                        let res: axum::response::Response = answer.await?;
                        Ok::<_, std::convert::Infallible>(res.map(|body| Tracked::new(body, busy)))
                    }
                })
        };
        let header_timeout = settings.connections.header_timeout;
        let stall_timeout = settings.connections.stall_timeout;
        let gateway = gateway.clone();
        let builder = builder.clone();
        let mut stop = stop_rx.clone();
        let open = open_tx.clone();
        tokio::spawn(async move {
            // The builder reads the first bytes to choose HTTP/1 or HTTP/2 before either's
            // timeouts run: a silent or stalled client is bounded here instead.
            let Some(version) = version_read(&tcp, header_timeout).await else {
                return;
            };
            let svc = Dispatch {
                api: TowerToHyperService::new(svc),
                gateway: gateway.map(crate::gateway::Connection::new),
                peer,
                activity: activity.clone(),
            };
            let io = TokioIo::new(HeldStream { tcp, _slot: slot });
            let conn = builder.serve_connection_with_upgrades(io, svc);
            let mut conn = std::pin::pin!(conn);
            // What closes the connection: no request in flight for the header timeout
            // (counted from the accept or from the end of the last answer), and the
            // server's shutdown. This is HTTP/2's idle timeout (its pings only prove the
            // peer alive) and HTTP/1's header and keep-alive timeout, as hyper's own timer
            // for HTTP/1 is off. On HTTP/1, `graceful_shutdown` closes a connection at once
            // between answers, even with part of the next head read (hyper's keep-alive
            // state is idle until a head is whole); but before the first answer it only
            // disables keep-alive and would go on reading a trickled first head, so a
            // connection that never had a request is dropped outright: it has nothing to
            // finish.
            let closer = async {
                tokio::select! {
                    biased;
                    why = activity.watch(header_timeout, stall_timeout) => why,
                    _ = stop.wait_for(|s| *s) => Closing::Shutdown,
                }
            };
            let mut closer = std::pin::pin!(closer);
            let closer_woken = OnWake::new();
            let mut closing = false;
            // Once closing, how long the connection has to finish: the GOAWAY (or the last
            // answers) may never be written to a client that stopped reading, which held
            // the connection, and its slot, for ever. Armed when closing starts.
            let grace = tokio::time::sleep_until(tokio::time::Instant::now());
            let mut grace = std::pin::pin!(grace);
            let ended = std::future::poll_fn(|cx| {
                // The connection first: it is what wakes this task, several times per
                // request. The closer is polled only when its own timer or signal woke
                // it (polling it at every wake-up cost ~500 instructions per request).
                use std::task::Poll;
                if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                    return Poll::Ready(ended);
                }
                if closing {
                    if grace.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Pending;
                }
                if let Poll::Ready(why) = closer_woken.poll(closer.as_mut(), cx) {
                    if why == Closing::Idle && version == Version::Http1 && !activity.had_requests()
                    {
                        return Poll::Ready(Ok(()));
                    }
                    // A client that stopped reading: nothing more can be written to it, a
                    // `GOAWAY` included, so it is dropped rather than asked to close.
                    if why == Closing::Stalled {
                        tracing::debug!(%peer, "connection dropped: its answers stopped moving");
                        return Poll::Ready(Ok(()));
                    }
                    closing = true;
                    grace
                        .as_mut()
                        .reset(tokio::time::Instant::now() + header_timeout.max(SHUTDOWN_GRACE));
                    conn.as_mut().graceful_shutdown();
                    if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                        return Poll::Ready(ended);
                    }
                    // Registers the grace's timer with this task.
                    if grace.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Pending;
                }
                Poll::Pending
            })
            .await;
            // Errors here are the client's (a reset, a timeout, a malformed request).
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
            drop(open);
        });
    }
    drop(listener);
    tracing::info!("shutdown requested; finishing in-flight requests");
    // Live streams (WebSocket, SSE) close now rather than hold the drain to its end.
    streams_stop.send_replace(true);
    stop_tx.send_replace(true);
    drop(open_tx);
    tokio::select! {
        _ = open_rx.recv() => {}
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
            tracing::warn!(
                grace_sec = SHUTDOWN_GRACE.as_secs(),
                "connections still open after the grace period; closing them"
            );
        }
    }
    Ok(())
}

/// A connection's service: waitroom's own routes through the API's router (`api`), and in
/// gateway mode every other path straight to the proxy, with no router, no layer and no
/// request extension on the way (those are the API's; the proxy has its own rules and
/// metrics, see `gateway`). Either way the request counts as in flight until its response
/// body is done.
struct Dispatch<S> {
    api: S,
    gateway: Option<Arc<crate::gateway::Connection>>,
    peer: SocketAddr,
    activity: Activity,
}

type Proxied = std::pin::Pin<
    Box<
        dyn Future<Output = Result<axum::http::Response<Tracked>, std::convert::Infallible>> + Send,
    >,
>;

impl<S> hyper::service::Service<axum::http::Request<hyper::body::Incoming>> for Dispatch<S>
where
    S: hyper::service::Service<
        axum::http::Request<hyper::body::Incoming>,
        Response = axum::http::Response<Tracked>,
        Error = std::convert::Infallible,
    >,
{
    type Response = axum::http::Response<Tracked>;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::Either<S::Future, Proxied>;

    fn call(&self, req: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        use futures_util::future::Either;
        match &self.gateway {
            Some(gw) if !crate::gateway::is_own_path(req.uri().path()) => {
                let (gw, peer, busy) = (gw.clone(), self.peer, self.activity.busy());
                Either::Right(boxed_in_place(|| async move {
                    let res = gw.serve(req, peer).await;
                    Ok(res.map(|body| Tracked::new(body, busy)))
                }))
            }
            _ => Either::Left(self.api.call(req)),
        }
    }
}

/// `make()`'s future, pinned in a box allocated before it is made, so that it can be
/// written there in place. `Box::pin(async { .. })` makes the future on the stack and then
/// copies it into the box whole: the proxied request's future is the whole gateway's
/// request (the gate, the origin's send, the answer), ~420 instructions of `memcpy` per
/// request, though only its few captured values are set when it is made.
fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    let mut place = Box::new_uninit();
    place.write(make());
    // SAFETY: written just above. (`Box::write` does the same safely, but is newer than
    // the crate's minimum Rust version.)
    Box::into_pin(unsafe { place.assume_init() })
}

/// Polls a future only when its own waker fired (and at its first poll), however often the
/// task holding it is woken for something else: a connection's task wakes several times per
/// request, its idle timer and shutdown signal almost never.
struct OnWake {
    flag: Arc<WakeFlag>,
    waker: std::task::Waker,
}

struct WakeFlag {
    woken: std::sync::atomic::AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, std::sync::atomic::Ordering::Release);
        self.task.wake();
    }
}

impl OnWake {
    fn new() -> Self {
        let flag = Arc::new(WakeFlag {
            woken: std::sync::atomic::AtomicBool::new(true),
            task: futures_util::task::AtomicWaker::new(),
        });
        let waker = std::task::Waker::from(flag.clone());
        OnWake { flag, waker }
    }

    fn poll<F: Future>(
        &self,
        f: std::pin::Pin<&mut F>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        // The task's waker first: a wake-up after the flag is read wakes the task again.
        self.flag.task.register(cx.waker());
        if !self
            .flag
            .woken
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return std::task::Poll::Pending;
        }
        f.poll(&mut std::task::Context::from_waker(&self.waker))
    }
}

/// The protocol a connection speaks, as the connection builder will tell it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    Http1,
    Http2,
}

/// Which protocol the connection speaks, once enough of the request arrived within `limit`
/// for the connection builder to tell (a byte that differs from the HTTP/2 preface: HTTP/1;
/// all of it: HTTP/2); `None` if it did not, or the connection ended.
async fn version_read(tcp: &TcpStream, limit: Duration) -> Option<Version> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let wait = async {
        let mut buf = [0u8; 24];
        let mut pause = Duration::from_millis(10);
        loop {
            match tcp.peek(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) if buf[..n] != PREFACE[..n] => return Some(Version::Http1),
                Ok(n) if n >= PREFACE.len() => return Some(Version::Http2),
                // Part of the preface: peek answers at once while it sits unread, so look
                // again later, less and less often. A client's preface is nearly always one
                // segment; at a fixed 10 ms, a thousand connections holding one byte each
                // kept a sixth of a core busy until their timeout.
                Ok(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(320));
                }
            }
        }
    };
    tokio::time::timeout(limit, wait).await.ok().flatten()
}

/// The generated admin token, kept in the data dir like the signing key (owner-only), so
/// that a restart does not log every dashboard and script out.
fn load_or_generate_admin_token(
    data_dir: &std::path::Path,
) -> anyhow::Result<(String, std::path::PathBuf)> {
    let path = data_dir.join("admin-token");
    match std::fs::read_to_string(&path) {
        // Checked as a configured token is: it travels in an `Authorization` header.
        Ok(t) if !t.trim().is_empty() && !t.trim().bytes().all(|b| b.is_ascii_graphic()) => {
            anyhow::bail!(
                "the admin token in {} must be printable ASCII without spaces, as a \
                 configured one: correct it, or delete the file to have one generated",
                path.display()
            )
        }
        Ok(t) if !t.trim().is_empty() => {
            crate::tokens::narrow_secret_file(&path);
            let t = t.trim();
            if let Some(characters) = crate::config::short_admin_token(t) {
                tracing::warn!(
                    characters,
                    path = %path.display(),
                    "the admin token kept in the data dir is short: whoever guesses it runs \
                     the sale and proves joins; use 32 random characters or more (delete the \
                     file, and one of 64 is generated)"
                );
            }
            return Ok((t.to_string(), path));
        }
        // Empty (a power cut while it was written, or emptied by hand): every dashboard and
        // script holding the old token is logged out, which deserves a word.
        Ok(_) => tracing::warn!(
            path = %path.display(),
            "the admin token kept in the data dir was empty: a new one is generated (scripts \
             and dashboards holding the old one must be given it)"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot read the admin token {}", path.display()))
        }
    }
    let t = generate_admin_token();
    tokens::write_private(&path, t.as_bytes())
        .with_context(|| format!("cannot keep the admin token in {}", path.display()))?;
    Ok((t, path))
}

/// Takes the data dir's lock (`waitroom.lock`, an advisory `flock` held while the answer
/// is open), or says plainly that another process holds it.
fn lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let path = data_dir.join("waitroom.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot create the lock file {}", path.display()))?;
    // An existing store's files are its owner's only, this one too (made before that rule,
    // or copied in, it kept its mode).
    crate::tokens::narrow_secret_file(&path);
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                anyhow::bail!(
                    "the data dir {} is in use by another waitroom process (it holds {}); \
                     stop that one, or give this one another --data-dir",
                    data_dir.display(),
                    path.display()
                );
            }
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    Ok(file)
}

/// How long `waitroom healthcheck` waits for the answer: container runtimes run it every
/// few seconds and expect it to end well before the next.
const HEALTHCHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// `waitroom healthcheck`: `GET /healthz` on the address the server with these settings
/// listens on (an unspecified address such as `0.0.0.0` is asked on loopback). `Ok` for a
/// 200, otherwise why not.
pub async fn healthcheck(listen: &str) -> Result<(), String> {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let target = match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            let ip: IpAddr = if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            };
            std::net::SocketAddr::new(ip, a.port()).to_string()
        }
        Ok(a) => a.to_string(),
        Err(_) => listen.to_string(),
    };
    let url = format!("http://{target}/healthz");
    let uri: axum::http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<axum::body::Body>();
    let asked = tokio::time::timeout(HEALTHCHECK_TIMEOUT, client.get(uri)).await;
    match asked {
        Err(_) => Err(format!("{url} did not answer in {HEALTHCHECK_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("{url}: {e}")),
        Ok(Ok(res)) if res.status().is_success() => Ok(()),
        Ok(Ok(res)) => Err(format!("{url} answered {}", res.status())),
    }
}

/// Resolves on SIGTERM, SIGINT (Ctrl-C) or SIGHUP (the terminal closed, or a supervisor's
/// `reload` where the process has nothing to reload): each stops the server gracefully.
/// SIGHUP's default action killed the process on the spot, with requests in flight and
/// the history's last minute unwritten.
///
/// Not an `async fn`: the handlers are installed when this is called, not when the future
/// is first polled. A signal that arrives after startup but before the server polls its
/// shutdown future is then still caught, rather than killing the process by default action.
/// Must be called inside a tokio runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handler = |kind: SignalKind| {
            signal(kind).map(|mut s| -> SignalFuture {
                Box::pin(async move {
                    s.recv().await;
                })
            })
        };
        let mut handlers = vec![
            ("SIGTERM", handler(SignalKind::terminate())),
            ("SIGINT", handler(SignalKind::interrupt())),
        ];
        // A server started under `nohup` (or with SIGHUP ignored by its supervisor) was
        // asked to outlive its terminal: catching SIGHUP would undo that.
        if !hangup_ignored() {
            handlers.push(("SIGHUP", handler(SignalKind::hangup())));
        }
        first_signal(handlers)
    }
    #[cfg(not(unix))]
    {
        let ctrl_c: SignalFuture = Box::pin(async {
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %e, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        });
        first_signal(vec![("Ctrl-C", Ok(ctrl_c))])
    }
}

/// A signal handler's wait for its signal.
type SignalFuture = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Resolves when the first of the installed handlers fires. A handler that could not be
/// installed is logged and left out, and the others still count; with none at all it never
/// resolves (the signals' default actions still end the process: only the graceful part is
/// lost).
/// Whether this process was started with SIGHUP ignored (`nohup`).
#[cfg(unix)]
fn hangup_ignored() -> bool {
    // SAFETY: reads the current action only (a null new action changes nothing), into a
    // zeroed `sigaction` this function owns.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

async fn first_signal(handlers: Vec<(&'static str, std::io::Result<SignalFuture>)>) {
    let mut installed = Vec::new();
    for (name, handler) in handlers {
        match handler {
            Ok(wait) => installed.push(Box::pin(async move {
                wait.await;
                name
            })),
            Err(e) => tracing::error!(signal = name, error = %e, "cannot install signal handler"),
        }
    }
    if installed.is_empty() {
        std::future::pending::<()>().await;
    }
    let (name, _, _) = futures_util::future::select_all(installed).await;
    tracing::info!("{name} received");
}

/// The check `tokens::load_key_for_store` makes against the data dir, made against Redis,
/// which every node shares, and stricter: a node whose keys include none of those recorded
/// (those of the node that started last) is refused unless `repair`, whether or not
/// Redis holds places. Nodes running with the recorded keys would refuse its tokens and it
/// theirs, and "no place yet" says nothing about whether such nodes run; accepting it would
/// also make its keys the record, against which correctly configured nodes are then
/// refused. A rotation keeps one of the recorded keys. The node then keeps its record in
/// Redis while it runs ([`RedisStore::keep_signing_keys`]).
async fn check_redis_keys(
    redis: &RedisStore,
    keys: &[ed25519_dalek::SigningKey],
    store: &impl std::fmt::Display,
    repair: bool,
) -> anyhow::Result<()> {
    let current: Vec<String> = keys.iter().map(tokens::key_fingerprint).collect();
    let text = current.join("\n");
    let recorded = redis.recorded_signing_keys().await?;
    let old: Vec<&str> = recorded
        .as_deref()
        .map(|r| r.lines().map(str::trim).filter(|l| !l.is_empty()).collect())
        .unwrap_or_default();
    if old != current.iter().map(String::as_str).collect::<Vec<_>>() {
        let now = crate::clock::system_now();
        let places: u64 = redis
            .list_events(now)
            .await?
            .iter()
            .map(|e| e.figures.waiting + e.figures.admitted + e.figures.active)
            .sum();
        let store = format!("the Redis store at {store}");
        let kept = old.iter().any(|f| current.iter().any(|c| c == f));
        if !old.is_empty() && !kept {
            if !repair {
                anyhow::bail!(disjoint_keys_refusal(&store, &old, &current, places));
            }
            if places == 0 {
                // (With places, `check_key_change` logs their loss.)
                tracing::warn!(
                    old_fingerprint = old.join(", "),
                    fingerprint = current.join(", "),
                    "repair: recording signing keys that share none of the recorded ones; \
                     nodes still running with those refuse this node's tokens, and it theirs, \
                     until they are restarted with these keys"
                );
            }
        }
        tokens::check_key_change(&old, &current, places, repair, &store, old.is_empty())?;
        redis.record_signing_keys(&text).await?;
    }
    redis.keep_signing_keys(text);
    Ok(())
}

/// Why a node whose signing keys share none of the fingerprints `old` recorded in `store`
/// (a Redis) does not start, and what to do instead.
fn disjoint_keys_refusal(store: &str, old: &[&str], current: &[String], places: u64) -> String {
    let (held, orphaned) = if places > 0 {
        (
            format!(
                " It holds {places} places, whose waiting tokens would all be invalid on this \
                 node."
            ),
            " (its places expire after their idle period)",
        )
    } else {
        (String::new(), "")
    };
    format!(
        "{store} records the signing keys of the nodes sharing it (fingerprints {}), but \
         this node's keys (fingerprints {}) include none of them: nodes running with the \
         recorded keys would refuse the tokens this node issues, and it theirs.{held} \
         Start this node with the same --signing-key file(s) as the other nodes. If every \
         node is being moved to new keys on purpose, start this one with --repair: it \
         records its keys{orphaned}, and every node still running with the old ones must \
         then be restarted with the new",
        old.join(", "),
        current.join(", "),
    )
}

#[cfg(test)]
mod tests;
