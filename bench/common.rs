//! What both benchmark binaries share: a minimal HTTP/1.1 keep-alive client, latency
//! tallies and percentiles, CPU accounting from `/proc`, and starting the real `waitroom`
//! binary as a child process.
//!
//! The client is deliberately tiny (one request in flight per connection, `TCP_NODELAY`,
//! one `write` per request, responses framed by `Content-Length`): on a 2-core machine the
//! load generator competes with the server for CPU, so every cycle it saves is a cycle the
//! server gets. It is what `wrk` does, in a few dozen lines of tokio.

#![allow(dead_code)] // each binary uses its own part of this module

use std::collections::BTreeMap;
use std::io::{self, BufRead as _, BufReader};
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Where requests go: the socket address and the `Host` header.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
}

impl Target {
    /// Parses `http://host:port` (a path, if any, is ignored).
    pub fn from_url(url: &str) -> Result<Target> {
        let rest = url
            .strip_prefix("http://")
            .context("only http:// URLs are supported")?;
        let host = rest.split('/').next().unwrap_or(rest).to_string();
        let with_port = if host.contains(':') {
            host.clone()
        } else {
            format!("{host}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))?
            .next()
            .with_context(|| format!("{host} resolves to no address"))?;
        Ok(Target { addr, host })
    }
}

/// One keep-alive HTTP/1.1 connection with one request in flight at a time.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// Parses a response head: (status, head length including the blank line, body length).
/// Works on the bytes as they are (no UTF-8 check, no string splitting): it runs once per
/// answer on the load generator, whose every cycle is taken from the server it measures.
fn parse_head(buf: &[u8]) -> io::Result<Option<(u16, usize, usize)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let mut lines = buf[..end].split(|&b| b == b'\n');
    let status = lines
        .next()
        .and_then(|l| l.split(|&b| b == b' ').nth(1))
        .and_then(parse_decimal)
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| bad("bad status line"))?;
    let mut len = None;
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let k = line[..colon].trim_ascii();
        if k.eq_ignore_ascii_case(b"content-length") {
            len = parse_decimal(&line[colon + 1..]);
        } else if k.eq_ignore_ascii_case(b"transfer-encoding") {
            return Err(bad(
                "chunked responses are not supported by the bench client",
            ));
        }
    }
    let len = match (status, len) {
        (_, Some(n)) => n,
        (204 | 304, None) => 0,
        _ => return Err(bad("response without Content-Length")),
    };
    Ok(Some((status, end + 4, len)))
}

/// A decimal number between optional spaces (and a trailing `\r`).
fn parse_decimal(b: &[u8]) -> Option<usize> {
    let b = b.trim_ascii();
    if b.is_empty() || b.len() > 15 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, &d| n * 10 + usize::from(d - b'0')))
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// Sends one whole request and reads its whole response: (status, body).
    pub async fn call(&mut self, req: &[u8]) -> io::Result<(u16, &[u8])> {
        self.stream.write_all(req).await?;
        self.buf.clear();
        loop {
            if let Some((status, head, body)) = parse_head(&self.buf)? {
                let total = head + body;
                while self.buf.len() < total {
                    self.read_more().await?;
                }
                return Ok((status, &self.buf[head..total]));
            }
            self.read_more().await?;
        }
    }

    /// Bytes of the last response, head included (what the client paid for it).
    pub fn received(&self) -> usize {
        self.buf.len()
    }

    async fn read_more(&mut self) -> io::Result<()> {
        if self.buf.capacity() - self.buf.len() < 2048 {
            self.buf.reserve(8192);
        }
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        Ok(())
    }
}

