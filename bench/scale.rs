//! `waitroom-scale`: one event with a million waiting places, against the budgets of
//! `docs/PERFORMANCE.md` (resident memory, O(log n) positions, restart time, disk).
//!
//! ```text
//! cargo build --release --bins
//! target/release/waitroom-scale all                 # everything below, ~2–4 minutes
//! target/release/waitroom-scale all --places 200000 # a quicker look
//! ```
//!
//! `all` runs each step in a child process of its own (`memory`, `load`, `reopen`, `leave`,
//! `compact`), so each resident-memory figure is that of a process which did only that
//! step, then prints a summary. The steps:
//!
//! 1. `memory`: the **in-memory** [`EmbeddedStore`] (no journal), in-process: joins grow one
//!    event to 1k, 10k, 100k, 1M places; at each size, the cost of `status` and `peek` on
//!    random places, and VmRSS. Positions are checked exactly.
//! 2. `load`: the **durable** store (`--durability sync`, group commit) in a data dir laid
//!    out like the server's (`DIR/store`, `DIR/signing-key.pem`): 1M joins from many
//!    concurrent tasks (join throughput), plus a 1k-place event; VmRSS and disk bytes/place.
//! 3. `reopen`: [`EmbeddedStore::open`] on that directory (the restart), timed, with VmRSS
//!    and `status` cost afterwards.
//! 4. the real `waitroom` binary started on that directory: time until `/readyz` answers,
//!    its VmRSS, and `status` requests/s over HTTP on the 1k-place and 1M-place events side
//!    by side.
//! 5. `leave`: 900k of the places leave (durable), then disk; `reopen` again (restart time
//!    and disk with 100k live places); `compact`: an offline fjall major compaction, disk.

#[path = "common.rs"]
mod common;

/// The server's allocator (src/main.rs): the in-process steps measure the resident memory
/// of the store's structures, which depends on the allocator that holds them.
#[global_allocator]
static ALLOCATOR: waitroom::alloc::MiMalloc = waitroom::alloc::MiMalloc;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};

use waitroom::core::{EventPatch, PlaceKey, PlaceState};
use waitroom::store::embedded::EmbeddedStore;
use waitroom::store::journal::Durability;
use waitroom::store::{JoinRequest, Store};

use common::{mb, ms, percentiles, thousands, ServerProc};

const BIG: &str = "scale-big";
const SMALL: &str = "scale-small";
/// Tokens of the big event written for the HTTP comparison (a random sample).
const HTTP_SAMPLE: usize = 100_000;

#[derive(Parser)]
#[command(
    name = "waitroom-scale",
    about = "A million waiting places: memory, O(log n) positions, restart, disk."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every step, each in a child process, then a summary.
    All(AllArgs),
    /// The in-memory store grown to --places in-process; status cost and VmRSS at each
    /// power of ten.
    Memory(MemoryArgs),
    /// Loads the durable store in DIR/store with --places places (and a 1k-place event).
    Load(LoadArgs),
    /// Times EmbeddedStore::open on DIR/store.
    Reopen(DirArgs),
    /// Makes the first --count places of the big event leave.
    Leave(LeaveArgs),
    /// Offline fjall major compaction of DIR/store.
    Compact(DirArgs),
}

