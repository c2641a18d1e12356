//! One virtual person, behaving as the waiting page does (`src/http/assets/wait.js`): join,
//! follow the place over a WebSocket (or by polling `status`, for a set share), enter when
//! admitted, hold a session on the site for a while, complete. Some close the tab without
//! a word (abandon), some reload (resume with the stored token, perhaps on another node),
//! some lose the network for a while and then resume.
//!
//! Everything the person saw is logged with the instants it was asked for and answered,
//! so the report can tell what is certain from what is merely observed.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::Scenario;
use crate::common::{get_request, json_request, Conn, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Ws,
    Poll,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Behaviour {
    Stay,
    Abandon,
    Reload,
    Netloss,
}

/// What one person will do, drawn before the run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub id: usize,
    /// Seconds after the opening.
    pub arrival: f64,
    pub transport: Transport,
    pub behaviour: Behaviour,
    /// Seconds the session is held on the site.
    pub hold: f64,
    /// Seconds after the join at which the behaviour strikes, if still waiting.
    pub strike_after: f64,
    /// Seconds without network (netloss) or before the page is back (reload).
    pub pause: f64,
    /// The node this person's requests go to first.
    pub node: usize,
    /// Seats this person wants to buy (0: the event sells none).
    pub seats_wanted: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Join,
    Status,
    WsConnect,
    Enter,
    SessionHeartbeat,
    /// `GET /session/holds`: the seat map.
    SeatMap,
    /// `POST /session/holds`: the seats chosen, all or none.
    Hold,
    Complete,
}

impl Step {
    pub const ALL: [Step; 8] = [
        Step::Join,
        Step::Status,
        Step::WsConnect,
        Step::Enter,
        Step::SessionHeartbeat,
        Step::SeatMap,
        Step::Hold,
        Step::Complete,
    ];

    /// Steps of the waiting room itself (the rest are the protected site's session calls).
    pub fn is_waiting_page(self) -> bool {
        matches!(
            self,
            Step::Join | Step::Status | Step::WsConnect | Step::Enter
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Abandoned,
    /// The place lapsed (an outage longer than `waiting_idle_sec`, a ready window missed).
    Expired,
    /// The place ended for another reason (cleared, deleted).
    Gone,
    /// Entered, found no seat to hold (none left, or every try conflicted) and left.
    NoSeats,
    /// Waiting when the sale ended: told by a live `ended` or a status answer's `reason`.
    SaleEnded,
    /// Came after the sale ended: the join answered `EVENT_CLOSED` with a `reason`.
    Closed,
    /// Still waiting (or on the site) when `max_run_secs` ended the run: what the person
    /// saw until then is kept, and they count as not admitted unless they were.
    Unfinished,
    Failed(String),
}

/// An estimate the page showed.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Estimate {
    pub at: f64,
    pub eta_sec: f64,
    pub eta_low_sec: Option<f64>,
    pub eta_high_sec: Option<f64>,
    pub position: Option<u64>,
}

/// What the waiting page cost, by the page's own requests (session calls excluded).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Cost {
    pub requests: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub ws_messages: u64,
}

/// Everything one person saw; times in seconds since the opening.
#[derive(Debug, Clone)]
pub struct Log {
    pub plan: Plan,
    pub join_sent: Option<f64>,
    pub join_ack: Option<f64>,
    pub admit_lo: Option<f64>,
    pub admit_hi: Option<f64>,
    /// The admission was learnt from a live push, which the server sends at the admission:
    /// `admit_hi` is then the admission to within the push's latency (`admit_lo` is the
    /// conservative bound the order promise needs).
    pub admit_pushed: bool,
    pub entered: Option<f64>,
    pub complete_sent: Option<f64>,
    pub complete_ack: Option<f64>,
    /// When the person went silent for good (abandon, or an outage that cost the place).
    pub silent_at: Option<f64>,
    /// Whether the behaviour struck while waiting (a fast admission can pre-empt it).
    pub struck: bool,
    /// After a reload or an outage: whether the stored token still held the place.
    pub resumed_kept: Option<bool>,
    pub outcome: Outcome,
    pub estimates: Vec<Estimate>,
    /// Times a position shown was larger than the one shown before.
    pub position_rises: u32,
    /// Answers that carried `poll_after_sec`.
    pub poll_after_seen: u32,
    pub cost: Cost,
    pub latencies: Vec<(Step, f64)>,
    pub errors: Vec<(Step, String)>,
    /// A reload's or an outage's span without a page, [from, to).
    pub offline: Option<(f64, f64)>,
    /// When the person learnt that the sale ended, and whether by a live push.
    pub ended_learned: Option<f64>,
    pub ended_by_push: bool,
    /// Seat holds tried, and those refused with `HOLD_CONFLICT`.
    pub hold_attempts: u32,
    pub hold_conflicts: u32,
    /// The seats this person believes they bought: what they held when `complete`
    /// succeeded.
    pub seats_bought: Vec<String>,
}

