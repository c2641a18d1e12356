//! The JSON bodies of every successful answer, one type per shape, in the order of
//! `docs/API.md`. Handlers build one of these and hand it to `Json`; none assembles JSON by
//! hand, so this file is the contract as the compiler sees it. Errors have their own body
//! in [`super::error`]; live messages are [`crate::live::LiveMessage`].
//!
//! Field order follows the contract's examples. An `Option` that the contract shows only in
//! some states is skipped when absent (`#[serde(skip_serializing_if)]`); one that the
//! contract always carries is written as `null`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::ser::{Error as _, SerializeMap, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use crate::core::schedule::{commitment, format_rfc3339, hex};
use crate::core::{
    Announcement, EndCause, EventConfig, EventFigures, InviteHolder, Millis, PlaceState, PlaceView,
    QueueingMethod, ShownStatus, Texts,
};
use crate::store::EventSnapshot;

// ---------------------------------------------------------------------------------------
// End-user API (`/api/v1/queue/…`, `/api/v1/session/…`)
// ---------------------------------------------------------------------------------------

/// What `status` answers, and `join` around its waiting token: the fields a waiting page
/// needs, present according to the place's state. Serialized by hand ([`Place::fields`]),
/// so that `join` writes the same fields after its token without serde's `flatten` (which
/// goes through a map: a third more work for the answer); the `serde` attributes here
/// describe the same fields to the OpenAPI schema.
#[derive(Debug, utoipa::ToSchema)]
pub struct Place {
    /// `pre-queue` (before the opening), `waiting`, `admitted` or `active`.
    #[schema(value_type = String, example = "waiting")]
    pub status: ShownStatus,
    pub event_id: String,
    /// The place's id: the number `GET /admin/events/{id}/prequeue` lists, so that its
    /// holder can check its rank against the published shuffle ("Auditing the shuffle").
    pub place_id: u64,
    /// Present while `waiting` (not under the `random` method: a lottery has no order).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// Present while `pre-queue`: seconds until the opening.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_in_sec: Option<u64>,
    /// Present for a place of the pre-queue once the sale opened: its rank in the shuffled
    /// pre-queue, among those of it still waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequeue_rank: Option<u64>,
    pub queue_length: u64,
    pub eta_sec: u64,
    /// The range of the wait (`null`, both: no basis for an estimate yet, or paused).
    pub eta_low_sec: Option<u64>,
    pub eta_high_sec: Option<u64>,
    /// When a polling client should ask again, in seconds.
    pub poll_after_sec: u64,
    pub paused: bool,
    pub waited_sec: u64,
    pub ready_for_entry: bool,
    /// Present while `admitted`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enter_within_sec: Option<u64>,
    /// Present while `active`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_expires_in_sec: Option<u64>,
    /// The operator's latest message (absent when there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announcement: Option<AnnouncementBody>,
}

/// An announcement as every answer shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AnnouncementBody {
    pub message: Texts,
    /// When it was posted (RFC 3339).
    pub at: String,
}

impl AnnouncementBody {
    pub fn new(a: &Announcement) -> Self {
        AnnouncementBody {
            message: a.message.clone(),
            at: format_rfc3339(a.at),
        }
    }
}

/// The end of a sale as every answer shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EndedBody {
    /// `sold_out`, `closed` or `cancelled`.
    #[schema(value_type = String, example = "sold_out")]
    pub reason: EndCause,
    pub message: Option<Texts>,
    /// When it ended (RFC 3339).
    pub at: String,
}

impl EndedBody {
    /// The sale's end at `now`, if it ended.
    pub fn of(c: &EventConfig, now: Millis) -> Option<Self> {
        c.sale_ended(now).map(|e| EndedBody {
            reason: e.reason,
            message: e.message.cloned(),
            at: format_rfc3339(e.at),
        })
    }
}

/// `POST /admin/events/{id}/announcement` and its `DELETE`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Announced {
    pub event_id: String,
    /// `null` once cleared.
    pub announcement: Option<AnnouncementBody>,
}

/// `POST /admin/events/{id}/end`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SaleEnded {
    pub event_id: String,
    pub ended: EndedBody,
    /// Places waiting just before it ended: they answer `TOKEN_NOT_FOUND` at once and are
    /// removed in the background, in batches.
    pub waiting: u64,
}

