//! `GET /api/v1/events`, the public event list, and the one copy of it that the requests
//! of a second share ([`PublicList`]).
//!
//! The list names every stored event, ended sales too: at 10,000 events it is about 3 MB
//! of JSON, and reading it costs the store one read per event. Every open landing page
//! asks for it every few seconds, and anyone may ask without a token. Read and rendered
//! per request, eight clients held one server to 15 lists a second at 10,000 events, and
//! every other request waited behind them. So the list is read and rendered (as JSON, and
//! gzipped) by one request at a time, at most once per [`SHARE_MS`], and every request
//! until then is answered the same bytes: any number of clients costs one read a second.
//! The figures are then up to that long old (plus the read's own time): they are estimates
//! of a moving line anyway. A created, changed or deleted event does not wait: the store's
//! notice of it ends the shared copy at once (on another node as soon as the notice
//! arrives there; one that is lost, at the end of the second).
//!
//! The requests that find no fresh copy wait for the one read in progress rather than
//! start their own, and a read that fails fails them too (on Redis each would otherwise
//! wait out the same timeout, one after another).
//!
//! `?after=&limit=` answer a page of the same copy: the elements are rendered once, with
//! their places in the bytes, so a page is a copy of a slice, never a rendering.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::broadcast::{self, error::TryRecvError};

use super::body::PublicEvent;
use super::error::{AppError, AppResult};
use super::extract::AppQuery;
use super::pages::accepts_gzip;
use super::Shared;
use crate::clock::Clock;
use crate::core::Millis;
use crate::store::{Notice, Store, StoreError, StoreResult};

/// How long one reading of the list answers every request (docs/API.md says so).
pub const SHARE_MS: Millis = 1000;

/// The list as the requests of one [`SHARE_MS`] share it.
pub struct Rendered {
    /// When the store's answer came (the clock of the state).
    at: Millis,
    /// The [`PublicList::generation`] before the store was asked: a change notice since
    /// makes this copy stale at once.
    generation: u64,
    /// The event ids in order, for a page's `after`.
    ids: Vec<String>,
    /// The whole list as JSON, `[e0,e1,…]`.
    json: Bytes,
    /// Where each element's bytes start and end in `json`.
    spans: Vec<(usize, usize)>,
    /// `json` gzipped, when that is smaller.
    gzip: Option<Bytes>,
}

impl Rendered {
    fn new(events: Vec<PublicEvent>, at: Millis, generation: u64) -> serde_json::Result<Self> {
        let mut json = Vec::with_capacity(events.len() * 320 + 2);
        let mut spans = Vec::with_capacity(events.len());
        json.push(b'[');
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                json.push(b',');
            }
            let start = json.len();
            serde_json::to_writer(&mut json, e)?;
            spans.push((start, json.len()));
        }
        json.push(b']');
        let gzip = gzipped(&json).map(Bytes::from);
        Ok(Rendered {
            at,
            generation,
            ids: events.into_iter().map(|e| e.event_id).collect(),
            json: Bytes::from(json),
            spans,
            gzip,
        })
    }

    /// The event ids, in order.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The events from index `from`, at most `limit`, as a JSON array.
    fn page(&self, from: usize, limit: usize) -> Vec<u8> {
        let to = from.saturating_add(limit).min(self.spans.len());
        let mut out = Vec::new();
        out.push(b'[');
        if from < to {
            out.extend_from_slice(&self.json[self.spans[from].0..self.spans[to - 1].1]);
        }
        out.push(b']');
        out
    }
}

/// The body gzipped, if that saves anything. Fast rather than best: it runs once a second
/// at most, on up to megabytes.
fn gzipped(body: &[u8]) -> Option<Vec<u8>> {
    if body.len() < 1024 {
        return None;
    }
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(body).ok()?;
    let out = z.finish().ok()?;
    (out.len() < body.len()).then_some(out)
}

/// The shared copy of the public list, and the one read that renews it.
pub struct PublicList {
    store: Arc<dyn Store>,
    /// The store's notices about events; drained by the requests themselves (no task), so
    /// that an answer after a change of this node never misses it.
    notices: Mutex<broadcast::Receiver<Notice>>,
    /// Moved by every notice of a created, changed or deleted event (and by missed ones).
    generation: AtomicU64,
    shared: ArcSwapOption<Rendered>,
    /// Held by the request that reads the list; what the last read left behind.
    reading: tokio::sync::Mutex<LastRead>,
    /// How many reads have ended (`LastRead::count`), to be seen without the lock.
    reads: AtomicU64,
}