#[derive(Args, Clone)]
struct AllArgs {
    #[arg(long, default_value_t = 1_000_000)]
    places: u64,
    /// Concurrent joining tasks while loading the durable store (they share fsyncs).
    #[arg(long, default_value_t = 1024)]
    concurrency: usize,
    /// Places that leave after loading (the rest stay).
    #[arg(long, default_value_t = 900_000)]
    leave: u64,
    /// Work directory (default: a fresh one under the temp dir, deleted at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the work directory.
    #[arg(long)]
    keep: bool,
    /// Seconds per HTTP status phase.
    #[arg(long, default_value_t = 5.0)]
    http_phase: f64,
    /// The server binary (default: `waitroom` next to this binary).
    #[arg(long)]
    bin: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum UserIds {
    /// `user-00000000042` (16 characters), as a site's user ids would be.
    Short,
    /// No user id: anonymous places (never deduplicated).
    None,
}

#[derive(Args)]
struct MemoryArgs {
    #[arg(long, default_value_t = 1_000_000)]
    places: u64,
    #[arg(long, value_enum, default_value_t = UserIds::Short)]
    user_ids: UserIds,
    /// Calls timed per measurement.
    #[arg(long, default_value_t = 200_000)]
    calls: u64,
}

#[derive(Args)]
struct LoadArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 1_000_000)]
    places: u64,
    #[arg(long, default_value_t = 1024)]
    concurrency: usize,
}

#[derive(Args)]
struct DirArgs {
    #[arg(long)]
    dir: PathBuf,
}

#[derive(Args)]
struct LeaveArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    count: u64,
    #[arg(long, default_value_t = 1024)]
    concurrency: usize,
}

fn now() -> u64 {
    waitroom::clock::system_now()
}

fn bench_patch() -> EventPatch {
    EventPatch {
        name: Some("scale".into()),
        max_active: Some(1),
        paused: Some(true),
        waiting_idle_sec: Some(30 * 24 * 3600),
        ..EventPatch::default()
    }
}

fn user_id(kind: UserIds, i: u64) -> Option<String> {
    match kind {
        UserIds::Short => Some(format!("user-{i:011}")),
        UserIds::None => None,
    }
}

fn rss_self() -> (u64, u64) {
    common::rss("self").unwrap_or((0, 0))
}

/// One machine-readable result line for the parent.
fn emit(v: Value) {
    println!("@result {v}");
    let _ = std::io::stdout().flush();
}

/// Mean nanoseconds per `status` (or `peek`) call on random places drawn from `keys` (best
/// of three passes), checking
/// that each position equals the place's index + 1 when `exact` (nothing left the queue).
async fn time_calls(
    store: &EmbeddedStore,
    event: &str,
    keys: &[PlaceKey],
    calls: u64,
    peek: bool,
    exact: bool,
) -> Result<f64> {
    let mut rng = 0x00C0_FFEE_u64 + keys.len() as u64;
    // Draw the sample first so the timing holds only the store calls.
    let picks: Vec<usize> = (0..calls)
        .map(|_| (common::next_rand(&mut rng) % keys.len() as u64) as usize)
        .collect();
    let t = now();
    // Best of three passes: the machine is shared, and interference only ever adds time.
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        for &i in &picks {
            let v = if peek {
                store.peek(event, keys[i], t).await?
            } else {
                store.status(event, keys[i], t).await?
            };
            if exact && v.position != Some(i as u64 + 1) {
                bail!(
                    "place {} is at position {:?}, expected {}",
                    i,
                    v.position,
                    i + 1
                );
            }
        }
        best = best.min(started.elapsed().as_nanos() as f64 / calls as f64);
    }
    Ok(best)
}

// ---- step 1: in-memory store -----------------------------------------------------------

