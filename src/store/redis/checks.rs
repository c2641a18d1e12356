//! What a node checks of, and keeps in, Redis when it starts: that Redis will not evict
//! keys, and the record of the signing keys the places were issued under (which a running
//! node also writes back should Redis lose it); and what `/readyz` asks of it ([`ready`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::RedisResult;

use super::{Conn, Inner, RedisStore};
use crate::store::{StoreError, StoreResult};

/// How often a running node looks for its signing-key record in Redis at most.
const KEY_RECORD_EVERY: Duration = Duration::from_secs(1);

/// Refuses a server that may evict keys: an evicted chunk of places or of the line loses
/// acknowledged places silently, and the event's counters, kept apart, go on counting
/// them (an evicted admitted place holds its slot for ever). With `noeviction` a full
/// Redis refuses writes instead, which nodes answer with 503. Without a memory limit
/// (`maxmemory` 0) nothing is evicted whatever the policy; a `volatile-*` policy evicts
/// only keys with a time to live (here the scheduler's lease and spent proofs of work),
/// which is warned about. Checked on the server connected to (the seed of a Cluster) when
/// the connection is opened.
pub(super) async fn check_eviction(
    conn: &mut redis::aio::MultiplexedConnection,
) -> RedisResult<()> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    let limited = info_field(&info, "maxmemory").is_some_and(|m| m != "0");
    match info_field(&info, "maxmemory_policy") {
        _ if !limited => Ok(()),
        None | Some("noeviction") => Ok(()),
        Some(policy) if policy.starts_with("volatile-") => {
            tracing::warn!(
                policy,
                "redis evicts keys with a time to live under maxmemory: a spent proof of \
                 work may be accepted again; `maxmemory-policy noeviction` is safer"
            );
            Ok(())
        }
        Some(policy) => Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "redis may evict keys",
            format!(
                "maxmemory-policy is {policy} under a maxmemory limit; an evicted key loses \
                 places silently: set `maxmemory-policy noeviction` (a full Redis then \
                 refuses writes, answered 503)"
            ),
        ))),
    }
}

/// The replicas of an `INFO replication` answer that are `online`: the ones that
/// acknowledge writes, so the ones a `WAIT` can count (a replica still syncing is listed,
/// as `connected_slaves` counts it, but acknowledges nothing).
pub(super) fn online_replicas(info: &str) -> u32 {
    let online = info.lines().filter(|l| {
        l.strip_prefix("slave")
            .and_then(|r| r.split_once(':'))
            .is_some_and(|(n, fields)| {
                n.bytes().all(|b| b.is_ascii_digit())
                    && fields.split(',').any(|f| f == "state=online")
            })
    });
    online.count() as u32
}

