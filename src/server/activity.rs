//! What a connection's closer watches: how many of its requests are in flight, when the
//! last one ended, and whether its answers' bodies still move.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Why a connection's closer fired.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// No request in flight for the header timeout.
    Idle,
    /// Every request in flight was answered, and no answer's body moved on for the stall
    /// timeout (`ConnectionSettings::stall_timeout`): the client stopped reading (an HTTP/2 window it
    /// never opens, a socket it never reads). The connection is dropped outright: nothing
    /// more can be written to it, a `GOAWAY` included.
    Stalled,
    /// The server is shutting down.
    Shutdown,
}

/// One connection's requests.
#[derive(Clone)]
pub(super) struct Activity(Arc<Shared>);

struct Shared {
    requests: parking_lot::Mutex<Requests>,
    /// Requests whose answer's head is out and whose body is being sent.
    answered: AtomicUsize,
    /// Frames of answer bodies handed to the connection so far: progress, without a clock.
    frames: AtomicU64,
}

struct Requests {
    in_flight: usize,
    since: tokio::time::Instant,
    any: bool,
}

impl Activity {
    pub(super) fn new() -> Self {
        Activity(Arc::new(Shared {
            requests: parking_lot::Mutex::new(Requests {
                in_flight: 0,
                since: tokio::time::Instant::now(),
                any: false,
            }),
            answered: AtomicUsize::new(0),
            frames: AtomicU64::new(0),
        }))
    }

    /// One more request in flight, until the returned value is dropped.
    pub(super) fn busy(&self) -> Busy {
        let mut r = self.0.requests.lock();
        r.in_flight += 1;
        r.any = true;
        drop(r);
        Busy(self.clone())
    }

    /// Whether a request was ever handed to the service on this connection.
    pub(super) fn had_requests(&self) -> bool {
        self.0.requests.lock().any
    }

    /// Resolves with [`Closing::Idle`] once no request has been in flight for `limit`, or
    /// with [`Closing::Stalled`] once every request in flight is answered and no answer's
    /// body has moved on for `stall` (looked at every `stall` / ⌈`stall` / `limit`⌉, at
    /// most `limit`: a frame counter, so no clock is read per frame; an answer is then cut
    /// between `stall` and `stall` plus one look after its last byte, never sooner). A
    /// request still in its handler (a join waiting for the
    /// disk, a proxied one waiting for the site or still uploading) is bounded by its own
    /// timeouts, so it is never counted as stalled. A minute (the default) is well past a
    /// live stream's pings (15 s); a proxied answer whose site pauses longer is one nginx
    /// would cut as well (`proxy_read_timeout`).
    pub(super) async fn watch(&self, limit: Duration, stall: Duration) -> Closing {
        // Looks that divide `stall` evenly: with a `limit` that does not (21 s into a
        // minute), counting whole limits cut pauses of 42 s.
        let looks = stall.as_millis().div_ceil(limit.as_millis().max(1)).max(1);
        let every = stall / u32::try_from(looks).unwrap_or(u32::MAX);
        let mut seen = u64::MAX;
        let mut still = 0;
        loop {
            let (in_flight, since) = {
                let r = self.0.requests.lock();
                (r.in_flight, r.since)
            };
            let until = since + limit;
            if in_flight == 0 && tokio::time::Instant::now() >= until {
                return Closing::Idle;
            }
            let frames = self.0.frames.load(Ordering::Relaxed);
            let answered = self.0.answered.load(Ordering::Relaxed);
            if in_flight > 0 && answered >= in_flight && frames == seen {
                still += 1;
                if still >= looks {
                    return Closing::Stalled;
                }
            } else {
                still = 0;
                seen = frames;
            }
            // Busy: look again a timeout later (a request ending resets `since`).
            let wake = if in_flight == 0 {
                until
            } else {
                tokio::time::Instant::now() + every
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// A request in flight on its connection.
pub(super) struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut r = (self.0).0.requests.lock();
        r.in_flight -= 1;
        r.since = tokio::time::Instant::now();
    }
}

/// A response body that keeps its request counted as in flight until it is done, and
/// counts its frames as the connection's progress. Handed to hyper as it is, not boxed
/// again into a `Body`: its polls reach the inner body through one box, not two.
pub(crate) struct Tracked {
    body: axum::body::Body,
    busy: Busy,
}

impl Tracked {
    pub(super) fn new(body: axum::body::Body, busy: Busy) -> Self {
        let shared = &(busy.0).0;
        shared.answered.fetch_add(1, Ordering::Relaxed);
        // The head going out is progress too: a stall counts from it, not from the last
        // look before it (a fix-check saw a long poll cut 40 s after its head).
        shared.frames.fetch_add(1, Ordering::Relaxed);
        Tracked { body, busy }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        (self.busy.0).0.answered.fetch_sub(1, Ordering::Relaxed);
    }
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(_))) = &polled {
            (self.busy.0).0.frames.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long after an answer's last frame the watcher says it stalled, for a header
    /// timeout `limit` and a stall timeout `stall` (paused time: exact).
    async fn cut_after(limit: Duration, stall: Duration, moving_for: Duration) -> Duration {
        let a = Activity::new();
        let busy = a.busy();
        let body = Tracked::new(axum::body::Body::empty(), busy);
        let watcher = {
            let a = a.clone();
            tokio::spawn(async move { a.watch(limit, stall).await })
        };
        // Frames keep coming for a while, then stop.
        let start = tokio::time::Instant::now();
        while start.elapsed() < moving_for {
            a.0.frames.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let last = tokio::time::Instant::now();
        assert!(Closing::Stalled == watcher.await.unwrap());
        drop(body);
        last.elapsed()
    }

    /// An answer whose head goes out while its request is watched, and then nothing, is cut
    /// no sooner than the stall timeout after the head.
    #[tokio::test(start_paused = true)]
    async fn a_stall_counts_from_the_head_when_no_body_follows() {
        let minute = Duration::from_secs(60);
        for (limit, head_at) in [(21, 39), (10, 25), (30, 59)] {
            let limit = Duration::from_secs(limit);
            let a = Activity::new();
            let busy = a.busy();
            let watcher = {
                let a = a.clone();
                tokio::spawn(async move { a.watch(limit, minute).await })
            };
            tokio::time::sleep(Duration::from_secs(head_at)).await;
            let body = Tracked::new(axum::body::Body::empty(), busy);
            let head = tokio::time::Instant::now();
            assert!(Closing::Stalled == watcher.await.unwrap());
            let cut = head.elapsed();
            drop(body);
            assert!(
                cut >= minute && cut <= minute + limit,
                "limit {limit:?}, head at {head_at} s: cut {cut:?} after the head"
            );
        }
    }

    /// An answer is cut no sooner than the stall timeout after its last frame, and at most
    /// one look later, whatever the header timeout (docs probe: with 21 s, counting whole
    /// header timeouts into the minute cut a pause of 43 s).
    #[tokio::test(start_paused = true)]
    async fn a_stall_is_cut_between_the_stall_timeout_and_one_look_later() {
        let minute = Duration::from_secs(60);
        for limit in [10, 16, 21, 30] {
            let limit = Duration::from_secs(limit);
            for moving in [0, 7, 33] {
                let cut = cut_after(limit, minute, Duration::from_secs(moving)).await;
                assert!(
                    cut >= minute && cut <= minute + limit,
                    "limit {limit:?}, moving {moving} s: cut {cut:?} after the last frame"
                );
            }
        }
    }
}