impl Place {
    pub fn new(event_id: String, v: &PlaceView) -> Self {
        Place {
            status: v.shown_status(),
            event_id,
            place_id: v.key.seq,
            position: v.position,
            opens_in_sec: v.opens_in_sec,
            prequeue_rank: v.prequeue_rank,
            queue_length: v.queue_length,
            eta_sec: v.eta_sec.unwrap_or(0),
            eta_low_sec: v.eta_range.map(|r| r.0),
            eta_high_sec: v.eta_range.map(|r| r.1),
            poll_after_sec: v.poll_after_sec,
            paused: v.paused,
            waited_sec: v.waited_sec,
            ready_for_entry: v.status == PlaceState::Admitted,
            enter_within_sec: v.enter_within_sec,
            session_expires_in_sec: v.session_expires_in_sec,
            announcement: None,
        }
    }
}

/// `POST /queue/join`: the waiting token, then the place's fields (serialized by hand, see
/// [`Place`]).
#[derive(Debug, utoipa::ToSchema)]
pub struct Joined {
    pub waiting_token: String,
    #[serde(flatten)]
    pub place: Place,
}

impl Place {
    /// How many fields [`Place::fields`] writes.
    fn field_count(&self) -> usize {
        let optional = [
            self.position.is_some(),
            self.opens_in_sec.is_some(),
            self.prequeue_rank.is_some(),
            self.enter_within_sec.is_some(),
            self.session_expires_in_sec.is_some(),
            self.announcement.is_some(),
        ];
        11 + optional.iter().filter(|&&b| b).count()
    }

    /// Writes the fields in the contract's order, leaving out the absent ones that the
    /// contract shows only in some states.
    fn fields<S: SerializeStruct>(&self, s: &mut S) -> Result<(), S::Error> {
        fn some<S: SerializeStruct, T: Serialize>(
            s: &mut S,
            key: &'static str,
            v: &Option<T>,
        ) -> Result<(), S::Error> {
            match v {
                Some(v) => s.serialize_field(key, v),
                None => s.skip_field(key),
            }
        }
        s.serialize_field("status", &self.status)?;
        s.serialize_field("event_id", &self.event_id)?;
        s.serialize_field("place_id", &self.place_id)?;
        some(s, "position", &self.position)?;
        some(s, "opens_in_sec", &self.opens_in_sec)?;
        some(s, "prequeue_rank", &self.prequeue_rank)?;
        s.serialize_field("queue_length", &self.queue_length)?;
        s.serialize_field("eta_sec", &self.eta_sec)?;
        s.serialize_field("eta_low_sec", &self.eta_low_sec)?;
        s.serialize_field("eta_high_sec", &self.eta_high_sec)?;
        s.serialize_field("poll_after_sec", &self.poll_after_sec)?;
        s.serialize_field("paused", &self.paused)?;
        s.serialize_field("waited_sec", &self.waited_sec)?;
        s.serialize_field("ready_for_entry", &self.ready_for_entry)?;
        some(s, "enter_within_sec", &self.enter_within_sec)?;
        some(s, "session_expires_in_sec", &self.session_expires_in_sec)?;
        some(s, "announcement", &self.announcement)
    }
}

impl Serialize for Place {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Place", self.field_count())?;
        self.fields(&mut s)?;
        s.end()
    }
}

impl Serialize for Joined {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Joined", 1 + self.place.field_count())?;
        s.serialize_field("waiting_token", &self.waiting_token)?;
        self.place.fields(&mut s)?;
        s.end()
    }
}

/// A JSON answer written into one buffer sized for the common answer, rather than through
/// `axum::Json`'s `BytesMut` writer (starting at 128 bytes, grown two or three times for a
/// place, each small write checked by `BufMut`). Same header and bytes as `axum::Json`.
pub struct JsonAnswer<T>(pub T);

impl<T: Serialize> IntoResponse for JsonAnswer<T> {
    fn into_response(self) -> Response {
        let mut buf = Vec::with_capacity(512);
        match serde_json::to_writer(&mut buf, &self.0) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                buf,
            )
                .into_response(),
            // As `axum::Json` answers it (our bodies do not fail to serialize).
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                )],
                e.to_string(),
            )
                .into_response(),
        }
    }
}

/// `POST /queue/enter`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Entered {
    /// Always `"granted"`: a refusal is an error answer.
    #[schema(value_type = String, example = "granted")]
    pub admission: &'static str,
    pub access_token: String,
    /// Always `"Bearer"`.
    #[schema(value_type = String, example = "Bearer")]
    pub token_type: &'static str,
    pub session_id: String,
    /// Seconds until the token's `exp` (the session's latest end in whole seconds), rounded
    /// up: at least 1, as the token is valid.
    pub expires_in: u64,
    /// That moment in Unix seconds (the token's `exp`).
    pub expires_at: u64,
    pub event_id: String,
}

