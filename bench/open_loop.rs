//! The open-loop generator of `waitroom-bench run --rate R`: request slots released at R
//! per second on an exact schedule, latency measured from each slot's intended time.
//!
//! On a 2-core machine the generator shares the cores with the server, so its own CPU is
//! taken from the server and its own lateness is added to every latency it reports. It is
//! therefore built to do as little as possible per request:
//!
//! - **One current-thread runtime per generator thread**, each owning its share of the
//!   connections and of the schedule (thread `k` of `K` sends slots `k, k + K, k + 2K, …`).
//!   Everything a slot touches (the backlog, the idle connections, the tally) is local to
//!   its thread: no mutex, no channel, no wake-up of another thread per request.
//! - **The schedule is kept by a `timerfd`** in the thread's own epoll set: the thread
//!   wakes at a slot's time (to the microsecond, not the runtime's millisecond timer wheel)
//!   and releases every slot due by then, so while the thread is busy with answers the slots
//!   that came due meanwhile go out together, at no extra wake-up. No pacer thread sleeps
//!   and wakes once per slot.
//! - **A free connection takes a slot directly**: the releasing task writes the slot into
//!   the connection's mailbox and wakes its task on the same thread; a connection that
//!   finishes a request takes the next slot from the backlog before it goes idle.
//! - Requests come from templates where the workload has them (only the varying bytes are
//!   rewritten), and answers are framed without UTF-8 checks (see `common::Conn`).
//!
//! What it measures stays as before: latency from the slot's intended time (a server stall
//! counts against every request it delayed, as does any lateness of the generator itself:
//! no coordinated omission); the service time (from the actual send) and the send lag (how
//! late the generator sent) beside it; slots still unsent `give_up_after` past the end are
//! counted in the latencies with the wait they had and as `unsent` errors. One request is
//! in flight per connection (no pipelining); while slots wait for a free connection each
//! thread opens one more connection at a time, up to its share of `max_connections`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::common::{self, Conn, CpuSnap, CpuUse, Tally, Target};

/// Writes the request of slot `n` (unique in the run) into the buffer, replacing what it
/// held; the `u64` is the connection's PRNG state.
pub type WriteFn = dyn Fn(u64, &mut u64, &mut Vec<u8>) + Send + Sync;

/// What to offer.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: Target,
    /// Slots per second.
    pub rate: u32,
    /// Connections opened before the first slot (split over the threads).
    pub connections: usize,
    /// Connections the generator may grow to while slots wait for a free one.
    pub max_connections: usize,
    /// Generator threads, each with its own runtime and share of the schedule.
    pub threads: usize,
    /// Slots before the measured window (sent, not counted).
    pub warmup: Duration,
    /// The measured window.
    pub dur: Duration,
    /// Slots still unsent this long after the window's end are given up (and counted).
    pub give_up_after: Duration,
}

/// What one open-loop run saw.
#[derive(Debug)]
pub struct Outcome {
    /// Every slot of the measured window: answered, failed or never sent.
    pub tally: Tally,
    /// Connections it ended with (opened at the start and while slots waited).
    pub connections: usize,
    /// Cores used over the measured window.
    pub cpu: CpuUse,
}