/// `GET path`.
pub fn get_request(host: &str, path: &str, out: &mut Vec<u8>) {
    use std::io::Write as _;
    let _ = write!(out, "GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
}

/// A request with a JSON body and an optional bearer token.
pub fn json_request(
    method: &str,
    host: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
    out: &mut Vec<u8>,
) {
    use std::io::Write as _;
    let _ = write!(out, "{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    if let Some(t) = bearer {
        let _ = write!(out, "Authorization: Bearer {t}\r\n");
    }
    let _ = write!(
        out,
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

/// One request on a fresh connection (setup calls, not measured): (status, body).
pub async fn call_once(target: &Target, req: &[u8]) -> Result<(u16, String)> {
    let mut c = Conn::connect(target.addr)
        .await
        .with_context(|| format!("connecting to {}", target.addr))?;
    let (status, body) = c.call(req).await?;
    Ok((status, String::from_utf8_lossy(body).into_owned()))
}

/// Creates or updates an event through the admin API.
pub async fn put_event(target: &Target, admin: &str, event: &str, config: &str) -> Result<()> {
    let mut req = Vec::new();
    json_request(
        "PUT",
        &target.host,
        &format!("/api/v1/admin/events/{event}"),
        Some(admin),
        config,
        &mut req,
    );
    let (status, body) = call_once(target, &req).await?;
    if status != 200 {
        bail!("creating event {event}: {status} {body}");
    }
    Ok(())
}

pub async fn delete_event(target: &Target, admin: &str, event: &str) -> Result<()> {
    let req = format!(
        "DELETE /api/v1/admin/events/{event} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {admin}\r\n\r\n",
        target.host
    );
    call_once(target, req.as_bytes()).await?;
    Ok(())
}

/// A small, fast PRNG (splitmix64): the load must not depend on a crate the server lacks.
pub fn next_rand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What one worker saw during the measured window.
#[derive(Debug, Default)]
pub struct Tally {
    /// Latency of every measured request, in microseconds (from the intended send time in
    /// open-loop runs).
    pub lat_us: Vec<u32>,
    /// Open loop only: from the actual send (service time) and the send's lag behind the
    /// schedule.
    pub svc_us: Vec<u32>,
    pub lag_us: Vec<u32>,
    /// Open loop only: each sample's intended send time, in ms from the measured window's
    /// start (for `--timeline`).
    pub at_ms: Vec<u32>,
    pub by_status: BTreeMap<u16, u64>,
    pub io_errors: u64,
    /// Open loop only: slots never sent because the client fell too far behind (each also
    /// in the latencies, with the wait it had when given up).
    pub unsent: u64,
}

pub fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

impl Tally {
    /// Room for `n` samples of each kind, so recording never grows a vector mid-run.
    pub fn with_capacity(n: usize) -> Tally {
        Tally {
            lat_us: Vec::with_capacity(n),
            svc_us: Vec::with_capacity(n),
            lag_us: Vec::with_capacity(n),
            at_ms: Vec::with_capacity(n),
            ..Tally::default()
        }
    }

    /// One open-loop sample: the slot's time, the actual send, the answer.
    pub fn record(&mut self, intended: Instant, sent: Instant, done: Instant, from: Instant) {
        self.lat_us.push(micros(done.duration_since(intended)));
        self.svc_us.push(micros(done.duration_since(sent)));
        self.lag_us.push(micros(sent.duration_since(intended)));
        self.at_ms
            .push(intended.duration_since(from).as_millis() as u32);
    }

    pub fn merge(&mut self, other: Tally) {
        self.lat_us.extend(other.lat_us);
        self.svc_us.extend(other.svc_us);
        self.lag_us.extend(other.lag_us);
        self.at_ms.extend(other.at_ms);
        for (k, v) in other.by_status {
            *self.by_status.entry(k).or_default() += v;
        }
        self.io_errors += other.io_errors;
        self.unsent += other.unsent;
    }

    pub fn count(&self) -> u64 {
        self.lat_us.len() as u64
    }

    /// Requests that did not get a 2xx (or failed on the wire).
    pub fn errors(&self) -> u64 {
        self.io_errors
            + self.unsent
            + self
                .by_status
                .iter()
                .filter(|(s, _)| !(200..300).contains(*s))
                .map(|(_, n)| n)
                .sum::<u64>()
    }

    pub fn error_summary(&self) -> String {
        let mut parts: Vec<String> = self
            .by_status
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(s, n)| format!("{n}×{s}"))
            .collect();
        if self.io_errors > 0 {
            parts.push(format!("{}×io", self.io_errors));
        }
        if self.unsent > 0 {
            parts.push(format!("{}×unsent", self.unsent));
        }
        if parts.is_empty() {
            "0".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Percentiles of a sample (sorted in place), in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pcts {
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub p999: u32,
    pub max: u32,
}

pub fn percentiles(v: &mut [u32]) -> Pcts {
    if v.is_empty() {
        return Pcts::default();
    }
    v.sort_unstable();
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Pcts {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        p999: at(0.999),
        max: v[v.len() - 1],
    }
}

/// Microseconds as milliseconds with two decimals.
pub fn ms(us: u32) -> String {
    format!("{:.2}", f64::from(us) / 1000.0)
}

/// Thousands separators for request rates.
pub fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---- closed-loop load ------------------------------------------------------------------

/// Builds request `n` of connection `conn` into the buffer (cleared by the caller); the
/// `u64` is the connection's PRNG state.
pub type BuildFn = dyn Fn(usize, u64, &mut u64, &mut Vec<u8>) + Send + Sync;

pub async fn connect_all(target: &Target, n: usize) -> Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(
            Conn::connect(target.addr)
                .await
                .with_context(|| format!("connecting to {}", target.addr))?,
        );
    }
    Ok(conns)
}

/// Replaces a broken connection, retrying until `until`.
pub async fn reconnect(target: &Target, until: Instant) -> Option<Conn> {
    while Instant::now() < until {
        if let Ok(c) = Conn::connect(target.addr).await {
            return Some(c);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Closed loop: every connection sends its next request as soon as it has an answer.
/// Requests started during `warmup` are not counted. Answers what was seen in the measured
/// window and the CPU used meanwhile.
pub async fn closed_loop(
    target: &Target,
    server_pid: Option<u32>,
    build: std::sync::Arc<BuildFn>,
    connections: usize,
    warmup: Duration,
    dur: Duration,
) -> Result<(Tally, CpuUse)> {
    let conns = connect_all(target, connections).await?;
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + dur;
    let mut handles = Vec::with_capacity(connections);
    for (id, mut conn) in conns.into_iter().enumerate() {
        let build = build.clone();
        let target = target.clone();
        handles.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut req = Vec::with_capacity(512);
            let mut rng = 0x5EED_0000 + id as u64;
            let mut n = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                req.clear();
                build(id, n, &mut rng, &mut req);
                n += 1;
                match conn.call(&req).await {
                    Ok((status, _)) => {
                        if t0 >= measure_from {
                            tally.lat_us.push(micros(t0.elapsed()));
                            *tally.by_status.entry(status).or_default() += 1;
                        }
                    }
                    Err(_) => {
                        if t0 >= measure_from {
                            tally.io_errors += 1;
                        }
                        match reconnect(&target, end).await {
                            Some(c) => conn = c,
                            None => break,
                        }
                    }
                }
            }
            tally
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let before = CpuSnap::take(server_pid);
    tokio::time::sleep_until(end.into()).await;
    let after = CpuSnap::take(server_pid);
    let mut tally = Tally::default();
    for h in handles {
        tally.merge(h.await?);
    }
    Ok((tally, after.since(&before)))
}

// ---- CPU accounting --------------------------------------------------------------------

/// Clock ticks per second of `/proc` times (USER_HZ, 100 on every Linux we run on).
const TICKS: f64 = 100.0;

/// utime + stime of a process (`self` or a pid), in ticks; all threads included.
pub fn proc_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// (busy, steal) ticks of the whole machine, summed over CPUs.
fn machine_ticks() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)?;
    Some((busy, *v.get(7).unwrap_or(&0)))
}

/// Resident memory of a process (`self` or a pid), in bytes: (VmRSS, VmHWM).
pub fn rss(pid: &str) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Bytes in MB (10^6 bytes), the unit of the budgets.
pub fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

#[derive(Debug, Clone, Copy)]
pub struct CpuSnap {
    at: Instant,
    server: Option<u64>,
    bench: u64,
    machine: (u64, u64),
}

/// Cores used over an interval by the server, this load generator, everything else on the
/// machine, and stolen by the hypervisor.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuUse {
    pub server: Option<f64>,
    pub bench: f64,
    pub other: f64,
    pub steal: f64,
}

impl CpuSnap {
    pub fn take(server_pid: Option<u32>) -> CpuSnap {
        CpuSnap {
            at: Instant::now(),
            server: server_pid.and_then(|p| proc_ticks(&p.to_string())),
            bench: proc_ticks("self").unwrap_or(0),
            machine: machine_ticks().unwrap_or((0, 0)),
        }
    }

    pub fn since(&self, earlier: &CpuSnap) -> CpuUse {
        let secs = self.at.duration_since(earlier.at).as_secs_f64().max(1e-3);
        let cores = |t: u64| t as f64 / TICKS / secs;
        let server = match (self.server, earlier.server) {
            (Some(a), Some(b)) => Some(a.saturating_sub(b)),
            _ => None,
        };
        let bench = self.bench.saturating_sub(earlier.bench);
        let busy = self.machine.0.saturating_sub(earlier.machine.0);
        let other = busy.saturating_sub(bench + server.unwrap_or(0));
        CpuUse {
            server: server.map(cores),
            bench: cores(bench),
            other: cores(other),
            steal: cores(self.machine.1.saturating_sub(earlier.machine.1)),
        }
    }
}

impl CpuUse {
    pub fn cells(&self) -> [String; 3] {
        [
            self.server.map_or("-".into(), |c| format!("{c:.2}")),
            format!("{:.2}", self.bench),
            format!("{:.2}", self.other + self.steal),
        ]
    }
}

/// Waits until the machine has been nearly idle (< `quiet` cores busy, steal included) for
/// one second, or `max` has passed; answers the busy cores of the last second seen. On a
/// shared machine this keeps phases out of other tenants' bursts where it can, and the
/// phase tables still report what the others used meanwhile.
pub async fn settle(max: Duration, quiet: f64) -> f64 {
    let until = Instant::now() + max;
    loop {
        let a = machine_ticks().unwrap_or((0, 0));
        let t = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = machine_ticks().unwrap_or((0, 0));
        let secs = t.elapsed().as_secs_f64();
        let busy = ((b.0 - a.0) + (b.1 - a.1)) as f64 / TICKS / secs;
        if busy < quiet || Instant::now() >= until {
            return busy;
        }
    }
}

// ---- the server as a child process ----------------------------------------------------

/// A `waitroom` process started for the benchmark; stopped (SIGTERM, then SIGKILL) on drop.
pub struct ServerProc {
    child: Child,
    pub target: Target,
    /// Set when the data directory is ours to delete.
    temp_dir: Option<PathBuf>,
    pub started: Instant,
}

/// The `waitroom` binary next to the running benchmark binary (`target/release/`).
pub fn default_server_bin() -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating the bench binary")?;
    let bin = me.with_file_name("waitroom");
    if !bin.exists() {
        bail!(
            "{} not found: build it with `cargo build --release --bins`, or pass --bin",
            bin.display()
        );
    }
    Ok(bin)
}

/// A fresh directory under the system temp dir.
pub fn fresh_temp_dir(tag: &str) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "waitroom-{tag}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// One client (this process) makes every request: per-client limits this large are still
/// checked on every request but never refuse one. The open loop may open up to 1,024
/// connections (`--max-connections`), past the default of 256 per client address.
pub const LOAD_FLAGS: &[&str] = &[
    "--joins-per-minute",
    "100000000",
    "--polls-per-second",
    "1000000",
    "--max-connections-per-client",
    "100000",
];

impl ServerProc {
    /// Starts `bin serve --listen 127.0.0.1:0 --no-demo` on `data_dir` (a fresh temporary
    /// one, deleted afterwards, when `None`) and waits for its `listening on` line. The
    /// per-client limits stay on, with quotas no benchmark reaches.
    pub fn start(
        bin: &Path,
        data_dir: Option<&Path>,
        durability: &str,
        admin_token: &str,
    ) -> Result<ServerProc> {
        Self::start_with(bin, data_dir, durability, admin_token, LOAD_FLAGS)
    }

    /// [`start`](Self::start) with `extra` flags.
    pub fn start_with(
        bin: &Path,
        data_dir: Option<&Path>,
        durability: &str,
        admin_token: &str,
        extra: &[&str],
    ) -> Result<ServerProc> {
        Self::start_with_env(bin, data_dir, durability, admin_token, extra, &[])
    }

    /// [`start_with`](Self::start_with) with extra environment variables for the server
    /// (`TOKIO_WORKER_THREADS`, say).
    pub fn start_with_env(
        bin: &Path,
        data_dir: Option<&Path>,
        durability: &str,
        admin_token: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<ServerProc> {
        let (dir, temp_dir) = match data_dir {
            Some(d) => (d.to_path_buf(), None),
            None => {
                let d = fresh_temp_dir("bench")?;
                (d.clone(), Some(d))
            }
        };
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--no-demo"])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--durability", durability, "--admin-token", admin_token])
            .args(extra)
            .envs(env.iter().copied());
        Self::spawn(cmd, &dir.with_extension("server.log"), temp_dir)
    }

    /// Starts `bin args…`, any program that prints `listening on http://ADDR` once it
    /// serves (the reference server of `waitroom-bench`, for one), logging to a temporary
    /// file.
    pub fn start_command(bin: &Path, args: &[&str]) -> Result<ServerProc> {
        let dir = fresh_temp_dir("ref")?;
        let mut cmd = Command::new(bin);
        cmd.args(args);
        Self::spawn(cmd, &dir.with_extension("server.log"), Some(dir))
    }

    /// Spawns `cmd` and waits for its `listening on` line.
    fn spawn(mut cmd: Command, log_path: &Path, temp_dir: Option<PathBuf>) -> Result<ServerProc> {
        let log = std::fs::File::create(log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let started = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {:?}", cmd.get_program()))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on http://") {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the server did not print its address; see {}",
                    log_path.display()
                );
            }
        };
        let target = Target::from_url(&format!("http://{addr}"))?;
        Ok(ServerProc {
            child,
            target,
            temp_dir,
            started,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `GET /readyz` until it answers 200; answers the time since the process started.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Duration> {
        let mut req = Vec::new();
        get_request(&self.target.host, "/readyz", &mut req);
        loop {
            if let Ok((200, _)) = call_once(&self.target, &req).await {
                return Ok(self.started.elapsed());
            }
            if self.started.elapsed() > timeout {
                bail!("the server was not ready after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within 15 s.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.stop();
        if let Some(d) = self.temp_dir.take() {
            let _ = std::fs::remove_dir_all(&d);
            let _ = std::fs::remove_file(d.with_extension("server.log"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_head;

    #[test]
    fn parses_status_and_length_from_bytes() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nContent-Length:  12 \r\n\r\nhello world!";
        assert_eq!(parse_head(r).unwrap(), Some((200, r.len() - 12, 12)));
        let r = b"HTTP/1.1 204 No Content\r\ndate: x\r\n\r\n";
        assert_eq!(parse_head(r).unwrap(), Some((204, r.len(), 0)));
        // Not a whole head yet.
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n").unwrap(),
            None
        );
        // Bytes that are not UTF-8 in a header value do not matter.
        let r = b"HTTP/1.1 429 Too Many\r\nx: \xff\xfe\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(parse_head(r).unwrap(), Some((429, r.len(), 0)));
    }

    #[test]
    fn refuses_what_it_cannot_frame() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 2x0 OK\r\ncontent-length: 1\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
    }
}
