//! `sync`: how many changes are on disk, and the requests waiting for theirs.
//!
//! A request waits until the count reaches its ticket. A broadcast (a `watch` channel, a
//! `Notify`) would wake every waiting request at every sync, though only those of the batch
//! just synced can go on: the others, queued for the next batch, poll once for nothing and
//! wait again. With 64 clients that is about one useless wake-up and poll of a request per
//! join, with 256 several (see docs/PERFORMANCE.md, "Sync joins: each wakes once"). Here each
//! waiter is kept with its ticket, and a sync wakes exactly those it covered.
//!
//! A disk that stops confirming must not hang the requests. Rather than a timer per
//! waiting request (a timer-wheel entry made and cancelled at every join: 0.5-0.8 µs of a
//! runtime worker's time per join, docs/PERFORMANCE.md), one [`Watchdog`] thread notes the
//! latest ticket four times a second; a ticket queued longer than the bound ago and still
//! not synced is *late*, and every waiter up to it is woken to answer that. Late stays
//! late until the ticket is synced: a later wait for it (a read that waits for the latest
//! ticket, say) ends at once, as the disk has not confirmed anything for the bound.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
pub(super) struct Synced {
    /// Changes synced so far, in ticket order. Only ever raised.
    upto: AtomicU64,
    /// Writing failed: nothing more will be synced.
    failed: AtomicBool,
    /// Told when writing fails, for [`Synced::until_failed`].
    on_fail: Notify,
    /// Changes up to here that are not synced were given up on ([`Watchdog`]): their waiters
    /// answer that the disk did not confirm them in time. Only ever raised.
    late: AtomicU64,
    /// The waiters not yet covered, each with its ticket (in no particular order).
    waiting: Mutex<Vec<(u64, Waker)>>,
}

impl Synced {
    /// Changes synced so far.
    pub(super) fn upto(&self) -> u64 {
        self.upto.load(SeqCst)
    }

    pub(super) fn failed(&self) -> bool {
        self.failed.load(SeqCst)
    }

    /// Records that the changes up to `to` are synced and wakes their waiters. `woken` is
    /// the caller's scratch space (kept so that a sync allocates nothing); the wakers are
    /// called after the lock is let go, so a waiter registering meanwhile is not held up by
    /// the wake-ups' system calls.
    pub(super) fn advance(&self, to: u64, woken: &mut Vec<Waker>) {
        // Before the lock: a waiter that registers after we took it finds the new count
        // when it looks again under the lock (see `wait`).
        self.upto.store(to, SeqCst);
        self.take(woken, |ticket| ticket <= to);
        woken.drain(..).for_each(Waker::wake);
    }

    /// Writing failed: every waiter is woken to see it, and later ones do not wait.
    pub(super) fn fail(&self) {
        self.failed.store(true, SeqCst);
        let mut woken = Vec::new();
        self.take(&mut woken, |_| true);
        woken.into_iter().for_each(Waker::wake);
        self.on_fail.notify_waiters();
    }

    /// Resolves once writing failed (at once if it has).
    pub(super) async fn until_failed(&self) {
        loop {
            let told = self.on_fail.notified();
            let mut told = std::pin::pin!(told);
            // Registered before the flag is read: a failure after the read still wakes it.
            told.as_mut().enable();
            if self.failed() {
                return;
            }
            told.await;
        }
    }