/// `POST /queue/leave`, `DELETE /queue/leave`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Removed {
    /// `false` when the place had already ended.
    pub removed: bool,
}

/// `POST /queue/verify`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Verified {
    /// Always `true`: an invalid token is an error answer.
    pub valid: bool,
    pub event_id: String,
    /// The user id, or for an anonymous place its subject (the session), never null.
    pub user_id: String,
    /// `user_id` was proven by the join (a user token or the server key); `false` for a
    /// bare id anyone may have sent, and for an anonymous place.
    pub user_verified: bool,
    pub sub: String,
    pub session_id: String,
    pub expires_at: u64,
    pub session_expires_in_sec: Option<u64>,
}

/// `POST /session/complete`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Completed {
    pub completed: bool,
}

/// `GET /admin/events/{id}/prequeue`: a page of the pre-queue's place ids, in join order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Prequeue {
    pub event_id: String,
    pub place_ids: Vec<u64>,
    /// The `after` of the next page; `null` on the last one.
    pub next_after: Option<u64>,
}

/// `GET /queue/info`: public figures, no user data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct QueueInfo {
    pub event_id: String,
    pub name: String,
    pub queue_length: u64,
    pub admitted: u64,
    pub active: u64,
    pub capacity: u64,
    pub available_slots: u64,
    pub admitted_last_minute: u64,
    pub paused: bool,
    pub accept_joins: bool,
    /// The schedule: when the sale opens (RFC 3339, `null`: open) and how it admits.
    pub opens_at: Option<String>,
    #[schema(value_type = String, example = "fifo")]
    pub queueing_method: QueueingMethod,
    /// Before the opening: sha256 (hex) of the shuffle seed, so the seed published later
    /// is known to have been chosen before anyone joined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shuffle_commitment: Option<String>,
    /// From the opening: the seed (hex) the pre-queue was ordered by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shuffle_seed: Option<String>,
    /// When the sale ends by itself (RFC 3339); absent: no set end. (The three fields are
    /// absent rather than `null` when unset, so that the answer of an event that uses none
    /// of them is what it was before they existed.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closes_at: Option<String>,
    /// How the sale ended; absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<EndedBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announcement: Option<AnnouncementBody>,
}

