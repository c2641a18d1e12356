//! One client connection's view of the gateway ([`Connection`]): the gateway, and the
//! session cookie the connection last sent with the place it names.
//!
//! A browser sends the same `Cookie` header with every request of a connection. Finding
//! the session cookie among its pairs and looking its token up among the verified ones
//! cost ~1,000 instructions per gated request (a fifth of what a gated request costs over
//! a passthrough); comparing the header's bytes with the last ones costs a few dozen.
//!
//! What is kept is exactly what [`gate::cookie_place`] answered for those bytes and that
//! event: a function of the token's text and the signing keys (fixed for the process's
//! life), never of the place's state. Whether the place is still live (completed, expired,
//! idle, cleared) is asked at every request as before: the renewal throttle, then the
//! store. A forged or changed cookie is other bytes, so it misses and is read and verified
//! as any. Each connection keeps its own: nothing one client sends reaches another's.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use hyper::body::Incoming;
use parking_lot::Mutex;

use super::Gateway;
use crate::core::PlaceKey;
use crate::gates::Gate;
use crate::http::gate;

/// Longest `Cookie` header kept; a longer one is read at every request.
const MAX_KEPT: usize = 4096;

/// The gateway as one client connection uses it (see the module documentation).
pub struct Connection {
    gateway: Arc<Gateway>,
    pub(super) last: LastCookie,
    /// The forwarding headers' values last written for this connection's peer.
    pub(super) forwarding: super::forward::Forwarding,
}

impl Connection {
    /// Made once per connection (one allocation); each request clones the `Arc`, as it
    /// cloned the gateway's before.
    pub fn new(gateway: Arc<Gateway>) -> Arc<Self> {
        Arc::new(Connection {
            gateway,
            last: LastCookie::default(),
            forwarding: Default::default(),
        })
    }

    /// [`Gateway::serve`], for a request of this connection. Not an `async fn` of its own:
    /// a future around the gateway's would be one more layer for every request's future
    /// to be copied into (measured: ~500 instructions of `memcpy` per request).
    pub fn serve(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl std::future::Future<Output = Response> + Send + '_ {
        self.gateway.serve_on(req, peer, Some(self))
    }
}

/// The `Cookie` header a connection last sent to a gated path, and its answer.
#[derive(Default)]
pub struct LastCookie(Mutex<Option<Seen>>);

struct Seen {
    event_id: Arc<str>,
    header: Box<[u8]>,
    place: Option<PlaceKey>,
}

impl LastCookie {
    /// The place the request's cookie for `gate` names, as `look` (the full reading)
    /// answers it: kept from the last request when this one carries a single `Cookie`
    /// header of the very same bytes, for the same event.
    pub fn place_of(
        &self,
        gate: &Gate,
        headers: &HeaderMap,
        look: impl FnOnce() -> Option<PlaceKey>,
    ) -> Option<PlaceKey> {
        let mut all = headers.get_all(header::COOKIE).iter();
        let (Some(only), None) = (all.next(), all.next()) else {
            return look();
        };
        let bytes = only.as_bytes();
        if bytes.len() > MAX_KEPT {
            return look();
        }
        if let Some(seen) = &*self.0.lock() {
            if *seen.event_id == *gate.event_id && *seen.header == *bytes {
                return seen.place;
            }
        }
        let place = look();
        *self.0.lock() = Some(Seen {
            event_id: gate.event_id.clone(),
            header: bytes.into(),
            place,
        });
        place
    }
}

/// The place `headers`' cookie names for `gate`: through the connection's last cookie when
/// there is one, else read and looked up in full.
pub(super) fn place_of(
    gateway: &Gateway,
    last: Option<&LastCookie>,
    gate: &Gate,
    headers: &HeaderMap,
) -> Option<PlaceKey> {
    let look = || gate::cookie_place(&gateway.state, gate, headers);
    match last {
        Some(last) => last.place_of(gate, headers, look),
        None => look(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::cell::Cell;

    fn key(n: u128) -> PlaceKey {
        PlaceKey { seq: 1, nonce: n }
    }

    /// Kept only for the very same single header and event: other bytes, another event, two
    /// headers or none are read in full, and what is kept is what the reading answered.
    #[test]
    fn the_last_cookie_stands_for_the_same_bytes_and_event_only() {
        let last = LastCookie::default();
        let (a, b) = (
            Gate::new("a".into(), Default::default(), 1000),
            Gate::new("b".into(), Default::default(), 1000),
        );
        let calls = Cell::new(0);
        let answer = |k: Option<PlaceKey>| {
            let calls = &calls;
            move || {
                calls.set(calls.get() + 1);
                k
            }
        };
        let one = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.append(header::COOKIE, HeaderValue::from_static(v));
            h
        };
        let h = one("waitroom_a=tok");
        assert_eq!(last.place_of(&a, &h, answer(Some(key(7)))), Some(key(7)));
        assert_eq!(last.place_of(&a, &h, answer(None)), Some(key(7)), "kept");
        assert_eq!(calls.get(), 1);
        // One byte changed: read again, and its answer (a forgery: none) is what counts.
        let forged = one("waitroom_a=tol");
        assert_eq!(last.place_of(&a, &forged, answer(None)), None);
        assert_eq!(calls.get(), 2);
        assert_eq!(last.place_of(&a, &h, answer(Some(key(7)))), Some(key(7)));
        assert_eq!(calls.get(), 3, "the forgery replaced it");
        // Another event, the same bytes: read again.
        assert_eq!(last.place_of(&b, &h, answer(None)), None);
        assert_eq!(calls.get(), 4);
        // Two headers, or none: always read.
        let mut two = one("waitroom_a=tok");
        two.append(header::COOKIE, HeaderValue::from_static("x=1"));
        for h in [two.clone(), two, HeaderMap::new()] {
            assert_eq!(last.place_of(&a, &h, answer(Some(key(9)))), Some(key(9)));
        }
        assert_eq!(calls.get(), 7);
        // A header too long to keep is read every time.
        let long = format!("waitroom_a={}", "t".repeat(MAX_KEPT));
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_str(&long).unwrap());
        for _ in 0..2 {
            last.place_of(&a, &h, answer(Some(key(3))));
        }
        assert_eq!(calls.get(), 9);
    }
}
