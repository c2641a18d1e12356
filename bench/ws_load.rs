//! `ws_load`: how many live WebSocket clients one `waitroom` node holds with updates flowing,
//! what each costs in server memory, and how fast `queue-ready` arrives at that load.
//!
//! ```text
//! cargo build --release --bin waitroom --example ws_load
//! target/release/examples/ws_load --clients 19500
//! ```
//!
//! It starts the release `waitroom` binary as a child (`--listen 127.0.0.1:0`, a temporary
//! data dir, `--no-demo`), so the server's memory is measured alone (`VmRSS` from `/proc`),
//! then:
//! 1. creates an event with one slot (`max_active` 1), taken by a session the bench holds;
//! 2. joins `--clients` places over HTTP (they all wait) and notes the server's RSS;
//! 3. opens one WebSocket per place and notes the RSS again: the difference over the number
//!    of sockets is the memory per connection;
//! 4. with every socket open, a place joins at the back of the line every 100 ms, so every
//!    client's `queue_length` keeps changing and updates flow to all of them (coalesced by
//!    the server to at most two per second per client);
//! 5. meanwhile, `--probes` times, completes the session holding the slot and measures the
//!    time until the first waiting client receives `queue-ready` (it then enters and holds
//!    the slot for the next probe). This is the "slot freed → queue-ready" delay at load.
//!
//! Each process may hold at most `ulimit -n` descriptors; the server needs one per client
//! plus a few dozen, and so does this bench. Raise the soft limit in the shell first
//! (`ulimit -n 65536`) where the hard limit allows; this bench refuses to start when the
//! limit is below what `--clients` needs, rather than fail half-way.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser, Debug)]
#[command(name = "ws_load", about = "WebSocket scale benchmark for waitroom")]
struct Cli {
    /// Live WebSocket clients to open.
    #[arg(long, default_value_t = 19_500)]
    clients: usize,
    /// The server binary (release build).
    #[arg(long, default_value = "target/release/waitroom")]
    server: PathBuf,
    /// Joins and WebSocket handshakes in flight at once.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// How many times to free the slot and time the `queue-ready`.
    #[arg(long, default_value_t = 40)]
    probes: usize,
    /// Seconds of updates flowing before the probes start (measures the message rate).
    #[arg(long, default_value_t = 10)]
    flow_sec: u64,
    /// `--durability` of the server: `sync` (default) or `relaxed`.
    #[arg(long, default_value = "sync")]
    durability: String,
}

const ADMIN: &str = "ws-bench-admin";
const EVENT: &str = "wsbench";

struct Server {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(cli: &Cli) -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(&cli.server)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-demo",
            "--admin-token",
            ADMIN,
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--durability", &cli.durability])
        // Every client comes from this one address: no per-client limits or caps, and the
        // descriptor limit is checked by this bench itself.
        .args([
            "--rate-limits",
            "off",
            "--max-connections-per-client",
            "10000000",
        ])
        .args(["--max-connections", "10000000"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", cli.server.display()))?;
    let stdout = child.stdout.take().context("server stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let base = loop {
        let line = lines
            .next()
            .context("the server exited before listening")??;
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.trim().to_string();
        }
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(Server {
        child,
        base,
        _dir: dir,
    })
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time (user + system) of a process so far, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat (utime, stime), counted from after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    bearer: Option<&str>,
    body: Option<Value>,
) -> Result<Value> {
    let mut req = http.request(method, &url);
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.with_context(|| url.clone())?;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("{url}: {status} {v}");
    }
    Ok(v)
}

/// Counters shared by every client task.
#[derive(Default)]
struct Tally {
    connected: AtomicUsize,
    updates: AtomicU64,
    readies: AtomicU64,
    closed: AtomicUsize,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// A runtime that may be dropped inside another one (on any path out of `main`).
struct ProbeRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for ProbeRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("present until drop")
    }
}