async fn memory(a: MemoryArgs) -> Result<()> {
    let (base_rss, _) = rss_self();
    let store = EmbeddedStore::new();
    store.put_event(BIG, &bench_patch(), now()).await?;
    let mut keys: Vec<PlaceKey> = Vec::with_capacity(a.places as usize);
    let mut size = 1_000u64.min(a.places);
    let mut worst_join = Duration::ZERO;
    // The slowest joins and where they happened: growth steps of the indexes are O(n).
    let mut slowest: Vec<(u64, u64)> = Vec::new();
    loop {
        let from = keys.len() as u64;
        let started = Instant::now();
        for i in from..size {
            let req = JoinRequest {
                user_id: user_id(a.user_ids, i),
                metadata: None,
                nonce: u128::from(i) * 0x9E37_79B9 + 7,
                ..JoinRequest::default()
            };
            let t0 = Instant::now();
            let v = store.join(BIG, &req, now()).await?;
            let took = t0.elapsed();
            worst_join = worst_join.max(took);
            if took > Duration::from_millis(2) {
                slowest.push((i + 1, took.as_micros() as u64));
            }
            if v.status != PlaceState::Waiting || v.position != Some(i + 1) {
                bail!("join {i} answered {:?} at {:?}", v.status, v.position);
            }
            keys.push(v.key);
        }
        let join_rate = (size - from) as f64 / started.elapsed().as_secs_f64();
        let (rss, hwm) = rss_self();
        // The bench's own list of keys is in that figure too; it is reported apart.
        let bench_bytes = (keys.len() * std::mem::size_of::<PlaceKey>()) as u64;
        time_calls(&store, BIG, &keys, a.calls / 10, false, true).await?; // warm-up
        let status_ns = time_calls(&store, BIG, &keys, a.calls, false, true).await?;
        let peek_ns = time_calls(&store, BIG, &keys, a.calls, true, true).await?;
        // The same work on a hot set of 1,000 places: what is left is the O(log n) walk.
        let hot = &keys[..1000.min(keys.len())];
        let hot_ns = time_calls(&store, BIG, hot, a.calls, false, true).await?;
        eprintln!(
            "memory: {size} places, RSS {} MB (+{} over start), status {status_ns:.0} ns, peek {peek_ns:.0} ns, status on 1k hot places {hot_ns:.0} ns, joins {join_rate:.0}/s",
            mb(rss),
            mb(rss.saturating_sub(base_rss))
        );
        emit(json!({
            "step": "memory", "user_ids": format!("{:?}", a.user_ids), "places": size,
            "rss": rss, "hwm": hwm, "base_rss": base_rss, "bench_bytes": bench_bytes,
            "status_ns": status_ns, "peek_ns": peek_ns, "hot_status_ns": hot_ns,
            "join_rate": join_rate, "worst_join_us": worst_join.as_micros() as u64,
            "slow_joins": slowest,
        }));
        if size >= a.places {
            break;
        }
        size = (size * 10).min(a.places);
    }
    Ok(())
}

// ---- step 2: durable load --------------------------------------------------------------

fn store_dir(dir: &Path) -> PathBuf {
    dir.join("store")
}

/// Joins `n` places into `event` from `concurrency` tasks; answers their keys in seq order
/// and the wall time.
async fn join_many(
    store: &Arc<EmbeddedStore>,
    event: &str,
    n: u64,
    concurrency: usize,
    prefix: &str,
) -> Result<(Vec<PlaceKey>, Duration)> {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..concurrency.max(1) {
        let store = store.clone();
        let next = next.clone();
        let event = event.to_string();
        let prefix = prefix.to_string();
        handles.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let req = JoinRequest {
                    user_id: Some(format!("{prefix}{i:011}")),
                    metadata: None,
                    nonce: waitroom::tokens::random_u128(),
                    ..JoinRequest::default()
                };
                let v = store.join(&event, &req, now()).await?;
                keys.push(v.key);
            }
            Ok::<_, anyhow::Error>(keys)
        }));
    }
    let mut keys = Vec::with_capacity(n as usize);
    for h in handles {
        keys.extend(h.await??);
    }
    let took = started.elapsed();
    keys.sort_by_key(|k| k.seq);
    Ok((keys, took))
}

fn write_keys(path: &Path, keys: &[PlaceKey]) -> Result<()> {
    let mut buf = Vec::with_capacity(keys.len() * 24);
    for k in keys {
        buf.extend_from_slice(&k.seq.to_le_bytes());
        buf.extend_from_slice(&k.nonce.to_le_bytes());
    }
    std::fs::write(path, buf).with_context(|| format!("writing {}", path.display()))
}