    fn take(&self, into: &mut Vec<Waker>, covered: impl Fn(u64) -> bool) {
        let mut waiting = self.waiting.lock();
        let mut i = 0;
        while i < waiting.len() {
            if covered(waiting[i].0) {
                into.push(waiting.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
    }

    /// Gives up on the changes up to `ticket` that are not synced yet: their waiters are
    /// woken, and they and later waits for them see [`Synced::late`]. Their changes may
    /// still be synced later.
    pub(super) fn give_up_to(&self, ticket: u64) {
        // Before the lock, as in `advance`.
        self.late.fetch_max(ticket, SeqCst);
        let mut woken = Vec::new();
        self.take(&mut woken, |t| t <= ticket);
        woken.into_iter().for_each(Waker::wake);
    }

    /// Whether the change of `ticket` was given up on and is still not synced.
    pub(super) fn late(&self, ticket: u64) -> bool {
        self.late.load(SeqCst) >= ticket && self.upto.load(SeqCst) < ticket
    }

    /// Whether a change given up on is still not synced: the disk has confirmed nothing for
    /// the watchdog's bound, and changes answer `503` until it catches up.
    pub(super) fn stalled(&self) -> bool {
        self.late.load(SeqCst) > self.upto.load(SeqCst)
    }

    fn ready(&self, ticket: u64) -> bool {
        self.upto.load(SeqCst) >= ticket
            || self.failed.load(SeqCst)
            || self.late.load(SeqCst) >= ticket
    }

    /// Ends once the change of `ticket` is synced, writing failed, or it was given up on
    /// (the caller tells which). Cancel-safe: a dropped wait leaves its entry behind until the sync that
    /// covers its ticket (or the failure) takes it, which wakes nothing then.
    pub(super) async fn wait(&self, ticket: u64) {
        poll_fn(|cx| {
            if self.ready(ticket) {
                return Poll::Ready(());
            }
            let mut waiting = self.waiting.lock();
            // Again under the lock: `advance` raised the count before taking it, so either
            // this sees the new count or `advance` sees this entry.
            if self.ready(ticket) {
                return Poll::Ready(());
            }
            waiting.push((ticket, cx.waker().clone()));
            Poll::Pending
        })
        .await
    }

    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiting.lock().len()
    }
}

/// Gives up on changes the disk does not confirm within a bound (see the module's notes).
/// Its thread ends when the watchdog is stopped or dropped, or when what it watches is gone.
pub(super) struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Every `every`, notes `queued()` (the latest ticket); a ticket noted at least `bound`
    /// ago that is not synced is given up on. A change is noted up to `every` after it is
    /// queued and looked at every `every`, so its request waits between `bound` and
    /// `bound + 2 × every` (and the thread's scheduling) before it answers.
    pub(super) fn spawn<Q>(
        synced: &Arc<Synced>,
        queued: Weak<Q>,
        ticket: fn(&Q) -> u64,
        bound: Duration,
        every: Duration,
    ) -> std::io::Result<Watchdog>
    where
        Q: Send + Sync + 'static,
    {
        let synced = Arc::downgrade(synced);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("waitroom-journal-watch".into())
            .spawn(move || {
                let mut noted: VecDeque<(Instant, u64)> = VecDeque::new();
                // Ends on `Disconnected`: the watchdog was dropped.
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let (Some(synced), Some(queued)) = (synced.upgrade(), queued.upgrade()) else {
                        return;
                    };
                    let now = Instant::now();
                    noted.push_back((now, ticket(&queued)));
                    // The newest ticket noted at least `bound` ago.
                    let mut due = None;
                    while noted
                        .front()
                        .is_some_and(|(at, _)| now.duration_since(*at) >= bound)
                    {
                        due = noted.pop_front().map(|(_, t)| t);
                    }
                    // `late` stays raised: a later wait for these tickets ends at once.
                    if let Some(t) = due.filter(|&t| synced.upto() < t) {
                        synced.give_up_to(t);
                    }
                }
            })?;
        Ok(Watchdog {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it: it may hold what it watches for a moment (an
    /// upgraded reference), which must be let go before the journal's files are.
    pub(super) fn stop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wake-ups.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn poll_once(s: &Synced, ticket: u64, count: &Arc<Count>) -> bool {
        let waker = Waker::from(count.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let fut = std::pin::pin!(s.wait(ticket));
        fut.poll(&mut cx).is_ready()
    }

    use std::future::Future;

    /// A sync wakes the waiters it covered and no other: the next batch's waiters sleep on.
    #[test]
    fn a_sync_wakes_only_the_waiters_it_covered() {
        let s = Synced::default();
        let counts: Vec<Arc<Count>> = (0..6)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        for (i, c) in counts.iter().enumerate() {
            assert!(!poll_once(&s, i as u64 + 1, c));
        }
        let mut woken = Vec::new();
        s.advance(3, &mut woken);
        let wakes: Vec<usize> = counts.iter().map(|c| c.0.load(SeqCst)).collect();
        assert_eq!(wakes, [1, 1, 1, 0, 0, 0]);
        assert_eq!(s.waiting(), 3);
        assert!(poll_once(&s, 3, &counts[2]));
        s.advance(6, &mut woken);
        let wakes: Vec<usize> = counts.iter().map(|c| c.0.load(SeqCst)).collect();
        assert_eq!(wakes, [1, 1, 1, 1, 1, 1]);
        assert_eq!(s.waiting(), 0);
    }

    #[test]
    fn a_failure_wakes_everyone_and_later_waits_end_at_once() {
        let s = Synced::default();
        let c = Arc::new(Count(AtomicUsize::new(0)));
        assert!(!poll_once(&s, 5, &c));
        assert!(!poll_once(&s, 9, &c));
        s.fail();
        assert_eq!(c.0.load(SeqCst), 2);
        assert!(poll_once(&s, 100, &c));
        assert!(s.failed());
    }

    /// What the server waits on to stop: a wait begun before the failure ends with it, and
    /// one begun after ends at once.
    #[tokio::test]
    async fn until_failed_ends_when_writing_fails() {
        let s = Arc::new(Synced::default());
        let before = tokio::spawn({
            let s = s.clone();
            async move { s.until_failed().await }
        });
        tokio::task::yield_now().await;
        assert!(!before.is_finished());
        s.fail();
        tokio::time::timeout(Duration::from_secs(5), before)
            .await
            .expect("a wait begun before the failure ends with it")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), s.until_failed())
            .await
            .expect("a wait begun after the failure ends at once");
    }

    /// The watchdog gives up on a ticket queued longer than its bound ago and not synced,
    /// wakes its waiter, and leaves alone one synced in time and one queued later.
    #[test]
    fn the_watchdog_gives_up_on_what_waited_its_bound() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s = Arc::new(Synced::default());
        let queued = Arc::new(AtomicU64::new(0));
        let bound = Duration::from_millis(300);
        let _watch = Watchdog::spawn(
            &s,
            Arc::downgrade(&queued),
            |q: &AtomicU64| q.load(SeqCst),
            bound,
            Duration::from_millis(20),
        )
        .unwrap();
        let asked = Instant::now();
        queued.store(3, SeqCst);
        let mut woken = Vec::new();
        s.advance(2, &mut woken);
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), s.wait(3))
                .await
                .expect("the watchdog woke the waiter")
        });
        assert!(asked.elapsed() >= bound, "after {:?}", asked.elapsed());
        assert!(s.late(3) && !s.late(2), "2 was synced in time");
        assert!(!s.failed());
        // Queued now: not given up on before its own bound.
        queued.store(4, SeqCst);
        std::thread::sleep(bound / 2);
        assert!(!s.late(4));
        s.advance(4, &mut woken);
        assert!(!s.late(3) && !s.late(4), "synced at last");
    }

    /// Many tasks wait while a thread raises the count in uneven steps: every wait ends
    /// (none is lost between its look and the raise), and nothing is left registered.
    #[test]
    fn racing_waits_and_syncs_lose_no_waiter() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for _ in 0..20 {
            let s = Arc::new(Synced::default());
            const N: u64 = 2000;
            let tasks: Vec<_> = (1..=N)
                .map(|t| {
                    let s = s.clone();
                    rt.spawn(async move { s.wait(t).await })
                })
                .collect();
            let raiser = {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut woken = Vec::new();
                    let mut to = 0;
                    while to < N {
                        to = (to + 1 + to % 7).min(N);
                        s.advance(to, &mut woken);
                        std::thread::yield_now();
                    }
                })
            };
            rt.block_on(async {
                for t in tasks {
                    tokio::time::timeout(std::time::Duration::from_secs(10), t)
                        .await
                        .expect("a waiter was never woken")
                        .unwrap();
                }
            });
            raiser.join().unwrap();
            assert_eq!(s.waiting(), 0);
        }
    }
}