impl Log {
    pub fn new(plan: Plan) -> Log {
        Log {
            plan,
            join_sent: None,
            join_ack: None,
            admit_lo: None,
            admit_hi: None,
            admit_pushed: false,
            entered: None,
            complete_sent: None,
            complete_ack: None,
            silent_at: None,
            struck: false,
            resumed_kept: None,
            outcome: Outcome::Failed("unfinished".into()),
            estimates: Vec::new(),
            position_rises: 0,
            poll_after_seen: 0,
            cost: Cost::default(),
            latencies: Vec::new(),
            errors: Vec::new(),
            offline: None,
            ended_learned: None,
            ended_by_push: false,
            hold_attempts: 0,
            hold_conflicts: 0,
            seats_bought: Vec::new(),
        }
    }
}

/// What every person shares: the clock, the nodes, the event and the scenario.
pub struct Ctx {
    pub t0: Instant,
    pub targets: Vec<Target>,
    pub event: String,
    pub sc: Scenario,
    /// Distinguishes user ids of runs against one event.
    pub run_tag: String,
}

impl Ctx {
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn at(&self, secs: f64) -> tokio::time::Instant {
        (self.t0 + Duration::from_secs_f64(secs.max(0.0))).into()
    }
}

/// A TCP stream that counts its bytes both ways (the WebSocket's cost, handshake included).
struct Counted {
    inner: TcpStream,
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

struct Ws {
    stream: WebSocketStream<Counted>,
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

/// The person's browser: one keep-alive HTTP connection, a WebSocket at times.
struct Page<'a> {
    ctx: &'a Ctx,
    node: usize,
    conn: Option<(Conn, Instant)>,
    ws: Option<Ws>,
    log: Log,
    token: String,
    /// The send instant of the last answer that said "waiting" (admission came after it).
    waiting_seen_sent: f64,
    watch: Watch,
}

/// What the page keeps from the answers about a waiting place: the server's polling
/// interval, the last position, and when the next estimate is to be scored.
#[derive(Debug, Default)]
struct Watch {
    poll_after: Option<f64>,
    last_position: Option<u64>,
    next_checkpoint: f64,
    /// Seconds between two scored estimates.
    every: f64,
    /// Keep to the page's fixed interval whatever the server says (`ignore_poll_after`).
    fixed_only: bool,
}

impl Watch {
    fn note(&mut self, v: &Value, received: f64, log: &mut Log) {
        if let Some(p) = v["poll_after_sec"].as_f64() {
            self.poll_after = Some(p);
            log.poll_after_seen += 1;
        }
        let position = v["position"].as_u64();
        if let (Some(p), Some(last)) = (position, self.last_position) {
            if p > last {
                log.position_rises += 1;
            }
        }
        if position.is_some() {
            self.last_position = position;
        }
        let Some(eta) = v["eta_sec"].as_f64() else {
            return;
        };
        // The estimate at join, then the first one shown at or after each checkpoint.
        if log.estimates.is_empty() {
            // Checkpoints count from the first estimate, the one at join.
            self.next_checkpoint = received;
        }
        if received >= self.next_checkpoint {
            log.estimates.push(Estimate {
                at: received,
                eta_sec: eta,
                eta_low_sec: v["eta_low_sec"].as_f64(),
                eta_high_sec: v["eta_high_sec"].as_f64(),
                position,
            });
            while self.next_checkpoint <= received {
                self.next_checkpoint += self.every.max(1.0);
            }
        }
    }

