//! How a node calls the script: as a Redis Function (`FCALL`) where the server has them
//! (Redis 7.0 and later), else with EVALSHA.
//!
//! EVALSHA runs the script's whole top level on every call (every function definition of
//! the rules, about 200 closures) before the operation itself; a library loaded with
//! `FUNCTION LOAD` runs it once, and each `FCALL` then runs the operation alone. The keys
//! go with the call either way, so a Cluster routes it by the event's slot.
//!
//! The library is loaded when the connection opens (on every master of a Cluster), and
//! again whenever a call finds it missing (a restart without persistence, a `FUNCTION
//! FLUSH`, a failover to a server that never had it), after which the call is made once
//! more, as EVALSHA does on NOSCRIPT; a load that fails then (`FUNCTION LOAD` is refused
//! under `maxmemory` and on a read-only replica) sends that call as EVALSHA. A server
//! without Functions, or an ACL user without `FUNCTION LOAD` or `FCALL`, answers the load or
//! the call with an error, and the node keeps to EVALSHA.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::conn::Conn;
use super::script::{LIBRARY, SCRIPT};

/// Which way this node calls the script.
pub(super) struct Caller {
    /// EVALSHA only: [`RedisOptions::functions`](super::RedisOptions) off.
    eval: AtomicBool,
    /// When the server last refused Functions (ms since `start`, plus 1; 0: never): calls
    /// go as EVALSHA until `retry` has passed, then FCALL is tried again. For good, a
    /// permission withdrawn for a moment cost every later call EVALSHA's ~1.8 times the
    /// Redis CPU until the node restarted.
    refused_at: AtomicU64,
    start: std::time::Instant,
    retry: std::time::Duration,
    /// The refusal was logged as a warning, and not yet followed by a working FCALL:
    /// refusals meanwhile (a server without Functions, met again every `retry`) are logged
    /// at debug level.
    warned: AtomicBool,
}

/// Error codes with which Redis refuses a writing command before it runs it. A function
/// without the `no-writes` flag counts as one, so `FCALL` is refused whole; EVAL, which
/// declares nothing, runs until its first write and is refused only there (under
/// `maxmemory` a batch's leaves still go through, and an operation that writes nothing still
/// answers: see the batch in ops.lua). Such a call goes again as EVALSHA, so that it is
/// answered exactly as before; nothing of it ran.
const REFUSED_UP_FRONT: [&str; 4] = ["OOM", "READONLY", "NOREPLICAS", "MISCONF"];

/// The library is not on the server the call reached.
fn missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// The server has no Functions (before Redis 7: no such command), or the ACL user may not
/// load them. Any other error (a server still loading, a Cluster in a failover) passes.
fn refuses_functions(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or("");
    e.code() == Some("NOPERM")
        || (e.code() == Some("ERR")
            && (detail.starts_with("unknown command") || detail.starts_with("unknown subcommand")))
}

/// `FCALL` itself is refused: by the ACL ("no permissions to run the 'fcall' command"),
/// or as an unknown command (a server without Functions, such as one a failover reached).
/// A refusal for the keys the call names is not one: EVALSHA gets it as well.
fn refuses_fcall(e: &RedisError) -> bool {
    let detail = e.detail().unwrap_or("");
    (e.code() == Some("NOPERM") && detail.contains("'fcall'"))
        || (e.code() == Some("ERR") && detail.starts_with("unknown command"))
}

impl Caller {
    pub(super) fn new(functions: bool, retry: std::time::Duration) -> Caller {
        Caller {
            eval: AtomicBool::new(!functions),
            refused_at: AtomicU64::new(0),
            start: std::time::Instant::now(),
            retry,
            warned: AtomicBool::new(false),
        }
    }

    /// Whether calls go as EVALSHA: configured so, or the server refused Functions less
    /// than `retry` ago.
    pub(super) fn eval_only(&self) -> bool {
        if self.eval.load(Ordering::Relaxed) {
            return true;
        }
        let at = self.refused_at.load(Ordering::Relaxed);
        at != 0 && self.now() < at + self.retry.as_millis() as u64
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// The server refused Functions: EVALSHA for `retry`.
    fn refused(&self, e: &RedisError, what: &str) {
        self.refused_at.store(self.now(), Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, retry_in = ?self.retry, "redis refused {what}; using EVALSHA");
        } else {
            tracing::debug!(error = %e, "redis refused {what} again; using EVALSHA");
        }
    }

    /// Loads the library (`REPLACE`: one of the same name is the same code, since the name
    /// is its hash; so a node starting beside others of its version succeeds). On a
    /// Cluster the command goes to every master. A server that refuses it (no Functions
    /// before Redis 7, or an ACL without them) leaves this node on EVALSHA for `retry`;
    /// any other failure is an error.
    pub(super) async fn load(&self, conn: &mut Conn) -> RedisResult<()> {
        if self.eval_only() {
            return Ok(());
        }
        let load = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&LIBRARY.code)
            .query_async::<Value>(conn)
            .await;
        match load {
            Ok(_) => Ok(()),
            Err(e) if refuses_functions(&e) => {
                self.refused(&e, "to load the script as a function library");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Calls the script with `keys` and the arguments `args` appends: `FCALL`, with one
    /// load and one more call if the library is missing, or EVALSHA.
    ///
    /// Every error that sends the call on as EVALSHA is one Redis answers before it runs
    /// anything of the call: a missing library, a load that failed (under `maxmemory`, where
    /// `FUNCTION LOAD` is refused too; on a read-only replica), a write refused up front, or
    /// `FCALL` itself refused (an ACL without it, a server without it). So no call is
    /// applied twice, and each is answered as EVALSHA answers it.
    pub(super) async fn call(
        &self,
        conn: &mut Conn,
        keys: &[String],
        args: impl Fn(&mut Cmd),
    ) -> RedisResult<Value> {
        if !self.eval_only() {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(&LIBRARY.name).arg(keys.len()).arg(keys);
            args(&mut cmd);
            let mut reply = cmd.query_async::<Value>(conn).await;
            if reply.as_ref().is_err_and(missing) {
                match self.load(conn).await {
                    Ok(()) if !self.eval_only() => reply = cmd.query_async(conn).await,
                    Ok(()) => {}
                    Err(e) => tracing::warn!(
                        error = %e,
                        "could not load the script's function library; this call goes as EVALSHA"
                    ),
                }
            }
            match reply {
                Ok(_) if self.refused_at.load(Ordering::Relaxed) != 0 => {
                    // Functions work again: said once, and a later refusal is warned of.
                    self.refused_at.store(0, Ordering::Relaxed);
                    if self.warned.swap(false, Ordering::Relaxed) {
                        tracing::info!("redis takes FCALL again; EVALSHA no longer used");
                    }
                    return reply;
                }
                Err(e) if refuses_fcall(&e) => self.refused(&e, "FCALL"),
                Err(e) if missing(&e) => {}
                Err(e) if e.code().is_some_and(|c| REFUSED_UP_FRONT.contains(&c)) => {}
                other => return other,
            }
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(SCRIPT.get_hash()).arg(keys.len()).arg(keys);
        args(&mut cmd);
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                SCRIPT.load_async(conn).await?;
                cmd.query_async(conn).await
            }
            other => other,
        }
    }
}
