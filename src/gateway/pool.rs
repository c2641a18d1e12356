//! Connections to the origin, driven on the task that serves the request.
//!
//! hyper-util's pooled client runs each origin connection as a task of its own and reaches
//! it through channels: a proxied request woke that task to write, the origin's answer woke
//! it to read, and its answer woke the serving task back, each hand-off often across worker
//! threads. Here a request takes an idle `hyper::client::conn::http1` connection from the
//! pool (or opens one), and the serving task polls that connection itself while it waits
//! for the answer's head and, through [`Driven`], while the answer's body streams out. So a
//! proxied request is served start to end by one task, as one nginx worker serves it in
//! one event loop. A connection whose answer was read to its end, and whose request was sent
//! whole, goes back to the pool; one dropped midway (the client went away), or answered
//! before its request body was all sent, is closed.
//!
//! The pool is a stack (the most recently used connection first, so the busy ones stay
//! warm) of at most [`MAX_IDLE`] connections per process (each of gateway mode's serving
//! threads has a pool of its own, and a share of them: [`idle_cap`]); one idle longer than [`IDLE_TIMEOUT`] is
//! closed when met. A connection the origin closed while idle is noticed when taken (it is
//! polled once: its end of stream shows) and replaced; a request the connection had not
//! started to send when it failed is sent again on a new one, as hyper-util's client does,
//! and so is one lost in flight on a connection taken after an idle spell, when it can be
//! sent twice (a safe method, no body), as nginx does.
//!
//! Upgrades (WebSocket) get a connection of their own, driven by a task of its own (the
//! joined streams outlive the request) and never pooled.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::body::Bytes;

use crate::http::body_timeout::BodyTimeout;
use axum::http::{Request, Response};
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;

/// Longest wait for a connection to the origin.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for the origin's answer head once a request without a body is on its way
/// (nginx's `proxy_read_timeout`): an origin that stalls does not hold the client's
/// connection, and a connection to it, for ever.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest wait for the next piece of a request's body on its way to the origin (nginx's
/// `client_body_timeout`).
pub const UPLOAD_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// An idle connection older than this is closed rather than used (origins close theirs
/// after a minute or more: nginx's `keepalive_timeout` is 75 s).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept by the process: enough for every busy client connection of a
/// large sale's burst to find one, few enough not to hold an origin's workers.
pub const MAX_IDLE: usize = 256;

/// The idle connections each of `pools` pools (one per serving thread) may keep, so that
/// all together keep at most [`MAX_IDLE`]: an equal share, at least one.
pub fn idle_cap(pools: usize) -> usize {
    (MAX_IDLE / pools.max(1)).max(1)
}

/// A pooled connection idle at least this long may have been closed by the origin as the
/// request went out: a request that can be sent twice is kept until answered.
const RESEND_AFTER_IDLE: Duration = Duration::from_millis(250);
/// A request lost with its connection this soon after it went out was lost to the
/// keep-alive race; later, the origin had it.
const RESEND_WITHIN: Duration = Duration::from_secs(1);

/// A copy of `req` to send again if the first was lost with its connection: a safe method
/// (GET, HEAD, OPTIONS, TRACE) and no body, so that the origin may see it twice.
fn resendable(req: &Request<Body>) -> Option<Request<Body>> {
    use axum::http::Method;
    let safe = matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    if !safe || !req.body().is_end_stream() {
        return None;
    }
    let mut copy = Request::new(Body::empty());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}

type Conn = http1::Connection<TokioIo<TcpStream>, Body>;

/// One connection to the origin: the handle to send on, and the connection to drive.
struct Link {
    send: http1::SendRequest<Body>,
    conn: Conn,
}

/// Links are boxed: one is moved out of the idle stack, into the answer's body and back
/// at every proxied request, and a `Link` (the connection's buffers and state) is several
/// hundred bytes, copied at each move; a box is a pointer, allocated once per connection.
struct Idle {
    link: Box<Link>,
    since: Instant,
}