fn read_keys(path: &Path) -> Result<Vec<PlaceKey>> {
    let buf = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(buf
        .chunks_exact(24)
        .map(|c| PlaceKey {
            seq: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
            nonce: u128::from_le_bytes(c[8..].try_into().expect("16 bytes")),
        })
        .collect())
}

/// Waiting tokens the server started on `dir` will accept (same signing key).
fn write_tokens(dir: &Path, event: &str, keys: &[PlaceKey], file: &str) -> Result<()> {
    let key = waitroom::tokens::load_or_generate_key(None, dir)?;
    let wt = waitroom::tokens::AccessTokens::from_signing_key(&key)?.waiting_tokens();
    let mut out = String::new();
    for k in keys {
        out.push_str(&wt.issue(event, *k));
        out.push('\n');
    }
    std::fs::write(dir.join(file), out)?;
    Ok(())
}

async fn load(a: LoadArgs) -> Result<()> {
    let (base_rss, _) = rss_self();
    let store = Arc::new(EmbeddedStore::open(
        &store_dir(&a.dir),
        Durability::Sync,
        now(),
    )?);
    store.put_event(BIG, &bench_patch(), now()).await?;
    store.put_event(SMALL, &bench_patch(), now()).await?;
    let (small, _) = join_many(&store, SMALL, 1000, a.concurrency, "small-").await?;
    eprintln!(
        "load: joining {} places (durable, sync, {} tasks)…",
        a.places, a.concurrency
    );
    let (keys, took) = join_many(&store, BIG, a.places, a.concurrency, "user-").await?;
    let join_rate = a.places as f64 / took.as_secs_f64();
    let (rss, hwm) = rss_self();
    let bench_bytes =
        ((keys.capacity() + small.capacity()) * std::mem::size_of::<PlaceKey>()) as u64;
    let disk = store.disk_space();
    eprintln!(
        "load: {} joins in {:.1} s ({join_rate:.0}/s); RSS {} MB; disk {} MB",
        a.places,
        took.as_secs_f64(),
        mb(rss),
        mb(disk)
    );
    let status_ns = time_calls(&store, BIG, &keys, 200_000, false, true).await?;
    write_keys(&a.dir.join("keys.bin"), &keys)?;
    let mut rng = 42u64;
    let sample: Vec<PlaceKey> = (0..HTTP_SAMPLE.min(keys.len()))
        .map(|_| keys[(common::next_rand(&mut rng) % keys.len() as u64) as usize])
        .collect();
    write_tokens(&a.dir, BIG, &sample, "tokens-big.txt")?;
    write_tokens(&a.dir, SMALL, &small, "tokens-small.txt")?;
    store.close().await?;
    drop(store);
    emit(json!({
        "step": "load", "places": a.places, "concurrency": a.concurrency,
        "secs": took.as_secs_f64(), "join_rate": join_rate,
        "rss": rss, "hwm": hwm, "base_rss": base_rss, "disk": disk, "bench_bytes": bench_bytes,
        "status_ns": status_ns, "parts": parts_json(&store_dir(&a.dir)),
    }));
    Ok(())
}

// ---- step 3: restart -------------------------------------------------------------------

