//! `waitroom-bench journey`: a flash crowd of virtual people against real servers, and a
//! report of what a waiting room promises them: order, pace within capacity, no idle
//! slots, ghosts gone soon, honest estimates, and what it all costs a client.
//!
//! ```text
//! cargo build --release --bins
//! target/release/waitroom-bench journey --report target/journey            # embedded store
//! target/release/waitroom-bench journey --store redis --nodes 2 --report target/journey-redis
//! target/release/waitroom-bench journey --scenario bench/journey/standard.toml --report DIR
//! target/release/waitroom-bench journey --scenario bench/journey/steady.toml --report DIR
//! target/release/waitroom-bench journey --scenario bench/journey/steady.toml --ignore-poll-after
//! target/release/waitroom-bench journey --scenario bench/journey/sellout.toml --report DIR
//! target/release/waitroom-bench journey --url http://127.0.0.1:8080 --admin-token T \
//!     --event sale --users 500 --arrival-secs 10 --report DIR
//! ```
//!
//! Without `--url` it starts the release `waitroom` binary: one node on the embedded store,
//! or `--nodes N` on Redis (`--store redis` starts a private `redis-server` on a free
//! loopback port; `--store redis://…` uses one that runs). Started nodes run with
//! `--rate-limits off` and no per-address connection cap, since every virtual person comes
//! from this one address; a server named by `--url` must allow that too.
//!
//! The scenario (defaults, then `--scenario FILE` in TOML, then flags) sets the crowd
//! (arrival spike and tail, shares of polling clients and of people who abandon, reload or
//! lose the network) and the event's capacity and pace; with `seats`, the hall each session
//! holds and buys seats of, and whether the simulator ends the sale once it sold out
//! (`seats.rs`). `--report DIR` writes `report.json` and a self-contained `report.html`.

pub mod html;
pub mod metrics;
pub mod report;
pub mod seats;
pub mod user;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::{self, put_event, Conn, ServerProc, Target};
use user::{Behaviour, Ctx, Plan, Transport};

/// The crowd and the event. Every field has a default; a TOML file sets any of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    /// People in all.
    pub users: usize,
    /// Length of the spike at the opening, in seconds.
    pub arrival_secs: f64,
    /// Share of the people who arrive within the spike; the rest arrive over the tail.
    pub spike_share: f64,
    /// Length of the tail after the spike, in seconds.
    pub tail_secs: f64,
    pub seed: u64,
    /// Share of clients that poll `status` instead of holding a WebSocket.
    pub poll_share: f64,
    /// Shares of people who close the tab silently, reload the page, lose the network.
    pub abandon_share: f64,
    pub reload_share: f64,
    pub netloss_share: f64,
    /// When the behaviour strikes: seconds after the join, drawn in [min, max].
    pub strike_secs: [f64; 2],
    /// How long a network outage lasts, in seconds, drawn in [min, max].
    pub netloss_secs: [f64; 2],
    /// Seconds a session is held on the site, drawn in [min, max].
    pub hold_secs: [f64; 2],
    /// Polling interval when no answer carries `poll_after_sec` (the page's 3 s).
    pub poll_secs: f64,
    /// Polling clients keep to `poll_secs` even when answers carry `poll_after_sec` (a page
    /// older than it): what the server's direction saves is the difference.
    pub ignore_poll_after: bool,
    /// An estimate is scored at join and then at each of these intervals while waiting.
    pub eta_every_sec: f64,
    /// Waits shorter than this are not scored (a whole-second estimate of them means little).
    pub eta_min_wait_sec: f64,
    /// How late a WebSocket's `queue-ready` may arrive after the admission; admissions seen
    /// within this of each other are not told apart for the order promise.
    pub order_slack_sec: f64,
    /// Interval of the admin figures sampled during the run, in milliseconds.
    pub sample_ms: u64,
    /// Longest a run may last before its stragglers are given up, in seconds.
    pub max_run_secs: f64,
    // The event's settings (see docs/API.md, admin API).
    pub max_active: u64,
    pub admit_per_minute: Option<u32>,
    pub waiting_idle_sec: u32,
    pub ready_ttl_sec: u32,
    pub session_idle_sec: u32,
    pub session_max_sec: u32,
    /// Seats for sale (0: none; sessions hold nothing, as before seats existed). The
    /// simulator puts them up as the event's inventory before the opening.
    pub seats: usize,
    /// Seats one person wants, drawn in [min, max]; one who finds fewer takes what is left.
    pub seats_per_person: [u32; 2],
    /// The simulator, as the operator, ends the sale (`sold_out`) as soon as its sampling
    /// loop sees nothing available nor held.
    pub end_when_sold_out: bool,
}