    /// Seconds until the next poll: the server's `poll_after_sec` when an answer carried
    /// one (unless told to ignore it), else the page's fixed interval.
    fn poll_every(&self, fixed: f64) -> f64 {
        let directed = self.poll_after.filter(|_| !self.fixed_only);
        directed.unwrap_or(fixed).max(0.2)
    }
}

/// A connection unused this long is dropped before the next request: the server closes
/// idle keep-alive connections (`--header-timeout-sec`, 10 s by default), and a request
/// written as it closes would be lost, which a join must never be.
const IDLE_REUSE: Duration = Duration::from_secs(4);

enum Reply {
    Ok(u16, Value),
    /// No answer: connection refused, reset, or closed.
    Io,
}

impl<'a> Page<'a> {
    async fn call(
        &mut self,
        step: Step,
        method: &str,
        path: &str,
        bearer: Option<&str>,
        body: Option<&str>,
    ) -> Reply {
        let target = &self.ctx.targets[self.node];
        let mut req = Vec::with_capacity(256);
        match (body, bearer) {
            (Some(b), _) => json_request(method, &target.host, path, bearer, b, &mut req),
            (None, Some(t)) => {
                // A session's read (the seat map): the access token in the header.
                use std::io::Write as _;
                let _ = write!(
                    req,
                    "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {t}\r\n\r\n",
                    target.host
                );
            }
            (None, None) => get_request(&target.host, path, &mut req),
        }
        if self
            .conn
            .as_ref()
            .is_some_and(|(_, used)| used.elapsed() > IDLE_REUSE)
        {
            self.conn = None;
        }
        let t = Instant::now();
        if self.conn.is_none() {
            match Conn::connect(target.addr).await {
                Ok(c) => self.conn = Some((c, t)),
                Err(e) => {
                    self.log.errors.push((step, format!("connect: {e}")));
                    return Reply::Io;
                }
            }
        }
        let (conn, used) = self.conn.as_mut().expect("connected above");
        let counted = step.is_waiting_page();
        if counted {
            self.log.cost.requests += 1;
            self.log.cost.bytes_out += req.len() as u64;
        }
        match conn.call(&req).await {
            Ok((status, body)) => {
                let value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let received = conn.received() as u64;
                *used = Instant::now();
                if counted {
                    self.log.cost.bytes_in += received;
                }
                self.log
                    .latencies
                    .push((step, t.elapsed().as_secs_f64() * 1000.0));
                if !(200..300).contains(&status) {
                    let code = value["error"]["code"].as_str().unwrap_or("?");
                    self.log.errors.push((step, format!("{status} {code}")));
                }
                Reply::Ok(status, value)
            }
            Err(e) => {
                self.conn = None;
                self.log.errors.push((step, format!("io: {e}")));
                Reply::Io
            }
        }
    }

    fn drop_connections(&mut self) {
        self.conn = None;
        if let Some(ws) = self.ws.take() {
            self.settle_ws(&ws);
        }
    }

    fn settle_ws(&mut self, ws: &Ws) {
        self.log.cost.bytes_in += ws.read.swap(0, Ordering::Relaxed);
        self.log.cost.bytes_out += ws.written.swap(0, Ordering::Relaxed);
    }

    async fn ws_connect(&mut self) -> Result<(), String> {
        let target = &self.ctx.targets[self.node];
        let url = format!("ws://{}/api/v1/queue/ws?token={}", target.host, self.token);
        let t = Instant::now();
        self.log.cost.requests += 1;
        let tcp = TcpStream::connect(target.addr)
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let read = Arc::new(AtomicU64::new(0));
        let written = Arc::new(AtomicU64::new(0));
        let counted = Counted {
            inner: tcp,
            read: read.clone(),
            written: written.clone(),
        };
        match tokio_tungstenite::client_async(url, counted).await {
            Ok((stream, _)) => {
                self.log
                    .latencies
                    .push((Step::WsConnect, t.elapsed().as_secs_f64() * 1000.0));
                self.ws = Some(Ws {
                    stream,
                    read,
                    written,
                });
                Ok(())
            }
            Err(e) => {
                self.log.cost.bytes_in += read.load(Ordering::Relaxed);
                self.log.cost.bytes_out += written.load(Ordering::Relaxed);
                self.log.errors.push((Step::WsConnect, e.to_string()));
                Err(e.to_string())
            }
        }
    }

