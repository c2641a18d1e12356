//! The queue rules, pure: no I/O, no clock. Every operation takes the current time as an
//! argument, so the rules are unit- and property-tested with a fake clock and every backend
//! applies exactly the same transitions.
//!
//! - [`config`]: event settings and their validation.
//! - [`gate`]: which requests an event gates in front of a site, and the bypass rules.
//! - [`look`]: an event's look and words (title, texts, colour, logo) and their checks.
//! - [`rank`]: the Fenwick tree behind exact O(log n) positions.
//! - [`queue`]: [`EventQueue`], the state machine of one event's places.
//! - [`effect`]: the state changes it reports ([`Effect`]).
//! - [`lifecycle`]: the end of a sale (`closes_at`, the `end` call) and announcements.
//! - `places`: how the queue stores its places (by sequence, and by user).
//! - [`pace`]: the admission pace behind ETAs, and the token bucket of `admit_per_minute`.
//! - [`view`]: what clients and admins are told (place views, event figures), computed from
//!   raw facts so that every backend answers with the same arithmetic.

pub mod config;
mod deadlines;
pub mod effect;
pub mod gate;
pub mod holds;
pub mod lifecycle;
pub mod look;
pub mod pace;
mod places;
pub mod queue;
pub mod rank;
pub mod schedule;
pub mod view;

pub use config::{validate_event_id, Access, EventConfig, EventPatch, RateLimits};
pub use effect::{Effect, EndReason, InviteHolder};
pub use gate::GateRules;
pub use holds::{HeldItem, Inventory, InventoryCounts, InventoryView, ItemState, SessionHolds};
pub use lifecycle::{Announcement, EndCause, Ended, SaleEnd, END_BATCH};
pub use look::{Look, Texts};
pub use pace::{Eta, Holds, Pace, RATE_WINDOW_MS};
pub use queue::{EventQueue, JoinProof, QueueMeta, RestoredPlace, EXPIRED_RETENTION_MS};
pub use schedule::{EventSecret, QueueingMethod};
pub use view::{
    poll_after_sec, EventCounts, EventFigures, HeadEntry, PlaceFacts, PlaceState, PlaceView,
    ReadyKept, ShownStatus, Timeouts, POLL_MAX_SEC, POLL_MIN_SEC,
};

/// Milliseconds since the Unix epoch. Wall-clock time, because deadlines must survive a
/// restart and be comparable across nodes.
pub type Millis = u64;

/// Why an operation on the queue was refused. Each maps to one API error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("{0}")]
    Invalid(String),
    #[error("unknown event")]
    EventNotFound,
    #[error("the event does not accept joins now")]
    EventClosed,
    #[error("the queue is full")]
    QueueFull,
    #[error("the place is gone")]
    TokenNotFound,
    #[error("the place expired")]
    TokenExpired,
    #[error("the place has not been admitted yet")]
    NotReady,
    #[error("the place holds no active session")]
    NoSession,
    /// A repeat join for a user who holds a place, without proof of being that user.
    #[error("this user already holds a place; prove the identity (waiting token, user token or server key) to get it back")]
    AlreadyJoined,
    /// An invite-only event, joined without an invite code.
    #[error("this event is invite-only: an invite code is required")]
    InviteRequired,
    /// An invite code that is unknown, or already seats someone else.
    #[error("the invite code is unknown or already used")]
    InviteInvalid,
    /// A hold of an item that another session holds, or that is sold.
    #[error("an item is held by another session or sold")]
    HoldConflict,
    /// A hold of an item the event's inventory does not have.
    #[error("an item is not in the event's inventory")]
    ItemNotFound,
    /// A hold past the event's `max_holds_per_session`.
    #[error("the session would hold more items than the event allows")]
    TooManyHolds,
    /// More items than one inventory takes.
    #[error("the inventory is full")]
    InventoryFull,
    /// A session extension past the event's `max_extensions`.
    #[error("the session cannot be extended any further")]
    ExtensionLimit,
    /// A `reject` event with no room for one more: it keeps no queue.
    #[error("the event is full and keeps no queue: try again later")]
    EventFull,
}