impl Default for Scenario {
    /// The standard scenario of docs/PERFORMANCE.md, sized for a 2-core machine.
    fn default() -> Self {
        Scenario {
            users: 2000,
            arrival_secs: 10.0,
            spike_share: 0.8,
            tail_secs: 30.0,
            seed: 1,
            poll_share: 0.2,
            abandon_share: 0.05,
            reload_share: 0.05,
            netloss_share: 0.03,
            strike_secs: [2.0, 30.0],
            netloss_secs: [2.0, 6.0],
            hold_secs: [4.0, 12.0],
            poll_secs: 3.0,
            ignore_poll_after: false,
            eta_every_sec: 60.0,
            eta_min_wait_sec: 2.0,
            order_slack_sec: 1.0,
            sample_ms: 250,
            max_run_secs: 1200.0,
            max_active: 150,
            admit_per_minute: None,
            waiting_idle_sec: 20,
            ready_ttl_sec: 15,
            session_idle_sec: 60,
            session_max_sec: 600,
            seats: 0,
            seats_per_person: [1, 4],
            end_when_sold_out: false,
        }
    }
}

impl Scenario {
    /// What each person will do: arrival instants from the curve, the rest drawn per person.
    pub fn plans(&self, nodes: usize) -> Vec<Plan> {
        let arrivals = metrics::arrival_times(
            self.users,
            self.arrival_secs,
            self.spike_share,
            self.tail_secs,
            self.seed,
        );
        let mut rng = self.seed ^ 0x6A09_E667_F3BC_C908;
        let mut draw = |[lo, hi]: [f64; 2]| lo + metrics::unit(&mut rng) * (hi - lo).max(0.0);
        // Seats come from a stream of their own, so a scenario without seats draws
        // exactly what it drew before they existed.
        let mut seat_rng = self.seed ^ 0xBB67_AE85_84CA_A73B;
        let [lo, hi] = self.seats_per_person;
        let mut wanted = move || {
            let span = f64::from(hi.saturating_sub(lo) + 1);
            lo + ((metrics::unit(&mut seat_rng) * span) as u32).min(hi.saturating_sub(lo))
        };
        arrivals
            .into_iter()
            .enumerate()
            .map(|(id, arrival)| {
                let t = draw([0.0, 1.0]);
                let transport = if t < self.poll_share {
                    Transport::Poll
                } else {
                    Transport::Ws
                };
                let b = draw([0.0, 1.0]);
                let behaviour = if b < self.abandon_share {
                    Behaviour::Abandon
                } else if b < self.abandon_share + self.reload_share {
                    Behaviour::Reload
                } else if b < self.abandon_share + self.reload_share + self.netloss_share {
                    Behaviour::Netloss
                } else {
                    Behaviour::Stay
                };
                let pause = match behaviour {
                    Behaviour::Netloss => draw(self.netloss_secs),
                    _ => draw([0.3, 1.5]), // a reload: the page is back within a second or so
                };
                Plan {
                    id,
                    arrival,
                    transport,
                    behaviour,
                    hold: draw(self.hold_secs),
                    strike_after: draw(self.strike_secs),
                    pause,
                    node: id % nodes.max(1),
                    seats_wanted: if self.seats > 0 { wanted() } else { 0 },
                }
            })
            .collect()
    }

    /// The scenario with the event's settings as the server answered them (`GET
    /// /api/v1/admin/events/{id}`, the report's `event_config`). With `--keep-settings`
    /// they are the event's own, which the scenario's (file or defaults) know nothing of:
    /// the people's heartbeats, the wait for ghosts and every goal of the report must go by
    /// what the server applies. Fields the answer lacks keep the scenario's.
    pub fn with_event_settings(&self, event: &Value) -> Scenario {
        let mut sc = self.clone();
        let secs = |k: &str| event[k].as_u64().and_then(|v| u32::try_from(v).ok());
        if let Some(v) = event["max_active"].as_u64() {
            sc.max_active = v;
        }
        // `null` is no pace at all; an absent field says nothing.
        if let Some(v) = event.get("admit_per_minute") {
            sc.admit_per_minute = v.as_u64().and_then(|v| u32::try_from(v).ok());
        }
        for (k, f) in [
            ("waiting_idle_sec", &mut sc.waiting_idle_sec),
            ("ready_ttl_sec", &mut sc.ready_ttl_sec),
            ("session_idle_sec", &mut sc.session_idle_sec),
            ("session_max_sec", &mut sc.session_max_sec),
        ] {
            if let Some(v) = secs(k) {
                *f = v;
            }
        }
        sc
    }