async fn reopen(a: DirArgs) -> Result<()> {
    let (base_rss, _) = rss_self();
    let started = Instant::now();
    let store = EmbeddedStore::open(&store_dir(&a.dir), Durability::Sync, now())?;
    let open = started.elapsed();
    // Resident memory of the store alone, before this bench reads its list of keys.
    let (rss, hwm) = rss_self();
    let keys = read_keys(&a.dir.join("keys.bin"))?;
    let gone = read_gone(&a.dir);
    let live = &keys[gone as usize..];
    // Ready to serve: the first answer, with the right position.
    let t = Instant::now();
    let first = store.status(BIG, live[live.len() / 2], now()).await?;
    let ready = open + t.elapsed();
    if first.position != Some(live.len() as u64 / 2 + 1) {
        bail!(
            "after reopening, place {} is at {:?}",
            live.len() / 2,
            first.position
        );
    }
    let disk = store.disk_space();
    let status_ns = time_calls(&store, BIG, live, 200_000, false, true).await?;
    eprintln!(
        "reopen: {} live places; open {:.2} s, first answer at {:.2} s; RSS {} MB; disk {} MB; status {status_ns:.0} ns",
        live.len(),
        open.as_secs_f64(),
        ready.as_secs_f64(),
        mb(rss),
        mb(disk)
    );
    store.close().await?;
    drop(store);
    emit(json!({
        "step": "reopen", "places": live.len(), "open_s": open.as_secs_f64(),
        "ready_s": ready.as_secs_f64(), "rss": rss, "hwm": hwm, "base_rss": base_rss,
        "disk": disk, "status_ns": status_ns, "parts": parts_json(&store_dir(&a.dir)),
    }));
    Ok(())
}

