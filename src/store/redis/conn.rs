//! The connection every operation uses: standalone, Cluster, or the master Sentinel names.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::sentinel;

/// How often, at most, a refused connection is made again.
const REMAKE_EVERY: Duration = Duration::from_secs(1);

/// A connection to a standalone Redis or to a Cluster; both reconnect by themselves.
#[derive(Clone)]
pub(super) enum Conn {
    Single(Healing),
    Cluster(ClusterConnection),
    /// The master the sentinels name, followed across failovers.
    Sentinel(sentinel::Following),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Runs a command that names no key. On a Cluster it goes to a master that holds
    /// slots: the client would send such a command (`CLUSTER INFO`) to any node it has a
    /// connection to, including a seed node that has since left the Cluster, which answers
    /// for itself (`cluster_state:fail`).
    pub(super) async fn on_a_master<T: redis::FromRedisValue>(
        &mut self,
        cmd: Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Cluster(c) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let v = c
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
                    )
                    .await?;
                Ok(redis::from_redis_value(v)?)
            }
            _ => cmd.query_async(self).await,
        }
    }
}

/// A node's connection: redis-rs's `ConnectionManager`, made again when it can no longer
/// reconnect by itself. It reconnects only after an I/O error, so a reconnection that Redis
/// refused (a password changed and changed back, an ACL user made again, a failover to a
/// replica whose users lag) left it answering that refusal to every call for good: the
/// node unready until restarted, while Redis took connections again.
#[derive(Clone)]
pub(super) struct Healing(Arc<HealingInner>);

struct HealingInner {
    current: ArcSwap<ConnectionManager>,
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// When the manager was last made again: a refusal that lasts makes one a second.
    remade: parking_lot::Mutex<Option<Instant>>,
}

impl Healing {
    /// `conn`, made of `client` with `config`, which a remaking uses again.
    pub(super) fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
        conn: ConnectionManager,
    ) -> Self {
        Healing(Arc::new(HealingInner {
            current: ArcSwap::from_pointee(conn),
            client,
            config,
            remade: parking_lot::Mutex::new(None),
        }))
    }

    fn conn(&self) -> ConnectionManager {
        (**self.0.current.load()).clone()
    }

    /// After a call's error that was not an I/O error (those the manager reconnects
    /// after by itself): if the connection itself is what fails (a `PING` through it fails
    /// too, and not with an I/O error), the manager is made again, in the background; this
    /// call and those meanwhile answer the failure. A command's own error (a script's, a
    /// key's) leaves the `PING` answered, and nothing is made. The refusals that stick
    /// otherwise: `AUTH` refused, RESP3's `HELLO` refused, `SELECT` refused (no permission,
    /// a busy script, a database out of range) while reconnecting.
    fn after(&self, e: &RedisError) {
        if e.is_io_error() || e.is_timeout() {
            return;
        }
        {
            let mut last = self.0.remade.lock();
            if last.is_some_and(|t| t.elapsed() < REMAKE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let me = self.clone();
        tokio::spawn(async move {
            let mut conn = me.conn();
            let ping = tokio::time::timeout(
                REMAKE_EVERY,
                redis::cmd("PING").query_async::<Value>(&mut conn),
            )
            .await;
            match ping {
                // A server loading its data, running a long script or without its master
                // refuses `PING` too, on any connection: nothing to make (a new one would
                // be refused the same, or taken and swapped in for nothing).
                Ok(Err(e)) if matches!(e.code(), Some("LOADING" | "BUSY" | "MASTERDOWN")) => return,
                Ok(Err(e)) if !e.is_io_error() && !e.is_timeout() => {}
                // It answers (the error was the command's own), it reconnects by itself
                // (I/O), or it is slow: nothing to make.
                _ => return,
            }
            let (client, config) = (me.0.client.clone(), me.0.config.clone());
            let made = tokio::time::timeout(
                REMAKE_EVERY * 5,
                ConnectionManager::new_with_config(client, config),
            )
            .await;
            match made {
                Ok(Ok(c)) => {
                    tracing::warn!("redis: connected again after a refused reconnection");
                    me.0.current.store(Arc::new(c));
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "redis: the connection is still refused"),
                Err(_) => tracing::debug!("redis: no answer while connecting again"),
            }
        });
    }
}

impl ConnectionLike for Healing {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut c = self.conn();
        Box::pin(async move {
            let r = c.req_packed_command(cmd).await;
            if let Err(e) = &r {
                self.after(e);
            }
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut c = self.conn();
        Box::pin(async move {
            let r = c.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &r {
                self.after(e);
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.0.current.load().get_db()
    }
}

/// `url` with the characters of its user and password that would end them early for a URL
/// parser (`/`, `?`, `#`, an `@` but the last) percent-encoded: a password may hold them
/// (base64 ones often hold `/`), and redis-rs then failed with a bare "did not parse".
/// redis-rs decodes them back. A `%` is left alone: an encoded password stays as it was.
pub(in crate::store) fn with_userinfo_encoded(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.into();
    };
    let Some((userinfo, hosts)) = rest.rsplit_once('@') else {
        return url.into();
    };
    if !userinfo.contains(['/', '?', '#', '@']) {
        return url.into();
    }
    let encoded = userinfo
        .replace('/', "%2F")
        .replace('?', "%3F")
        .replace('#', "%23")
        .replace('@', "%40");
    format!("{scheme}://{encoded}@{hosts}").into()
}