    /// How long the run waits, after the last person went silent, for the server to remove
    /// the ghosts: a lapsed heartbeat, then perhaps a ready window, and a sweep's slack.
    pub fn ghost_wait_deadline(&self, last_silent: f64) -> f64 {
        last_silent + f64::from(self.waiting_idle_sec) + f64::from(self.ready_ttl_sec) + 10.0
    }

    /// The event's settings as the admin API takes them.
    pub fn event_settings(&self) -> Value {
        let mut v = serde_json::json!({
            "name": "journey",
            "max_active": self.max_active,
            "admit_per_minute": self.admit_per_minute,
            "waiting_idle_sec": self.waiting_idle_sec,
            "ready_ttl_sec": self.ready_ttl_sec,
            "session_idle_sec": self.session_idle_sec,
            "session_max_sec": self.session_max_sec,
            "paused": false,
            // Every virtual person comes from one address.
            "rate_limits": {"joins_per_minute": 100_000_000, "polls_per_second": 100},
        });
        if self.seats > 0 {
            // Holds outlast any session here, so none lapses before its `complete`.
            v["max_holds_per_session"] = self.seats_per_person[1].into();
            v["hold_ttl_sec"] = (self.session_max_sec.max(60) * 2).into();
        }
        v
    }
}

#[derive(clap::Args, Debug, Default)]
pub struct JourneyArgs {
    /// Running server(s) to use, comma-separated (people are spread over them like a
    /// round-robin balancer); without it, servers are started.
    #[arg(long, value_delimiter = ',')]
    pub url: Vec<String>,
    /// Admin token of the server(s) named by --url.
    #[arg(long, env = "WAITROOM_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// The event: created (or updated) with the scenario's settings, unless --keep-settings.
    #[arg(long, default_value = "journey")]
    pub event: String,
    /// Use the event as it is configured (it must exist): the report shows and judges
    /// against the event's own settings, whatever the scenario file says of them;
    /// --max-active, --admit-per-minute and --waiting-idle-sec are refused with it.
    #[arg(long)]
    pub keep_settings: bool,
    /// Fail (exit status 1) when a promise was not kept (a ✗ among the checks), after the
    /// summary and the report are written: for a job that runs the simulator as a check.
    /// Without it a ✗ is a warning and the exit status says only whether the run was made.
    #[arg(long)]
    pub strict: bool,
    /// A TOML scenario file (the fields of the scenario; flags below override it).
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Write report.json and report.html here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// A name for the run, shown in the report.
    #[arg(long)]
    pub label: Option<String>,
    /// Nodes to start (more than one needs a Redis store).
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Store of the started nodes: `embedded`, `redis` (a private redis-server is started)
    /// or a `redis://` URL.
    #[arg(long, default_value = "embedded")]
    pub store: String,
    /// The server binary to start (default: `waitroom` next to this binary).
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// `--durability` of started embedded nodes.
    #[arg(long, default_value = "sync")]
    pub durability: String,
    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    #[arg(long)]
    pub users: Option<usize>,
    #[arg(long)]
    pub arrival_secs: Option<f64>,
    #[arg(long)]
    pub tail_secs: Option<f64>,
    #[arg(long)]
    pub spike_share: Option<f64>,
    #[arg(long)]
    pub poll_share: Option<f64>,
    #[arg(long)]
    pub abandon_share: Option<f64>,
    #[arg(long)]
    pub reload_share: Option<f64>,
    #[arg(long)]
    pub netloss_share: Option<f64>,
    /// Session length on the site, `MIN,MAX` seconds.
    #[arg(long, value_delimiter = ',')]
    pub hold_secs: Option<Vec<f64>>,
    #[arg(long)]
    pub max_active: Option<u64>,
    #[arg(long)]
    pub admit_per_minute: Option<u32>,
    #[arg(long)]
    pub waiting_idle_sec: Option<u32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Polling clients keep to the fixed `poll_secs`, ignoring the server's `poll_after_sec`.
    #[arg(long)]
    pub ignore_poll_after: bool,
    /// Seats for sale: each session reads the seat map, holds seats and buys them.
    #[arg(long)]
    pub seats: Option<usize>,
    /// Seats one person wants, `MIN,MAX`.
    #[arg(long, value_delimiter = ',')]
    pub seats_per_person: Option<Vec<u32>>,
    /// End the sale (`sold_out`) as soon as nothing is available nor held.
    #[arg(long)]
    pub end_when_sold_out: bool,
}