/// Why the origin gave no answer.
#[derive(Debug)]
pub enum OriginError {
    Connect(std::io::Error),
    ConnectTimeout,
    Http(hyper::Error),
    /// The connection ended without answering and without an error.
    Closed,
    /// No answer head within this long.
    Timeout(Duration),
    /// The request's own body failed while it went out (the client stopped sending it, or
    /// went away): the client's doing, not the origin's.
    Upload(hyper::Error),
}

impl std::fmt::Display for OriginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OriginError::Connect(e) => write!(f, "cannot connect: {e}"),
            OriginError::ConnectTimeout => write!(f, "cannot connect: timed out"),
            OriginError::Http(e) => write!(f, "{e}"),
            OriginError::Closed => write!(f, "the connection closed before an answer"),
            OriginError::Timeout(d) => write!(f, "no answer within {} s", d.as_secs_f64()),
            OriginError::Upload(e) => match std::error::Error::source(e) {
                Some(cause) => write!(f, "the request body failed: {cause}"),
                None => write!(f, "the request body failed: {e}"),
            },
        }
    }
}

/// The pool of connections to one origin.
pub struct Pool {
    /// `host:port`, as `TcpStream::connect` resolves it.
    addr: String,
    idle: Mutex<Vec<Idle>>,
    /// Most idle connections kept (see [`idle_cap`]).
    max_idle: usize,
    /// [`HEAD_TIMEOUT`], shorter in tests.
    head_timeout: Duration,
    /// [`UPLOAD_IDLE_TIMEOUT`], shorter in tests.
    upload_idle: Duration,
}

impl Pool {
    /// A pool that keeps at most `max_idle` idle connections.
    pub fn new(authority: &axum::http::uri::Authority, max_idle: usize) -> std::sync::Arc<Self> {
        let addr = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        std::sync::Arc::new(Pool {
            addr,
            idle: Mutex::new(Vec::new()),
            max_idle,
            head_timeout: HEAD_TIMEOUT,
            upload_idle: UPLOAD_IDLE_TIMEOUT,
        })
    }

    /// The same pool waiting at most `d` for an answer head.
    #[cfg(test)]
    fn with_head_timeout(self: std::sync::Arc<Self>, d: Duration) -> std::sync::Arc<Self> {
        let mut p = std::sync::Arc::into_inner(self).expect("not shared yet");
        p.head_timeout = d;
        std::sync::Arc::new(p)
    }

    /// The same pool waiting at most `d` for the next piece of an upload.
    #[cfg(test)]
    fn with_upload_idle(self: std::sync::Arc<Self>, d: Duration) -> std::sync::Arc<Self> {
        let mut p = std::sync::Arc::into_inner(self).expect("not shared yet");
        p.upload_idle = d;
        std::sync::Arc::new(p)
    }

