//! The body-read timeout of [`super::edge`]: a request body that stops arriving for longer
//! than the limit fails, so a body trickled byte by byte cannot hold a connection forever.
//!
//! It waits as tower-http's `TimeoutBody` did (the limit runs while a frame is awaited and
//! starts again after each frame; the failure reads "data was not received within the
//! designated timeout"), but asks the body first and makes the timer only when the body
//! has nothing yet. tower-http's makes a timer at every read and polls it before the body:
//! a join's body, already received whole with its head, paid two timers (each a
//! registration in the runtime's timer wheel and, when dropped, its lock) for a frame and
//! an end of stream that were both there at once (about 2,000 instructions of a join,
//! callgrind; PERFORMANCE.md, "Join's own work, seventh round").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::HttpBody;
use hyper::body::Buf as _;
use hyper::body::Frame;
use pin_project_lite::pin_project;
use tokio::time::{sleep, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// `body`, failing with [`BodyTimedOut`] once a frame has been awaited for `timeout`
    /// ([`BodyTimeout::new`]), or once the rest of the body has ([`BodyTimeout::whole`]).
    pub struct BodyTimeout<B> {
        timeout: Duration,
        // The limit is the whole body's, not each frame's.
        whole: bool,
        // Made at the first read that found nothing; dropped as soon as a frame (or the
        // end) came, unless the limit is the whole body's.
        #[pin]
        sleep: Option<Sleep>,
        #[pin]
        body: B,
    }
}

impl<B> BodyTimeout<B> {
    /// The limit applies to each wait for a frame (an upload may take as long as it needs
    /// while it keeps coming).
    pub fn new(timeout: Duration, body: B) -> Self {
        BodyTimeout {
            timeout,
            whole: false,
            sleep: None,
            body,
        }
    }

    /// The limit applies to the whole body, from the first read that found nothing: a
    /// body trickled a byte at a time, each within a per-frame limit, is cut off too.
    pub fn whole(timeout: Duration, body: B) -> Self {
        BodyTimeout {
            whole: true,
            ..Self::new(timeout, body)
        }
    }
}

impl<B> HttpBody for BodyTimeout<B>
where
    B: HttpBody,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            if !*this.whole {
                this.sleep.set(None);
            }
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(sleep(*this.timeout)));
        }
        let timer = this.sleep.as_pin_mut().expect("set above");
        match timer.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    // `is_end_stream` and `size_hint` keep their defaults, as tower-http's wrapper did: the
    // body limit and the readers behind this layer see the same body as before.
}

impl<B: Unpin + Default> BodyTimeout<B> {
    /// The body, leaving an empty one (and the timer) behind.
    fn take_body(self: Pin<&mut Self>) -> B {
        std::mem::take(self.project().body.get_mut())
    }
}

pin_project! {
    /// A request body under the body-read timeout that, when dropped before its end, is
    /// read to its end by a task of its own (at most `max_bytes` more, within `timeout`
    /// more), and thrown away.
    ///
    /// An answer made without reading the body (an unknown path, a refused token, a rate
    /// limit) drops it. hyper then reads what has already arrived, and if the rest has not
    /// (a client that sends the head and the body in two writes, as Python's `requests`
    /// does), closes the connection after the answer, without saying so in it: the
    /// client's next request on that connection, sent meanwhile, gets no answer at all,
    /// and a `POST` is not sent again. Read to its end, the body frees the connection for
    /// the next request, as nginx does with a body it discards.
    pub struct DrainOnDrop {
        #[pin]
        inner: BodyTimeout<axum::body::Body>,
        ended: bool,
        max_bytes: usize,
        timeout: Duration,
    }

    impl PinnedDrop for DrainOnDrop {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.ended {
                return;
            }
            // Outside a runtime (nothing serves the connection then) there is nothing to do.
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let body = this.inner.take_body();
            if body.is_end_stream() {
                return;
            }
            drain_later(&runtime, body, *this.max_bytes, *this.timeout);
        }
    }
}

/// Reads `body` to its end in a task of its own and throws it away. Past `max_bytes` or
/// `timeout` the body is dropped, and hyper closes the connection, as without this.
fn drain_later<B>(
    runtime: &tokio::runtime::Handle,
    mut body: B,
    max_bytes: usize,
    timeout: Duration,
) where
    B: HttpBody + Send + Unpin + 'static,
    B::Data: Send,
{
    runtime.spawn(async move {
        let mut left = max_bytes;
        let _ = tokio::time::timeout(timeout, async {
            while let Some(Ok(frame)) = http_body_util::BodyExt::frame(&mut body).await {
                let n = frame.data_ref().map_or(0, |d| d.remaining());
                let Some(l) = left.checked_sub(n) else { return };
                left = l;
            }
        })
        .await;
    });
}

/// Gateway mode's request body (no timeout of its own: an upload to the site may take as
/// long as it takes), read to its end when dropped before it (see [`DrainOnDrop`]): the
/// waiting room's page and the refusals answer a gated request without reading its body.
pub struct DrainIncoming {
    body: Option<hyper::body::Incoming>,
    ended: bool,
}

/// At most this much of a body the gateway answered without is read, within
/// [`DRAIN_TIME`]; a longer one closes its connection.
const DRAIN_BYTES: usize = 64 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(10);

impl DrainIncoming {
    pub fn new(body: hyper::body::Incoming) -> Self {
        DrainIncoming {
            body: Some(body),
            ended: false,
        }
    }
}