impl QueueInfo {
    pub fn new(s: EventSnapshot, now: Millis) -> Self {
        let (c, f) = (s.config, s.figures);
        let seed = c
            .opens_at
            .and(c.event_secret)
            .map(|secret| secret.shuffle_seed());
        // Reached by this clock or recorded as reached (by any node's): once published,
        // the seed is never withdrawn for a commitment again.
        let ahead = c.opening_ahead(now).is_some();
        let ended = EndedBody::of(&c, now);
        QueueInfo {
            opens_at: c.opens_at.map(format_rfc3339),
            queueing_method: c.queueing_method,
            shuffle_commitment: seed.filter(|_| ahead).map(|s| commitment(&s)),
            shuffle_seed: seed.filter(|_| !ahead).map(|s| hex(&s)),
            event_id: s.event_id,
            name: c.name,
            queue_length: f.waiting,
            admitted: f.admitted,
            active: f.active,
            capacity: f.capacity,
            available_slots: f.available_slots,
            admitted_last_minute: f.admitted_last_minute,
            paused: c.paused,
            accept_joins: c.accept_joins,
            closes_at: c.closes_at.map(format_rfc3339),
            ended,
            announcement: c.announcement.as_ref().map(AnnouncementBody::new),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Public event list (`/api/v1/events`), read by the pages
// ---------------------------------------------------------------------------------------

/// The public face of an event: what a person deciding to join may see. No user data, no
/// admin settings beyond where the line leads.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PublicEvent {
    pub event_id: String,
    pub name: String,
    pub queue_length: u64,
    pub admitted: u64,
    pub active: u64,
    pub capacity: u64,
    pub admitted_last_minute: u64,
    pub paused: bool,
    pub accept_joins: bool,
    pub target_url: Option<String>,
    /// How long a closed page keeps its place: the waiting room tells people.
    pub waiting_idle_sec: u32,
    /// The look and words of the waiting page (`core::look`), each `null` when not set.
    pub title: Option<Texts>,
    pub headline: Option<Texts>,
    pub note: Option<Texts>,
    pub turn_message: Option<Texts>,
    pub theme_color: Option<String>,
    pub logo_url: Option<String>,
    /// As in `GET /queue/info` (absent when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closes_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<EndedBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announcement: Option<AnnouncementBody>,
}

impl PublicEvent {
    pub fn new(s: EventSnapshot, now: Millis) -> Self {
        let (c, f) = (s.config, s.figures);
        let ended = EndedBody::of(&c, now);
        PublicEvent {
            event_id: s.event_id,
            name: c.name,
            queue_length: f.waiting,
            admitted: f.admitted,
            active: f.active,
            capacity: f.capacity,
            admitted_last_minute: f.admitted_last_minute,
            paused: c.paused,
            accept_joins: c.accept_joins,
            target_url: c.target_url,
            waiting_idle_sec: c.waiting_idle_sec,
            title: c.look.title,
            headline: c.look.headline,
            note: c.look.note,
            turn_message: c.look.turn_message,
            closes_at: c.closes_at.map(format_rfc3339),
            ended,
            announcement: c.announcement.as_ref().map(AnnouncementBody::new),
            theme_color: c.look.theme_color,
            logo_url: c.look.logo_url,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Admin API (`/api/v1/admin/…`)
// ---------------------------------------------------------------------------------------

/// An event's settings as every read answers them: the stored config, field for field and
/// in its order, except that `user_token_secret` and `bypass_secret` are never shown;
/// `user_token_secret_set` and `bypass_secret_set` (whether one is stored) stand in their place.
#[derive(Debug)]
pub struct Settings(pub EventConfig);

impl From<EventConfig> for Settings {
    fn from(c: EventConfig) -> Self {
        Settings(c)
    }
}

/// The stored config's JSON fields in their order (a `serde_json::Map` would sort them).
struct OrderedFields(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for OrderedFields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedFields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<OrderedFields, A::Error> {
                let mut out = Vec::new();
                while let Some(kv) = m.next_entry()? {
                    out.push(kv);
                }
                Ok(OrderedFields(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl Serialize for Settings {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let json = serde_json::to_string(&self.0).map_err(S::Error::custom)?;
        let OrderedFields(fields) = serde_json::from_str(&json).map_err(S::Error::custom)?;
        let mut m = s.serialize_map(Some(fields.len()))?;
        for (k, v) in fields {
            if k == "event_secret" || k == "opening_reached" || k == "end_seen_at" {
                // The secret is behind the shuffle seed and the lottery: never shown. The
                // records of the opening and of the end are the store's own (answered
                // through the queue's `shuffle_seed`, `ended` and the places' status).
                continue;
            }
            if k == "user_token_secret" {
                m.serialize_entry("user_token_secret_set", &!v.is_null())?;
            } else if k == "bypass_secret" {
                m.serialize_entry("bypass_secret_set", &!v.is_null())?;
            } else if k == "closes_at" {
                // Times in RFC 3339, as they are set (stored in ms).
                m.serialize_entry(&k, &self.0.closes_at.map(format_rfc3339))?;
            } else if k == "ended" {
                let e = self.0.ended.as_ref().map(|e| EndedBody {
                    reason: e.reason,
                    message: e.message.clone(),
                    at: format_rfc3339(e.at),
                });
                m.serialize_entry(&k, &e)?;
            } else if k == "announcement" {
                let a = self.0.announcement.as_ref().map(AnnouncementBody::new);
                m.serialize_entry(&k, &a)?;
            } else {
                m.serialize_entry(&k, &v)?;
            }
        }
        m.end()
    }
}

/// A stored config with its id, as `PUT /events/{id}`, pause and resume answer it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventSettings {
    pub event_id: String,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub config: Settings,
}

/// Config and figures side by side in one flat object (their field names do not overlap),
/// as `GET /events/{id}` and each row of `GET /events` answer them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AdminEvent {
    pub event_id: String,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub config: Settings,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub figures: EventFigures,
}

impl AdminEvent {
    pub fn new(s: EventSnapshot) -> Self {
        AdminEvent {
            event_id: s.event_id,
            config: s.config.into(),
            figures: s.figures,
        }
    }
}

/// `POST /events/{id}/invites` (as JSON; the CSV download lists the same codes).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Invites {
    pub codes: Vec<String>,
}

/// `GET /events/{id}/invites`: a page of the event's codes, in code order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InviteList {
    pub invites: Vec<InviteRow>,
    /// The `after` of the next page; `null` on the last one.
    pub next_after: Option<String>,
}

/// One invite code and its state.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InviteRow {
    pub code: String,
    pub state: InviteState,
    /// The proven user the code is bound to (who may rejoin with it); absent when it is
    /// unused or bound to the one place an anonymous or unproven join made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

/// `unused`: no join took the code yet; `bound`: it seats someone (nobody else can use it).
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InviteState {
    Unused,
    Bound,
}

impl InviteState {
    pub fn as_str(self) -> &'static str {
        match self {
            InviteState::Unused => "unused",
            InviteState::Bound => "bound",
        }
    }
}

impl From<(String, Option<InviteHolder>)> for InviteRow {
    fn from((code, holder): (String, Option<InviteHolder>)) -> Self {
        let (state, user_id) = match holder {
            None => (InviteState::Unused, None),
            Some(InviteHolder::User(u)) => (InviteState::Bound, Some(u.into())),
            Some(InviteHolder::Place(_)) => (InviteState::Bound, None),
        };
        InviteRow {
            code,
            state,
            user_id,
        }
    }
}

/// `DELETE /events/{id}`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Deleted {
    pub deleted: bool,
    pub event_id: String,
}

/// `POST /events/{id}/clear`
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Cleared {
    /// How many waiting places were removed.
    pub cleared: u64,
}

/// `GET /events/{id}/history`: the event's samples, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HistoryBody {
    pub event_id: String,
    /// Seconds between samples as asked (`step`); gaps mean the server was not running.
    pub step_sec: u64,
    #[schema(value_type = Vec<Object>)]
    pub samples: Vec<crate::history::Sample>,
}

/// One row of `GET /stats`. The names are the contract's (`used_count` counts completed
/// sessions), not the figures' own.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatsRow {
    pub event_id: String,
    pub name: String,
    pub waiting_count: u64,
    pub active_count: u64,
    pub used_count: u64,
    pub average_wait_time_sec: f64,
}