    /// Sends `req` (its URI in origin form) and answers the origin's response, whose body
    /// drives the connection as it is read.
    pub async fn send(
        self: &std::sync::Arc<Self>,
        req: Request<Body>,
    ) -> Result<Response<Body>, OriginError> {
        let mut req = req;
        // Set once the upload was sent whole: the wait for the answer is timed from then.
        let mut uploaded = None;
        if !req.body().is_end_stream() {
            // An upload that stops arriving would hold the client's connection and the
            // origin's for ever: like nginx's `client_body_timeout`, a spell without data
            // ends it (the whole upload may take as long as it needs). Bodiless requests,
            // most of them, skip the wrapper and its box.
            let idle = self.upload_idle;
            let (tx, rx) = tokio::sync::watch::channel(false);
            uploaded = Some(rx);
            req = req.map(|b| {
                Body::new(Uploaded {
                    body: BodyTimeout::new(idle, b),
                    sent: SentWhole(Some(tx)),
                })
            });
        }
        // Once on a pooled connection, then on a new one: a pooled connection the origin
        // closed at the moment it was taken fails before anything is sent.
        for fresh in [false, true] {
            let link = if fresh {
                None
            } else {
                poll_fn(|cx| Poll::Ready(self.checkout(cx))).await
            };
            // The origin may also close an idle connection just as a request goes out on
            // it (its keep-alive timeout: gunicorn's 2 s, Node's 5 s), and the request is
            // then lost in flight. One that can be sent twice (no body, a safe method) is
            // kept to send again on a new connection, as nginx does; only after an idle
            // spell, since a connection in steady use is not closed so.
            let mut again = match &link {
                Some((_, since)) if since.elapsed() >= RESEND_AFTER_IDLE => resendable(&req),
                _ => None,
            };
            let mut link = match link {
                Some((l, _)) => l,
                // Boxed: the connect future (name lookup, timeout, handshake) is large,
                // and held inline it would be copied with every request's future.
                None => Box::pin(self.connect()).await?,
            };
            // Timed from when the request was sent whole: with a body, the wait includes the
            // upload, which a slow client may take minutes over (nginx buffers it first,
            // then times the answer), so the limit starts when its last byte went.
            let d = self.head_timeout;
            let sent_at = Instant::now();
            let sent = link.send.try_send_request(req);
            let answered = drive(&mut link.conn, sent);
            // Stalled: the connection is dropped with the request (never sent again: the
            // origin may be working on it).
            let answered = match &mut uploaded {
                None => match tokio::time::timeout(d, answered).await {
                    Ok(a) => a,
                    Err(_) => return Err(OriginError::Timeout(d)),
                },
                // Boxed: held inline, the upload's wait made every request's future larger
                // (about 540 instructions more a gated request, copying it), bodiless ones
                // too (docs/PERFORMANCE.md).
                Some(up) => Box::pin(after_upload(answered, up, d)).await?,
            };
            let failed = match answered {
                Ok(Ok(res)) => {
                    return Ok(res.map(|body| {
                        Body::new(Driven {
                            body,
                            link: Some(link),
                            pool: self.clone(),
                            ended: false,
                            failed: None,
                        })
                    }))
                }
                Ok(Err(mut e)) => match e.take_message() {
                    // Never sent: safe to send again, whatever it is.
                    Some(unsent) => {
                        again = Some(unsent);
                        OriginError::Http(e.into_error())
                    }
                    None => {
                        let e = e.into_error();
                        // hyper's only user error with a cause is the request body's own.
                        if e.is_user() && std::error::Error::source(&e).is_some() {
                            return Err(OriginError::Upload(e));
                        }
                        // Sent, and then only the connection closing is the keep-alive
                        // race; an answer the origin sent (however malformed) is not.
                        if !e.is_incomplete_message() {
                            again = None;
                        }
                        OriginError::Http(e)
                    }
                },
                Err(closed) => closed,
            };
            // The race is over at once: a connection that closed later had the request
            // (an origin's worker killed mid-request), and the origin may have acted on it.
            if sent_at.elapsed() > RESEND_WITHIN {
                again = None;
            }
            match again.take() {
                Some(r) if !fresh => req = r,
                _ => return Err(failed),
            }
        }
        Err(OriginError::Closed)
    }

