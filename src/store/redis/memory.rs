//! An event's Redis memory, for the `waitroom_store_memory_bytes` gauge.

use super::script::KEYS;
use super::{Inner, StoreResult};

/// How many chunks of per-place keys [`Inner::memory_usage`] measures to estimate them all.
const MEMORY_SAMPLED_CHUNKS: usize = 16;

impl Inner {
    /// The sum of `MEMORY USAGE` over the event's keys (they share a hash tag, so on a
    /// Cluster it goes to one shard). Redis estimates a large hash or set from a few sampled
    /// elements (`SAMPLES 5`, its default); the per-place chunks (`script::CHUNK`) are
    /// estimated the same way: those of [`MEMORY_SAMPLED_CHUNKS`] chunks holding waiting
    /// places (the `wi` index lists them), times the number of such chunks. So this costs
    /// about the same whatever the size of the queue (the index is one small integer per
    /// chunk of places); the records of admitted and active places in chunks where nobody waits
    /// any more are left out, as are one-off proof-of-work claim keys (small, they expire
    /// by themselves). Keys that do not exist (yet) count 0.
    pub(super) async fn memory_usage(&self, event_id: &str) -> StoreResult<u64> {
        let s = self;
        let mut pipe = redis::pipe();
        let keys = s.keys(event_id);
        for key in &keys {
            pipe.cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(5);
        }
        let mut conn = s.connection().await?;
        let sizes: Vec<Option<u64>> = s.bounded(pipe.query_async(&mut conn)).await?;
        let fixed: u64 = sizes.into_iter().flatten().sum();
        let key = |suffix: &str| {
            let at = KEYS.iter().position(|(k, _)| *k == suffix);
            keys[at.expect("a key of the script")].clone()
        };
        let chunks: Vec<u64> = s
            .bounded(
                redis::cmd("ZRANGE")
                    .arg(key("wi"))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn),
            )
            .await?;
        if chunks.is_empty() {
            return Ok(fixed);
        }
        let step = chunks.len().div_ceil(MEMORY_SAMPLED_CHUNKS);
        let sampled: Vec<u64> = chunks.iter().step_by(step).copied().collect();
        let mut pipe = redis::pipe();
        for c in &sampled {
            for suffix in ["p", "q", "ws"] {
                pipe.cmd("MEMORY")
                    .arg("USAGE")
                    .arg(format!("{}:{c}", key(suffix)))
                    .arg("SAMPLES")
                    .arg(5);
            }
        }
        let sizes: Vec<Option<u64>> = s.bounded(pipe.query_async(&mut conn)).await?;
        let in_sample: u64 = sizes.into_iter().flatten().sum();
        Ok(fixed + in_sample * chunks.len() as u64 / sampled.len() as u64)
    }
}
