//! The answer of `GET /queue/status`, written by hand. serde_json writes each of a place's
//! dozen field names through its string escaper and each value through the `Serializer`
//! machinery: about 3,000 instructions of a status poll (callgrind), as much as the store's
//! part of it. Here the names are constant bytes, the numbers go through `itoa` (as
//! serde_json's do), and only text that could need escaping (the event id, and the rare
//! announcement) goes through serde_json. The bytes are the same as `Place`'s `Serialize`
//! (tests below, every field present and absent), which stays the contract's description.
//! The answer of `POST /queue/join` is the same place after its waiting token.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::body::{Joined, Place};
use crate::core::ShownStatus;

/// A place as `status` answers it: `JsonAnswer(place)`'s header and bytes, written by hand.
pub struct PlaceAnswer(pub Place);

impl IntoResponse for PlaceAnswer {
    fn into_response(self) -> Response {
        let mut buf = Vec::with_capacity(512);
        self.0.write_json(&mut buf);
        json_response(buf)
    }
}

/// A new place as `join` answers it: `JsonAnswer(joined)`'s header and bytes, written by
/// hand as the status answer is (serde_json took ~4,000 instructions of a join for it,
/// half of them escaping the waiting token character by character).
pub struct JoinedAnswer(pub Joined);

impl IntoResponse for JoinedAnswer {
    fn into_response(self) -> Response {
        let Joined {
            waiting_token,
            place,
        } = &self.0;
        // A waiting token is base64url as issued (`WaitingTokens::issue`), which JSON never
        // escapes: written as is, rather than scanned byte by byte for characters to
        // escape (~750 instructions for a token of ~100 characters).
        debug_assert!(waiting_token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let mut buf = Vec::with_capacity(512);
        buf.extend_from_slice(b"{\"waiting_token\":\"");
        buf.extend_from_slice(waiting_token.as_bytes());
        buf.extend_from_slice(b"\",");
        place.write_fields(&mut buf);
        buf.push(b'}');
        json_response(buf)
    }
}

/// The answer `JsonAnswer` gives for these JSON bytes, which no cache may keep: a place's
/// answer is one person's (a shared cache in front of the server that kept a status poll
/// gave the next person polling within its lifetime the first one's position, or
/// `admitted`, and held back the polls that renew their places).
fn json_response(buf: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(buf));
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, super::NO_STORE.clone());
    r
}

impl Place {
    /// Appends the place as one JSON object: `serde_json::to_vec(self)`'s bytes.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        self.write_fields(out);
        out.push(b'}');
    }

    /// Appends the fields in the contract's order (as `Place::fields` writes them), with
    /// no braces: leading a comma-separated list.
    pub fn write_fields(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"\"status\":\"");
        out.extend_from_slice(shown(self.status).as_bytes());
        out.extend_from_slice(b"\",\"event_id\":");
        string(out, &self.event_id);
        out.extend_from_slice(b",\"place_id\":");
        number(out, self.place_id);
        some(out, b",\"position\":", self.position);
        some(out, b",\"opens_in_sec\":", self.opens_in_sec);
        some(out, b",\"prequeue_rank\":", self.prequeue_rank);
        out.extend_from_slice(b",\"queue_length\":");
        number(out, self.queue_length);
        out.extend_from_slice(b",\"eta_sec\":");
        number(out, self.eta_sec);
        out.extend_from_slice(b",\"eta_low_sec\":");
        nullable(out, self.eta_low_sec);
        out.extend_from_slice(b",\"eta_high_sec\":");
        nullable(out, self.eta_high_sec);
        out.extend_from_slice(b",\"poll_after_sec\":");
        number(out, self.poll_after_sec);
        out.extend_from_slice(b",\"paused\":");
        boolean(out, self.paused);
        out.extend_from_slice(b",\"waited_sec\":");
        number(out, self.waited_sec);
        out.extend_from_slice(b",\"ready_for_entry\":");
        boolean(out, self.ready_for_entry);
        some(out, b",\"enter_within_sec\":", self.enter_within_sec);
        some(
            out,
            b",\"session_expires_in_sec\":",
            self.session_expires_in_sec,
        );
        if let Some(a) = &self.announcement {
            out.extend_from_slice(b",\"announcement\":");
            serde_json::to_writer(&mut *out, a).expect("an announcement serializes");
        }
    }
}

/// `ShownStatus`'s serde name (kebab-case).
fn shown(s: ShownStatus) -> &'static str {
    match s {
        ShownStatus::PreQueue => "pre-queue",
        ShownStatus::Waiting => "waiting",
        ShownStatus::Admitted => "admitted",
        ShownStatus::Active => "active",
    }
}

fn number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn nullable(out: &mut Vec<u8>, n: Option<u64>) {
    match n {
        Some(n) => number(out, n),
        None => out.extend_from_slice(b"null"),
    }
}