    /// Notes what a status answer, join answer or live update said about a waiting place.
    fn note_waiting(&mut self, v: &Value, received: f64) {
        self.watch.note(v, received, &mut self.log);
    }

    fn admitted(&mut self, lo: f64, hi: f64) {
        self.log.admit_lo = Some(lo.min(hi));
        self.log.admit_hi = Some(hi);
    }
}

/// What a status answer means for the page.
enum Seen {
    Waiting,
    Admitted,
    Ended(Outcome),
    /// No usable answer (an I/O error, a 429, a 5xx): try again later.
    Retry,
}

fn ended_by(code: &str) -> Outcome {
    match code {
        "TOKEN_EXPIRED" => Outcome::Expired,
        _ => Outcome::Gone,
    }
}

impl<'a> Page<'a> {
    /// `GET /queue/status` (a poll, or the resume after a reload).
    async fn status(&mut self) -> Seen {
        let sent = self.ctx.now();
        let path = format!("/api/v1/queue/status?token={}", self.token);
        match self.call(Step::Status, "GET", &path, None, None).await {
            Reply::Ok(200, v) => {
                let got = self.ctx.now();
                match v["status"].as_str() {
                    Some("waiting") => {
                        self.waiting_seen_sent = sent;
                        self.note_waiting(&v, got);
                        Seen::Waiting
                    }
                    Some("admitted" | "active") => {
                        self.admitted(self.waiting_seen_sent, got);
                        Seen::Admitted
                    }
                    _ => Seen::Retry,
                }
            }
            Reply::Ok(404, v) => self.ended_answer(&v),
            _ => Seen::Retry,
        }
    }

    /// A `404` about the place: with `error.reason` the sale ended (and the person now
    /// knows it), without it the place lapsed or was removed.
    fn ended_answer(&mut self, v: &Value) -> Seen {
        if v["error"]["reason"].is_string() {
            self.sale_ended(false);
            return Seen::Ended(Outcome::SaleEnded);
        }
        Seen::Ended(ended_by(v["error"]["code"].as_str().unwrap_or("")))
    }

    fn sale_ended(&mut self, pushed: bool) {
        if self.log.ended_learned.is_none() {
            self.log.ended_learned = Some(self.ctx.now());
            self.log.ended_by_push = pushed;
        }
    }

    /// One message from the live channel.
    fn live_message(&mut self, text: &str) -> Option<Seen> {
        let v: Value = serde_json::from_str(text).ok()?;
        let got = self.ctx.now();
        let slack = self.ctx.sc.order_slack_sec;
        match v["type"].as_str()? {
            "queue-update" => match v["status"].as_str() {
                Some("admitted" | "active") => {
                    self.admitted(self.waiting_seen_sent.max(got - slack), got);
                    self.log.admit_pushed = true;
                    Some(Seen::Admitted)
                }
                _ => {
                    self.note_waiting(&v, got);
                    Some(Seen::Waiting)
                }
            },
            "queue-ready" => {
                self.admitted(self.waiting_seen_sent.max(got - slack), got);
                self.log.admit_pushed = true;
                Some(Seen::Admitted)
            }
            "queue-expired" => Some(Seen::Ended(Outcome::Expired)),
            "ended" => {
                self.sale_ended(true);
                Some(Seen::Ended(Outcome::SaleEnded))
            }
            "queue-left" | "queue-cleared" => Some(Seen::Ended(Outcome::Gone)),
            _ => None,
        }
    }