impl StatsRow {
    pub fn new(s: EventSnapshot) -> Self {
        StatsRow {
            event_id: s.event_id,
            name: s.config.name,
            waiting_count: s.figures.waiting,
            active_count: s.figures.active,
            used_count: s.figures.completed,
            average_wait_time_sec: s.figures.avg_wait_sec,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Operations (`/healthz`, `/readyz`)
// ---------------------------------------------------------------------------------------

/// `GET /healthz` (`"ok"`) and `GET /readyz` (`"ready"`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    #[schema(value_type = String, example = "ok")]
    pub status: &'static str,
}

/// Tests: a place in `status`, third in a line of nine.
#[cfg(test)]
pub(crate) fn sample_view(status: PlaceState) -> PlaceView {
    use crate::core::PlaceKey;
    PlaceView {
        key: PlaceKey { seq: 1, nonce: 2 },
        user_proven: false,
        status,
        user_id: None,
        position: Some(3),
        queue_length: 9,
        eta_sec: None,
        waited_sec: 4,
        joined_at: 0,
        enter_within_sec: None,
        entered_at: None,
        session_ends_at: None,
        session_expires_in_sec: None,
        eta_range: None,
        poll_after_sec: 5,
        paused: false,
        opens_in_sec: None,
        prequeue_rank: None,
        replaced: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn view(status: PlaceState) -> PlaceView {
        sample_view(status)
    }

    /// Absent state-dependent fields are left out rather than written as `null`, and a
    /// missing ETA is written as 0, as the hand-built bodies did.
    #[test]
    fn a_place_shows_only_the_fields_of_its_state() {
        let v = serde_json::to_value(Place::new("ev".into(), &view(PlaceState::Waiting))).unwrap();
        assert_eq!(
            v,
            json!({"status": "waiting", "event_id": "ev", "place_id": 1, "position": 3,
                   "queue_length": 9,
                   "eta_sec": 0, "eta_low_sec": null, "eta_high_sec": null,
                   "poll_after_sec": 5, "paused": false, "waited_sec": 4,
                   "ready_for_entry": false})
        );
        let mut admitted = view(PlaceState::Admitted);
        admitted.position = None;
        admitted.enter_within_sec = Some(60);
        admitted.eta_range = Some((0, 0));
        let joined = Joined {
            waiting_token: "t".into(),
            place: Place::new("ev".into(), &admitted),
        };
        assert_eq!(
            serde_json::to_value(joined).unwrap(),
            json!({"waiting_token": "t", "status": "admitted", "event_id": "ev",
                   "place_id": 1, "queue_length": 9, "eta_sec": 0, "eta_low_sec": 0, "eta_high_sec": 0,
                   "poll_after_sec": 5, "paused": false, "waited_sec": 4,
                   "ready_for_entry": true, "enter_within_sec": 60})
        );
    }

    /// The hand-written serialization writes what serde's derive (and `flatten` for
    /// `join`) wrote: the same keys in the same order, every optional field present here.
    #[test]
    fn join_and_status_bodies_are_byte_for_byte_the_derived_ones() {
        let mut v = view(PlaceState::Waiting);
        v.opens_in_sec = Some(11);
        v.prequeue_rank = Some(12);
        v.enter_within_sec = Some(13);
        v.session_expires_in_sec = Some(14);
        v.eta_range = Some((1, 2));
        let mut place = Place::new("ev".into(), &v);
        place.announcement = Some(AnnouncementBody {
            message: serde_json::from_value(json!({"en": "hi \"there\""})).unwrap(),
            at: "2026-11-23T00:00:00Z".into(),
        });
        let fields = concat!(
            r#""status":"pre-queue","event_id":"ev","place_id":1,"position":3,"opens_in_sec":11,"#,
            r#""prequeue_rank":12,"queue_length":9,"eta_sec":0,"eta_low_sec":1,"#,
            r#""eta_high_sec":2,"poll_after_sec":5,"paused":false,"waited_sec":4,"#,
            r#""ready_for_entry":false,"enter_within_sec":13,"session_expires_in_sec":14,"#,
            r#""announcement":{"message":{"en":"hi \"there\""},"at":"2026-11-23T00:00:00Z"}"#
        );
        assert_eq!(
            serde_json::to_string(&place).unwrap(),
            format!("{{{fields}}}")
        );
        let joined = Joined {
            waiting_token: "t.k".into(),
            place,
        };
        assert_eq!(
            serde_json::to_string(&joined).unwrap(),
            format!(r#"{{"waiting_token":"t.k",{fields}}}"#)
        );
    }

    /// `JsonAnswer` answers as `axum::Json` does: the same header and bytes.
    #[tokio::test]
    async fn a_json_answer_is_what_axum_json_answers() {
        let place = || {
            let mut p = Place::new("ev".into(), &view(PlaceState::Waiting));
            p.event_id = "e".repeat(600); // past the buffer's first size
            p
        };
        let ours = JsonAnswer(place()).into_response();
        let axums = axum::Json(place()).into_response();
        assert_eq!(ours.status(), axums.status());
        assert_eq!(ours.headers(), axums.headers());
        let body = |r: Response| async {
            axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap()
        };
        assert_eq!(body(ours).await, body(axums).await);
    }

    /// Config and figures flatten into one object beside the id, with no name clash.
    #[test]
    fn an_admin_event_is_one_flat_object() {
        let snap = EventSnapshot {
            event_id: "ev".into(),
            config: EventConfig::default(),
            figures: EventFigures::default(),
        };
        let config = serde_json::to_value(Settings(snap.config.clone())).unwrap();
        let figures = serde_json::to_value(&snap.figures).unwrap();
        let v = serde_json::to_value(AdminEvent::new(snap)).unwrap();
        let obj = v.as_object().unwrap();
        let (c, f) = (config.as_object().unwrap(), figures.as_object().unwrap());
        assert_eq!(obj.len(), 1 + c.len() + f.len(), "{v}");
        assert_eq!(obj["event_id"], "ev");
        assert!(c.iter().chain(f.iter()).all(|(k, x)| &obj[k] == x));
    }

    /// The user-token secret is stored but never shown; whether one is set is.
    #[test]
    fn settings_never_show_the_user_token_secret() {
        let secret = "s".repeat(40);
        let mut c = EventConfig {
            user_token_secret: Some(secret.clone()),
            ..EventConfig::default()
        };
        let bypass = "b".repeat(20);
        c.gate.bypass_secret = Some(bypass.clone());
        let text = serde_json::to_string(&EventSettings {
            event_id: "ev".into(),
            config: c.into(),
        })
        .unwrap();
        assert!(!text.contains(&secret), "{text}");
        assert!(!text.contains("\"user_token_secret\""), "{text}");
        assert!(text.contains("\"user_token_secret_set\":true"), "{text}");
        assert!(!text.contains(&bypass), "{text}");
        assert!(text.contains("\"bypass_secret_set\":true"), "{text}");
        // Field order is the config's own.
        assert!(text.find("\"name\"").unwrap() < text.find("\"max_active\"").unwrap());
    }
}
