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
use crate::scheduler::{self, spawn_task};
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::Store;
use crate::tokens;

/// How long in-flight requests and open connections get to finish after the shutdown
/// signal. Long-lived streams (WebSocket, SSE) would otherwise hold the process forever;
/// it stays under the 10 s that container runtimes wait before killing.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long background tasks get to stop once the server is done.
const TASK_GRACE: Duration = Duration::from_secs(2);

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting, lets
/// in-flight requests finish (for at most [`SHUTDOWN_GRACE`]), stops the background tasks
/// and answers `Ok`. Startup problems (an unusable data dir or signing key, an unavailable
/// backend) are errors before anything is served.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tracing::info!(?settings, "starting");
    std::fs::create_dir_all(&settings.data_dir).with_context(|| {
        format!(
            "cannot create the data directory {}",
            settings.data_dir.display()
        )
    })?;
    let store: Arc<dyn Store> = match &settings.store {
        StoreBackend::Embedded => {
            let dir = settings.data_dir.join("store");
            let store = EmbeddedStore::open(&dir, settings.durability, crate::clock::system_now())
                .with_context(|| format!("opening the store in {}", dir.display()))?;
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
    let key = tokens::load_or_generate_key(settings.signing_key.as_deref(), &settings.data_dir)?;

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

    let (stop_tx, stop_rx) = scheduler::stop_channel();
    let mut tasks = vec![spawn_task(
        "scheduler",
        scheduler::run(state.clone(), stop_rx.clone()),
    )];
    if settings.demo {
        scheduler::ensure_demo_event(&state)
            .await
            .context("creating the demo event")?;
        tasks.push(spawn_task(
            "demo-crowd",
            scheduler::run_demo_crowd(state.clone(), stop_rx.clone()),
        ));
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
    // Connection info lets handlers key per-client limits by peer address.
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

    let _ = stop_tx.send(true);
    for t in tasks {
        if tokio::time::timeout(TASK_GRACE, t).await.is_err() {
            tracing::warn!("a background task did not stop in time");
        }
    }
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
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM received"),
                        _ = int.recv() => tracing::info!("SIGINT received"),
                    }
                }
                (term, int) => {
                    // Without handlers the default actions still end the process; we only
                    // lose the graceful part.
                    let e = term.err().or(int.err());
                    tracing::error!(error = ?e, "cannot install signal handlers");
                    std::future::pending::<()>().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %e, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        }
    }
}