fn read_gone(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("gone.txt"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

// ---- step 5: leave and compaction ------------------------------------------------------

async fn leave(a: LeaveArgs) -> Result<()> {
    let store = Arc::new(EmbeddedStore::open(
        &store_dir(&a.dir),
        Durability::Sync,
        now(),
    )?);
    let keys = Arc::new(read_keys(&a.dir.join("keys.bin"))?);
    let n = a.count.min(keys.len() as u64);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..a.concurrency.max(1) {
        let (store, keys, next) = (store.clone(), keys.clone(), next.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                if !store.leave(BIG, keys[i as usize], now()).await? {
                    bail!("place {i} was already gone");
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let took = started.elapsed();
    std::fs::write(a.dir.join("gone.txt"), n.to_string())?;
    let disk_open = store.disk_space();
    store.close().await?;
    drop(store);
    let disk_closed = dir_size(&store_dir(&a.dir));
    eprintln!(
        "leave: {n} leaves in {:.1} s ({:.0}/s); disk {} MB (files after close: {} MB)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        mb(disk_open),
        mb(disk_closed)
    );
    emit(json!({
        "step": "leave", "left": n, "secs": took.as_secs_f64(),
        "rate": n as f64 / took.as_secs_f64(), "disk": disk_open, "disk_files": disk_closed,
        "parts": parts_json(&store_dir(&a.dir)),
    }));
    Ok(())
}

/// The store's files: (journal bytes allocated, journal bytes written, everything else).
/// fjall preallocates its journal, so its file size overstates what it holds.
fn disk_parts(dir: &Path) -> (u64, u64, u64) {
    let mut jnl = 0;
    let mut written = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "jnl") {
                jnl += e.metadata().map_or(0, |m| m.len());
                written += waitroom::store::journal::written_end(&p).unwrap_or(0);
            }
        }
    }
    (jnl, written, dir_size(dir).saturating_sub(jnl))
}

fn parts_json(dir: &Path) -> Value {
    let (jnl, written, tables) = disk_parts(dir);
    json!({"journal": jnl, "journal_written": written, "tables": tables})
}

/// Bytes of every file under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                total += dir_size(&e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

fn compact(a: DirArgs) -> Result<()> {
    let dir = store_dir(&a.dir);
    let before = dir_size(&dir);
    let started = Instant::now();
    {
        let db = fjall::Database::builder(&dir)
            .open()
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", dir.display()))?;
        for name in db.list_keyspace_names() {
            let ks = db.keyspace(&name, fjall::KeyspaceCreateOptions::default)?;
            ks.rotate_memtable_and_wait()?;
            ks.major_compact()?;
        }
        db.persist(fjall::PersistMode::SyncAll)?;
        let disk = db.disk_space()?;
        eprintln!(
            "compact: {} MB of files before, {} MB after a major compaction ({:.1} s)",
            mb(before),
            mb(disk),
            started.elapsed().as_secs_f64()
        );
        emit(
            json!({"step": "compact", "before_files": before, "disk": disk,
                    "secs": started.elapsed().as_secs_f64()}),
        );
    }
    emit(json!({"step": "compact-files", "parts": parts_json(&dir)}));
    Ok(())
}

// ---- all -------------------------------------------------------------------------------

/// Runs this binary with `args`, relaying its output; answers its result lines.
fn child(args: &[String]) -> Result<Vec<Value>> {
    let me = std::env::current_exe()?;
    eprintln!("\n$ waitroom-scale {}", args.join(" "));
    let out = Command::new(me)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut results = Vec::new();
    for line in text.lines() {
        match line.strip_prefix("@result ") {
            Some(j) => results.push(serde_json::from_str(j)?),
            None => println!("{line}"),
        }
    }
    if !out.status.success() {
        bail!("waitroom-scale {} failed: {}", args.join(" "), out.status);
    }
    Ok(results)
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// HTTP status requests/s on the 1k and the 1M event of a server, alternated twice.
async fn http_status(
    srv: &ServerProc,
    dir: &Path,
    phase: Duration,
    big_places: u64,
) -> Result<Vec<(String, f64, u32)>> {
    let read = |f: &str| -> Result<Arc<Vec<String>>> {
        Ok(Arc::new(
            std::fs::read_to_string(dir.join(f))?
                .lines()
                .map(str::to_string)
                .collect(),
        ))
    };
    let (small, big) = (read("tokens-small.txt")?, read("tokens-big.txt")?);
    let mut rows = Vec::new();
    for round in 1..=2 {
        let big_name = format!("{} places", thousands(big_places as f64));
        for (name, tokens) in [("1,000 places", &small), (big_name.as_str(), &big)] {
            let host = srv.target.host.clone();
            let tokens = tokens.clone();
            let build: Arc<common::BuildFn> = Arc::new(move |_, _, rng, out| {
                let t = &tokens[(common::next_rand(rng) % tokens.len() as u64) as usize];
                common::get_request(&host, &format!("/api/v1/queue/status?token={t}"), out);
            });
            let (mut tally, _) = common::closed_loop(
                &srv.target,
                Some(srv.pid()),
                build,
                64,
                Duration::from_secs(1),
                phase,
            )
            .await?;
            if tally.errors() > 0 {
                bail!("status over HTTP: errors {}", tally.error_summary());
            }
            let rps = tally.count() as f64 / phase.as_secs_f64();
            let p = percentiles(&mut tally.lat_us);
            eprintln!(
                "http: status on {name} (round {round}): {} req/s, p99 {} ms",
                thousands(rps),
                ms(p.p99)
            );
            rows.push((format!("{name} r{round}"), rps, p.p99));
        }
    }
    Ok(rows)
}

async fn all(a: AllArgs) -> Result<()> {
    let (dir, temp) = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (d.clone(), false)
        }
        None => (common::fresh_temp_dir("scale")?, true),
    };
    let data = dir.join("data");
    let data_s = data.to_string_lossy().to_string();
    let places = a.places.to_string();
    let started = Instant::now();

    let mem = child(&s(&["memory", "--places", &places]))?;
    let anon = child(&s(&[
        "memory",
        "--places",
        &places,
        "--user-ids",
        "none",
        "--calls",
        "20000",
    ]))?;
    let load = child(&s(&[
        "load",
        "--dir",
        &data_s,
        "--places",
        &places,
        "--concurrency",
        &a.concurrency.to_string(),
    ]))?;
    let reopen1 = child(&s(&["reopen", "--dir", &data_s]))?;

    // The real binary on the same directory.
    let bin = match &a.bin {
        Some(b) => b.clone(),
        None => common::default_server_bin()?,
    };
    eprintln!("\n$ waitroom serve --data-dir {data_s} (until /readyz answers)");
    let (ready, server_rss, server_hwm, http) = {
        let srv = ServerProc::start(&bin, Some(&data), "sync", "scale-admin")?;
        let ready = srv.wait_ready(Duration::from_secs(120)).await?;
        let (rss, hwm) = common::rss(&srv.pid().to_string()).unwrap_or((0, 0));
        eprintln!(
            "binary: ready after {:.2} s, VmRSS {} MB",
            ready.as_secs_f64(),
            mb(rss)
        );
        let http =
            http_status(&srv, &data, Duration::from_secs_f64(a.http_phase), a.places).await?;
        (ready, rss, hwm, http)
    };

    let leave = child(&s(&[
        "leave",
        "--dir",
        &data_s,
        "--count",
        &a.leave.to_string(),
        "--concurrency",
        &a.concurrency.to_string(),
    ]))?;
    let reopen2 = child(&s(&["reopen", "--dir", &data_s]))?;
    let compact = child(&s(&["compact", "--dir", &data_s]))?;
    let reopen3 = child(&s(&["reopen", "--dir", &data_s]))?;

    // ---- summary
    let n = a.places as f64;
    println!("\n## waitroom-scale: {} places in one event\n", a.places);
    println!("### status cost in-process (in-memory store; positions checked exactly)\n");
    println!("| places | VmRSS MB | status ns/call (random place) | peek ns/call | status ns/call (1k hot places) | join/s while growing |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in &mem {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {} |",
            thousands(f(r, "places")),
            mb(u(r, "rss")),
            f(r, "status_ns"),
            f(r, "peek_ns"),
            f(r, "hot_status_ns"),
            thousands(f(r, "join_rate"))
        );
    }
    let last_mem = mem.last().cloned().unwrap_or_default();
    if let Some(slow) = last_mem["slow_joins"].as_array() {
        let mut slow: Vec<(u64, u64)> = slow
            .iter()
            .filter_map(|p| Some((p[0].as_u64()?, p[1].as_u64()?)))
            .collect();
        slow.sort_by_key(|p| std::cmp::Reverse(p.1));
        let list: Vec<String> = slow
            .iter()
            .take(8)
            .map(|(n, us)| format!("{} ms at place {}", ms(*us as u32), thousands(*n as f64)))
            .collect();
        println!(
            "\nslowest single joins while growing to {} places (in-process, in-memory store): {}",
            thousands(a.places as f64),
            list.join(", ")
        );
    }
    let last_anon = anon.last().cloned().unwrap_or_default();
    let l = load.first().cloned().unwrap_or_default();
    let r1 = reopen1.first().cloned().unwrap_or_default();
    let r2 = reopen2.first().cloned().unwrap_or_default();
    let r3 = reopen3.first().cloned().unwrap_or_default();
    let lv = leave.first().cloned().unwrap_or_default();
    let c = compact.first().cloned().unwrap_or_default();
    let budget = 250e6;
    println!(
        "\n### resident memory with {} places (budget ≤ 250 MB)\n",
        a.places
    );
    println!("| process | VmRSS MB | the bench's own key list MB | VmRSS without it MB | peak (VmHWM) MB | verdict |");
    println!("|---|---:|---:|---:|---:|---|");
    let mem_row = |name: &str, v: &Value| {
        let (rss, bench) = (u(v, "rss"), u(v, "bench_bytes"));
        let store = rss - bench.min(rss);
        println!(
            "| {name} | {} | {} | **{}** | {} | {} |",
            mb(rss),
            mb(bench),
            mb(store),
            mb(u(v, "hwm")),
            verdict((store as f64) <= budget)
        );
    };
    mem_row("in-memory store, user ids of 16 chars", &last_mem);
    mem_row("in-memory store, anonymous places", &last_anon);
    mem_row("durable store, right after loading", &l);
    mem_row("durable store, after reopening", &r1);
    mem_row(
        "`waitroom` server after a restart, ready",
        &json!({"rss": server_rss, "hwm": server_hwm}),
    );

    println!("\n### restart with {} places (budget ≤ 5 s)\n", a.places);
    println!("| what | seconds | verdict |");
    println!("|---|---:|---|");
    println!(
        "| EmbeddedStore::open (in-process) | {:.2} | {} |",
        f(&r1, "open_s"),
        verdict(f(&r1, "open_s") <= 5.0)
    );
    println!(
        "| … until the first status answer | {:.2} | {} |",
        f(&r1, "ready_s"),
        verdict(f(&r1, "ready_s") <= 5.0)
    );
    println!(
        "| `waitroom` process start until /readyz answers 200 | {:.2} | {} |",
        ready.as_secs_f64(),
        verdict(ready.as_secs_f64() <= 5.0)
    );
    println!(
        "| EmbeddedStore::open after {} left ({} live) | {:.2} | |",
        u(&lv, "left"),
        u(&r2, "places"),
        f(&r2, "open_s")
    );

    println!("\n### status over HTTP on the restarted server, 64 connections (closed loop)\n");
    println!("| event | req/s | p99 ms |");
    println!("|---|---:|---:|");
    for (name, rps, p99) in &http {
        println!("| {name} | {} | {} |", thousands(*rps), ms(*p99));
    }

    println!("\n### durable store: loading and disk\n");
    println!(
        "joins: {} in {:.1} s = **{} joins/s** from {} concurrent tasks (sync durability, group commit); \
         leaves: {} in {:.1} s = {} /s\n",
        a.places,
        f(&l, "secs"),
        thousands(f(&l, "join_rate")),
        u(&l, "concurrency"),
        u(&lv, "left"),
        f(&lv, "secs"),
        thousands(f(&lv, "rate"))
    );
    let live_after = (a.places - u(&lv, "left")).max(1) as f64;
    let cf = compact.get(1).cloned().unwrap_or_default();
    println!(
        "fjall preallocates its journal (64 MB); `store.disk_space()` counts the whole file, \
         so the per-place figure uses the journal's written bytes plus the tables.\n"
    );
    println!("| moment | live places | disk_space() MB | journal written MB | tables MB | bytes per live place |");
    println!("|---|---:|---:|---:|---:|---:|");
    let disk_row = |name: &str, live: f64, space: Option<u64>, v: &Value| {
        let p = &v["parts"];
        let (w, t) = (u(p, "journal_written"), u(p, "tables"));
        println!(
            "| {name} | {} | {} | {} | {} | {:.0} |",
            thousands(live),
            space.map_or("-".into(), mb),
            mb(w),
            mb(t),
            (w + t) as f64 / live
        );
    };
    disk_row("after loading", n, Some(u(&l, "disk")), &l);
    disk_row("after a restart", n, Some(u(&r1, "disk")), &r1);
    disk_row(
        &format!("after {} left", u(&lv, "left")),
        live_after,
        Some(u(&lv, "disk")),
        &lv,
    );
    disk_row("… after a restart", live_after, Some(u(&r2, "disk")), &r2);
    disk_row(
        "… after an offline major compaction",
        live_after,
        Some(u(&c, "disk")),
        &cf,
    );
    disk_row("… after a restart", live_after, Some(u(&r3, "disk")), &r3);

    println!(
        "\nwaitroom-scale finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if temp && !a.keep {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("work directory kept: {}", dir.display());
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Loading uses both cores (many tasks share fsyncs); the timed in-process calls run
    // one after another either way.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.cmd {
        Cmd::All(a) => rt.block_on(all(a)),
        Cmd::Memory(a) => rt.block_on(memory(a)),
        Cmd::Load(a) => rt.block_on(load(a)),
        Cmd::Reopen(a) => rt.block_on(reopen(a)),
        Cmd::Leave(a) => rt.block_on(leave(a)),
        Cmd::Compact(a) => compact(a),
    }
}
