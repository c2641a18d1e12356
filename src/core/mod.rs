//! The queue rules, pure: no I/O, no clock. Every operation takes the current time as an
//! argument, so the rules are unit- and property-tested with a fake clock and every backend
//! applies exactly the same transitions.
//!
//! - [`config`]: event settings and their validation.
//! - [`rank`]: the Fenwick tree behind exact O(log n) positions.
//! - [`queue`]: [`EventQueue`], the state machine of one event's places.
//! - [`places`]: how the queue stores its places (by sequence, and by user).
//! - [`pace`]: the admission pace behind ETAs, and the token bucket of `admit_per_minute`.
//! - [`view`]: what clients and admins are told (place views, event figures), computed from
//!   raw facts so that every backend answers with the same arithmetic.

pub mod config;
pub mod pace;
mod places;
pub mod queue;
pub mod rank;
pub mod view;

pub use config::{validate_event_id, EventConfig, EventPatch};
pub use pace::{Pace, RATE_WINDOW_MS};
pub use queue::{Effect, EndReason, EventQueue, QueueMeta, RestoredPlace, EXPIRED_RETENTION_MS};
pub use view::{EventCounts, EventFigures, HeadEntry, PlaceFacts, PlaceState, PlaceView, Timeouts};

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
}

/// The identity of a place inside its event, as carried by tokens: the join sequence number
/// (its order in the queue) and a 128-bit random nonce that a new place with a reused
/// sequence number (after an event was deleted and created again) cannot match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlaceKey {
    pub seq: u64,
    pub nonce: u128,
}