impl Drop for ProbeRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// One client: connects, then reads until the stream ends (reading also answers the
/// server's pings), counting updates and reporting `queue-ready` with its arrival time.
async fn run_client(
    url: String,
    i: usize,
    tally: Arc<Tally>,
    ready_tx: mpsc::UnboundedSender<(usize, Instant)>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    // Small buffers: the defaults (128 KiB each way) would cost this process gigabytes.
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let conn = tokio_tungstenite::connect_async_with_config(url, Some(config), true).await;
    drop(permit);
    let mut ws = match conn {
        Ok((ws, _)) => ws,
        Err(e) => {
            eprintln!("client {i}: {e}");
            tally.closed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    tally.connected.fetch_add(1, Ordering::Relaxed);
    while let Some(m) = ws.next().await {
        match m {
            Ok(Message::Text(text)) => {
                if text.contains("\"queue-update\"") {
                    tally.updates.fetch_add(1, Ordering::Relaxed);
                } else if text.contains("\"queue-ready\"") {
                    tally.readies.fetch_add(1, Ordering::Relaxed);
                    let _ = ready_tx.send((i, Instant::now()));
                }
            }
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    tally.closed.fetch_add(1, Ordering::Relaxed);
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let limit = open_files_limit();
    let needed = cli.clients as u64 + 200;
    if limit < needed {
        bail!(
            "open files limit is {limit}, {needed} are needed for {} clients: raise it \
             (`ulimit -n 65536`) or ask for fewer --clients",
            cli.clients
        );
    }
    let server = start_server(&cli)?;
    let pid = server.child.id();
    let base = server.base.clone();
    let ws_base = base.replacen("http://", "ws://", 1);
    let http = reqwest::Client::builder()
        // Few idle connections: each one is a descriptor in the server, which needs them
        // for the sockets.
        .pool_max_idle_per_host(16)
        .timeout(Duration::from_secs(30))
        .build()?;
    println!("server pid {pid} at {base}; open files limit {limit}");
    let rss_start = rss(pid);

    // 1. One slot, held by the bench.
    call(
        &http,
        reqwest::Method::PUT,
        format!("{base}/api/v1/admin/events/{EVENT}"),
        Some(ADMIN),
        Some(
            json!({"name": "WS bench", "max_active": 1, "ready_ttl_sec": 600,
                    "session_idle_sec": 3600, "session_max_sec": 3600,
                    "waiting_idle_sec": 3600}),
        ),
    )
    .await?;
    let join = |user: Option<String>| {
        let (http, url) = (http.clone(), format!("{base}/api/v1/queue/join"));
        async move {
            let mut body = json!({"event_id": EVENT});
            if let Some(u) = user {
                body["user_id"] = json!(u);
            }
            call(&http, reqwest::Method::POST, url, None, Some(body)).await
        }
    };
    let holder = join(Some("holder".into())).await?;
    let holder_token = holder["waiting_token"]
        .as_str()
        .context("token")?
        .to_string();
    let enter = |token: String| {
        let (http, url) = (http.clone(), format!("{base}/api/v1/queue/enter"));
        async move {
            let v = call(
                &http,
                reqwest::Method::POST,
                url,
                None,
                Some(json!({"waiting_token": token})),
            )
            .await?;
            Ok::<String, anyhow::Error>(v["access_token"].as_str().context("jwt")?.to_string())
        }
    };
    let access = enter(holder_token).await?;

    // 2. The waiting crowd.
    let t = Instant::now();
    let sem = Arc::new(Semaphore::new(cli.concurrency));
    let mut joins = Vec::with_capacity(cli.clients);
    for i in 0..cli.clients {
        let permit = sem.clone().acquire_owned().await?;
        let j = join(Some(format!("u{i}")));
        joins.push(tokio::spawn(async move {
            let v = j.await;
            drop(permit);
            v
        }));
    }
    // Concurrent joins finish in any order: sort by position, so that `tokens[0]` is the
    // head of the line (the probes admit from there).
    let mut placed = Vec::with_capacity(cli.clients);
    for j in joins {
        let v = j.await??;
        let token = v["waiting_token"].as_str().context("token")?.to_string();
        placed.push((v["position"].as_u64().context("position")?, token));
    }
    placed.sort_unstable();
    let tokens: Vec<String> = placed.into_iter().map(|(_, t)| t).collect();
    println!(
        "joined {} places in {:.1} s",
        tokens.len(),
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_joined = rss(pid);

    // 3. One WebSocket per place.
    let tally = Arc::new(Tally::default());
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<(usize, Instant)>();
    let t = Instant::now();
    // The clients that the probes admit (the head of the line) run on a runtime of their
    // own, as a real client runs on its own machine: their `queue-ready` must not wait in
    // this process behind the updates of 19,000 other sockets, or the bench would measure
    // itself.
    let probe_rt = ProbeRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("probe-clients")
            .enable_all()
            .build()?,
    ));
    let probe_n = (cli.probes + 1).min(cli.clients);
    for (i, token) in tokens.iter().enumerate() {
        let permit = sem.clone().acquire_owned().await?;
        let url = format!("{ws_base}/api/v1/queue/ws?token={token}");
        let client = run_client(url, i, tally.clone(), ready_tx.clone(), permit);
        if i < probe_n {
            probe_rt.spawn(client);
        } else {
            tokio::spawn(client);
        }
    }
    while tally.connected.load(Ordering::Relaxed) + tally.closed.load(Ordering::Relaxed)
        < cli.clients
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_secs = t.elapsed().as_secs_f64();
    let connected = tally.connected.load(Ordering::Relaxed);
    println!("{connected} sockets open in {connect_secs:.1} s");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_connected = rss(pid);
    let per_conn = rss_connected.saturating_sub(rss_joined) as f64 / connected.max(1) as f64;
    // Idle: nothing changes, only pings, pongs and heartbeat renewals.
    let (c0, t0) = (cpu_secs(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(cli.flow_sec)).await;
    let idle_cpu = (cpu_secs(pid) - c0) / t0.elapsed().as_secs_f64();

    // 4. Updates flowing: a join at the back of the line every 100 ms changes every
    //    client's `queue_length`, so each flush of the server's coalescing window sends an
    //    update to every client.
    let churn_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (stop, http, base) = (churn_stop.clone(), http.clone(), base.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let url = format!("{base}/api/v1/queue/join");
                let body = json!({"event_id": EVENT, "user_id": format!("late{n}")});
                if call(&http, reqwest::Method::POST, url, None, Some(body))
                    .await
                    .is_ok()
                {
                    n += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            n
        })
    };
    let (u0, c0, t0) = (
        tally.updates.load(Ordering::Relaxed),
        cpu_secs(pid),
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs(cli.flow_sec)).await;
    let flow_secs = t0.elapsed().as_secs_f64();
    let update_rate = (tally.updates.load(Ordering::Relaxed) - u0) as f64 / flow_secs;
    let server_cpu = (cpu_secs(pid) - c0) / flow_secs;
    let rss_flowing = rss(pid);

    // 5. Probes: free the slot, time the queue-ready; the admitted client takes the slot.
    //    Driven from the probe runtime too, so the clock starts when the request leaves.
    while ready_rx.try_recv().is_ok() {}
    let probes = cli.probes;
    let probe_tokens: Vec<String> = tokens[..probe_n].to_vec();
    let probe_base = base.clone();
    let mut delays = probe_rt
        .spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?;
            let mut access = access;
            let mut delays = Vec::with_capacity(probes);
            for _ in 0..probes {
                let freed = Instant::now();
                call(
                    &http,
                    reqwest::Method::POST,
                    format!("{probe_base}/api/v1/session/complete"),
                    Some(&access),
                    None,
                )
                .await?;
                let (who, at) = tokio::time::timeout(Duration::from_secs(10), ready_rx.recv())
                    .await
                    .context("no queue-ready within 10 s")?
                    .context("ready channel closed")?;
                delays.push(at.duration_since(freed).as_secs_f64() * 1000.0);
                let token = probe_tokens
                    .get(who)
                    .context("a client beyond the head was admitted")?;
                let v = call(
                    &http,
                    reqwest::Method::POST,
                    format!("{probe_base}/api/v1/queue/enter"),
                    None,
                    Some(json!({"waiting_token": token})),
                )
                .await?;
                access = v["access_token"].as_str().context("jwt")?.to_string();
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Ok::<Vec<f64>, anyhow::Error>(delays)
        })
        .await??;
    churn_stop.store(true, Ordering::Relaxed);
    let churned = churn.await?;
    delays.sort_by(f64::total_cmp);

    let still_open = connected - tally.closed.load(Ordering::Relaxed).min(connected);
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| WebSocket clients requested / open | {} / {connected} |",
        cli.clients
    );
    println!(
        "| connect time (all, {} in flight) | {connect_secs:.1} s |",
        cli.concurrency
    );
    println!(
        "| server RSS: start / after joins / sockets open / updates flowing | {} / {} / {} / {} |",
        mib(rss_start),
        mib(rss_joined),
        mib(rss_connected),
        mib(rss_flowing)
    );
    println!(
        "| server memory per connection (RSS delta / sockets) | {:.1} KiB |",
        per_conn / 1024.0
    );
    println!(
        "| updates delivered while flowing (all clients) | {:.0} /s ({:.2} per client per s) |",
        update_rate,
        update_rate / connected.max(1) as f64
    );
    println!(
        "| server CPU idle (pings, heartbeats) / while flowing | {:.0} % / {:.0} % of one core |",
        idle_cpu * 100.0,
        server_cpu * 100.0
    );
    println!("| joins at the back while measuring (one per 100 ms) | {churned} |");
    println!(
        "| slot freed → queue-ready, {} probes: p50 / p95 / max | {:.1} / {:.1} / {:.1} ms |",
        delays.len(),
        pct(&delays, 0.5),
        pct(&delays, 0.95),
        pct(&delays, 1.0)
    );
    println!("| sockets still open at the end | {still_open} |");
    Ok(())
}