impl HttpBody for DrainIncoming {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = Pin::new(body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            self.ended = true;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(HttpBody::is_end_stream)
    }
}

impl Drop for DrainIncoming {
    fn drop(&mut self) {
        let Some(body) = self.body.take() else { return };
        if self.ended || body.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drain_later(&runtime, body, DRAIN_BYTES, DRAIN_TIME);
        }
    }
}

impl DrainOnDrop {
    /// `body` under [`BodyTimeout::whole`]`(timeout)`, drained when dropped unread.
    pub fn new(body: axum::body::Body, timeout: Duration, max_bytes: usize) -> Self {
        DrainOnDrop {
            inner: BodyTimeout::whole(timeout, body),
            ended: false,
            max_bytes,
            timeout,
        }
    }
}

impl HttpBody for DrainOnDrop {
    type Data = axum::body::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        // The end, or an error (after which the connection is closed anyway): nothing to
        // read when dropped.
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            *this.ended = true;
        }
        frame
    }
}

/// A request body that did not arrive in time; the same words as tower-http's, which the
/// 400 answer quotes.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::error::Error for BodyTimedOut {}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("data was not received within the designated timeout")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use std::convert::Infallible;
    use std::task::Waker;

    type Polled<B> = Poll<Option<Result<Frame<<B as HttpBody>::Data>, <B as HttpBody>::Error>>>;

    fn poll<B: HttpBody>(body: Pin<&mut B>) -> Polled<B> {
        body.poll_frame(&mut Context::from_waker(Waker::noop()))
    }

    fn timing<B>(body: Pin<&mut BodyTimeout<B>>) -> bool {
        body.project().sleep.is_some()
    }

    /// A body that is already there is read without any timer: polled outside a runtime,
    /// where making a `Sleep` panics ("there is no reactor running"), as tower-http's
    /// `TimeoutBody` does here.
    #[test]
    fn a_body_already_received_is_read_without_a_timer() {
        let mut body = std::pin::pin!(BodyTimeout::new(
            Duration::from_millis(1),
            http_body_util::Full::new(Bytes::from_static(b"{\"a\":1}")),
        ));
        let Poll::Ready(Some(Ok(frame))) = poll(body.as_mut()) else {
            panic!("the frame was there");
        };
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"{\"a\":1}"));
        assert!(matches!(poll(body.as_mut()), Poll::Ready(None)));
        assert!(!timing(body));
    }

    fn channel_body() -> (
        tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
        impl HttpBody<Data = Bytes, Error = Infallible> + Unpin,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        (tx, StreamBody::new(Box::pin(stream)))
    }

    /// Reads `body` to its end or its first error: the data, and the error's words.
    async fn read_all<B>(body: BodyTimeout<B>) -> (Vec<u8>, Option<String>)
    where
        B: HttpBody<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let mut body = Box::pin(body);
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => got.extend_from_slice(&f.into_data().unwrap()),
                Err(e) => return (got, Some(e.to_string())),
            }
        }
        (got, None)
    }

    /// The limit runs per frame awaited, from the read that found nothing, and starts again
    /// after each frame: frames spaced under it all pass, a gap over it fails with the
    /// words the 400 answer quotes.
    #[tokio::test(start_paused = true)]
    async fn a_gap_between_frames_longer_than_the_limit_fails() {
        let limit = Duration::from_millis(100);
        let (tx, inner) = channel_body();
        let reader = tokio::spawn(read_all(BodyTimeout::new(limit, inner)));
        for chunk in [&b"ab"[..], b"cd", b"ef"] {
            tokio::time::sleep(limit - Duration::from_millis(10)).await;
            tx.send(Ok(Frame::data(Bytes::from_static(chunk))))
                .await
                .unwrap();
        }
        // Then nothing, for longer than the limit.
        tokio::time::sleep(limit * 3).await;
        let (got, err) = reader.await.unwrap();
        assert_eq!(got, b"abcdef");
        assert_eq!(
            err.as_deref(),
            Some("data was not received within the designated timeout")
        );
        drop(tx);
    }

    /// With the whole body's limit, frames that each come in time but add up to more than
    /// the limit fail all the same (a trickle).
    #[tokio::test(start_paused = true)]
    async fn a_trickle_past_the_whole_limit_fails() {
        let limit = Duration::from_millis(100);
        let (tx, inner) = channel_body();
        let reader = tokio::spawn(read_all(BodyTimeout::whole(limit, inner)));
        for chunk in [&b"ab"[..], b"cd", b"ef"] {
            tokio::time::sleep(limit / 2 - Duration::from_millis(5)).await;
            if tx
                .send(Ok(Frame::data(Bytes::from_static(chunk))))
                .await
                .is_err()
            {
                break;
            }
        }
        let (got, err) = reader.await.unwrap();
        assert_eq!(
            got, b"abcd",
            "two frames came in time, the third after the limit"
        );
        assert_eq!(
            err.as_deref(),
            Some("data was not received within the designated timeout")
        );
    }

    /// A body that ends in time is read whole, and the timer of its last wait is gone.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_in_time_is_read_whole() {
        let (tx, inner) = channel_body();
        let mut body = Box::pin(BodyTimeout::new(Duration::from_millis(100), inner));
        assert!(poll(body.as_mut()).is_pending());
        assert!(timing(body.as_mut()), "a pending read runs the timer");
        tx.send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .await
            .unwrap();
        drop(tx);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"x"));
        assert!(!timing(body.as_mut()), "a frame stops the timer");
        assert!(body.frame().await.is_none());
    }
}