    /// Sends an upgrade request on a connection of its own, driven by its own task with
    /// upgrades on: `hyper::upgrade::on` of the answer then yields the origin's stream.
    pub async fn send_upgrade(
        &self,
        req: Request<Body>,
    ) -> Result<Response<Incoming>, OriginError> {
        let Link { mut send, conn } = *self.connect().await?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "an upgraded connection to the origin ended");
            }
        });
        match tokio::time::timeout(self.head_timeout, send.send_request(req)).await {
            Ok(answer) => answer.map_err(OriginError::Http),
            Err(_) => {
                driver.abort();
                Err(OriginError::Timeout(self.head_timeout))
            }
        }
    }

    /// An idle connection still open and ready, if there is one, with when it went idle.
    fn checkout(&self, cx: &mut Context<'_>) -> Option<(Box<Link>, Instant)> {
        loop {
            let Idle { mut link, since } = self.idle.lock().pop()?;
            if since.elapsed() > IDLE_TIMEOUT {
                continue;
            }
            // Polled once: a connection the origin closed ends here; an open one settles
            // into waiting for the next request.
            if Pin::new(&mut link.conn).poll(cx).is_ready() {
                continue;
            }
            if link.send.is_ready() {
                return Some((link, since));
            }
        }
    }

    /// Puts a connection whose last answer was read to its end back.
    fn checkin(&self, link: Box<Link>) {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        // The bottom of the stack is the longest idle: drop it once it is too old.
        if idle
            .first()
            .is_some_and(|i| now.saturating_duration_since(i.since) > IDLE_TIMEOUT)
        {
            idle.remove(0);
        }
        if idle.len() < self.max_idle {
            idle.push(Idle { link, since: now });
        }
    }

    async fn connect(&self) -> Result<Box<Link>, OriginError> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| OriginError::ConnectTimeout)?
            .map_err(OriginError::Connect)?;
        // Requests and answers are written whole: no Nagle delay on either.
        let _ = tcp.set_nodelay(true);
        // hyper's limit of 100 header fields in an answer is kept: raising it at all moves
        // the parsing buffers to the heap, for every answer (about 64 KiB at 1,000).
        let (send, conn) = http1::Builder::new()
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(OriginError::Http)?;
        Ok(Box::new(Link { send, conn }))
    }
}

/// Polls `conn` while `sent` waits for its answer, on the calling task. `Err` when the
/// connection ended and left the request unanswered.
async fn drive<F, T>(conn: &mut Conn, sent: F) -> Result<T, OriginError>
where
    F: Future<Output = T>,
{
    let mut sent = std::pin::pin!(sent);
    let mut conn_done = false;
    poll_fn(|cx| {
        if let Poll::Ready(r) = sent.as_mut().poll(cx) {
            return Poll::Ready(Ok(r));
        }
        if conn_done {
            return Poll::Ready(Err(OriginError::Closed));
        }
        match Pin::new(&mut *conn).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(ended) => {
                conn_done = true;
                // The connection failed or closed: the request learns it now (hyper
                // answers every request it holds when its connection ends).
                match sent.as_mut().poll(cx) {
                    Poll::Ready(r) => Poll::Ready(Ok(r)),
                    Poll::Pending => Poll::Ready(Err(match ended {
                        Err(e) => OriginError::Http(e),
                        Ok(()) => OriginError::Closed,
                    })),
                }
            }
        }
    })
    .await
}

/// The origin's answer body: reading it drives its connection, which goes back to the
/// pool once the body has ended.
struct Driven {
    body: Incoming,
    link: Option<Box<Link>>,
    pool: std::sync::Arc<Pool>,
    ended: bool,
    /// The body's error, held back for one poll (see `poll_frame`).
    failed: Option<hyper::Error>,
}

impl Driven {
    fn poll_conn(&mut self, cx: &mut Context<'_>) {
        if let Some(link) = &mut self.link {
            if Pin::new(&mut link.conn).poll(cx).is_ready() {
                // Ended (closed or failed): the body reports its own end or error.
                self.link = None;
            }
        }
    }

    /// The answer ended: the connection goes back to the pool only if it is ready for the
    /// next request. An origin may answer before it has read the whole request body (a
    /// refused upload): the rest of that body is still to go out on this connection, and
    /// an origin that did not drain it would read it as a request of its own, whose answer
    /// would reach the next client of the connection. Such a connection is closed. Polled
    /// once first (with the caller's context, or none from `drop`), so that a request and
    /// answer both done have settled into waiting for the next request.
    fn finished(&mut self, cx: Option<&mut Context<'_>>) {
        self.ended = true;
        let Some(mut link) = self.link.take() else {
            return;
        };
        let mut none = Context::from_waker(std::task::Waker::noop());
        let cx = cx.unwrap_or(&mut none);
        if Pin::new(&mut link.conn).poll(cx).is_pending() && link.send.is_ready() {
            self.pool.checkin(link);
        }
    }
}

