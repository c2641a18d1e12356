//! `waitroom-bench`: the HTTP load generator behind `docs/PERFORMANCE.md`.
//!
//! ```text
//! cargo build --release --bins
//! target/release/waitroom-bench suite                       # the budget suite, both durabilities
//! target/release/waitroom-bench run --scenario join          # closed loop, max throughput
//! target/release/waitroom-bench run --scenario status --rate 10000   # open loop, fixed rate
//! target/release/waitroom-bench run --url http://127.0.0.1:8080 --admin-token T --scenario healthz
//! target/release/waitroom-bench limits --phase 3 --rounds 2   # per-client limits on vs off
//! target/release/waitroom-bench ceiling --bins target/release/waitroom,/tmp/other-build
//! target/release/waitroom-bench scaling --rounds 2           # 1 vs 2 server worker threads
//! target/release/waitroom-bench journey --report target/journey   # a flash crowd, see journey/
//! ```
//!
//! **The ceiling**: a reference server, this binary's hidden `reference-serve` command,
//! answers `GET /healthz` with the server's body from a bare axum route, on the server's
//! runtime settings, through the server's own serving loop (and, as a second figure, through
//! `axum::serve`). `suite` measures it in every round beside the server and reports every
//! figure also as a ratio of it; `ceiling` puts the /healthz of one or more server builds
//! beside it.
//!
//! Unless `--url` names a running server, each run starts the release `waitroom` binary as a
//! child (`--listen 127.0.0.1:0`, a temporary `--data-dir`, `--no-demo`), creates its own
//! events through the admin API (paused, `max_active` 1, a month of `waiting_idle_sec`, so
//! every join stays waiting and nothing expires) and pre-joins places for `status`.
//!
//! - **Closed loop** (default): N keep-alive connections, each sending its next request as
//!   soon as the previous answer arrived. Measures the most requests/s the server gives.
//! - **Open loop** (`--rate R`, bench/open_loop.rs): request slots are released at exactly
//!   R per second (each generator thread keeps its share of the schedule with a `timerfd`);
//!   whichever connection of that thread is free takes the next one. Latency is measured
//!   from the slot's *intended* send time, so a server stall counts against every request it
//!   delayed (no coordinated omission). The service time (from the actual send), the send
//!   lag (how late the client itself was) and the generator's CPU per request are reported
//!   beside it.
//!
//! The load generator shares the machine with the server, so the budgets are ratios of
//! rates measured side by side in one run. Every phase reports the CPU used by the server,
//! by this process, and by everything else on the machine (other tenants and steal).

#[path = "common.rs"]
mod common;
mod holds;
mod journey;
mod open_loop;

/// The server's allocator (src/main.rs): the reference server (`reference-serve`, the
/// ceiling) is this binary, and the ceiling must run on what the server runs on, or
/// `/healthz` ÷ ceiling would compare two allocators as well as two request paths.
#[global_allocator]
static ALLOCATOR: waitroom::alloc::MiMalloc = waitroom::alloc::MiMalloc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

use common::{
    delete_event, get_request, json_request, ms, percentiles, put_event, thousands, CpuUse, Pcts,
    ServerProc, Tally, Target,
};

#[derive(Parser)]
#[command(
    name = "waitroom-bench",
    about = "HTTP load generator for waitroom: closed-loop throughput and open-loop latency."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One scenario: closed loop (max throughput), or open loop with --rate.
    Run(RunArgs),
    /// The budget suite: healthz, join and status rates for sync and relaxed durability
    /// side by side, their ratios, then p99 latency at a fixed rate.
    Suite(SuiteArgs),
    /// The cost of the per-client limits: healthz, join and status rates of two servers,
    /// limits on (quotas too large to refuse anything, so every request pays the whole
    /// check) and `--rate-limits off`, interleaved round by round.
    Limits(LimitsArgs),
    /// The ceiling against /healthz: the reference server (a bare axum route, through the
    /// server's serving loop and through `axum::serve`) and the /healthz of one or more
    /// server binaries, interleaved round by round.
    Ceiling(CeilingArgs),
    /// Scaling with cores: join and status (one hot event, and spread over many events)
    /// against a server on 1 and on 2 worker threads, interleaved round by round; reports
    /// the speed-up.
    Scaling(ScalingArgs),
    /// A flash crowd of virtual people (join, live updates or polling, enter, session,
    /// complete; some abandon, reload or lose the network) and a report of the promises:
    /// order, capacity, idle slots, ghosts, estimates, client cost (see bench/journey).
    Journey(Box<journey::JourneyArgs>),
    /// Hold/release throughput of the store itself (no HTTP): memory, durable or Redis.
    Holds(holds::HoldsArgs),
    /// The reference server itself (started by the other commands as a child): `GET
    /// /healthz` answering what the server answers, with no middleware, on the server's
    /// runtime settings. Prints `listening on http://ADDR`.
    #[command(hide = true)]
    ReferenceServe(ReferenceArgs),
}

/// The serving loop of the reference server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ServeLoop {
    /// The server's own loop (`waitroom::server::serve_router`: hyper-util's connection
    /// builder, header timeouts, connection caps, `TCP_NODELAY`).
    Server,
    /// `axum::serve` with `TCP_NODELAY`.
    Axum,
}

impl ServeLoop {
    fn label(self) -> &'static str {
        match self {
            ServeLoop::Server => "ceiling",
            ServeLoop::Axum => "ceiling axum::serve",
        }
    }
}

#[derive(Args)]
struct ReferenceArgs {
    #[arg(long, value_enum, default_value_t = ServeLoop::Server)]
    serve_loop: ServeLoop,
}

#[derive(Args)]
struct CeilingArgs {
    #[command(flatten)]
    common: Common,
    /// Server binaries whose /healthz is measured (default: `waitroom` next to this one).
    #[arg(long, value_delimiter = ',')]
    bins: Vec<std::path::PathBuf>,
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds measured per phase.
    #[arg(long, default_value_t = 3.0)]
    phase: f64,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

#[derive(Args)]
struct ScalingArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds measured per phase.
    #[arg(long, default_value_t = 3.0)]
    phase: f64,
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Events the spread-out status phase polls (the places are split evenly among them).
    #[arg(long, default_value_t = 32)]
    events: usize,
    /// Worker-thread counts to compare (the server's `TOKIO_WORKER_THREADS`).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
    workers: Vec<usize>,
}

#[derive(Args)]
struct LimitsArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds measured per phase.
    #[arg(long, default_value_t = 3.0)]
    phase: f64,
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Durability of both servers (relaxed: the store costs least, so the limiter's share
    /// shows most).
    #[arg(long, value_enum, default_value_t = Durability::Relaxed)]
    durability: Durability,
}

