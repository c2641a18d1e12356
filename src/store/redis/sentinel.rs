//! Redis Sentinel: the store follows whichever node the sentinels call master.
//!
//! `redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]` names the
//! sentinels and the service (the name in their `sentinel monitor` line); the credentials
//! and the database are those of the Redis nodes. At open the store asks the sentinels for
//! the master and connects to it; a watcher then asks again every [`WATCH_EVERY`] and, when
//! the sentinels have promoted another node, connects to that one and swaps it in. Requests
//! in flight on the old master fail (503, like any outage) and the next ones go to the new
//! one, so a failover costs the sentinels' detection time plus at most one watch period.
//!
//! Replication is asynchronous: a write the old master acknowledged but had not yet sent to
//! the replica is lost with it. `RedisOptions::wait_replicas` makes the store answer a
//! change only once that many replicas have it (`WAIT`), which closes that window at the
//! cost of a replication round trip per operation (see docs/API.md, "Redis Sentinel").

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// How often the watcher asks the sentinels who the master is.
pub(super) const WATCH_EVERY: Duration = Duration::from_millis(250);

/// The scheme of a sentinel URL.
pub const SCHEME: &str = "redis+sentinel://";

/// Where the sentinels are and what to ask them.
#[derive(Clone, Debug)]
pub(super) struct SentinelTarget {
    sentinels: Vec<String>,
    service: String,
    node: SentinelNodeConnectionInfo,
}

/// A sentinel URL's parts: the sentinels (host, port), the service, the database.
pub type Parsed = (Vec<(String, u16)>, String, Option<i64>);

/// Reads a sentinel URL; `None` when `url` is not one. The error names what is wrong
/// without echoing the password.
pub fn parse(url: &str) -> Option<Result<Parsed, String>> {
    let rest = url.strip_prefix(SCHEME)?;
    Some(parse_rest(rest))
}

/// A sentinel URL's authority (credentials and hosts) and its path. The authority ends at
/// the first `/` after its last `@`: a password may hold a `/` (base64 ones often do), and
/// cut there it was quoted, in part, in the "bad port" error.
fn split_authority(rest: &str) -> (&str, &str) {
    let from = rest.rfind('@').map_or(0, |i| i + 1);
    match rest[from..].find('/') {
        Some(j) => (&rest[..from + j], &rest[from + j + 1..]),
        None => (rest, ""),
    }
}

fn parse_rest(rest: &str) -> Result<Parsed, String> {
    let (authority, path) = split_authority(rest);
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let mut sentinels = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = h
            .rsplit_once(':')
            .ok_or_else(|| format!("sentinel `{h}` has no port (host:port)"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("sentinel `{h}` has a bad port"))?;
        if host.is_empty() {
            return Err(format!("sentinel `{h}` names no host"));
        }
        sentinels.push((host.to_string(), port));
    }
    let mut parts = path.splitn(2, '/');
    let service = parts.next().unwrap_or("");
    if service.is_empty() {
        return Err("a sentinel URL names its service: redis+sentinel://host:port/service".into());
    }
    let db = match parts.next().filter(|d| !d.is_empty()) {
        None => None,
        Some(d) => Some(
            d.parse::<i64>()
                .map_err(|_| format!("bad database number `{d}`"))?,
        ),
    };
    Ok((sentinels, service.to_string(), db))
}

/// The nodes' credentials (from the authority of a sentinel URL, decoded as redis-rs
/// decodes those of a redis:// URL) and database.
fn node_info(authority: &str, db: Option<i64>) -> anyhow::Result<redis::RedisConnectionInfo> {
    let mut info = redis::RedisConnectionInfo::default();
    if let Some((creds, _)) = authority.rsplit_once('@') {
        let url = format!("redis://{creds}@localhost/");
        let node = Client::open(&*super::with_userinfo_encoded(&url))?;
        let settings = node.get_connection_info().redis_settings();
        if let Some(user) = settings.username() {
            info = info.set_username(user);
        }
        if let Some(password) = settings.password() {
            info = info.set_password(password);
        }
    }
    if let Some(db) = db {
        info = info.set_db(db);
    }
    Ok(info)
}

impl SentinelTarget {
    /// The target of a sentinel URL, or `None` when `url` is not one.
    pub(super) fn from_url(url: &str) -> Option<anyhow::Result<Self>> {
        let parsed = parse(url)?;
        Some((|| {
            let (hosts, service, db) = parsed.map_err(|e| anyhow::anyhow!(e))?;
            let rest = url.strip_prefix(SCHEME).unwrap_or_default();
            let (authority, _) = split_authority(rest);
            let info = node_info(authority, db)?;
            Ok(SentinelTarget {
                sentinels: hosts
                    .into_iter()
                    .map(|(h, p)| format!("redis://{h}:{p}"))
                    .collect(),
                service,
                node: SentinelNodeConnectionInfo::default().set_redis_connection_info(info),
            })
        })())
    }

    /// A client of the node the sentinels call master now (it checks that node's role).
    pub(super) async fn master(&self) -> RedisResult<Client> {
        let mut s = Sentinel::build(self.sentinels.clone())?;
        s.async_master_for(&self.service, Some(&self.node)).await
    }