/// Runs the open loop on `plan.threads` threads of its own and answers once every slot is
/// accounted for. Blocking: call it from a thread that may block.
pub fn run(plan: &Plan, server_pid: Option<u32>, write: Arc<WriteFn>) -> Result<Outcome> {
    if plan.rate == 0 {
        bail!("--rate must be positive");
    }
    let threads = plan.threads.max(1);
    let connections = plan.connections.max(threads);
    let max_connections = plan.max_connections.max(connections);
    // Every thread connects first; the schedule starts once all of them are ready.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let mut starts = Vec::with_capacity(threads);
    let mut handles = Vec::with_capacity(threads);
    for k in 0..threads {
        let (start_tx, start_rx) = std::sync::mpsc::channel::<Instant>();
        starts.push(start_tx);
        let share = |n: usize| n / threads + usize::from(k < n % threads);
        let worker = Worker {
            plan: plan.clone(),
            k: k as u64,
            threads: threads as u64,
            connections: share(connections),
            max_connections: share(max_connections),
            write: write.clone(),
        };
        let ready_tx = ready_tx.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("open-loop-{k}"))
                .spawn(move || worker.run(ready_tx, start_rx))?,
        );
    }
    drop(ready_tx);
    for _ in 0..threads {
        ready_rx
            .recv()
            .context("a generator thread ended before starting")??;
    }
    let start = Instant::now() + Duration::from_millis(20);
    for tx in starts {
        let _ = tx.send(start);
    }
    let measure_from = start + plan.warmup;
    let end = measure_from + plan.dur;
    sleep_until(measure_from);
    let before = CpuSnap::take(server_pid);
    sleep_until(end);
    let after = CpuSnap::take(server_pid);
    let mut tally = Tally::default();
    let mut opened = 0;
    for h in handles {
        let (t, n) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a generator thread panicked"))??;
        tally.merge(t);
        opened += n;
    }
    Ok(Outcome {
        tally,
        connections: opened,
        cpu: after.since(&before),
    })
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// One generator thread's share of the run.
struct Worker {
    plan: Plan,
    /// This thread's first slot; it sends every `threads`-th slot from there.
    k: u64,
    threads: u64,
    connections: usize,
    max_connections: usize,
    write: Arc<WriteFn>,
}

/// One slot: its number in the whole run and its intended send time.
#[derive(Debug, Clone, Copy)]
struct Slot {
    n: u64,
    at: Instant,
}

/// A connection's mailbox: the slot given to it while idle, and its task's waker.
#[derive(Default)]
struct Mailbox {
    slot: Option<Slot>,
    waker: Option<Waker>,
}

/// Slots not yet taken by a connection, and the connections waiting for one.
#[derive(Default)]
struct Slots {
    backlog: VecDeque<Slot>,
    /// First in, first out: every connection is used in turn, so none sits unused for
    /// the server's header timeout (10 s), after which the server closes it.
    idle: VecDeque<usize>,
    mailbox: Vec<Mailbox>,
    /// Connections open or being opened.
    open: usize,
    /// A connection is being opened.
    growing: bool,
    /// Every slot has been released: idle connections end.
    done: bool,
}

/// What the tasks of one thread share (never leaves the thread).
struct Local {
    slots: RefCell<Slots>,
    tally: RefCell<Tally>,
    write: Arc<WriteFn>,
    target: Target,
    max_connections: usize,
    measure_from: Instant,
    give_up: Instant,
    /// Seeds the connections' PRNGs, distinct across threads.
    seed: u64,
}