#[derive(Args, Clone)]
struct Common {
    /// Benchmark a running server (e.g. http://127.0.0.1:8080) instead of starting one.
    #[arg(long)]
    url: Option<String>,
    /// Admin token of the server named by --url (generated for a server we start).
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// The server binary to start (default: `waitroom` next to this binary).
    #[arg(long)]
    bin: Option<std::path::PathBuf>,
    /// Threads of the load generator: the closed loop's runtime workers; in the open loop,
    /// threads each with a runtime of its own and a share of the connections and schedule.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Places joined before a status or mixed phase (their tokens are polled at random).
    #[arg(long, default_value_t = 10_000)]
    places: usize,
    /// Seconds of load before each measured window (not counted).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, value_enum, default_value_t = Scenario::Healthz)]
    scenario: Scenario,
    /// Durability of the server we start (ignored with --url).
    #[arg(long, value_enum, default_value_t = Durability::Sync)]
    durability: Durability,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Open loop: connections it may open on top of --connections while slots wait for a
    /// free one (as many independent users would have); the table's `conns` is how many
    /// it ended with.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds measured.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Open loop at this many requests/s (latency from the intended send time).
    #[arg(long)]
    rate: Option<u32>,
    /// Share of joins in the mixed scenario, in percent (the rest are status polls).
    #[arg(long, default_value_t = 10)]
    join_percent: u32,
    /// Open loop: list the 100 ms windows whose worst latency exceeds this many ms.
    #[arg(long)]
    timeline: Option<f64>,
    /// Join scenario: places joined into the event before measuring, so that the measured
    /// joins land in a large event (its indexes' growth steps included).
    #[arg(long, default_value_t = 0)]
    prefill: usize,
}

#[derive(Args)]
struct SuiteArgs {
    #[command(flatten)]
    common: Common,
    /// Connections of the closed-loop (throughput) phases.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds measured per closed-loop phase.
    #[arg(long, default_value_t = 5.0)]
    phase: f64,
    /// Rounds of healthz, join, status per durability (interleaved, so noise spreads).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Rate of the open-loop (latency) phases, requests/s.
    #[arg(long, default_value_t = 10_000)]
    rate: u32,
    /// Seconds measured per open-loop phase.
    #[arg(long, default_value_t = 10.0)]
    rate_duration: f64,
    /// Connections the open-loop phases start with.
    #[arg(long, default_value_t = 128)]
    rate_connections: usize,
    /// Connections the open-loop phases may grow to while slots wait for a free one.
    #[arg(long, default_value_t = 1024)]
    rate_max_connections: usize,
    /// Before each phase, wait up to this many seconds for the machine to be quiet (less
    /// than 0.3 cores busy for a second); 0 to never wait.
    #[arg(long, default_value_t = 20.0)]
    settle: f64,
    /// Durabilities to measure (servers we start only).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Durability::Sync, Durability::Relaxed])]
    durability: Vec<Durability>,
    /// Leave out the reference server (the ceiling) and the ratios to it.
    #[arg(long)]
    no_ceiling: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Healthz,
    Join,
    Status,
    Mixed,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Healthz => "healthz",
            Scenario::Join => "join",
            Scenario::Status => "status",
            Scenario::Mixed => "mixed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Durability {
    Sync,
    Relaxed,
}

impl Durability {
    fn name(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Relaxed => "relaxed",
        }
    }
}

/// Every bench event: joins stay waiting (paused, one slot) and nothing expires.
const EVENT_CONFIG: &str =
    r#"{"name": "bench", "max_active": 1, "paused": true, "waiting_idle_sec": 2592000}"#;

/// Distinguishes user ids of different phases (and of different bench processes against
/// one server), so every join of a phase makes a new place.
static PHASE: AtomicU64 = AtomicU64::new(0);

/// What a phase sends.
struct Workload {
    scenario: Scenario,
    host: String,
    event: String,
    tokens: Arc<Vec<String>>,
    join_percent: u32,
    tag: String,
    /// The open loop's requests, built once: only the slot number (joins) or the token
    /// (polls, when every token has one length) is rewritten per request.
    healthz_req: Vec<u8>,
    join_req: Template,
    status_req: Option<Template>,
}

/// A whole request with one stretch (`hole`, `len` bytes) rewritten per request.
struct Template {
    bytes: Vec<u8>,
    hole: usize,
    len: usize,
}

impl Template {
    /// `build(filler)` must place `filler` exactly once in the request.
    fn new(len: usize, build: impl Fn(&str, &mut Vec<u8>)) -> Template {
        let filler = "~".repeat(len);
        let mut bytes = Vec::new();
        build(&filler, &mut bytes);
        let hole = bytes
            .windows(len)
            .position(|w| w == filler.as_bytes())
            .expect("the filler is in the request");
        Template { bytes, hole, len }
    }

    /// Copies the request into `out` (cleared) and answers its hole to fill.
    fn fill<'a>(&self, out: &'a mut Vec<u8>) -> &'a mut [u8] {
        out.clear();
        out.extend_from_slice(&self.bytes);
        &mut out[self.hole..self.hole + self.len]
    }
}

/// Digits of a join's slot number in its user id (zero-padded, so every join request has
/// one length and one template).
const SLOT_DIGITS: usize = 20;