impl hyper::body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(e)));
        }
        // What the connection already read first; then let it read more, and look again.
        let mut got = Pin::new(&mut this.body).poll_frame(cx);
        if got.is_pending() {
            this.poll_conn(cx);
            got = Pin::new(&mut this.body).poll_frame(cx);
        }
        if let Poll::Ready(Some(Err(e))) = got {
            this.link = None;
            // An origin cut mid-body. The serving connection aborts the moment it sees
            // the error, and drops what it holds unwritten: the head, and the part of
            // the body that came, often all in one go. Held back for one poll, the
            // error lets it write those first (it writes out whenever the body is
            // pending), so the client usually gets the head and a cut body, as from
            // nginx, and not an empty reply (a slow reader's unwritten tail still goes).
            this.failed = Some(e);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match &got {
            Poll::Ready(None) => this.finished(Some(cx)),
            _ if this.body.is_end_stream() => this.finished(Some(cx)),
            _ => {}
        }
        got
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // An empty answer (no body to read, `HEAD`, `204`) is never polled: it ended all
        // the same. One dropped midway leaves bytes on the connection: it is closed.
        if !self.ended && self.body.is_end_stream() {
            self.finished(None);
        }
    }
}

/// The answer to a request with a body, its wait timed from the body's last byte.
async fn after_upload<F: Future>(
    answered: F,
    uploaded: &mut tokio::sync::watch::Receiver<bool>,
    d: Duration,
) -> Result<F::Output, OriginError> {
    let stalled = async {
        // The guard `wait_for` answers is not held across the sleep.
        let sent = uploaded.wait_for(|sent| *sent).await.is_ok();
        if sent {
            tokio::time::sleep(d).await;
        } else {
            // Unreachable in practice (the body tells at the latest when dropped): never.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        a = answered => Ok(a),
        () = stalled => Err(OriginError::Timeout(d)),
    }
}

pin_project_lite::pin_project! {
    /// A proxied request's body that says when it was sent whole: read to its end, or
    /// dropped by hyper (which stops reading once it wrote `Content-Length` bytes, and
    /// drops the body after a chunked upload's trailers). A body dropped because the
    /// request failed says so too, but the failed request's answer has ended the wait.
    struct Uploaded<B> {
        #[pin]
        body: B,
        sent: SentWhole,
    }
}

/// Tells the request's wait that its body was sent whole, once, at the latest when dropped.
struct SentWhole(Option<tokio::sync::watch::Sender<bool>>);

impl SentWhole {
    fn tell(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(true);
        }
    }
}

impl Drop for SentWhole {
    fn drop(&mut self) {
        self.tell();
    }
}

