//! `waitroom-bench holds`: hold/release throughput of the store itself (no HTTP), on the
//! in-memory embedded store, the durable one (journal synced per group commit, in a
//! temporary directory) or Redis. `--sessions` active sessions each hold two random seats
//! of `--seats` and release them, in a closed loop, for `--seconds`; a hold that meets
//! another session's seat is refused (`HOLD_CONFLICT`) and counted as such, since
//! refusing is work the store does too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::{Args, ValueEnum};
use waitroom::core::QueueError;
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::journal::Durability;
use waitroom::store::redis::{RedisOptions, RedisStore};
use waitroom::store::{JoinRequest, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Memory,
    Durable,
    Redis,
}

#[derive(Args)]
pub struct HoldsArgs {
    #[arg(long, value_enum, default_value_t = Backend::Memory)]
    backend: Backend,
    /// The Redis of `--backend redis` (keys under a fresh prefix, removed with the event).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    #[arg(long, default_value_t = 64)]
    sessions: usize,
    #[arg(long, default_value_t = 1000)]
    seats: usize,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Worker threads of the load generator's runtime (the store runs on it too).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

pub async fn run(a: HoldsArgs) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("waitroom-holds-{}", std::process::id()));
    let store: Arc<dyn Store> = match a.backend {
        Backend::Memory => Arc::new(EmbeddedStore::new()),
        Backend::Durable => Arc::new(EmbeddedStore::open(&dir, Durability::Sync, now())?),
        Backend::Redis => {
            let options = RedisOptions {
                key_prefix: format!("bench-holds-{}", std::process::id()),
                ..RedisOptions::default()
            };
            Arc::new(RedisStore::connect(&a.redis_url, options).await?)
        }
    };
    let ev = "holds";
    let settings = serde_json::json!({"max_active": a.sessions, "max_holds_per_session": 4,
        "session_idle_sec": 3600, "session_max_sec": 3600});
    store
        .put_event(ev, &serde_json::from_value(settings)?, now())
        .await?;
    let seats: Vec<String> = (1..=a.seats).map(|i| format!("S-{i}")).collect();
    for chunk in seats.chunks(5000) {
        store.put_inventory(ev, chunk, now()).await?;
    }
    let mut keys = Vec::new();
    for i in 0..a.sessions {
        let req = JoinRequest {
            nonce: waitroom::tokens::random_u128(),
            user_id: Some(format!("u{i}")),
            proven: true,
            ..JoinRequest::default()
        };
        let p = store.join(ev, &req, now()).await?;
        store.enter(ev, p.key, now()).await?;
        keys.push(p.key);
    }
    let ops = Arc::new(AtomicU64::new(0));
    let conflicts = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let tasks: Vec<_> = keys
        .into_iter()
        .enumerate()
        .map(|(i, key)| {
            let (store, ops, conflicts, seats) =
                (store.clone(), ops.clone(), conflicts.clone(), seats.clone());
            tokio::spawn(async move {
                // A small xorshift per session: reproducible picks without a dependency.
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
                let mut pick = || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    seats[(x % seats.len() as u64) as usize].clone()
                };
                while Instant::now() < until {
                    let want = [pick(), pick()];
                    match store.hold(ev, key, &want, now()).await {
                        Ok(_) => {
                            store.release(ev, key, None, now()).await?;
                            ops.fetch_add(2, Ordering::Relaxed);
                        }
                        Err(e) if e.queue() == Some(&QueueError::HoldConflict) => {
                            conflicts.fetch_add(1, Ordering::Relaxed);
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return Err(anyhow::anyhow!("hold failed: {e}")),
                    }
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    let c = conflicts.load(Ordering::Relaxed);
    let counts = store.inventory(ev, now()).await?.counts;
    store.delete_event(ev).await?;
    store.close().await?;
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "holds {:?}: {} sessions, {} seats, {:.1} s: {:.0} hold/release ops/s ({} ops, {} \
         HOLD_CONFLICT); after: {} held",
        a.backend,
        a.sessions,
        a.seats,
        secs,
        n as f64 / secs,
        n,
        c,
        counts.held
    );
    Ok(())
}
