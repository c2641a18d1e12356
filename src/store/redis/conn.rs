//! The connection every operation uses: standalone, Cluster, or the master Sentinel names.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::sentinel;

/// A connection to a standalone Redis or to a Cluster; both reconnect by themselves.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
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