/// Defaults, then the TOML file, then the flags.
pub fn scenario_of(a: &JourneyArgs) -> Result<Scenario> {
    use figment::providers::{Format as _, Serialized, Toml};
    if a.keep_settings {
        // These flags only set the event, which --keep-settings leaves alone: taking them
        // silently would let the command line claim settings the run never had.
        let given: Vec<&str> = [
            ("--max-active", a.max_active.is_some()),
            ("--admit-per-minute", a.admit_per_minute.is_some()),
            ("--waiting-idle-sec", a.waiting_idle_sec.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, set)| set.then_some(f))
        .collect();
        if !given.is_empty() {
            bail!(
                "{} cannot apply with --keep-settings (the event keeps its own settings): \
                 drop {}, or drop --keep-settings",
                given.join(", "),
                if given.len() == 1 { "it" } else { "them" }
            );
        }
    }
    let mut fig = figment::Figment::from(Serialized::defaults(Scenario::default()));
    if let Some(f) = &a.scenario {
        if !f.exists() {
            bail!("scenario file {} not found", f.display());
        }
        fig = fig.merge(Toml::file(f));
    }
    let mut sc: Scenario = fig.extract().context("reading the scenario")?;
    macro_rules! over {
        ($($f:ident),*) => { $( if let Some(v) = a.$f.clone() { sc.$f = v; } )* };
    }
    over!(
        users,
        arrival_secs,
        tail_secs,
        spike_share,
        poll_share,
        abandon_share,
        reload_share,
        netloss_share,
        max_active,
        waiting_idle_sec,
        seed,
        seats
    );
    if a.end_when_sold_out {
        sc.end_when_sold_out = true;
    }
    if let Some(v) = &a.seats_per_person {
        let [lo, hi] = v[..] else {
            bail!("--seats-per-person takes MIN,MAX");
        };
        sc.seats_per_person = [lo, hi];
    }
    if let Some(v) = a.admit_per_minute {
        sc.admit_per_minute = Some(v);
    }
    if a.ignore_poll_after {
        sc.ignore_poll_after = true;
    }
    if let Some(v) = &a.hold_secs {
        let [lo, hi] = v[..] else {
            bail!("--hold-secs takes MIN,MAX");
        };
        sc.hold_secs = [lo, hi];
    }
    check(&sc)?;
    Ok(sc)
}

/// The longest duration a scenario may give, in seconds (a day): beyond it (or `inf`) a
/// figure is a typo, and it would panic turning into a `Duration` or keep the run waiting
/// for `max_run_secs`.
const MAX_SECS: f64 = 86_400.0;

fn check(sc: &Scenario) -> Result<()> {
    let share = |name: &str, v: f64| {
        if !(0.0..=1.0).contains(&v) {
            bail!("{name} must be within 0..1, not {v}");
        }
        Ok(())
    };
    share("spike_share", sc.spike_share)?;
    share("poll_share", sc.poll_share)?;
    // Each share on its own too: a negative one passes the sum and silently takes the
    // room of another (the behaviours are drawn from consecutive intervals).
    share("abandon_share", sc.abandon_share)?;
    share("reload_share", sc.reload_share)?;
    share("netloss_share", sc.netloss_share)?;
    share(
        "abandon_share + reload_share + netloss_share",
        sc.abandon_share + sc.reload_share + sc.netloss_share,
    )?;
    for (name, v) in [
        ("arrival_secs", sc.arrival_secs),
        ("tail_secs", sc.tail_secs),
        ("poll_secs", sc.poll_secs),
        ("eta_every_sec", sc.eta_every_sec),
        ("eta_min_wait_sec", sc.eta_min_wait_sec),
        ("order_slack_sec", sc.order_slack_sec),
        ("max_run_secs", sc.max_run_secs),
    ] {
        // Written so that NaN fails too.
        if !(0.0..=MAX_SECS).contains(&v) {
            bail!("{name} must be a number of seconds within 0..={MAX_SECS}, not {v}");
        }
    }
    for (name, [lo, hi]) in [
        ("strike_secs", sc.strike_secs),
        ("netloss_secs", sc.netloss_secs),
        ("hold_secs", sc.hold_secs),
    ] {
        if !(lo >= 0.0 && hi >= lo && hi <= MAX_SECS) {
            bail!("{name} must be [min, max] with 0 <= min <= max <= {MAX_SECS} seconds, not [{lo}, {hi}]");
        }
    }
    if sc.arrival_secs + sc.tail_secs >= sc.max_run_secs {
        bail!(
            "arrival_secs + tail_secs ({} s) must end before max_run_secs ({} s): \
             later people would never arrive",
            sc.arrival_secs + sc.tail_secs,
            sc.max_run_secs
        );
    }
    if sc.sample_ms > 60_000 {
        bail!("sample_ms must be at most 60000, not {}", sc.sample_ms);
    }
    let [lo, hi] = sc.seats_per_person;
    if sc.seats > 0 && !(1 <= lo && lo <= hi && u64::from(hi) <= 100) {
        bail!("seats_per_person must be [min, max] with 1 <= min <= max <= 100");
    }
    if sc.seats > 100_000 {
        bail!("seats: at most 100,000 items per event");
    }
    if sc.end_when_sold_out && sc.seats == 0 {
        bail!("end_when_sold_out needs seats");
    }
    if sc.users == 0 || sc.arrival_secs < 0.0 || sc.tail_secs < 0.0 || sc.max_active == 0 {
        bail!("users and max_active must be at least 1, arrival_secs and tail_secs at least 0");
    }
    Ok(())
}