#[derive(Default)]
struct LastRead {
    count: u64,
    /// Why the last read failed, when it did because the store was unavailable.
    failed: Option<String>,
}

impl PublicList {
    pub fn new(store: Arc<dyn Store>) -> Self {
        PublicList {
            notices: Mutex::new(store.subscribe_events()),
            store,
            generation: AtomicU64::new(0),
            shared: ArcSwapOption::empty(),
            reading: tokio::sync::Mutex::new(LastRead::default()),
            reads: AtomicU64::new(0),
        }
    }

    /// The generation after the notices that came since the last look.
    fn generation(&self) -> u64 {
        let mut notices = self.notices.lock();
        loop {
            match notices.try_recv() {
                Ok(Notice::EventChanged { .. } | Notice::EventDeleted { .. })
                | Err(TryRecvError::Lagged(_)) => {
                    self.generation.fetch_add(1, Ordering::AcqRel);
                }
                Ok(_) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        self.generation.load(Ordering::Acquire)
    }

    /// The shared copy, if it may still be answered at `now`.
    fn fresh(&self, now: Millis) -> Option<Arc<Rendered>> {
        let generation = self.generation();
        let r = self.shared.load_full()?;
        (r.generation == generation && now >= r.at && now - r.at < SHARE_MS).then_some(r)
    }

    /// The list as every request of this second answers it: the shared copy, or a new one
    /// read by this request (or by the one already reading, which this one waits for).
    pub async fn current(&self, clock: &Clock) -> StoreResult<Arc<Rendered>> {
        // Read before the copy is looked at: a read that ends in between is then seen below.
        let reads = self.reads.load(Ordering::Acquire);
        if let Some(r) = self.fresh(clock.now()) {
            return Ok(r);
        }
        let mut last = self.reading.lock().await;
        if last.count != reads {
            // Another request read the list while this one waited: its answer is this
            // one's too, a failure included.
            if let Some(r) = self.fresh(clock.now()) {
                return Ok(r);
            }
            if let Some(why) = &last.failed {
                return Err(StoreError::Unavailable(why.clone()));
            }
        }
        let generation = self.generation();
        let read = self.store.list_events(clock.now()).await;
        last.count += 1;
        self.reads.store(last.count, Ordering::Release);
        let events = match read {
            Ok(events) => events,
            Err(e) => {
                last.failed = match &e {
                    StoreError::Unavailable(why) => Some(why.clone()),
                    StoreError::Queue(_) => None,
                };
                return Err(e);
            }
        };
        last.failed = None;
        let now = clock.now();
        let public: Vec<PublicEvent> = events
            .into_iter()
            .map(|e| PublicEvent::new(e, now))
            .collect();
        // Megabytes of JSON and their gzip at thousands of events: off the async workers.
        let rendered = tokio::task::spawn_blocking(move || Rendered::new(public, now, generation))
            .await
            .map_err(|e| StoreError::Unavailable(format!("rendering the event list: {e}")))?
            .map_err(|e| StoreError::Unavailable(format!("rendering the event list: {e}")))?;
        let rendered = Arc::new(rendered);
        self.shared.store(Some(rendered.clone()));
        Ok(rendered)
    }
}

/// `?after=&limit=` of `GET /api/v1/events`; other parameters are ignored, as they were
/// before these existed (a page may add one to defeat a cache).
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// The page starts after this event id (the previous page's last).
    pub after: Option<String>,
    /// Most events in the page (at least 1); all when absent.
    pub limit: Option<usize>,
}

/// `GET /api/v1/events`: every event, public figures only, ordered by id; a page of them
/// with `after` or `limit`, with a `Link` to the next page when one follows.
pub async fn list_events(
    State(shared): State<Shared>,
    // A `Result`: a query refused is an answer of this URL too (`Vary` below).
    q: Result<AppQuery<ListQuery>, AppError>,
    headers: HeaderMap,
) -> Response {
    // Every answer, a page or a refusal too (API.md): a cache keying this URL by
    // `Accept-Encoding` then does so for all of them.
    let answer = match q {
        Ok(AppQuery(q)) => list_answer(&shared, q, &headers).await,
        Err(e) => Err(e),
    };
    let mut res = answer.into_response();
    res.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    res
}

async fn list_answer(shared: &Shared, q: ListQuery, headers: &HeaderMap) -> AppResult<Response> {
    if q.limit == Some(0) {
        return Err(AppError::invalid("limit must be at least 1"));
    }
    let list = shared.public_list().current(&shared.app().clock).await?;
    let json = HeaderValue::from_static("application/json");
    if q.after.is_none() && q.limit.is_none() {
        let gzip = list.gzip.as_ref().filter(|_| accepts_gzip(headers));
        // Gzipped or not by the request's `Accept-Encoding` (hence `Vary`, set above).
        let res = match gzip {
            Some(body) => (
                [
                    (header::CONTENT_TYPE, json),
                    (header::CONTENT_ENCODING, HeaderValue::from_static("gzip")),
                ],
                body.clone(),
            )
                .into_response(),
            None => ([(header::CONTENT_TYPE, json)], list.json.clone()).into_response(),
        };
        return Ok(res);
    }
    let from = match &q.after {
        Some(after) => list.ids.partition_point(|id| id.as_str() <= after.as_str()),
        None => 0,
    };
    let limit = q.limit.unwrap_or(usize::MAX);
    let mut res = ([(header::CONTENT_TYPE, json)], list.page(from, limit)).into_response();
    let to = from.saturating_add(limit).min(list.ids.len());
    if to < list.ids.len() && to > from {
        // Event ids are of `[A-Za-z0-9._-]`: nothing in them needs escaping in a URL.
        let next = format!(
            "</api/v1/events?after={}&limit={limit}>; rel=\"next\"",
            list.ids[to - 1]
        );
        if let Ok(v) = HeaderValue::from_str(&next) {
            res.headers_mut().insert(header::LINK, v);
        }
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str) -> PublicEvent {
        PublicEvent {
            event_id: id.into(),
            name: format!("Event {id}"),
            queue_length: 3,
            admitted: 0,
            active: 0,
            capacity: 1,
            admitted_last_minute: 0,
            paused: false,
            accept_joins: true,
            target_url: None,
            waiting_idle_sec: 90,
            title: None,
            headline: None,
            note: None,
            turn_message: None,
            theme_color: None,
            logo_url: None,
            closes_at: None,
            ended: None,
            announcement: None,
        }
    }

    /// Every page is the elements of the whole list, as JSON of their own.
    #[test]
    fn pages_are_slices_of_the_rendered_list() {
        let ids = ["a", "b", "c", "d"];
        let r = Rendered::new(ids.iter().map(|i| event(i)).collect(), 0, 0).unwrap();
        let whole: serde_json::Value = serde_json::from_slice(&r.json).unwrap();
        assert_eq!(whole.as_array().unwrap().len(), 4);
        for from in 0..=4 {
            for limit in 1..=5 {
                let page: serde_json::Value = serde_json::from_slice(&r.page(from, limit)).unwrap();
                let want: Vec<_> = whole
                    .as_array()
                    .unwrap()
                    .iter()
                    .skip(from)
                    .take(limit)
                    .cloned()
                    .collect();
                assert_eq!(page, serde_json::Value::Array(want), "{from} {limit}");
            }
        }
        let empty = Rendered::new(Vec::new(), 0, 0).unwrap();
        assert_eq!(&empty.json[..], b"[]");
        assert_eq!(empty.page(0, 10), b"[]");
        assert!(empty.gzip.is_none(), "too small to gzip");
    }

    #[test]
    fn a_large_list_is_gzipped_and_unzips_to_itself() {
        use std::io::Read as _;
        let r =
            Rendered::new((0..200).map(|i| event(&format!("e{i:03}"))).collect(), 0, 0).unwrap();
        let z = r.gzip.as_ref().expect("gzipped");
        assert!(
            z.len() * 4 < r.json.len(),
            "{} of {}",
            z.len(),
            r.json.len()
        );
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&z[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, r.json);
    }
}
