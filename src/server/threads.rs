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
//! caps on connections) is shared as before; a task a request spawns (a Redis batch's
//! drain, a joined upgrade) runs on its serving thread's runtime, which is kept running
//! until the server is done (see [`Threads::release`]).
//!
//! Where a second socket cannot join the address (`SO_REUSEPORT` refused), the threads share
//! the one listening socket instead, each accepting from it. With `SO_REUSEPORT` on, another
//! process of the same user could bind the port too and get a share of the connections, as
//! with nginx's `reuseport`: a process of the same user could already do worse.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::ConnectionCaps;
use crate::config::Settings;

/// The serving threads, drained and waiting for [`Threads::release`].
pub(super) struct Threads {
    release: watch::Sender<bool>,
    exited: Vec<oneshot::Receiver<()>>,
}

impl Threads {
    /// Lets the threads' runtimes go (what their requests spawned is dropped with them) and
    /// waits until they have. Called once the server is done, after the store is closed.
    pub(super) async fn release(self) {
        self.release.send_replace(true);
        for exited in self.exited {
            let _ = exited.await;
        }
    }
}

/// What each serving thread is given: everything but its listener and its gateway.
pub(super) struct Shared {
    pub app: axum::Router,
    pub settings: Settings,
    pub caps: ConnectionCaps,
    pub streams_stop: Arc<watch::Sender<bool>>,
}

/// Serves `listener`'s address on `count` threads (see the module's comment) until
/// `shutdown`; each thread gets the gateway `gateway` makes for it. Answers once every
/// thread has drained its connections (as [`super::serve`] does), with the threads, whose
/// runtimes still run what requests spawned until released.
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
        let spawned = std::thread::Builder::new()
            .name(format!("waitroom-serve-{i}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let runtime = match runtime {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = done_tx
                            .send(Err(anyhow::Error::new(e)
                                .context("starting a serving thread's runtime")));
                        return;
                    }
                };
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
                            )
                            .await
                        }
                        Err(e) => Err(anyhow::Error::new(e).context("registering a listener")),
                    };
                    let _ = done_tx.send(served);
                    // Still running what the requests spawned (a Redis batch's drain, an
                    // upgraded connection) while the server stops its tasks and the store.
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
        done.push(done_rx);
        threads.exited.push(exited_rx);
    }
    shutdown.await;
    stop_tx.send_replace(true);
    let mut result = Ok(());
    for d in done {
        let served = d
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a serving thread ended early")));
        if result.is_ok() {
            result = served;
        }
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
        Ok(more) => all.extend(more),
        Err(e) => {
            tracing::warn!(error = %e, %addr, "no SO_REUSEPORT: the serving threads share one listening socket");
            for _ in 1..count {
                all.push(all[0].try_clone().context("sharing the listener")?);
            }
        }
    }
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