/// Where the run goes: the nodes, the admin token, and whatever was started for it.
pub struct Setup {
    pub targets: Vec<Target>,
    pub admin: String,
    pub store: String,
    _nodes: Vec<ServerProc>,
    _redis: Option<RedisProc>,
    _dir: Option<TempDir>,
}

/// A `redis-server` started for the run, shut down with it.
struct RedisProc(Child);

impl Drop for RedisProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The run's directory (signing key, node data, server logs), removed with the run.
struct TempDir {
    path: PathBuf,
    /// A server failed to start: its log (`*.server.log`, named by the error) is kept,
    /// and everything else (the signing key, the data) removed.
    keep_logs: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep_logs {
            let _ = std::fs::remove_dir_all(&self.path);
            return;
        }
        for e in std::fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            if p.to_string_lossy().ends_with(".server.log") {
                continue;
            }
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

/// The error of a node that did not start, with the end of its log: the log is kept
/// (`TempDir::keep_logs`), but a CI job's temp dir may be gone before anyone reads it.
fn node_failed(e: anyhow::Error, log: &Path) -> anyhow::Error {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    if tail.is_empty() {
        e.context(format!("{} is empty (kept)", log.display()))
    } else {
        e.context(format!("the end of {} (kept):\n{tail}", log.display()))
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn start_redis(dir: &Path) -> Result<(RedisProc, String)> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting redis-server (Debian: apt-get install redis-server)")?;
    let proc = RedisProc(child);
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > until {
            bail!("redis-server did not listen on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((proc, format!("redis://127.0.0.1:{port}")))
}

fn random_tag() -> String {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id()).rotate_left(32);
    format!("{:012x}", common::next_rand(&mut seed) >> 16)
}

impl Setup {
    pub async fn new(a: &JourneyArgs) -> Result<Setup> {
        if !a.url.is_empty() {
            let admin = a
                .admin_token
                .clone()
                .context("--url needs --admin-token (or WAITROOM_ADMIN_TOKEN)")?;
            let targets = a
                .url
                .iter()
                .map(|u| Target::from_url(u))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Setup {
                targets,
                admin,
                store: "external".into(),
                _nodes: Vec::new(),
                _redis: None,
                _dir: None,
            });
        }
        let bin = match &a.bin {
            Some(b) => b.clone(),
            None => common::default_server_bin()?,
        };
        let mut dir = TempDir {
            path: common::fresh_temp_dir("journey")?,
            keep_logs: false,
        };
        let admin = format!("journey-{}", random_tag());
        let (redis, store) = match a.store.as_str() {
            "embedded" => {
                if a.nodes > 1 {
                    bail!(
                        "--nodes {} needs --store redis (or a redis:// URL)",
                        a.nodes
                    );
                }
                (None, "embedded".to_string())
            }
            "redis" => {
                let (p, url) = start_redis(&dir.path)?;
                (Some(p), url)
            }
            url if url.starts_with("redis://") => (None, url.to_string()),
            other => bail!("--store must be embedded, redis or redis://…, not {other}"),
        };
        waitroom::tokens::load_or_generate_key(None, &dir.path)?;
        let key = dir.path.join("signing-key.pem");
        let key = key.to_str().context("temp dir path")?.to_string();
        let mut nodes = Vec::new();
        for i in 0..a.nodes.max(1) {
            let data = dir.path.join(format!("node-{i}"));
            std::fs::create_dir_all(&data)?;
            let mut extra = vec![
                "--rate-limits",
                "off",
                "--max-connections-per-client",
                "1000000",
                "--signing-key",
                &key,
            ];
            if store != "embedded" {
                extra.extend(["--store", store.as_str()]);
            }
            // `ServerProc` logs next to the data dir; the error names that file.
            let log = data.with_extension("server.log");
            let started =
                match ServerProc::start_with(&bin, Some(&data), &a.durability, &admin, &extra) {
                    Ok(p) => p.wait_ready(Duration::from_secs(60)).await.map(|_| p),
                    Err(e) => Err(e),
                };
            match started {
                Ok(p) => nodes.push(p),
                Err(e) => {
                    dir.keep_logs = true;
                    return Err(node_failed(e, &log));
                }
            }
        }
        let label = if store == "embedded" {
            "embedded".to_string()
        } else {
            format!("redis, {} node(s)", nodes.len())
        };
        Ok(Setup {
            targets: nodes.iter().map(|n| n.target.clone()).collect(),
            admin,
            store: label,
            _nodes: nodes,
            _redis: redis,
            _dir: Some(dir),
        })
    }
}

/// One run: the event, the crowd, the sampler; answers the report.
pub struct RunOpts<'a> {
    pub targets: &'a [Target],
    pub admin: &'a str,
    pub event: &'a str,
    pub keep_settings: bool,
    pub label: String,
    /// Progress lines on stderr.
    pub verbose: bool,
}

/// One reading of the admin figures.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    pub t: f64,
    pub waiting: u64,
    pub admitted: u64,
    pub active: u64,
    pub capacity: u64,
    pub expired: u64,
    pub admissions: u64,
    pub completed: u64,
    pub left: u64,
}