impl Worker {
    /// Connects, reports ready, waits for the common start, runs its share of the
    /// schedule; answers its tally and how many connections it had.
    fn run(
        self,
        ready: std::sync::mpsc::Sender<Result<()>>,
        start: std::sync::mpsc::Receiver<Instant>,
    ) -> Result<(Tally, usize)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let set = tokio::task::LocalSet::new();
        set.block_on(&rt, async move {
            let conns = match common::connect_all(&self.plan.target, self.connections).await {
                Ok(c) => {
                    let _ = ready.send(Ok(()));
                    c
                }
                Err(e) => {
                    let _ = ready.send(Err(anyhow::anyhow!("{e:#}")));
                    return Err(e);
                }
            };
            let start = start.recv().context("the run was abandoned")?;
            self.serve(conns, start).await
        })
    }

    async fn serve(self, conns: Vec<Conn>, start: Instant) -> Result<(Tally, usize)> {
        let plan = &self.plan;
        let measure_from = start + plan.warmup;
        let end = measure_from + plan.dur;
        let give_up = end + plan.give_up_after;
        // Room for every measured slot of this thread, so no sample grows a vector.
        let mine =
            (f64::from(plan.rate) * plan.dur.as_secs_f64() / self.threads as f64) as usize + 2;
        let local = Rc::new(Local {
            slots: RefCell::new(Slots {
                idle: (0..conns.len()).collect(),
                mailbox: (0..conns.len()).map(|_| Mailbox::default()).collect(),
                open: conns.len(),
                ..Slots::default()
            }),
            tally: RefCell::new(Tally::with_capacity(mine)),
            write: self.write.clone(),
            target: plan.target.clone(),
            max_connections: self.max_connections,
            measure_from,
            give_up,
            seed: 0xFACE_0000 + (self.k << 20),
        });
        let mut tasks = Vec::with_capacity(self.max_connections);
        for (id, conn) in conns.into_iter().enumerate() {
            tasks.push(tokio::task::spawn_local(connection(
                local.clone(),
                id,
                conn,
                None,
            )));
        }
        let grown: Rc<RefCell<Vec<tokio::task::JoinHandle<()>>>> = Rc::default();
        // The schedule: slot n is due at start + n / rate (computed from n, so no error
        // accumulates), and this thread releases every `threads`-th one.
        let at = |n: u64| {
            start
                + Duration::from_nanos(
                    (u128::from(n) * 1_000_000_000 / u128::from(plan.rate)) as u64,
                )
        };
        let timer = Timer::new()?;
        let mut n = self.k;
        loop {
            let t = at(n);
            if t >= end {
                break;
            }
            timer.sleep_until(t).await?;
            // Every slot due by now goes out: several when the thread was busy meanwhile.
            let now = Instant::now();
            loop {
                let t = at(n);
                if t > now || t >= end {
                    break;
                }
                release(&local, &grown, Slot { n, at: t });
                n += self.threads;
            }
        }
        {
            let mut s = local.slots.borrow_mut();
            s.done = true;
            for m in &mut s.mailbox {
                if let Some(w) = m.waker.take() {
                    w.wake();
                }
            }
        }
        // Slots nobody took by the deadline are given up here, even if every connection
        // is stuck in a request.
        while !local.slots.borrow().backlog.is_empty() {
            if Instant::now() >= give_up {
                let left: Vec<Slot> = local.slots.borrow_mut().backlog.drain(..).collect();
                let now = Instant::now();
                for slot in left {
                    give_up_slot(&local, slot, now);
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for t in tasks {
            let _ = t.await;
        }
        loop {
            let next = grown.borrow_mut().pop();
            match next {
                Some(t) => {
                    let _ = t.await;
                }
                None => break,
            }
        }
        let opened = local.slots.borrow().mailbox.len();
        let tally = std::mem::take(&mut *local.tally.borrow_mut());
        Ok((tally, opened))
    }
}

/// Gives a slot to an idle connection, or queues it (and opens one more connection when
/// allowed and none is being opened).
fn release(local: &Rc<Local>, grown: &Rc<RefCell<Vec<tokio::task::JoinHandle<()>>>>, slot: Slot) {
    let mut s = local.slots.borrow_mut();
    if let Some(id) = s.idle.pop_front() {
        let m = &mut s.mailbox[id];
        m.slot = Some(slot);
        if let Some(w) = m.waker.take() {
            w.wake();
        }
        return;
    }
    s.backlog.push_back(slot);
    if !s.growing && s.open < local.max_connections {
        s.growing = true;
        drop(s);
        tokio::task::spawn_local(grow(local.clone(), grown.clone()));
    }
}

/// Opens one more connection for the backlog; opens another after it while slots still
/// wait. Never on a request's path.
async fn grow(local: Rc<Local>, grown: Rc<RefCell<Vec<tokio::task::JoinHandle<()>>>>) {
    loop {
        let conn = Conn::connect(local.target.addr).await;
        let mut s = local.slots.borrow_mut();
        s.growing = false;
        let Ok(conn) = conn else {
            s.open = local.max_connections; // the server refuses more: stop trying
            return;
        };
        if s.done && s.backlog.is_empty() {
            return;
        }
        let id = s.mailbox.len();
        s.mailbox.push(Mailbox::default());
        s.open += 1;
        let first = s.backlog.pop_front();
        if first.is_none() {
            s.idle.push_back(id);
        }
        let again = !s.backlog.is_empty() && s.open < local.max_connections;
        s.growing = again;
        drop(s);
        let task = tokio::task::spawn_local(connection(local.clone(), id, conn, first));
        grown.borrow_mut().push(task);
        if !again {
            return;
        }
    }
}

/// Counts a slot never sent: in the latencies, with the wait it had when given up (a lower
/// bound), so the percentiles do not leave out the worst slots.
fn give_up_slot(local: &Local, slot: Slot, now: Instant) {
    if slot.at >= local.measure_from {
        let mut t = local.tally.borrow_mut();
        t.record(slot.at, now, now, local.measure_from);
        t.unsent += 1;
    }
}

/// Waits for the slot given to connection `id`; `None` once every slot is released.
async fn next_slot(local: &Local, id: usize) -> Option<Slot> {
    poll_fn(|cx| {
        let mut s = local.slots.borrow_mut();
        let done = s.done;
        let m = &mut s.mailbox[id];
        if let Some(slot) = m.slot.take() {
            return Poll::Ready(Some(slot));
        }
        if done {
            return Poll::Ready(None);
        }
        if !m.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            m.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await
}

/// One connection: sends the slots it is given, one request in flight at a time, until
/// every slot is released and none is left for it.
async fn connection(local: Rc<Local>, id: usize, mut conn: Conn, first: Option<Slot>) {
    let mut req = Vec::with_capacity(512);
    let mut rng = local.seed + id as u64;
    let mut next = first;
    loop {
        let slot = match next.take() {
            Some(s) => s,
            None => match next_slot(&local, id).await {
                Some(s) => s,
                None => return,
            },
        };
        let sent = Instant::now();
        if sent > local.give_up {
            give_up_slot(&local, slot, sent);
        } else {
            (local.write)(slot.n, &mut rng, &mut req);
            let res = conn.call(&req).await;
            let done = Instant::now();
            let measured = slot.at >= local.measure_from;
            match res {
                Ok((status, _)) => {
                    if measured {
                        let mut t = local.tally.borrow_mut();
                        t.record(slot.at, sent, done, local.measure_from);
                        *t.by_status.entry(status).or_default() += 1;
                    }
                }
                Err(_) => {
                    if measured {
                        local.tally.borrow_mut().io_errors += 1;
                    }
                    match common::reconnect(&local.target, local.give_up).await {
                        Some(c) => conn = c,
                        None => {
                            // This connection is gone: it takes no more slots (those
                            // queued are given up by the schedule's task at the deadline).
                            local.slots.borrow_mut().open -= 1;
                            return;
                        }
                    }
                }
            }
        }
        let mut s = local.slots.borrow_mut();
        match s.backlog.pop_front() {
            Some(t) => next = Some(t),
            None if s.done => return,
            None => s.idle.push_back(id),
        }
    }
}

/// A one-shot `timerfd` in the runtime's epoll set: sleeps to the microsecond where the
/// runtime's own timer rounds up to the next millisecond.
struct Timer {
    fd: AsyncFd<OwnedFd>,
}

impl Timer {
    fn new() -> io::Result<Timer> {
        // SAFETY: timerfd_create has no memory arguments; a valid descriptor is owned here.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the `OwnedFd` stays open, and the same descriptor, for as long as the
        // `AsyncFd` that owns it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Timer { fd })
    }

    /// Returns at `t` (at once if it has passed).
    async fn sleep_until(&self, t: Instant) -> io::Result<()> {
        let now = Instant::now();
        if t <= now {
            return Ok(());
        }
        let d = t - now;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: valid descriptor and a valid itimerspec; the old value is not asked for.
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            let mut guard = self.fd.readable().await?;
            let mut expirations = 0u64;
            // SAFETY: reads 8 bytes into a u64 the call owns.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    (&mut expirations as *mut u64).cast(),
                    8,
                )
            };
            if n == 8 {
                // One-shot: nothing more comes until the next arming.
                guard.clear_ready();
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(e);
            }
            guard.clear_ready();
        }
    }
}