/// With `redis_wait_replicas` `want`, why the Redis at `conn` cannot acknowledge a change
/// (fewer replicas online than that), or `None`: every change it applies would then answer
/// 503 after the `WAIT`, so the node is not ready.
pub(super) async fn missing_replicas(
    conn: &mut impl redis::aio::ConnectionLike,
    want: u32,
) -> RedisResult<Option<String>> {
    if want == 0 {
        return Ok(None);
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await?;
    let online = online_replicas(&info);
    Ok((online < want).then(|| {
        format!(
            "redis has {online} replica(s) online, fewer than the {want} that \
             redis_wait_replicas needs: every change answers 503 until enough are"
        )
    }))
}

/// A field of an `INFO` answer.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

impl RedisStore {
    /// The fingerprints of the signing keys the last node to start used (one a line, oldest
    /// first): what every node's waiting tokens and access tokens in this Redis come from.
    /// Kept in Redis, not in a node's data dir, because nodes come and go with fresh ones.
    pub async fn recorded_signing_keys(&self) -> StoreResult<Option<String>> {
        let s = &self.inner;
        let mut conn = s.connection().await?;
        s.bounded(
            redis::cmd("GET")
                .arg(s.signing_keys_key())
                .query_async(&mut conn),
        )
        .await
    }

    /// Records `text` as [`RedisStore::recorded_signing_keys`].
    pub async fn record_signing_keys(&self, text: &str) -> StoreResult<()> {
        let s = &self.inner;
        let mut conn = s.connection().await?;
        s.bounded(
            redis::cmd("SET")
                .arg(s.signing_keys_key())
                .arg(text)
                .query_async::<()>(&mut conn),
        )
        .await
    }

    /// Keeps `text` (this node's record, as [`RedisStore::record_signing_keys`] wrote it or
    /// found it) in Redis while the node runs: when Redis has lost the record (a restart
    /// without persistence, a flush), the node writes it back, within about a second.
    /// Otherwise the next node to start would find no record and be accepted with any key.
    pub fn keep_signing_keys(&self, text: String) {
        *self.inner.kept_keys.lock() = Some(KeptKeys {
            text,
            due: Instant::now() + KEY_RECORD_EVERY,
        });
    }
}

/// What [`RedisStore::keep_signing_keys`] keeps, and when it looks next.
pub(super) struct KeptKeys {
    text: String,
    due: Instant,
}

impl Inner {
    pub(super) fn signing_keys_key(&self) -> String {
        format!("{}:signing-keys", self.options.key_prefix)
    }

    /// Writes the kept signing-key record back if Redis no longer has it, at most every
    /// [`KEY_RECORD_EVERY`] (a no-op before [`RedisStore::keep_signing_keys`]). `SET NX`: a
    /// record that is there, this node's or another's (a node started since with a
    /// rotation), is left alone. Sent from a task of its own, so that the caller never
    /// waits for it (on a Cluster the record's shard may be the one that is down); a
    /// failure is left to the next look.
    pub(super) fn restore_signing_keys(self: &Arc<Self>, conn: &Conn) {
        let text = {
            let mut kept = self.kept_keys.lock();
            match kept.as_mut() {
                Some(k) if k.due <= Instant::now() => {
                    k.due = Instant::now() + KEY_RECORD_EVERY;
                    k.text.clone()
                }
                _ => return,
            }
        };
        let (s, mut conn) = (self.clone(), conn.clone());
        tokio::spawn(async move {
            let set = s
                .bounded(
                    redis::cmd("SET")
                        .arg(s.signing_keys_key())
                        .arg(&text)
                        .arg("NX")
                        .query_async::<Option<String>>(&mut conn),
                )
                .await;
            match set {
                Ok(Some(_)) => tracing::warn!(
                    key = %s.signing_keys_key(),
                    "the record of the signing keys was missing from Redis (did it lose its \
                     data?); this node wrote its own back"
                ),
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "could not look for the signing-key record"),
            }
        });
    }
}

/// `/readyz`'s look at Redis through `conn` (`Store::ping`): it answers, it takes writes
/// (outside a Cluster), a Cluster is `ok`, and the replicas `--redis-wait-replicas` asks
/// for are online.
pub(super) async fn ready(s: &Inner, conn: &mut Conn) -> StoreResult<()> {
    if matches!(conn, Conn::Cluster(_)) {
        // A keyless `PING`: the probe's key lives on one shard, and a node whose seed
        // left the Cluster reaches it only after its client's next slot refresh
        // (`a_node_whose_seed_left_the_cluster_goes_on`), which the state check below
        // does not wait for.
        s.bounded(redis::cmd("PING").query_async::<String>(conn))
            .await?;
    } else {
        // A write, not a `PING`: a Redis that answers but refuses writes (over
        // `maxmemory` under `noeviction`, a demoted master's `READONLY`,
        // `min-replicas-to-write` unmet, a failed save's `MISCONF`) fails every change
        // with 503, so the node is not ready.
        let mut probe = redis::cmd("SET");
        probe
            .arg(format!("{}:ready", s.options.key_prefix))
            .arg(1)
            .arg("PX")
            .arg(60_000);
        s.bounded(probe.query_async::<()>(conn)).await?;
    }
    if matches!(conn, Conn::Cluster(_)) {
        // A Cluster that lost a master refuses every command (`CLUSTERDOWN`) while its
        // nodes still answer PING: not ready, as for an unreachable Redis.
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("INFO");
        let info: String = s.bounded(conn.on_a_master(cmd)).await?;
        if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
            return Err(StoreError::Unavailable(
                "the redis cluster is down (cluster_state is not ok)".into(),
            ));
        }
    } else if let Some(why) = s
        .bounded(missing_replicas(conn, s.options.wait_replicas))
        .await?
    {
        // Redis answers, but no change can be acknowledged: not ready either.
        return Err(StoreError::Unavailable(why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the replicas that are `online` count: one still syncing acknowledges no write.
    #[test]
    fn online_replicas_are_counted_from_info() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
                    slave0:ip=127.0.0.1,port=6380,state=online,offset=42,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=6381,state=wait_bgsave,offset=0,lag=0\r\n\
                    slave2:ip=127.0.0.1,port=6382,state=online,offset=42,lag=1\r\n\
                    master_failover_state:no-failover\r\nmaster_repl_offset:42\r\n";
        assert_eq!(online_replicas(info), 2);
        assert_eq!(
            online_replicas("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n"),
            0
        );
    }
}