/// A field the contract shows only in some states: left out when absent.
fn some(out: &mut Vec<u8>, name: &[u8], n: Option<u64>) {
    if let Some(n) = n {
        out.extend_from_slice(name);
        number(out, n);
    }
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// A JSON string: as is when nothing in it needs escaping (event ids never do), else as
/// serde_json escapes it.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("a string serializes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{PlaceKey, PlaceState, PlaceView};
    use crate::http::body::{AnnouncementBody, JsonAnswer};

    fn view(status: PlaceState, n: u64, all: bool) -> PlaceView {
        let opt = |x: u64| all.then_some(x);
        PlaceView {
            key: PlaceKey { seq: n, nonce: 2 },
            user_proven: false,
            status,
            user_id: None,
            position: opt(n),
            queue_length: n,
            eta_sec: opt(n / 2),
            waited_sec: n / 3,
            joined_at: 0,
            enter_within_sec: opt(n / 5),
            entered_at: None,
            session_ends_at: None,
            session_expires_in_sec: opt(n / 7),
            eta_range: all.then_some((n / 11, n / 13)),
            poll_after_sec: n / 17,
            paused: all,
            opens_in_sec: opt(n / 19),
            prequeue_rank: opt(n / 23),
            replaced: None,
        }
    }

    /// Places with each optional field present and absent, in every state, with small,
    /// large and extreme numbers, event ids that need escaping and that do not, with and
    /// without an announcement.
    fn places() -> Vec<Place> {
        let mut out = Vec::new();
        let states = [
            PlaceState::Waiting,
            PlaceState::Admitted,
            PlaceState::Active,
        ];
        let ids = [
            "concert-a",
            "",
            "q\"uote\\back",
            "tab\there\u{1}",
            "é-ü",
            "e",
        ];
        for status in states {
            for n in [0, 7, 1_234_567, u64::MAX] {
                for all in [false, true] {
                    for id in ids {
                        let v = view(status, n, all);
                        let mut p = Place::new(id.to_string(), &v);
                        out.push(Place::new(id.to_string(), &v));
                        p.announcement = Some(AnnouncementBody {
                            message: serde_json::from_value(
                                serde_json::json!({"en": "hi \"there\"", "ko": "안녕"}),
                            )
                            .unwrap(),
                            at: "2026-11-23T00:00:00Z".into(),
                        });
                        out.push(p);
                    }
                }
            }
        }
        // One optional field at a time, so each is seen alone too.
        for k in 0..6 {
            let mut p = Place::new("ev".into(), &view(PlaceState::Waiting, 3, false));
            let f = [
                &mut p.position,
                &mut p.opens_in_sec,
                &mut p.prequeue_rank,
                &mut p.enter_within_sec,
                &mut p.session_expires_in_sec,
                &mut p.eta_low_sec,
            ];
            for (i, x) in f.into_iter().enumerate() {
                *x = (i == k).then_some(41);
            }
            out.push(p);
        }
        let mut pre = Place::new("ev".into(), &view(PlaceState::Waiting, 3, true));
        pre.status = ShownStatus::PreQueue;
        out.push(pre);
        out
    }

    #[test]
    fn a_place_is_written_byte_for_byte_as_serde_writes_it() {
        let all = places();
        assert!(all.len() > 200);
        for p in &all {
            let mut ours = Vec::new();
            p.write_json(&mut ours);
            let serde = serde_json::to_vec(p).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(serde).unwrap()
            );
        }
    }

    /// `JsonAnswer`'s headers, and `Cache-Control: no-store`: a place's answer is one
    /// person's.
    fn no_store(r: Response) -> Response {
        let mut r = r;
        r.headers_mut()
            .insert(header::CACHE_CONTROL, super::super::NO_STORE.clone());
        r
    }

    /// The whole answer (status, headers, body) is `JsonAnswer`'s, itself `axum::Json`'s,
    /// with `no-store`.
    #[tokio::test]
    async fn the_status_answer_is_what_json_answer_answers() {
        let body = |r: Response| async {
            axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap()
        };
        for (p, again) in places().into_iter().zip(places()) {
            let (ours, theirs) = (
                PlaceAnswer(p).into_response(),
                no_store(JsonAnswer(again).into_response()),
            );
            assert_eq!(ours.status(), theirs.status());
            assert_eq!(ours.headers(), theirs.headers());
            assert_eq!(body(ours).await, body(theirs).await);
        }
    }

    /// The join answer is `JsonAnswer(Joined)`'s (status, headers with `no-store`, bytes)
    /// for every place above, with tokens as issued.
    #[tokio::test]
    async fn the_join_answer_is_what_json_answer_answers() {
        let body = |r: Response| async {
            axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap()
        };
        let issuer = crate::tokens::WaitingTokens::new([7; 32]);
        let tokens: Vec<String> = ["ev", "concert-a", "é-ü"]
            .iter()
            .zip([0, 7, u64::MAX])
            .map(|(id, seq)| issuer.issue(id, crate::core::PlaceKey { seq, nonce: 99 }))
            .collect();
        let mut seen = 0;
        for (i, (p, again)) in places().into_iter().zip(places()).enumerate() {
            let t = tokens[i % tokens.len()].as_str();
            let (ours, theirs) = (
                JoinedAnswer(Joined {
                    waiting_token: t.into(),
                    place: p,
                })
                .into_response(),
                no_store(
                    JsonAnswer(Joined {
                        waiting_token: t.into(),
                        place: again,
                    })
                    .into_response(),
                ),
            );
            assert_eq!(ours.status(), theirs.status());
            assert_eq!(ours.headers(), theirs.headers());
            assert_eq!(body(ours).await, body(theirs).await);
            seen += 1;
        }
        assert!(seen > 200);
    }
}
