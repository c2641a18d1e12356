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
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;

use crate::app::AppState;
use crate::clock::Clock;
use crate::config::{generate_admin_token, Settings, StoreBackend};
use crate::demo;
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::Store;
use crate::tokens;

/// How long in-flight requests and open connections get to finish after the shutdown
/// signal. Long-lived streams (WebSocket, SSE) would otherwise hold the process forever;
/// it stays under the 10 s that container runtimes wait before killing.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long background tasks get to stop, all together, once the server is done.
const TASK_GRACE: Duration = Duration::from_secs(2);
/// Name of the demo crowd's task.
const DEMO_CROWD: &str = "demo-crowd";

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting, lets
/// in-flight requests finish (for at most [`SHUTDOWN_GRACE`]), stops the background tasks
/// (the live hub, the scheduler, the gauge upkeep and the demo crowd; those that did not
/// stop in time are logged by name) and answers `Ok`. Startup problems (an unusable data dir or signing key, an unavailable
/// backend) are errors before anything is served.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(?settings, "starting");
    // Every file the process creates (the store's, the key's) is its owner's only.
    #[cfg(unix)]
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
    crate::store::journal::create_private_dir(&settings.data_dir).with_context(|| {
        format!(
            "cannot create the data directory {}",
            settings.data_dir.display()
        )
    })?;
    let mut places = 0;
    let store: Arc<dyn Store> = match &settings.store {
        StoreBackend::Embedded => {
            let dir = settings.data_dir.join("store");
            let now = crate::clock::system_now();
            let store = EmbeddedStore::open_with(&dir, settings.durability, now, settings.repair)
                .with_context(|| format!("opening the store in {}", dir.display()))?;
            places = store.restored_places();
            Arc::new(store)
        }
        StoreBackend::Redis { url } => {
            let store = RedisStore::connect(url.expose(), RedisOptions::default())
                .await
                .with_context(|| format!("opening the store at {}", settings.store))?;
            Arc::new(store)
        }
    };
    if matches!(settings.store, StoreBackend::Redis { .. }) && settings.signing_key.is_none() {
        // A key generated per node would make every token one node issued invalid on the
        // others (waiting-token MACs and access-token signatures both derive from it).
        anyhow::bail!(
            "with a Redis store every node must use the same --signing-key FILE \
             (generate one with `openssl genpkey -algorithm ed25519 -out key.pem`)"
        );
    }
    let key = tokens::load_key_for_store(
        settings.signing_key.as_deref(),
        &settings.data_dir,
        places,
        settings.repair,
    )?;

    let admin_token = match &settings.admin_token {
        Some(t) => t.expose().clone(),
        None => {
            let t = generate_admin_token();
            // stdout, not the log: a newcomer reads it from the terminal, and a log
            // collector should not keep the secret.
            println!("admin token: {t}");
            t
        }
    };
    let state = AppState::new(store, &key, &admin_token, Clock::system())?;

    // Before anything can change the store, so that no notice is missed.
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
    let app = crate::http::router(state);
    tracing::info!(%addr, store = %settings.store, demo = settings.demo, "serving");
    println!("listening on http://{addr}");

    // Once `shutdown` fires, the server stops accepting and drains; the grace timer starts
    // at that moment, not before.
    let (fired_tx, mut fired_rx) = tokio::sync::watch::channel(false);
    let graceful = async move {
        shutdown.await;
        tracing::info!("shutdown requested; finishing in-flight requests");
        // Live streams (WebSocket, SSE) close now rather than hold the drain to its end.
        streams_stop.send_replace(true);
        let _ = fired_tx.send(true);
    };
    // Connection info (the peer address) is not read by any handler yet: it is there for
    // the per-client limits that come next, which will key on it.
    // No Nagle delay: live frames written back to back must not wait for ACKs.
    let listener = axum::serve::ListenerExt::tap_io(listener, |s| {
        let _ = s.set_nodelay(true);
    });
    let serve = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(graceful);
    let grace = async move {
        let _ = fired_rx.wait_for(|f| *f).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let served = tokio::select! {
        r = serve => r.context("serving HTTP"),
        _ = grace => {
            tracing::warn!(
                grace_sec = SHUTDOWN_GRACE.as_secs(),
                "connections still open after the grace period; closing them"
            );
            Ok(())
        }
    };

    // Each one that did not stop in time is logged by name.
    tasks.stop(TASK_GRACE).await;
    // Last, once nothing can change the state any more: make what was acknowledged durable.
    let closed = store.close().await.context("closing the store");
    tracing::info!("stopped");
    served.and(closed)
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
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
        first_signal(vec![
            ("SIGTERM", handler(SignalKind::terminate())),
            ("SIGINT", handler(SignalKind::interrupt())),
        ])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> std::io::Result<SignalFuture> {
        Err(std::io::Error::other("no handler"))
    }

    /// A handler that fires when the answered sender sends.
    fn handler() -> (
        tokio::sync::oneshot::Sender<()>,
        std::io::Result<SignalFuture>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (
            tx,
            Ok(Box::pin(async move {
                let _ = rx.await;
            })),
        )
    }

    async fn resolves(f: impl Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::from_millis(100), f)
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_handler_does_not_drop_the_other() {
        // SIGINT failed, SIGTERM installed: SIGTERM still shuts down gracefully.
        let (term, ok) = handler();
        let wait = first_signal(vec![("SIGTERM", ok), ("SIGINT", failed())]);
        term.send(()).unwrap();
        assert!(resolves(wait).await);

        // And the other way round.
        let (int, ok) = handler();
        let wait = first_signal(vec![("SIGTERM", failed()), ("SIGINT", ok)]);
        int.send(()).unwrap();
        assert!(resolves(wait).await);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_a_signal_and_forever_without_handlers() {
        let (_term, ok) = handler();
        let (int, ok2) = handler();
        let mut wait = Box::pin(first_signal(vec![("SIGTERM", ok), ("SIGINT", ok2)]));
        assert!(!resolves(wait.as_mut()).await, "nothing fired yet");
        int.send(()).unwrap();
        assert!(resolves(wait).await);
        assert!(
            !resolves(first_signal(vec![
                ("SIGTERM", failed()),
                ("SIGINT", failed())
            ]))
            .await
        );
    }
}