/// `GET <path>` with the admin token on the operator's keep-alive connection (opened on
/// first use, dropped on an error): the JSON of a `200`, else `None`.
pub(crate) async fn admin_get(
    target: &Target,
    admin: &str,
    path: &str,
    conn: &mut Option<Conn>,
) -> Option<Value> {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {admin}\r\n\r\n",
        target.host
    );
    if conn.is_none() {
        *conn = Conn::connect(target.addr).await.ok();
    }
    let c = conn.as_mut()?;
    match c.call(req.as_bytes()).await {
        Ok((200, body)) => serde_json::from_slice(body).ok(),
        Ok(_) => None,
        Err(_) => {
            *conn = None;
            None
        }
    }
}

async fn admin_figures(
    target: &Target,
    admin: &str,
    event: &str,
    conn: &mut Option<Conn>,
) -> Option<Value> {
    admin_get(
        target,
        admin,
        &format!("/api/v1/admin/events/{event}"),
        conn,
    )
    .await
}

fn sample_of(t: f64, v: &Value) -> Sample {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Sample {
        t,
        waiting: n("waiting"),
        admitted: n("admitted"),
        active: n("active"),
        capacity: n("capacity"),
        expired: n("expired"),
        admissions: n("admissions"),
        completed: n("completed"),
        left: n("left"),
    }
}