/// `n` in decimal, zero-padded to the slice's length.
fn put_digits(out: &mut [u8], mut n: u64) {
    for b in out.iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

impl Workload {
    fn new(target: &Target, scenario: Scenario, event: &str, tokens: Arc<Vec<String>>) -> Self {
        let host = target.host.clone();
        let tag = format!(
            "b{}p{}",
            std::process::id(),
            PHASE.fetch_add(1, Ordering::Relaxed)
        );
        let mut healthz_req = Vec::new();
        get_request(&host, "/healthz", &mut healthz_req);
        let join_req = Template::new(SLOT_DIGITS, |digits, out| {
            let body = format!(r#"{{"event_id":"{event}","user_id":"{tag}-s{digits}"}}"#);
            json_request("POST", &host, "/api/v1/queue/join", None, &body, out);
        });
        let token_len = tokens.first().map_or(0, String::len);
        let status_req =
            (token_len > 0 && tokens.iter().all(|t| t.len() == token_len)).then(|| {
                Template::new(token_len, |token, out| {
                    get_request(&host, &format!("/api/v1/queue/status?token={token}"), out);
                })
            });
        Workload {
            scenario,
            host,
            event: event.to_string(),
            tokens,
            join_percent: 10,
            tag,
            healthz_req,
            join_req,
            status_req,
        }
    }

    /// The kind of the next request (the mixed scenario draws it).
    fn kind(&self, rng: &mut u64) -> Scenario {
        match self.scenario {
            Scenario::Mixed if (common::next_rand(rng) % 100) < u64::from(self.join_percent) => {
                Scenario::Join
            }
            Scenario::Mixed => Scenario::Status,
            s => s,
        }
    }

    /// Writes the open loop's request for slot `n` (unique in the phase) into `out`, from
    /// the templates.
    fn write_slot(&self, n: u64, rng: &mut u64, out: &mut Vec<u8>) {
        match self.kind(rng) {
            Scenario::Healthz => {
                out.clear();
                out.extend_from_slice(&self.healthz_req);
            }
            Scenario::Join => put_digits(self.join_req.fill(out), n),
            Scenario::Status | Scenario::Mixed => {
                let i = (common::next_rand(rng) % self.tokens.len() as u64) as usize;
                match &self.status_req {
                    Some(t) => t.fill(out).copy_from_slice(self.tokens[i].as_bytes()),
                    None => {
                        out.clear();
                        let path = format!("/api/v1/queue/status?token={}", self.tokens[i]);
                        get_request(&self.host, &path, out);
                    }
                }
            }
        }
    }

    /// Writes request `n` of connection `conn` into `out`.
    fn build(&self, conn: usize, n: u64, rng: &mut u64, out: &mut Vec<u8>) {
        out.clear();
        let kind = match self.scenario {
            Scenario::Mixed if (common::next_rand(rng) % 100) < u64::from(self.join_percent) => {
                Scenario::Join
            }
            Scenario::Mixed => Scenario::Status,
            s => s,
        };
        match kind {
            Scenario::Healthz => get_request(&self.host, "/healthz", out),
            Scenario::Join => {
                let body = format!(
                    r#"{{"event_id":"{}","user_id":"{}-{conn}-{n}"}}"#,
                    self.event, self.tag
                );
                json_request("POST", &self.host, "/api/v1/queue/join", None, &body, out);
            }
            Scenario::Status | Scenario::Mixed => {
                let i = (common::next_rand(rng) % self.tokens.len() as u64) as usize;
                let path = format!("/api/v1/queue/status?token={}", self.tokens[i]);
                get_request(&self.host, &path, out);
            }
        }
    }
}

/// The measured outcome of one phase.
struct Phase {
    label: String,
    connections: usize,
    secs: f64,
    /// Open loop: the target rate.
    rate: Option<u32>,
    tally: Tally,
    cpu: CpuUse,
}

impl Phase {
    /// Requests sent per second (answered or failed on the wire): an open loop's slots
    /// never sent are in the latencies but not in the rate it achieved.
    fn rps(&self) -> f64 {
        (self.tally.count() - self.tally.unsent) as f64 / self.secs
    }
}

/// Closed loop over the workload (see [`common::closed_loop`]).
async fn closed_loop(
    target: &Target,
    server_pid: Option<u32>,
    w: Arc<Workload>,
    label: String,
    connections: usize,
    warmup: Duration,
    dur: Duration,
) -> Result<Phase> {
    let build: Arc<common::BuildFn> =
        Arc::new(move |id, n, rng: &mut u64, out: &mut Vec<u8>| w.build(id, n, rng, out));
    let (tally, cpu) =
        common::closed_loop(target, server_pid, build, connections, warmup, dur).await?;
    Ok(Phase {
        label,
        connections,
        secs: dur.as_secs_f64(),
        rate: None,
        tally,
        cpu,
    })
}

/// Open loop over the workload (see [`open_loop::run`]): slots released at `rate` per
/// second, latency from each slot's intended time. It starts with `connections`
/// connections and opens more, up to `max_connections`, while slots wait for a free one:
/// independent users each have their own connection, so a server that is slow for a
/// moment should see the requests that came meanwhile rather than have them queued behind
/// the generator's few sockets. The waiting counts in the latency either way.
#[allow(clippy::too_many_arguments)]
async fn open_loop(
    target: &Target,
    server_pid: Option<u32>,
    w: Arc<Workload>,
    label: String,
    connections: usize,
    max_connections: usize,
    threads: usize,
    rate: u32,
    warmup: Duration,
    dur: Duration,
) -> Result<Phase> {
    let plan = open_loop::Plan {
        target: target.clone(),
        rate,
        connections,
        max_connections,
        threads,
        warmup,
        dur,
        give_up_after: Duration::from_secs(5),
    };
    let write: Arc<open_loop::WriteFn> =
        Arc::new(move |n, rng: &mut u64, out: &mut Vec<u8>| w.write_slot(n, rng, out));
    let out =
        tokio::task::spawn_blocking(move || open_loop::run(&plan, server_pid, write)).await??;
    if out.tally.unsent > 0 {
        eprintln!(
            "  {label}: {} slots never sent (client fell behind by > 5 s)",
            out.tally.unsent
        );
    }
    if out.connections > connections {
        eprintln!(
            "  {label}: {} connections (opened {} while slots waited)",
            out.connections,
            out.connections - connections.max(threads)
        );
    }
    Ok(Phase {
        label,
        connections: out.connections,
        secs: dur.as_secs_f64(),
        rate: Some(rate),
        tally: out.tally,
        cpu: out.cpu,
    })
}

/// Joins `n` places into `event` over `connections` connections; answers their tokens.
async fn prejoin(
    target: &Target,
    event: &str,
    n: usize,
    connections: usize,
) -> Result<Vec<String>> {
    let conns = common::connect_all(target, connections.min(n.max(1))).await?;
    let next = Arc::new(AtomicU64::new(0));
    let tag = format!(
        "pre{}p{}",
        std::process::id(),
        PHASE.fetch_add(1, Ordering::Relaxed)
    );
    let mut handles = Vec::new();
    for mut conn in conns {
        let next = next.clone();
        let host = target.host.clone();
        let event = event.to_string();
        let tag = tag.clone();
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut req = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n as u64 {
                    break;
                }
                req.clear();
                let body = format!(r#"{{"event_id":"{event}","user_id":"{tag}-{i}"}}"#);
                json_request("POST", &host, "/api/v1/queue/join", None, &body, &mut req);
                let (status, body) = conn.call(&req).await?;
                if status != 200 {
                    bail!(
                        "pre-join answered {status}: {}",
                        String::from_utf8_lossy(body)
                    );
                }
                let v: serde_json::Value = serde_json::from_slice(body)?;
                let t = v["waiting_token"]
                    .as_str()
                    .context("a join answer without waiting_token")?;
                out.push(t.to_string());
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut tokens = Vec::with_capacity(n);
    for h in handles {
        tokens.extend(h.await??);
    }
    Ok(tokens)
}

/// A server to load: ours (started now) or the one named by --url.
struct Server {
    target: Target,
    admin: String,
    pid: Option<u32>,
    proc: Option<ServerProc>,
    label: String,
}

fn random_token() -> String {
    let mut s = 0u64;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id());
    for _ in 0..2 {
        s ^= common::next_rand(&mut seed);
    }
    format!("bench-{s:016x}")
}

impl Server {
    fn get(c: &Common, durability: Durability) -> Result<Server> {
        if let Some(url) = &c.url {
            let admin = c
                .admin_token
                .clone()
                .context("--url needs --admin-token (or WAITROOM_ADMIN_TOKEN)")?;
            return Ok(Server {
                target: Target::from_url(url)?,
                admin,
                pid: None,
                proc: None,
                label: "external".into(),
            });
        }
        let bin = match &c.bin {
            Some(b) => b.clone(),
            None => common::default_server_bin()?,
        };
        let admin = random_token();
        let proc = ServerProc::start(&bin, None, durability.name(), &admin)?;
        Ok(Server {
            target: proc.target.clone(),
            admin,
            pid: Some(proc.pid()),
            proc: Some(proc),
            label: durability.name().into(),
        })
    }

    /// A fresh bench event (unique name), created on the server.
    async fn event(&self, scenario: &str) -> Result<String> {
        let id = format!(
            "bench-{scenario}-{}-{}",
            std::process::id(),
            PHASE.fetch_add(1, Ordering::Relaxed)
        );
        put_event(&self.target, &self.admin, &id, EVENT_CONFIG).await?;
        Ok(id)
    }

    fn rss(&self) -> Option<u64> {
        self.pid
            .and_then(|p| common::rss(&p.to_string()))
            .map(|r| r.0)
    }
}

/// The reference server (the ceiling), started as a child of this process: `GET /healthz`
/// answering the server's own body, with no middleware at all.
struct Reference {
    target: Target,
    pid: u32,
    serve_loop: ServeLoop,
    _proc: ServerProc,
}

impl Reference {
    fn start(serve_loop: ServeLoop) -> Result<Reference> {
        let me = std::env::current_exe().context("locating the bench binary")?;
        let lp = match serve_loop {
            ServeLoop::Server => "server",
            ServeLoop::Axum => "axum",
        };
        let proc = ServerProc::start_command(&me, &["reference-serve", "--serve-loop", lp])?;
        Ok(Reference {
            target: proc.target.clone(),
            pid: proc.pid(),
            serve_loop,
            _proc: proc,
        })
    }

    /// Both serving loops.
    fn start_both() -> Result<Vec<Reference>> {
        [ServeLoop::Server, ServeLoop::Axum]
            .into_iter()
            .map(Reference::start)
            .collect()
    }

    /// One closed-loop /healthz phase against it.
    async fn measure(
        &self,
        label: String,
        connections: usize,
        warmup: Duration,
        dur: Duration,
    ) -> Result<Phase> {
        let w = Arc::new(Workload::new(
            &self.target,
            Scenario::Healthz,
            "",
            Arc::default(),
        ));
        closed_loop(
            &self.target,
            Some(self.pid),
            w,
            label,
            connections,
            warmup,
            dur,
        )
        .await
    }
}

/// `reference-serve`: the reference server's process. Its runtime is the server's
/// (`#[tokio::main]`: one worker per core), its route answers what the server's /healthz
/// answers, and `--serve-loop server` serves it through the server's own connection loop
/// (`TCP_NODELAY`, header timeouts, caps): only the route stack differs from the server.
fn reference_serve(a: ReferenceArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let app = axum::Router::new().route(
            "/healthz",
            axum::routing::get(|| async {
                axum::Json(waitroom::http::body::Health { status: "ok" })
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening on http://{}", listener.local_addr()?);
        match a.serve_loop {
            ServeLoop::Server => {
                let settings = waitroom::config::Settings::default();
                waitroom::server::serve_router(listener, app, &settings, std::future::pending())
                    .await
            }
            ServeLoop::Axum => {
                use axum::serve::ListenerExt as _;
                let listener = listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                axum::serve(listener, app).await?;
                Ok(())
            }
        }
    })
}

/// `ceiling`: the reference server (both loops) and the /healthz of each binary, round by
/// round, with each rate as a ratio of the ceiling.
async fn ceiling(a: CeilingArgs) -> Result<()> {
    let c = &a.common;
    if c.url.is_some() {
        bail!("`ceiling` starts its own servers; --url is not supported");
    }
    let warmup = Duration::from_secs_f64(c.warmup);
    let phase = Duration::from_secs_f64(a.phase);
    let bins = if a.bins.is_empty() {
        vec![common::default_server_bin()?]
    } else {
        a.bins.clone()
    };
    let refs = Reference::start_both()?;
    let mut servers = Vec::new();
    for (i, bin) in bins.iter().enumerate() {
        let admin = random_token();
        let proc = ServerProc::start(bin, None, Durability::Sync.name(), &admin)?;
        // The file name, or with its folder when another build has the same file name
        // (`/tmp/before/waitroom,/tmp/after/waitroom`), so the columns can be told apart.
        let file = |b: &std::path::Path| b.file_name().map(|n| n.to_string_lossy().into_owned());
        let shared = bins
            .iter()
            .filter(|b| file(b.as_path()) == file(bin.as_path()))
            .count()
            > 1;
        let name = match (
            file(bin.as_path()),
            bin.parent().and_then(|p| p.file_name()),
        ) {
            (Some(f), Some(dir)) if shared => format!("{}/{f}", dir.to_string_lossy()),
            (Some(f), _) => f,
            (None, _) => format!("server {i}"),
        };
        servers.push((name, proc));
    }
    println!(
        "waitroom-bench ceiling: {} connections, {} s per phase, {} rounds",
        a.connections, a.phase, a.rounds
    );
    print_closed_header();
    // rates[round] = ceilings (per loop) then each server's /healthz; cpu the same, as the
    // server's CPU µs per request (which other tenants of the machine disturb far less).
    let mut rates: Vec<Vec<f64>> = Vec::new();
    let mut cpu: Vec<Vec<f64>> = Vec::new();
    for r in 1..=a.rounds {
        let mut row = Vec::new();
        let mut cpu_row = Vec::new();
        for rf in &refs {
            common::settle(Duration::from_secs(2), 0.3).await;
            let mut p = rf
                .measure(
                    format!("{} r{r}", rf.serve_loop.label()),
                    a.connections,
                    warmup,
                    phase,
                )
                .await?;
            row.push(p.rps());
            cpu_row.push(cpu_per_request(&p));
            print_closed(&mut p);
        }
        for (name, proc) in &servers {
            common::settle(Duration::from_secs(2), 0.3).await;
            let w = Arc::new(Workload::new(
                &proc.target,
                Scenario::Healthz,
                "",
                Arc::default(),
            ));
            let mut p = closed_loop(
                &proc.target,
                Some(proc.pid()),
                w,
                format!("healthz {name} r{r}"),
                a.connections,
                warmup,
                phase,
            )
            .await?;
            row.push(p.rps());
            cpu_row.push(cpu_per_request(&p));
            print_closed(&mut p);
        }
        rates.push(row);
        cpu.push(cpu_row);
    }
    println!("\n### /healthz as a ratio of the ceiling (goal ≥ 0.85)\n");
    print_ceiling_table(&servers, &rates, "req/s", thousands, false);
    println!("\n### server CPU per request, µs (the ratio is ceiling / server: 1 is free)\n");
    print_ceiling_table(&servers, &cpu, "µs", |v| format!("{v:.1}"), true);
    Ok(())
}

/// The server's CPU µs per answered request in a phase.
fn cpu_per_request(p: &Phase) -> f64 {
    p.cpu.server.unwrap_or(0.0) / p.rps().max(1.0) * 1e6
}

/// `scaling`: the same server binary on each worker-thread count, started side by side;
/// each round measures join, status on one hot event and status spread over many events
/// on every server in turn. The speed-up is the rate on N threads over the rate on the
/// first count; the server's CPU per request shows whether more threads cost more per
/// request (contention) or only serve more of them.
async fn scaling(a: ScalingArgs) -> Result<()> {
    let c = &a.common;
    if c.url.is_some() {
        bail!("`scaling` starts its own servers; --url is not supported");
    }
    if a.workers.is_empty() || a.events == 0 || c.places < a.events {
        bail!("--workers needs at least one count, and --places at least one per --events");
    }
    let warmup = Duration::from_secs_f64(c.warmup);
    let phase = Duration::from_secs_f64(a.phase);
    let bin = match &c.bin {
        Some(b) => b.clone(),
        None => common::default_server_bin()?,
    };
    struct Node {
        workers: usize,
        server: Server,
        join_event: String,
        hot: Arc<Vec<String>>,
        spread: Arc<Vec<String>>,
    }
    let mut nodes = Vec::new();
    for &w in &a.workers {
        let admin = random_token();
        let threads = w.to_string();
        let proc = ServerProc::start_with_env(
            &bin,
            None,
            Durability::Sync.name(),
            &admin,
            common::LOAD_FLAGS,
            &[("TOKIO_WORKER_THREADS", threads.as_str())],
        )?;
        let server = Server {
            target: proc.target.clone(),
            admin,
            pid: Some(proc.pid()),
            proc: Some(proc),
            label: format!("{w} worker{}", if w == 1 { "" } else { "s" }),
        };
        let join_event = server.event("join").await?;
        let hot_event = server.event("status").await?;
        eprintln!("[{}] pre-joining {} places…", server.label, c.places);
        let hot = Arc::new(prejoin(&server.target, &hot_event, c.places, a.connections).await?);
        let mut spread = Vec::with_capacity(c.places);
        for _ in 0..a.events {
            let ev = server.event("spread").await?;
            spread.extend(prejoin(&server.target, &ev, c.places / a.events, a.connections).await?);
        }
        nodes.push(Node {
            workers: w,
            server,
            join_event,
            hot,
            spread: Arc::new(spread),
        });
    }
    println!(
        "waitroom-bench scaling: {} connections, {} s per phase, {} rounds, `sync`, {} places \
         (status spread over {} events)",
        a.connections, a.phase, a.rounds, c.places, a.events
    );
    print_closed_header();
    // rates[node][phase] and cpu[node][phase], best round kept (highest rate, lowest cost).
    let names = ["join", "status (one event)", "status (many events)"];
    let mut rates = vec![[0.0f64; 3]; nodes.len()];
    let mut cpu = vec![[f64::MAX; 3]; nodes.len()];
    for r in 1..=a.rounds {
        for (k, n) in nodes.iter().enumerate() {
            let phases = [
                (Scenario::Join, n.join_event.as_str(), Arc::default()),
                (Scenario::Status, "", n.hot.clone()),
                (Scenario::Status, "", n.spread.clone()),
            ];
            for (i, (s, ev, tokens)) in phases.into_iter().enumerate() {
                common::settle(Duration::from_secs(2), 0.3).await;
                let w = Arc::new(Workload::new(&n.server.target, s, ev, tokens));
                let mut p = closed_loop(
                    &n.server.target,
                    n.server.pid,
                    w,
                    format!("{} ({}) r{r}", names[i], n.server.label),
                    a.connections,
                    warmup,
                    phase,
                )
                .await?;
                rates[k][i] = rates[k][i].max(p.rps());
                cpu[k][i] = cpu[k][i].min(cpu_per_request(&p));
                print_closed(&mut p);
            }
        }
    }
    println!("\n| phase | workers | best req/s | speed-up | server CPU µs/request |");
    println!("|---|---:|---:|---:|---:|");
    for (i, name) in names.iter().enumerate() {
        for (k, n) in nodes.iter().enumerate() {
            println!(
                "| {name} | {} | {} | {:.2}× | {:.1} |",
                n.workers,
                thousands(rates[k][i]),
                rates[k][i] / rates[0][i].max(1.0),
                cpu[k][i]
            );
        }
    }
    Ok(())
}

/// One table of `ceiling`: per round, then the best (highest rate, or lowest cost).
fn print_ceiling_table(
    servers: &[(String, ServerProc)],
    vals: &[Vec<f64>],
    unit: &str,
    fmt: impl Fn(f64) -> String,
    cost: bool,
) {
    let mut head = format!("| round | ceiling {unit} | ceiling axum::serve {unit} |");
    let mut rule = String::from("|---|---:|---:|");
    for (name, _) in servers {
        head.push_str(&format!(" {name} {unit} | {name} / ceiling |"));
        rule.push_str("---:|---:|");
    }
    println!("{head}\n{rule}");
    let n = vals.first().map_or(0, Vec::len);
    let best: Vec<f64> = (0..n)
        .map(|k| {
            let it = vals.iter().map(|r| r[k]);
            if cost {
                it.fold(f64::INFINITY, f64::min)
            } else {
                it.fold(0.0, f64::max)
            }
        })
        .collect();
    let rows = vals
        .iter()
        .enumerate()
        .map(|(i, r)| ((i + 1).to_string(), r))
        .chain(std::iter::once(("best".to_string(), &best)));
    for (label, r) in rows {
        let mut line = format!("| {label} | {} | {} |", fmt(r[0]), fmt(r[1]));
        for v in &r[2..] {
            let ratio = if cost { r[0] / v } else { v / r[0] };
            line.push_str(&format!(" {} | {ratio:.2} |", fmt(*v)));
        }
        println!("{line}");
    }
}

// ---- output ----------------------------------------------------------------------------

fn print_closed_header() {
    println!("| phase | conns | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors | cpu server | cpu bench | cpu other |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|");
}

fn print_closed(p: &mut Phase) {
    let rps = p.rps();
    let pc = percentiles(&mut p.tally.lat_us);
    let [cs, cb, co] = p.cpu.cells();
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {cs} | {cb} | {co} |",
        p.label,
        p.connections,
        thousands(rps),
        ms(pc.p50),
        ms(pc.p90),
        ms(pc.p99),
        ms(pc.p999),
        ms(pc.max),
        p.tally.error_summary()
    );
}

fn print_open_header() {
    println!("| phase | conns | target/s | achieved/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | service p99 ms | send lag p99 ms | errors | cpu server | cpu bench | cpu other | bench µs/req |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
}

/// Prints an open-loop row; answers the latency percentiles (from the intended time).
fn print_open(p: &mut Phase) -> Pcts {
    let rps = p.rps();
    let pc = percentiles(&mut p.tally.lat_us);
    let svc = percentiles(&mut p.tally.svc_us);
    let lag = percentiles(&mut p.tally.lag_us);
    let [cs, cb, co] = p.cpu.cells();
    // The generator's own CPU per request: what it takes from the server on a shared box.
    let sent = (p.tally.count() - p.tally.unsent).max(1);
    let bench_us = p.cpu.bench * p.secs * 1e6 / sent as f64;
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {cs} | {cb} | {co} | {bench_us:.1} |",
        p.label,
        p.connections,
        thousands(f64::from(p.rate.unwrap_or(0))),
        thousands(rps),
        ms(pc.p50),
        ms(pc.p90),
        ms(pc.p99),
        ms(pc.p999),
        ms(pc.max),
        ms(svc.p99),
        ms(lag.p99),
        p.tally.error_summary()
    );
    pc
}

/// The 100 ms windows (by intended send time) whose worst latency exceeds `limit_ms`.
fn print_timeline(t: &Tally, limit_ms: f64) {
    let mut worst: std::collections::BTreeMap<u32, (u32, u32)> = Default::default();
    for (&at, &lat) in t.at_ms.iter().zip(&t.lat_us) {
        let e = worst.entry(at / 100).or_default();
        e.0 = e.0.max(lat);
        e.1 += 1;
    }
    println!("| window (s from start) | requests | worst latency ms |");
    println!("|---|---:|---:|");
    for (w, (lat, n)) in worst {
        if f64::from(lat) / 1000.0 > limit_ms {
            println!("| {:.1} | {n} | {} |", f64::from(w) / 10.0, ms(lat));
        }
    }
    println!();
}

/// The journal's sync durations (`waitroom_store_sync_seconds`, a summary over about the
/// last minute) from the server's `/metrics`: how much of a join's wait is the disk.
async fn print_sync_times(target: &Target) {
    let mut req = Vec::new();
    common::get_request(&target.host, "/metrics", &mut req);
    let Ok((200, text)) = common::call_once(target, &req).await else {
        return;
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("waitroom_store_sync_seconds"))
        .collect();
    if !lines.is_empty() {
        println!("\njournal syncs (seconds):\n{}", lines.join("\n"));
    }
}

// ---- commands --------------------------------------------------------------------------

async fn run(a: RunArgs) -> Result<()> {
    let c = &a.common;
    let server = Server::get(c, a.durability)?;
    let event = server.event(a.scenario.name()).await?;
    if c.places == 0 && matches!(a.scenario, Scenario::Status | Scenario::Mixed) {
        bail!("--places must be positive for the status and mixed scenarios");
    }
    let tokens = if matches!(a.scenario, Scenario::Status | Scenario::Mixed) {
        eprintln!("pre-joining {} places…", c.places);
        prejoin(&server.target, &event, c.places, a.connections).await?
    } else {
        Vec::new()
    };
    if a.prefill > 0 && a.scenario == Scenario::Join {
        eprintln!("prefilling the join event with {} places…", a.prefill);
        prejoin(&server.target, &event, a.prefill, a.connections).await?;
    }
    let mut w = Workload::new(&server.target, a.scenario, &event, Arc::new(tokens));
    w.join_percent = a.join_percent;
    let label = format!("{} ({})", a.scenario.name(), server.label);
    let warmup = Duration::from_secs_f64(c.warmup);
    let dur = Duration::from_secs_f64(a.duration);
    let w = Arc::new(w);
    match a.rate {
        None => {
            let mut p = closed_loop(
                &server.target,
                server.pid,
                w,
                label,
                a.connections,
                warmup,
                dur,
            )
            .await?;
            print_closed_header();
            print_closed(&mut p);
        }
        Some(rate) => {
            let mut p = open_loop(
                &server.target,
                server.pid,
                w,
                label,
                a.connections,
                a.max_connections,
                c.threads,
                rate,
                warmup,
                dur,
            )
            .await?;
            if let Some(limit) = a.timeline {
                print_timeline(&p.tally, limit);
            }
            print_open_header();
            print_open(&mut p);
        }
    }
    if let Some(r) = server.rss() {
        println!("\nserver resident memory at the end: {} MB", common::mb(r));
    }
    print_sync_times(&server.target).await;
    if server.proc.is_none() {
        let _ = delete_event(&server.target, &server.admin, &event).await;
    }
    Ok(())
}

/// One round of the throughput part of the suite.
struct Round {
    durability: String,
    /// The reference server through the server's loop and through `axum::serve` (0 when
    /// left out).
    ceiling: f64,
    ceiling_axum: f64,
    /// Server CPU µs per request: ceiling, healthz, join, status.
    cpu_us: [f64; 4],
    healthz: f64,
    join: f64,
    status: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

/// Every figure of the suite as a ratio of the ceiling (the reference server through the
/// server's loop) and of /healthz, round by round and best of rounds.
fn print_ceiling_ratios(rounds: &[Round]) {
    println!("\n### against the ceiling (goal: healthz ≥ 0.85 × ceiling)\n");
    println!("| durability | round | ceiling req/s | ceiling axum::serve req/s | healthz req/s | status req/s | join req/s | healthz / ceiling | status / ceiling | join / ceiling | status / healthz | join / healthz |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut labels: Vec<String> = rounds.iter().map(|r| r.durability.clone()).collect();
    labels.dedup();
    for l in &labels {
        let mine: Vec<&Round> = rounds.iter().filter(|r| &r.durability == l).collect();
        let best = |f: fn(&Round) -> f64| mine.iter().map(|r| f(r)).fold(0.0, f64::max);
        let best_round = Round {
            durability: l.clone(),
            ceiling: best(|r| r.ceiling),
            ceiling_axum: best(|r| r.ceiling_axum),
            cpu_us: [0, 1, 2, 3].map(|k| {
                mine.iter()
                    .map(|r| r.cpu_us[k])
                    .fold(f64::INFINITY, f64::min)
            }),
            healthz: best(|r| r.healthz),
            join: best(|r| r.join),
            status: best(|r| r.status),
        };
        let rows = mine
            .iter()
            .enumerate()
            .map(|(i, r)| ((i + 1).to_string(), *r))
            .chain(std::iter::once(("best of rounds".to_string(), &best_round)));
        for (n, r) in rows {
            println!(
                "| {l} | {n} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                thousands(r.ceiling),
                thousands(r.ceiling_axum),
                thousands(r.healthz),
                thousands(r.status),
                thousands(r.join),
                r.healthz / r.ceiling,
                r.status / r.ceiling,
                r.join / r.ceiling,
                r.status / r.healthz,
                r.join / r.healthz
            );
        }
    }
    // Other tenants disturb the CPU a request costs far less than the rates.
    println!("\n### server CPU per request, µs, and the ceiling's cost as a share of it\n");
    println!("| durability | round | ceiling µs | healthz µs | status µs | join µs | ceiling / healthz | ceiling / status | ceiling / join |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for l in &labels {
        let mine: Vec<&Round> = rounds.iter().filter(|r| &r.durability == l).collect();
        let low = |k: usize| {
            mine.iter()
                .map(|r| r.cpu_us[k])
                .fold(f64::INFINITY, f64::min)
        };
        let lowest = [low(0), low(1), low(2), low(3)];
        let rows = mine
            .iter()
            .enumerate()
            .map(|(i, r)| ((i + 1).to_string(), r.cpu_us))
            .chain(std::iter::once(("lowest of rounds".to_string(), lowest)));
        for (n, [c, h, j, st]) in rows {
            println!(
                "| {l} | {n} | {c:.1} | {h:.1} | {st:.1} | {j:.1} | {:.2} | {:.2} | {:.2} |",
                c / h,
                c / st,
                c / j
            );
        }
    }
}

async fn suite(a: SuiteArgs) -> Result<()> {
    let c = &a.common;
    let warmup = Duration::from_secs_f64(c.warmup);
    let phase = Duration::from_secs_f64(a.phase);
    let rate_dur = Duration::from_secs_f64(a.rate_duration);
    let settle = Duration::from_secs_f64(a.settle);
    let durabilities: Vec<Option<Durability>> = if c.url.is_some() {
        vec![None]
    } else {
        a.durability.iter().copied().map(Some).collect()
    };
    if c.places == 0 {
        bail!("--places must be positive: the status phases poll those places");
    }
    // The ceiling is measured only next to servers on this machine.
    let refs = if a.no_ceiling || c.url.is_some() {
        Vec::new()
    } else {
        Reference::start_both()?
    };
    let mut rounds = Vec::new();
    let mut open_rows: Vec<(String, Pcts, f64)> = Vec::new();
    let started = Instant::now();
    println!(
        "waitroom-bench suite: {} closed-loop connections, {} s per phase, {} rounds; \
         open loop at {}/s for {} s with {} connections (up to {}); {} client threads; \
         up to {} s of settling before each phase",
        a.connections,
        a.phase,
        a.rounds,
        a.rate,
        a.rate_duration,
        a.rate_connections,
        a.rate_max_connections,
        c.threads,
        a.settle
    );
    for d in durabilities {
        let server = Server::get(c, d.unwrap_or(Durability::Sync))?;
        let label = server.label.clone();
        let join_event = server.event("join").await?;
        let status_event = server.event("status").await?;
        eprintln!("[{label}] pre-joining {} places…", c.places);
        let tokens =
            Arc::new(prejoin(&server.target, &status_event, c.places, a.connections).await?);
        println!("\n### durability: {label}\n");
        print_closed_header();
        // Everything warms up once (connections, allocator, page cache) before measuring.
        let hw = Arc::new(Workload::new(
            &server.target,
            Scenario::Healthz,
            "",
            tokens.clone(),
        ));
        closed_loop(
            &server.target,
            server.pid,
            hw,
            String::new(),
            a.connections,
            Duration::ZERO,
            warmup,
        )
        .await?;
        for r in 1..=a.rounds {
            let mut ceilings = [0.0; 2];
            // Server CPU µs per request: ceiling, healthz, join, status.
            let mut cpu = [0.0; 4];
            for (i, rf) in refs.iter().enumerate() {
                common::settle(settle, 0.3).await;
                let mut p = rf
                    .measure(
                        format!("{} ({label}) r{r}", rf.serve_loop.label()),
                        a.connections,
                        warmup,
                        phase,
                    )
                    .await?;
                ceilings[i] = p.rps();
                if i == 0 {
                    cpu[0] = cpu_per_request(&p);
                }
                print_closed(&mut p);
            }
            let mut rates = [0.0; 3];
            for (i, (s, ev)) in [
                (Scenario::Healthz, ""),
                (Scenario::Join, join_event.as_str()),
                (Scenario::Status, status_event.as_str()),
            ]
            .into_iter()
            .enumerate()
            {
                let w = Arc::new(Workload::new(&server.target, s, ev, tokens.clone()));
                common::settle(settle, 0.3).await;
                let mut p = closed_loop(
                    &server.target,
                    server.pid,
                    w,
                    format!("{} ({label}) r{r}", s.name()),
                    a.connections,
                    warmup,
                    phase,
                )
                .await?;
                rates[i] = p.rps();
                cpu[i + 1] = cpu_per_request(&p);
                print_closed(&mut p);
            }
            rounds.push(Round {
                durability: label.clone(),
                ceiling: ceilings[0],
                ceiling_axum: ceilings[1],
                cpu_us: cpu,
                healthz: rates[0],
                join: rates[1],
                status: rates[2],
            });
        }
        println!();
        print_open_header();
        // The fixed-rate joins go to a fresh event: the throughput phases leave hundreds of
        // thousands of places in `join_event` (a number that depends on how fast this
        // machine was), and growing an event's indexes has one-off costs of its own
        // (measured by `waitroom-scale`).
        let rate_event = server.event("join-rate").await?;
        for s in [Scenario::Healthz, Scenario::Join, Scenario::Status] {
            let ev = match s {
                Scenario::Join => rate_event.as_str(),
                Scenario::Status => status_event.as_str(),
                _ => "",
            };
            let w = Arc::new(Workload::new(&server.target, s, ev, tokens.clone()));
            common::settle(settle, 0.3).await;
            let mut p = open_loop(
                &server.target,
                server.pid,
                w,
                format!("{} ({label}) @{}/s", s.name(), a.rate),
                a.rate_connections,
                a.rate_max_connections,
                a.common.threads,
                a.rate,
                warmup,
                rate_dur,
            )
            .await?;
            let pc = print_open(&mut p);
            let other = p.cpu.other + p.cpu.steal;
            open_rows.push((format!("{} ({label})", s.name()), pc, other));
        }
        if let Some(r) = server.rss() {
            println!("\nserver resident memory at the end: {} MB", common::mb(r));
        }
        if server.proc.is_none() {
            let _ = delete_event(&server.target, &server.admin, &join_event).await;
            let _ = delete_event(&server.target, &server.admin, &status_event).await;
            let _ = delete_event(&server.target, &server.admin, &rate_event).await;
        }
    }

    println!("\n### ratios (budgets: join ≥ 0.5 × healthz with sync, status ≥ 0.7 × healthz)\n");
    println!("| durability | round | healthz req/s | join req/s | status req/s | join / healthz | status / healthz |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut labels: Vec<String> = rounds.iter().map(|r| r.durability.clone()).collect();
    labels.dedup();
    for l in &labels {
        let mine: Vec<&Round> = rounds.iter().filter(|r| &r.durability == l).collect();
        for (i, r) in mine.iter().enumerate() {
            println!(
                "| {l} | {} | {} | {} | {} | {:.2} | {:.2} |",
                i + 1,
                thousands(r.healthz),
                thousands(r.join),
                thousands(r.status),
                r.join / r.healthz,
                r.status / r.healthz
            );
        }
        let jr = median(mine.iter().map(|r| r.join / r.healthz).collect());
        let sr = median(mine.iter().map(|r| r.status / r.healthz).collect());
        println!(
            "| {l} | median of rounds | {} | {} | {} | {jr:.2} ({}) | {sr:.2} ({}) |",
            thousands(median(mine.iter().map(|r| r.healthz).collect())),
            thousands(median(mine.iter().map(|r| r.join).collect())),
            thousands(median(mine.iter().map(|r| r.status).collect())),
            verdict(jr >= 0.5),
            verdict(sr >= 0.7)
        );
        // Other tenants can only take throughput away, so each scenario's best round is
        // the closest to what the machine gives it.
        let best = |f: fn(&Round) -> f64| mine.iter().map(|r| f(r)).fold(0.0, f64::max);
        let (h, j, st) = (best(|r| r.healthz), best(|r| r.join), best(|r| r.status));
        println!(
            "| {l} | best of rounds | {} | {} | {} | **{:.2}** ({}) | **{:.2}** ({}) |",
            thousands(h),
            thousands(j),
            thousands(st),
            j / h,
            verdict(j / h >= 0.5),
            st / h,
            verdict(st / h >= 0.7)
        );
    }
    if !refs.is_empty() {
        print_ceiling_ratios(&rounds);
    }
    println!(
        "\n### latency at {}/s (budget: p99 ≤ 5 ms for join and status)\n",
        a.rate
    );
    println!("| phase | p50 ms | p99 ms | p99.9 ms | p99 verdict | cpu of other tenants |");
    println!("|---|---:|---:|---:|---|---:|");
    for (l, pc, other) in &open_rows {
        let budgeted = !l.starts_with("healthz");
        println!(
            "| {l} | {} | {} | {} | {} | {other:.2} |",
            ms(pc.p50),
            ms(pc.p99),
            ms(pc.p999),
            if budgeted {
                verdict(pc.p99 <= 5000)
            } else {
                "(baseline)"
            }
        );
    }
    println!(
        "\nsuite finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn limits(a: LimitsArgs) -> Result<()> {
    let c = &a.common;
    if c.url.is_some() {
        bail!("`limits` starts its own two servers; --url is not supported");
    }
    let warmup = Duration::from_secs_f64(c.warmup);
    let phase = Duration::from_secs_f64(a.phase);
    let bin = match &c.bin {
        Some(b) => b.clone(),
        None => common::default_server_bin()?,
    };
    let on_flags = [
        "--joins-per-minute",
        "100000000",
        "--polls-per-second",
        "1000000",
    ];
    let variants: [(&str, &[&str]); 2] = [("on", &on_flags), ("off", &["--rate-limits", "off"])];
    let mut servers = Vec::new();
    for (label, flags) in variants {
        let admin = random_token();
        let proc = ServerProc::start_with(&bin, None, a.durability.name(), &admin, flags)?;
        let server = Server {
            target: proc.target.clone(),
            admin,
            pid: Some(proc.pid()),
            proc: Some(proc),
            label: label.into(),
        };
        let join_event = server.event("join").await?;
        let status_event = server.event("status").await?;
        eprintln!("[limits {label}] pre-joining {} places…", c.places);
        let tokens =
            Arc::new(prejoin(&server.target, &status_event, c.places, a.connections).await?);
        servers.push((server, join_event, status_event, tokens));
    }
    println!(
        "waitroom-bench limits: {} connections, {} s per phase, {} rounds, durability {}",
        a.connections,
        a.phase,
        a.rounds,
        a.durability.name()
    );
    print_closed_header();
    // rates[round][server] = [healthz, join, status]; cpu: the server's CPU µs per request,
    // which other tenants disturb far less than the rates.
    let mut rates: Vec<[[f64; 3]; 2]> = Vec::new();
    let mut cpu: Vec<[[f64; 3]; 2]> = Vec::new();
    for r in 1..=a.rounds {
        let mut row = [[0.0; 3]; 2];
        let mut cpu_row = [[0.0; 3]; 2];
        for (k, (server, join_event, status_event, tokens)) in servers.iter().enumerate() {
            for (i, (s, ev)) in [
                (Scenario::Healthz, ""),
                (Scenario::Join, join_event.as_str()),
                (Scenario::Status, status_event.as_str()),
            ]
            .into_iter()
            .enumerate()
            {
                let w = Arc::new(Workload::new(&server.target, s, ev, tokens.clone()));
                common::settle(Duration::from_secs(2), 0.3).await;
                let mut p = closed_loop(
                    &server.target,
                    server.pid,
                    w,
                    format!("{} (limits {}) r{r}", s.name(), server.label),
                    a.connections,
                    warmup,
                    phase,
                )
                .await?;
                row[k][i] = p.rps();
                cpu_row[k][i] = p.cpu.server.unwrap_or(0.0) / p.rps().max(1.0) * 1e6;
                print_closed(&mut p);
            }
        }
        rates.push(row);
        cpu.push(cpu_row);
    }
    println!("\n### limits on vs off (goal: on ≥ 0.95 × off for join and status)\n");
    println!("| round | healthz on | healthz off | join on | join off | join on/off | status on | status off | status on/off | join/healthz on | join/healthz off | status/healthz on | status/healthz off |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, [on, off]) in rates.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} |",
            i + 1,
            thousands(on[0]),
            thousands(off[0]),
            thousands(on[1]),
            thousands(off[1]),
            on[1] / off[1],
            thousands(on[2]),
            thousands(off[2]),
            on[2] / off[2],
            on[1] / on[0],
            off[1] / off[0],
            on[2] / on[0],
            off[2] / off[0]
        );
    }
    // Other tenants only take throughput away: each side's best round is the fairest.
    let best = |k: usize, i: usize| rates.iter().map(|r| r[k][i]).fold(0.0, f64::max);
    println!(
        "| best | {} | {} | {} | {} | **{:.3}** | {} | {} | **{:.3}** | | | | |",
        thousands(best(0, 0)),
        thousands(best(1, 0)),
        thousands(best(0, 1)),
        thousands(best(1, 1)),
        best(0, 1) / best(1, 1),
        thousands(best(0, 2)),
        thousands(best(1, 2)),
        best(0, 2) / best(1, 2)
    );
    println!("\n### server CPU per request, µs (on / off)\n");
    println!("| round | healthz on | healthz off | join on | join off | join on/off | status on | status off | status on/off |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, [on, off]) in cpu.iter().enumerate() {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.1} | {:.1} | {:.3} |",
            i + 1,
            on[0],
            off[0],
            on[1],
            off[1],
            on[1] / off[1],
            on[2],
            off[2],
            on[2] / off[2]
        );
    }
    let med = |k: usize, i: usize| median(cpu.iter().map(|r| r[k][i]).collect());
    println!(
        "| median | {:.1} | {:.1} | {:.1} | {:.1} | **{:.3}** | {:.1} | {:.1} | **{:.3}** |",
        med(0, 0),
        med(1, 0),
        med(0, 1),
        med(1, 1),
        med(0, 1) / med(1, 1),
        med(0, 2),
        med(1, 2),
        med(0, 2) / med(1, 2)
    );
    limiter_micro().await;
    Ok(())
}

/// The limiter's own cost, in process: one join check and one poll check (the event's
/// settings from the node's catalog, the key's hash, the GCRA update), without HTTP.
async fn limiter_micro() {
    use waitroom::catalog::EventCatalog;
    use waitroom::config::RateLimitSettings;
    use waitroom::core::{EventPatch, PlaceKey};
    use waitroom::http::guard::Guard;
    use waitroom::store::embedded::EmbeddedStore;
    use waitroom::store::Store;

    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::new());
    store
        .put_event("e", &EventPatch::default(), 0)
        .await
        .unwrap();
    let events = EventCatalog::new(store);
    let guard = Guard::new(RateLimitSettings {
        joins_per_minute: 1_000_000,
        polls_per_second: 1_000_000,
        ..RateLimitSettings::default()
    });
    let n = 1_000_000u64;
    let ip = Some(std::net::IpAddr::from([203, 0, 113, 7]));
    let t = Instant::now();
    for i in 0..n {
        // Many clients, as a real crowd (4,096 distinct addresses).
        let ip =
            ip.map(|_| std::net::IpAddr::from((0xCB00_0000u32 | (i as u32 & 4095)).to_be_bytes()));
        let _ = guard.check_join(&events, 0, ip, "e").await;
    }
    let join_ns = t.elapsed().as_nanos() as f64 / n as f64;
    let t = Instant::now();
    for i in 0..n {
        let key = PlaceKey {
            seq: i & 4095,
            nonce: 7,
        };
        let _ = guard.check_poll(&events, 0, "e", key).await;
    }
    let poll_ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "\nlimiter checks in process (one thread, {n} each): join {join_ns:.0} ns, poll {poll_ns:.0} ns"
    );
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let threads = match cli.cmd {
        Cmd::Run(ref a) => a.common.threads,
        Cmd::Suite(ref a) => a.common.threads,
        Cmd::Limits(ref a) => a.common.threads,
        Cmd::Ceiling(ref a) => a.common.threads,
        Cmd::Scaling(ref a) => a.common.threads,
        Cmd::Journey(ref a) => a.threads,
        Cmd::Holds(ref a) => a.threads,
        // Its own runtime: the server's settings, not the load generator's.
        Cmd::ReferenceServe(a) => return reference_serve(a),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Run(a) => run(a).await,
            Cmd::Suite(a) => suite(a).await,
            Cmd::Limits(a) => limits(a).await,
            Cmd::Ceiling(a) => ceiling(a).await,
            Cmd::Scaling(a) => scaling(a).await,
            Cmd::Journey(a) => journey::run(*a).await,
            Cmd::Holds(a) => holds::run(a).await,
            Cmd::ReferenceServe(_) => unreachable!("handled above"),
        }
    })
}
