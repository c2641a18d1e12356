//! The caps on open connections, and the stream that holds a connection's share of them
//! for as long as its socket is open.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::Settings;

/// The caps on open connections: in total, and per client address. Clones share the
/// counts (the gateway's serving threads count against the same caps).
#[derive(Clone)]
pub(super) struct ConnectionCaps {
    pub(super) total: usize,
    pub(super) per_client: usize,
    /// Peers exempt from the per-client cap: a proxy carries many clients.
    trusted: Vec<crate::config::Cidr>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    by_client: ByClient,
}

/// Open connections per client address.
type ByClient = Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>;

impl ConnectionCaps {
    pub(super) fn new(settings: &Settings) -> Self {
        ConnectionCaps {
            total: settings
                .connections
                .max_connections
                .unwrap_or_else(super::default_max_connections),
            per_client: settings.connections.max_connections_per_client,
            trusted: settings.rate_limits.trusted_proxies.clone(),
            open: Arc::default(),
            by_client: Arc::default(),
        }
    }

    /// A slot for a new connection from `peer`, or `None` when a cap is reached.
    pub(super) fn admit(&self, peer: IpAddr) -> Option<ConnectionSlot> {
        use std::sync::atomic::Ordering;
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.total {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let mut slot = ConnectionSlot {
            open: self.open.clone(),
            client: None,
        };
        let peer = crate::config::guard::canonical(peer);
        if !self.trusted.iter().any(|c| c.contains(peer)) {
            // IPv6 by /64, as the rate limits key it.
            let key = match peer {
                IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) >> 64 << 64).into()),
                v4 => v4,
            };
            let mut by_client = self.by_client.lock();
            let n = by_client.entry(key).or_insert(0);
            if *n >= self.per_client {
                return None;
            }
            *n += 1;
            slot.client = Some((self.by_client.clone(), key));
        }
        Some(slot)
    }
}

/// One open connection's share of the caps, given back when dropped.
pub(super) struct ConnectionSlot {
    open: Arc<std::sync::atomic::AtomicUsize>,
    client: Option<(ByClient, IpAddr)>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if let Some((map, key)) = &self.client {
            let mut map = map.lock();
            if let Some(n) = map.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(key);
                }
            }
        }
    }
}

/// A client's socket with its connection's share of the caps. The share goes with the
/// socket, not with the HTTP connection's task: an upgraded connection (a WebSocket, a
/// tunnel to the origin in gateway mode) outlives that task, and still counts until it
/// closes.
pub(super) struct HeldStream {
    pub tcp: TcpStream,
    pub _slot: ConnectionSlot,
}

impl AsyncRead for HeldStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for HeldStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