    /// The join, retried on refusals that ask for it.
    async fn join(&mut self) -> Result<Seen, Outcome> {
        let body = serde_json::json!({
            "event_id": self.ctx.event,
            "user_id": format!("{}-{}", self.ctx.run_tag, self.log.plan.id),
        })
        .to_string();
        for _ in 0..30 {
            let sent = self.ctx.now();
            self.log.join_sent = Some(sent);
            match self
                .call(Step::Join, "POST", "/api/v1/queue/join", None, Some(&body))
                .await
            {
                Reply::Ok(200, v) => {
                    let got = self.ctx.now();
                    self.log.join_ack = Some(got);
                    self.token = v["waiting_token"].as_str().unwrap_or_default().to_string();
                    self.waiting_seen_sent = sent;
                    if v["status"].as_str() == Some("waiting") {
                        self.note_waiting(&v, got);
                        return Ok(Seen::Waiting);
                    }
                    self.admitted(sent, got);
                    return Ok(Seen::Admitted);
                }
                Reply::Ok(409, v)
                    if v["error"]["code"] == "EVENT_CLOSED" && v["error"]["reason"].is_string() =>
                {
                    // The sale ended before this person came.
                    return Err(Outcome::Closed);
                }
                Reply::Ok(409, v) if v["error"]["code"] == "ALREADY_JOINED" => {
                    // An earlier attempt joined but its answer was lost: no token to go on.
                    return Err(Outcome::Failed("join answer lost".into()));
                }
                Reply::Ok(429 | 503, _) | Reply::Io => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Reply::Ok(status, v) => {
                    let code = v["error"]["code"].as_str().unwrap_or("?").to_string();
                    return Err(Outcome::Failed(format!("join: {status} {code}")));
                }
            }
        }
        Err(Outcome::Failed("join: gave up after 30 tries".into()))
    }
}

/// Runs one person from arrival to the end of their session (or of their patience), or
/// until `until` (seconds since the opening; the run's `max_run_secs`), when the person is
/// cut off as `Unfinished`. The log is the page's own, so a person cut off keeps what they
/// did until then: their join, latencies, estimates and cost count in the report (a
/// timeout around the whole person would drop all of it with the future).
pub async fn run(ctx: Arc<Ctx>, plan: Plan, until: f64) -> Log {
    let mut page = Page {
        ctx: &ctx,
        node: plan.node,
        conn: None,
        ws: None,
        log: Log::new(plan),
        token: String::new(),
        waiting_seen_sent: 0.0,
        watch: Watch {
            every: ctx.sc.eta_every_sec,
            fixed_only: ctx.sc.ignore_poll_after,
            ..Watch::default()
        },
    };
    let journey = async {
        tokio::time::sleep_until(ctx.at(plan.arrival)).await;
        match page.join().await {
            Err(o) => o,
            Ok(seen) => match follow(&mut page, seen).await {
                Err(o) => o,
                Ok(()) => session(&mut page).await,
            },
        }
    };
    let outcome = tokio::time::timeout_at(ctx.at(until), journey)
        .await
        .unwrap_or(Outcome::Unfinished);
    // Also settles a WebSocket's byte counts of a person cut off.
    page.drop_connections();
    page.log.outcome = outcome;
    page.log
}

/// Waits for the turn, like the page: live updates or polls, and the person's behaviour.
async fn follow(page: &mut Page<'_>, first: Seen) -> Result<(), Outcome> {
    let ctx = page.ctx;
    let plan = page.log.plan;
    let join_ack = page.log.join_ack.unwrap_or(0.0);
    let mut seen = first;
    let mut strike_at = (plan.behaviour != Behaviour::Stay).then_some(join_ack + plan.strike_after);
    let mut next_poll = ctx.now();
    let mut next_ws_try = ctx.now();
    let heartbeat_every = 15.0; // the page's `CLIENT_HEARTBEAT_MS`
    let mut next_heartbeat = ctx.now() + heartbeat_every;
    loop {
        match seen {
            Seen::Admitted => {
                page.drop_connections();
                return Ok(());
            }
            Seen::Ended(o) => {
                // A place that lapsed went silent when it was last seen waiting (a poll
                // interval longer than the event's grace, say): count it with the ghosts.
                if o == Outcome::Expired && page.log.silent_at.is_none() {
                    page.log.silent_at = Some(page.waiting_seen_sent);
                }
                return Err(o);
            }
            Seen::Waiting | Seen::Retry => {}
        }
        let poll_every = page.watch.poll_every(ctx.sc.poll_secs);
        if plan.transport == Transport::Ws && page.ws.is_none() && ctx.now() >= next_ws_try {
            if page.ws_connect().await.is_err() {
                // The socket was refused: the page falls back to a poll, which says why.
                seen = page.status().await;
                next_ws_try = ctx.now() + 1.0;
                continue;
            }
            next_heartbeat = ctx.now() + heartbeat_every;
        }
        let strike = strike_at.map_or(f64::INFINITY, |s| s);
        let polling = plan.transport == Transport::Poll || page.ws.is_none();
        let wake = if polling {
            next_poll.min(strike)
        } else {
            next_heartbeat.min(strike)
        };
        let wake_at = ctx.at(wake.min(ctx.now() + 3600.0));
        let event = if let Some(ws) = page.ws.as_mut() {
            tokio::select! {
                m = ws.stream.next() => Some(m),
                _ = tokio::time::sleep_until(wake_at) => None,
            }
        } else {
            tokio::time::sleep_until(wake_at).await;
            None
        };
        match event {
            Some(Some(Ok(Message::Text(text)))) => {
                page.log.cost.ws_messages += 1;
                seen = page.live_message(text.as_str()).unwrap_or(Seen::Waiting);
                continue;
            }
            Some(Some(Ok(Message::Close(_)))) | Some(Some(Err(_))) | Some(None) => {
                if let Some(ws) = page.ws.take() {
                    page.settle_ws(&ws);
                }
                next_ws_try = ctx.now() + 1.0;
                next_poll = ctx.now();
                continue;
            }
            Some(Some(Ok(_))) => continue, // pings are answered by tungstenite
            None => {}
        }
        let now = ctx.now();
        if now >= strike {
            strike_at = None;
            page.log.struck = true;
            match plan.behaviour {
                Behaviour::Abandon => {
                    page.drop_connections();
                    page.log.silent_at = Some(now);
                    return Err(Outcome::Abandoned);
                }
                Behaviour::Reload | Behaviour::Netloss => {
                    page.drop_connections();
                    tokio::time::sleep(Duration::from_secs_f64(plan.pause)).await;
                    page.log.offline = Some((now, ctx.now()));
                    // Back on whichever node the balancer picks now.
                    page.node = (page.node + 1) % ctx.targets.len();
                    seen = page.status().await;
                    // A place the sale's end took was not lost by the reload.
                    if !matches!(seen, Seen::Ended(Outcome::SaleEnded)) {
                        page.log.resumed_kept = Some(!matches!(seen, Seen::Ended(_)));
                    }
                    if matches!(seen, Seen::Ended(Outcome::Expired)) {
                        page.log.silent_at = Some(now);
                    }
                    next_poll = ctx.now() + poll_every;
                    next_ws_try = ctx.now();
                }
                Behaviour::Stay => {}
            }
            continue;
        }
        if polling && now >= next_poll {
            seen = page.status().await;
            next_poll = ctx.now() + page.watch.poll_every(ctx.sc.poll_secs);
            continue;
        }
        if let Some(ws) = page.ws.as_mut() {
            if now >= next_heartbeat {
                let _ = ws
                    .stream
                    .send(Message::text(r#"{"type":"heartbeat"}"#))
                    .await;
                next_heartbeat = now + heartbeat_every;
            }
        }
    }
}

/// Enters, holds the session on the site (with its heartbeats), completes.
async fn session(page: &mut Page<'_>) -> Outcome {
    let ctx = page.ctx;
    let body = serde_json::json!({ "waiting_token": page.token }).to_string();
    let mut access = None;
    for _ in 0..20 {
        match page
            .call(
                Step::Enter,
                "POST",
                "/api/v1/queue/enter",
                None,
                Some(&body),
            )
            .await
        {
            Reply::Ok(200, v) => {
                access = v["access_token"].as_str().map(str::to_string);
                break;
            }
            Reply::Ok(404, v) => {
                return match page.ended_answer(&v) {
                    Seen::Ended(o) => o,
                    _ => Outcome::Gone,
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let Some(access) = access else {
        return Outcome::Failed("enter: no access token".into());
    };
    page.log.entered = Some(ctx.now());
    let end = ctx.now() + page.log.plan.hold;
    // With seats for sale the session starts on the seat map; without a seat the person
    // leaves at once (the site ends the session, buying nothing).
    let mut held = Vec::new();
    if page.log.plan.seats_wanted > 0 {
        match choose_seats(page, &access, end).await {
            Ok(h) => held = h,
            Err(o) => return o,
        }
    }
    let end = if page.log.plan.seats_wanted > 0 && held.is_empty() {
        ctx.now()
    } else {
        end
    };
    let beat = (f64::from(ctx.sc.session_idle_sec) / 2.0).max(1.0);
    loop {
        let left = end - ctx.now();
        if left <= 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs_f64(left.min(beat))).await;
        if end - ctx.now() > 0.0 {
            page.call(
                Step::SessionHeartbeat,
                "POST",
                "/api/v1/session/heartbeat",
                Some(&access),
                Some("{}"),
            )
            .await;
        }
    }
    page.log.complete_sent = Some(ctx.now());
    for _ in 0..5 {
        match page
            .call(
                Step::Complete,
                "POST",
                "/api/v1/session/complete",
                Some(&access),
                Some("{}"),
            )
            .await
        {
            Reply::Ok(200, _) => {
                page.log.complete_ack = Some(ctx.now());
                if page.log.plan.seats_wanted > 0 && held.is_empty() {
                    return Outcome::NoSeats;
                }
                page.log.seats_bought = held;
                return Outcome::Completed;
            }
            Reply::Ok(status, v) => {
                let code = v["error"]["code"].as_str().unwrap_or("?").to_string();
                return Outcome::Failed(format!("complete: {status} {code}"));
            }
            Reply::Io => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    Outcome::Failed("complete: no answer".into())
}

/// The seat map, as a page draws it: the available seats, the ones this session holds
/// already (`mine`), and how many others hold (they may come back).
fn seat_map(v: &Value) -> (Vec<String>, Vec<String>, usize) {
    let (mut available, mut mine, mut held) = (Vec::new(), Vec::new(), 0);
    for item in v["items"].as_array().into_iter().flatten() {
        let Some(id) = item["id"].as_str() else {
            continue;
        };
        match item["state"].as_str() {
            Some("available") => available.push(id.to_string()),
            Some("mine") => mine.push(id.to_string()),
            Some("held") => held += 1,
            _ => {}
        }
    }
    (available, mine, held)
}

/// The seat-map page: reads the map, picks the seats wanted among the available ones at
/// random (all that are left when fewer are), holds them all or none; on `HOLD_CONFLICT`
/// (someone was faster) reads the map again, up to `HOLD_TRIES` holds. While nothing is
/// available but others hold seats (they may come back), the person stays on the map and
/// reads it again every second, until `until` (their session's planned end). Answers the
/// seats held, or none when nothing was left or every try conflicted. A hold whose answer
/// was lost shows on the next map as `mine`, and is taken as held.
async fn choose_seats(
    page: &mut Page<'_>,
    access: &str,
    until: f64,
) -> Result<Vec<String>, Outcome> {
    let plan = page.log.plan;
    let mut rng = page.ctx.sc.seed ^ 0x3C6E_F372_FE94_F82B ^ (plan.id as u64).rotate_left(17);
    let mut failures = 0;
    while page.log.hold_attempts < super::seats::HOLD_TRIES {
        let map = match page
            .call(
                Step::SeatMap,
                "GET",
                "/api/v1/session/holds",
                Some(access),
                None,
            )
            .await
        {
            Reply::Ok(200, v) => v,
            Reply::Ok(status @ 400..=499, v) => {
                let code = v["error"]["code"].as_str().unwrap_or("?");
                return Err(Outcome::Failed(format!("seat map: {status} {code}")));
            }
            _ => {
                failures += 1;
                if failures > 10 {
                    return Err(Outcome::Failed("seat map: no answer".into()));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        let (available, mine, held) = seat_map(&map);
        if !mine.is_empty() {
            return Ok(mine);
        }
        if available.is_empty() {
            if held > 0 && page.ctx.now() + 1.0 < until {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            return Ok(Vec::new());
        }
        let picks = super::seats::pick(&available, plan.seats_wanted as usize, &mut rng);
        let body = serde_json::json!({ "items": picks }).to_string();
        page.log.hold_attempts += 1;
        match page
            .call(
                Step::Hold,
                "POST",
                "/api/v1/session/holds",
                Some(access),
                Some(&body),
            )
            .await
        {
            Reply::Ok(200, v) => {
                let held: Vec<String> = v["holds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|h| h["item"].as_str().map(str::to_string))
                    .collect();
                return Ok(held);
            }
            Reply::Ok(409, v) if v["error"]["code"] == "HOLD_CONFLICT" => {
                page.log.hold_conflicts += 1;
            }
            Reply::Ok(status @ (400..=499), v) => {
                let code = v["error"]["code"].as_str().unwrap_or("?");
                return Err(Outcome::Failed(format!("hold: {status} {code}")));
            }
            // No answer, or the store was busy: the next map tells whether it held.
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Log {
        Log::new(Plan {
            id: 0,
            arrival: 0.0,
            transport: Transport::Poll,
            behaviour: Behaviour::Stay,
            hold: 1.0,
            strike_after: 1.0,
            pause: 1.0,
            node: 0,
            seats_wanted: 0,
        })
    }

    #[test]
    fn the_seat_map_is_read_as_a_page_draws_it() {
        let v = serde_json::json!({"holds": [{"item": "A-2", "expires_at": 1}],
            "items": [{"id": "A-1", "state": "available"}, {"id": "A-2", "state": "mine"},
                      {"id": "A-3", "state": "held"}, {"id": "A-4", "state": "sold"},
                      {"id": "A-5", "state": "available"}, {"id": "A-6", "state": "held"}]});
        let (available, mine, held) = seat_map(&v);
        assert_eq!(available, vec!["A-1", "A-5"]);
        assert_eq!(mine, vec!["A-2"]);
        assert_eq!(held, 2);
        assert_eq!(seat_map(&serde_json::json!({})), (vec![], vec![], 0));
    }

    #[test]
    fn the_server_directs_polling_when_it_says_so() {
        let mut w = Watch {
            every: 60.0,
            ..Watch::default()
        };
        let mut l = log();
        w.note(
            &serde_json::json!({"position": 9, "eta_sec": 20}),
            0.0,
            &mut l,
        );
        assert_eq!(
            w.poll_every(3.0),
            3.0,
            "no poll_after_sec: the page's interval"
        );
        let v = serde_json::json!({"position": 8, "eta_sec": 18, "poll_after_sec": 7});
        w.note(&v, 1.0, &mut l);
        assert_eq!(w.poll_every(3.0), 7.0);
        assert_eq!(l.poll_after_seen, 1);
        w.note(
            &serde_json::json!({"position": 2, "poll_after_sec": 1.5}),
            2.0,
            &mut l,
        );
        assert_eq!(w.poll_every(3.0), 1.5);
        // A page that ignores the direction keeps its interval, but still counts it.
        let mut old = Watch {
            every: 60.0,
            fixed_only: true,
            ..Watch::default()
        };
        old.note(&v, 1.0, &mut l);
        assert_eq!(old.poll_every(3.0), 3.0);
        assert_eq!(l.poll_after_seen, 3);
    }

    #[test]
    fn estimates_are_kept_at_join_and_each_checkpoint_with_their_range() {
        let mut w = Watch {
            every: 60.0,
            ..Watch::default()
        };
        let mut l = log();
        let at = |eta: u64, pos: u64| {
            serde_json::json!({"position": pos, "eta_sec": eta,
                               "eta_low_sec": eta / 2, "eta_high_sec": eta * 2})
        };
        w.note(&at(100, 50), 10.0, &mut l); // the join answer
        w.note(&at(95, 48), 20.0, &mut l); // within the first minute: not scored
        w.note(&at(60, 30), 70.5, &mut l); // the first after a minute
        w.note(&at(59, 29), 71.0, &mut l);
        w.note(&at(10, 5), 135.0, &mut l); // after the second minute
        let kept: Vec<(f64, f64)> = l.estimates.iter().map(|e| (e.at, e.eta_sec)).collect();
        assert_eq!(kept, vec![(10.0, 100.0), (70.5, 60.0), (135.0, 10.0)]);
        assert_eq!(l.estimates[0].eta_low_sec, Some(50.0));
        assert_eq!(l.estimates[0].eta_high_sec, Some(200.0));
        assert_eq!(l.estimates[0].position, Some(50));
        assert_eq!(l.position_rises, 0);
        // A position that grows is noted (FIFO never does that).
        w.note(&serde_json::json!({"position": 7}), 136.0, &mut l);
        assert_eq!(l.position_rises, 1);
        // Answers without a range leave it empty.
        let mut l2 = log();
        Watch::default().note(
            &serde_json::json!({"position": 3, "eta_sec": 4}),
            0.0,
            &mut l2,
        );
        assert_eq!(l2.estimates[0].eta_low_sec, None);
    }
}