impl<B: hyper::body::Body> hyper::body::Body for Uploaded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.body.poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) {
            this.sent.tell();
        }
        frame
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    /// The serving threads' pools together keep at most `MAX_IDLE` idle connections,
    /// each at least one.
    #[test]
    fn the_threads_share_the_idle_cap() {
        assert_eq!(idle_cap(1), MAX_IDLE);
        assert_eq!(idle_cap(0), MAX_IDLE);
        assert_eq!(idle_cap(2), MAX_IDLE / 2);
        for threads in [1, 2, 3, 7, 16, 64, 255, 256] {
            assert!(idle_cap(threads) * threads <= MAX_IDLE, "{threads}");
            assert!(idle_cap(threads) >= 1);
        }
        assert_eq!(idle_cap(1000), 1);
    }

    /// An origin that takes the request and never answers: the wait ends at the head
    /// timeout, and the request is not sent again (the origin may be working on it).
    #[tokio::test]
    async fn a_stalled_origin_is_given_up_on() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(s);
            }
        });
        let authority: axum::http::uri::Authority = addr.to_string().parse().unwrap();
        let pool = Pool::new(&authority, 2).with_head_timeout(Duration::from_millis(300));
        let req = Request::get("/").body(Body::empty()).unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), pool.send(req))
            .await
            .expect("the wait ends")
            .unwrap_err();
        assert!(matches!(e, OriginError::Timeout(_)), "{e}");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A pool to an origin that answers the length of each request's body.
    async fn counting_origin() -> std::sync::Arc<Pool> {
        let origin =
            axum::Router::new().fallback(|body: Bytes| async move { body.len().to_string() });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, origin).await.unwrap() });
        let authority: axum::http::uri::Authority = addr.to_string().parse().unwrap();
        Pool::new(&authority, 2)
    }

    /// An upload is not timed: a slow client's body may take longer than the head timeout,
    /// and the origin answers once it has all of it.
    #[tokio::test]
    async fn a_slow_upload_outlasts_the_head_timeout() {
        let pool = counting_origin()
            .await
            .with_head_timeout(Duration::from_millis(200));
        // Four parts, 150 ms apart: 600 ms of upload against a 200 ms head timeout.
        let chunks = futures_util::stream::unfold(0, |i| async move {
            if i == 4 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"part")), i + 1))
        });
        let req = Request::post("/upload")
            .body(Body::from_stream(chunks))
            .unwrap();
        let res = pool
            .send(req)
            .await
            .expect("answered after the whole upload");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"16");
    }

    /// An upload that stops arriving ends after the idle limit, as the client's failure
    /// (not the origin's), instead of holding both connections for ever.
    #[tokio::test]
    async fn a_stalled_upload_is_given_up_on() {
        let pool = counting_origin()
            .await
            .with_upload_idle(Duration::from_millis(300));
        use futures_util::StreamExt as _;
        // One part, then nothing ever again (the client went quiet mid-upload).
        let chunks = futures_util::stream::once(async {
            Ok::<_, std::io::Error>(Bytes::from_static(b"part"))
        })
        .chain(futures_util::stream::pending());
        let req = Request::post("/upload")
            .body(Body::from_stream(chunks))
            .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), pool.send(req))
            .await
            .expect("the wait ends")
            .unwrap_err();
        assert!(matches!(e, OriginError::Upload(_)), "{e}");
        assert!(e.to_string().contains("designated timeout"), "{e}");
    }

    /// Once the upload was sent whole, the wait for the answer is timed as a bodiless
    /// request's is (defect: with a body, an origin that never answered held both
    /// connections for as long as the client waited, with no `502`).
    #[tokio::test]
    async fn the_answer_to_a_whole_upload_is_timed() {
        let origin = axum::Router::new().fallback(|_body: Bytes| std::future::pending::<()>());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, origin).await.unwrap() });
        let authority: axum::http::uri::Authority = addr.to_string().parse().unwrap();
        let pool = Pool::new(&authority, 2).with_head_timeout(Duration::from_millis(300));
        let req = Request::post("/orders")
            .body(Body::from_stream(futures_util::stream::once(async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"x=1"))
            })))
            .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), pool.send(req))
            .await
            .expect("the wait ends")
            .unwrap_err();
        assert!(matches!(e, OriginError::Timeout(_)), "{e}");
        // With a length, as a browser's form sends it: hyper stops reading the body at its
        // last byte and drops it, without the read that finds its end.
        let req = Request::post("/orders")
            .header("content-length", "3")
            .body(Body::from("x=1"))
            .unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), pool.send(req))
            .await
            .expect("the wait with a length ends")
            .unwrap_err();
        assert!(matches!(e, OriginError::Timeout(_)), "{e}");
    }

    /// Three answers read to their end at once, from three connections: a pool capped at
    /// two keeps two of them.
    #[tokio::test]
    async fn a_pool_keeps_no_more_idle_connections_than_its_cap() {
        let origin = axum::Router::new().fallback(|| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            "ok"
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, origin).await.unwrap() });
        let authority: axum::http::uri::Authority = addr.to_string().parse().unwrap();
        let pool = Pool::new(&authority, 2);
        let ask = |pool: std::sync::Arc<Pool>| async move {
            let req = Request::get("/")
                .header("host", "origin.example")
                .body(Body::empty())
                .unwrap();
            let res = pool.send(req).await.unwrap();
            res.into_body().collect().await.unwrap().to_bytes()
        };
        let answers = futures_util::future::join_all((0..3).map(|_| ask(pool.clone()))).await;
        assert!(answers.iter().all(|a| a.as_ref() == b"ok"));
        assert_eq!(pool.idle.lock().len(), 2);
    }
}