impl QueueError {
    /// Every error that carries no detail, so can be named by its code alone (what the
    /// Redis script answers). `Invalid` carries a message and is never sent by a script.
    pub const NAMED: [QueueError; 16] = [
        QueueError::EventNotFound,
        QueueError::EventClosed,
        QueueError::QueueFull,
        QueueError::TokenNotFound,
        QueueError::TokenExpired,
        QueueError::NotReady,
        QueueError::NoSession,
        QueueError::AlreadyJoined,
        QueueError::InviteRequired,
        QueueError::InviteInvalid,
        QueueError::HoldConflict,
        QueueError::ItemNotFound,
        QueueError::TooManyHolds,
        QueueError::InventoryFull,
        QueueError::ExtensionLimit,
        QueueError::EventFull,
    ];

    /// The code of [`QueueError::Invalid`], which is also the API's code of any bad input.
    pub const INVALID_CODE: &'static str = "INVALID_REQUEST";

    /// The stable code of the error: the one table of them, used by the HTTP error body
    /// and by the Redis store's decoder (the Lua scripts are checked against it by a test).
    /// (`NoSession` is answered as `ACCESS_DENIED` over HTTP; it has its own code for the
    /// Redis protocol.)
    pub const fn code(&self) -> &'static str {
        match self {
            QueueError::Invalid(_) => Self::INVALID_CODE,
            QueueError::EventNotFound => "EVENT_NOT_FOUND",
            QueueError::EventClosed => "EVENT_CLOSED",
            QueueError::QueueFull => "QUEUE_FULL",
            QueueError::TokenNotFound => "TOKEN_NOT_FOUND",
            QueueError::TokenExpired => "TOKEN_EXPIRED",
            QueueError::NotReady => "NOT_READY",
            QueueError::NoSession => "NO_SESSION",
            QueueError::AlreadyJoined => "ALREADY_JOINED",
            QueueError::InviteRequired => "INVITE_REQUIRED",
            QueueError::InviteInvalid => "INVITE_INVALID",
            QueueError::HoldConflict => "HOLD_CONFLICT",
            QueueError::ItemNotFound => "ITEM_NOT_FOUND",
            QueueError::TooManyHolds => "TOO_MANY_HOLDS",
            QueueError::InventoryFull => "INVENTORY_FULL",
            QueueError::ExtensionLimit => "EXTENSION_LIMIT",
            QueueError::EventFull => "EVENT_FULL",
        }
    }

    /// The error a code names, among [`Self::NAMED`].
    pub fn from_code(code: &str) -> Option<QueueError> {
        Self::NAMED.into_iter().find(|e| e.code() == code)
    }
}

/// The identity of a place inside its event, as carried by tokens: the join sequence number
/// (its order in the queue) and a 128-bit random nonce that a new place with a reused
/// sequence number (after an event was deleted and created again) cannot match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlaceKey {
    pub seq: u64,
    pub nonce: u128,
}

#[cfg(test)]
mod tests {
    use super::QueueError;

    #[test]
    fn every_named_error_reads_back_from_its_code() {
        let mut codes: Vec<_> = QueueError::NAMED.iter().map(QueueError::code).collect();
        for e in QueueError::NAMED {
            assert_eq!(QueueError::from_code(e.code()), Some(e));
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(
            codes.len(),
            QueueError::NAMED.len(),
            "two errors share a code"
        );
        assert_eq!(QueueError::from_code("INVALID_REQUEST"), None);
        assert_eq!(QueueError::from_code("OK"), None);
    }

    /// Fails to compile when a variant is added, as a reminder to list it in `NAMED`.
    #[allow(dead_code)]
    fn named_is_complete(e: QueueError) {
        match e {
            QueueError::Invalid(_) => {}
            QueueError::EventNotFound
            | QueueError::EventClosed
            | QueueError::QueueFull
            | QueueError::TokenNotFound
            | QueueError::TokenExpired
            | QueueError::NotReady
            | QueueError::NoSession
            | QueueError::AlreadyJoined
            | QueueError::InviteRequired
            | QueueError::InviteInvalid
            | QueueError::HoldConflict
            | QueueError::ItemNotFound
            | QueueError::TooManyHolds
            | QueueError::InventoryFull
            | QueueError::ExtensionLimit
            | QueueError::EventFull => {}
        }
    }
}