    /// Clients of the master's replicas (the notice relay's fallbacks: a PUBLISH on the
    /// master reaches subscribers on its replicas too).
    pub(super) async fn replicas(&self) -> Vec<Client> {
        let Ok(mut s) = Sentinel::build(self.sentinels.clone()) else {
            return Vec::new();
        };
        s.async_get_replica_clients(&self.service, Some(&self.node))
            .await
            .unwrap_or_default()
    }
}

/// The master's address and connection.
struct Master {
    addr: String,
    conn: super::conn::Healing,
}

/// A connection to whichever node is master; cloning shares it.
#[derive(Clone)]
pub(super) struct Following {
    current: Arc<ArcSwap<Master>>,
}

impl Following {
    pub(super) fn new(client: &Client, conn: super::conn::Healing) -> Self {
        let addr = client.get_connection_info().addr().to_string();
        Following {
            current: Arc::new(ArcSwap::from_pointee(Master { addr, conn })),
        }
    }

    pub(super) fn addr(&self) -> String {
        self.current.load().addr.clone()
    }

    fn conn(&self) -> super::conn::Healing {
        self.current.load().conn.clone()
    }
}

impl ConnectionLike for Following {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut c = self.conn();
        Box::pin(async move { c.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut c = self.conn();
        Box::pin(async move { c.req_packed_commands(pipeline, offset, count).await })
    }

    fn get_db(&self) -> i64 {
        self.conn().get_db()
    }
}

/// The watcher: swaps in the master the sentinels name whenever it changes. Runs until the
/// store aborts it.
pub(super) async fn watch(
    target: SentinelTarget,
    following: Following,
    config: ConnectionManagerConfig,
    op_timeout: Duration,
) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let client = match tokio::time::timeout(op_timeout, target.master()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "the sentinels named no master");
                continue;
            }
            Err(_) => continue,
        };
        let addr = client.get_connection_info().addr().to_string();
        if addr == following.addr() {
            continue;
        }
        match tokio::time::timeout(
            op_timeout,
            ConnectionManager::new_with_config(client.clone(), config.clone()),
        )
        .await
        {
            Ok(Ok(conn)) => {
                let conn = super::conn::Healing::new(client, config.clone(), conn);
                tracing::warn!(
                    from = %following.addr(),
                    to = %addr,
                    "following the master the sentinels promoted"
                );
                following.current.store(Arc::new(Master { addr, conn }));
            }
            Ok(Err(e)) => tracing::debug!(error = %e, %addr, "cannot reach the new master yet"),
            Err(_) => tracing::debug!(%addr, "the new master did not answer in time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sentinels_service_and_db() {
        let (hosts, service, db) = parse("redis+sentinel://a:26379,b:26380/mymaster/2")
            .unwrap()
            .unwrap();
        assert_eq!(hosts, vec![("a".into(), 26379), ("b".into(), 26380)]);
        assert_eq!(service, "mymaster");
        assert_eq!(db, Some(2));
        let (_, service, db) = parse("redis+sentinel://u:p%40ss@a:1/m").unwrap().unwrap();
        assert_eq!((service.as_str(), db), ("m", None));
        assert!(parse("redis://a:1").is_none());
        // A `/` in the password (defect: the authority was cut there, and the error quoted
        // the user and the password's first part as a sentinel with a bad port).
        let (hosts, service, db) = parse("redis+sentinel://app:Xk9/AbC==@s1:26379/mymaster/1")
            .unwrap()
            .unwrap();
        assert_eq!(hosts, vec![("s1".into(), 26379)]);
        assert_eq!((service.as_str(), db), ("mymaster", Some(1)));
        let err = parse("redis+sentinel://app:Xk9/AbC==@s1:x/m")
            .unwrap()
            .unwrap_err();
        assert!(!err.contains("Xk9") && !err.contains("app"), "{err}");
    }

    /// A password holding `/`, `?`, `#` or `@` reaches Redis as written (defect: redis-rs
    /// refused such a URL with a bare "did not parse"); an encoded one stays as it was.
    #[test]
    fn passwords_with_url_characters_are_read_whole() {
        for (url, password) in [
            ("redis://u:ab/cd?e#f@g@h:1/2", "ab/cd?e#f@g"),
            ("redis://u:ab%2Fcd@h:1/2", "ab/cd"),
            ("redis://:plain@h:1", "plain"),
        ] {
            let c = redis::Client::open(&*super::super::with_userinfo_encoded(url)).unwrap();
            let info = c.get_connection_info().redis_settings();
            assert_eq!(info.password(), Some(password), "{url}");
        }
        let (authority, _) = split_authority("app:Xk9/Ab?C@s1:26379/m/1");
        let info = node_info(authority, Some(1)).unwrap();
        assert_eq!(info.password(), Some("Xk9/Ab?C"));
        assert_eq!(info.username(), Some("app"));
    }

    #[test]
    fn names_what_is_wrong() {
        for (url, says) in [
            ("redis+sentinel://a:1", "names its service"),
            ("redis+sentinel://a/m", "no port"),
            ("redis+sentinel://a:x/m", "bad port"),
            ("redis+sentinel://:1/m", "no host"),
            ("redis+sentinel://a:1/m/x", "database"),
        ] {
            let err = parse(url).unwrap().unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