pub async fn run_scenario(sc: &Scenario, o: RunOpts<'_>) -> Result<report::Report> {
    let target0 = o
        .targets
        .first()
        .context("no server to run against")?
        .clone();
    if !o.keep_settings {
        put_event(&target0, o.admin, o.event, &sc.event_settings().to_string()).await?;
    }
    let mut probe = None;
    if sc.seats > 0 {
        seats::put_inventory(&target0, o.admin, o.event, sc.seats).await?;
    }
    let before = admin_figures(&target0, o.admin, o.event, &mut probe)
        .await
        .with_context(|| format!("reading event {} through the admin API", o.event))?;
    if sc.seats > 0 {
        // The seats measured are this run's: an event that sold or ended before would
        // mix another run's sales (and an ended sale never reopens).
        let inv = seats::read_inventory(&target0, o.admin, o.event, &mut None)
            .await
            .context("reading the inventory")?;
        let c = seats::Counts::of(&inv);
        if c.held + c.sold > 0 || !before["ended"].is_null() {
            bail!(
                "event {} has sold or held seats, or its sale ended: use a fresh --event",
                o.event
            );
        }
    }
    let config = before.clone();
    // From here on the settings are the event's as the server answered them (the same as
    // the scenario's after the PUT above; the event's own with --keep-settings).
    let sc = &sc.with_event_settings(&config);
    if o.verbose {
        if o.keep_settings {
            eprintln!(
                "event {} as configured: max_active {}, admit_per_minute {:?}, waiting_idle_sec {}, ready_ttl_sec {}",
                o.event, sc.max_active, sc.admit_per_minute, sc.waiting_idle_sec, sc.ready_ttl_sec
            );
        }
        if sc.poll_secs >= f64::from(sc.waiting_idle_sec) {
            eprintln!(
                "warning: poll_secs {} >= waiting_idle_sec {}: polling places will lapse between polls",
                sc.poll_secs, sc.waiting_idle_sec
            );
        }
    }
    let plans = sc.plans(o.targets.len());
    let ctx = Arc::new(Ctx {
        t0: Instant::now() + Duration::from_millis(300),
        targets: o.targets.to_vec(),
        event: o.event.to_string(),
        sc: sc.clone(),
        run_tag: format!("j{}", random_tag()),
    });
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sold_out: Arc<std::sync::Mutex<Option<seats::SoldOutCall>>> = Arc::default();
    let sampler = {
        let ctx = ctx.clone();
        let admin = o.admin.to_string();
        let verbose = o.verbose;
        let sold_out = sold_out.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut inv_samples = Vec::new();
            let mut conn = None;
            let mut tick = tokio::time::interval(Duration::from_millis(ctx.sc.sample_ms.max(20)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut next_print = 0.0;
            while !*stop_rx.borrow() {
                tick.tick().await;
                let t = ctx.now();
                if let Some(v) = admin_figures(&ctx.targets[0], &admin, &ctx.event, &mut conn).await
                {
                    let s = sample_of(t, &v);
                    if verbose && t >= next_print {
                        eprintln!(
                            "t={t:>6.1}s waiting={:>6} admitted={:>4} active={:>4} capacity={} admissions={}",
                            s.waiting, s.admitted, s.active, s.capacity, s.admissions
                        );
                        next_print = t + 5.0;
                    }
                    samples.push(s);
                }
                if ctx.sc.seats > 0 {
                    let inv =
                        seats::read_inventory(&ctx.targets[0], &admin, &ctx.event, &mut conn).await;
                    if let Some(c) = inv.as_ref().map(seats::Counts::of) {
                        inv_samples.push(seats::InvSample { t, counts: c });
                        let ended = sold_out.lock().unwrap().is_some();
                        if ctx.sc.end_when_sold_out && !ended && c.sold_out() {
                            operator_ends(&ctx, &admin, &sold_out, verbose).await;
                        }
                    }
                }
            }
            (samples, inv_samples)
        })
    };
    let limit = sc.max_run_secs.max(1.0);
    let handles: Vec<_> = plans
        .iter()
        .map(|&plan| tokio::spawn(user::run(ctx.clone(), plan, limit)))
        .collect();
    let mut logs = Vec::with_capacity(handles.len());
    for h in handles {
        logs.push(h.await?);
    }
    // Wait for the silent places to be removed (or for their deadline to pass).
    let base_expired = sample_of(0.0, &before).expired;
    let silent = logs.iter().filter(|l| l.silent_at.is_some()).count() as u64;
    let last_silent = logs.iter().filter_map(|l| l.silent_at).fold(0.0, f64::max);
    let deadline = sc.ghost_wait_deadline(last_silent);
    loop {
        let now = ctx.now();
        if now >= deadline || now >= sc.max_run_secs {
            break;
        }
        if let Some(v) = admin_figures(&target0, o.admin, o.event, &mut probe).await {
            let s = sample_of(now, &v);
            // After the end of the sale the ghosts still waiting leave with everyone else
            // (counted as `left`): nothing more to wait for once the line is empty.
            let ended = sold_out.lock().unwrap().is_some();
            if (ended || s.expired.saturating_sub(base_expired) >= silent) && s.waiting == 0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // One more sample period so the last removals are recorded.
    tokio::time::sleep(Duration::from_millis(sc.sample_ms * 2)).await;
    let _ = stop_tx.send(true);
    let (samples, inv_samples) = sampler.await?;
    let duration = ctx.now();
    let seats = if sc.seats > 0 {
        let inv = seats::read_inventory(&target0, o.admin, o.event, &mut None)
            .await
            .context("reading the inventory at the end")?;
        let call = *sold_out.lock().unwrap();
        Some((inv, inv_samples, call))
    } else {
        None
    };
    Ok(report::build(report::Inputs {
        label: o.label,
        scenario: sc.clone(),
        settings_kept: o.keep_settings,
        event: o.event.to_string(),
        nodes: o.targets.len(),
        started_unix,
        duration_sec: duration,
        event_config: config,
        base: sample_of(0.0, &before),
        samples,
        logs,
        seats,
    }))
}

/// The operator ends the sale: `sold_out`, timed from the moment the call is sent.
async fn operator_ends(
    ctx: &user::Ctx,
    admin: &str,
    sold_out: &std::sync::Mutex<Option<seats::SoldOutCall>>,
    verbose: bool,
) {
    let sent = ctx.now();
    match seats::end_sold_out(&ctx.targets[0], admin, &ctx.event).await {
        Ok(waiting) => {
            let call = seats::SoldOutCall {
                sent_sec: sent,
                answered_sec: ctx.now(),
                waiting,
            };
            if verbose {
                eprintln!("t={sent:>6.1}s sold out: the sale ends ({waiting} waiting)");
            }
            *sold_out.lock().unwrap() = Some(call);
        }
        // The next reading tries again.
        Err(e) => eprintln!("ending the sale: {e:#}"),
    }
}

/// The `journey` command. SIGTERM and SIGINT (a CI timeout, `kill`, Ctrl-C) end it as a
/// normal end does: their default action would kill this process at once, leaving the
/// nodes it started, its private `redis-server` and its temp dir behind (the nodes with
/// the admin token on their command line).
pub async fn run(a: JourneyArgs) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Before anything is started, so no instant is left uncovered.
    let mut term = signal(SignalKind::terminate()).context("catching SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("catching SIGINT")?;
    let mut work = Box::pin(run_command(a));
    let (name, code) = tokio::select! {
        r = &mut work => return r,
        _ = term.recv() => ("SIGTERM", 143),
        _ = int.recv() => ("SIGINT", 130),
    };
    eprintln!("journey: {name}: stopping the started servers and removing the temp dir");
    // Dropping the run drops its `Setup`: nodes stopped (SIGTERM, then SIGKILL), the
    // private redis-server killed, the temp dir removed. The people's tasks only hold the
    // clock and the addresses; the exit ends them.
    drop(work);
    // The shell's convention for a death by that signal, so a caller still sees it.
    std::process::exit(code);
}

async fn run_command(a: JourneyArgs) -> Result<()> {
    let sc = scenario_of(&a)?;
    let setup = Setup::new(&a).await?;
    let label = a.label.clone().unwrap_or_else(|| {
        format!(
            "{} users, {} ({} node{})",
            sc.users,
            setup.store,
            setup.targets.len(),
            if setup.targets.len() == 1 { "" } else { "s" }
        )
    });
    // With --keep-settings the scenario's event settings are not the event's: those are
    // read (and printed) by the run.
    let settings = if a.keep_settings {
        "its settings kept".to_string()
    } else {
        format!(
            "max_active {}, admit_per_minute {:?}",
            sc.max_active, sc.admit_per_minute
        )
    };
    eprintln!(
        "journey: {} people over {} s (+{} s tail) on {}; event {} ({settings})",
        sc.users, sc.arrival_secs, sc.tail_secs, setup.store, a.event,
    );
    let report = run_scenario(
        &sc,
        RunOpts {
            targets: &setup.targets,
            admin: &setup.admin,
            event: &a.event,
            keep_settings: a.keep_settings,
            label,
            verbose: true,
        },
    )
    .await?;
    println!("{}", report.summary());
    // Without --strict a ✗ does not change the exit code (the command fails only when the
    // run cannot be made), but it is never silent: the summary's `checks:` line, and this.
    let failed = report.failed_checks();
    let not_kept = failed.len();
    if !failed.is_empty() {
        eprintln!(
            "journey: warning: {} promise(s) not kept: {}",
            failed.len(),
            failed
                .iter()
                .map(|c| format!("{} ({})", c.name, c.why))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if let Some(dir) = &a.report {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(dir.join("report.json"), json)?;
        std::fs::write(dir.join("report.html"), report::html(&report))?;
        println!("wrote {0}/report.json and {0}/report.html", dir.display());
    }
    if a.strict && not_kept > 0 {
        anyhow::bail!("{not_kept} promise(s) not kept (--strict)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
