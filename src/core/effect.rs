//! The state changes an operation on [`super::EventQueue`] reports, in order: the durable
//! store writes them to its journal, the notifier turns them into notices for live
//! clients, and telemetry counts them. The Redis store decodes the same changes from its
//! script's answers.

use serde::Serialize;

#[cfg(doc)]
use super::EXPIRED_RETENTION_MS;
use super::{ItemState, Millis};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndReason {
    Left,
    Completed,
    Expired,
    Cleared,
    /// Waiting when the sale ended (`closes_at` or the admin's `end`).
    Closed,
}

/// One state change, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Joined {
        seq: u64,
        nonce: u128,
        user_id: Option<Box<str>>,
        /// The joiner proved it is `user_id` (never for an anonymous place).
        proven: bool,
        metadata: Option<Box<str>>,
        at: Millis,
    },
    Admitted {
        seq: u64,
        at: Millis,
    },
    Entered {
        seq: u64,
        at: Millis,
    },
    Ended {
        seq: u64,
        nonce: u128,
        reason: EndReason,
        /// When the place ended: its deadline, for an expiry.
        at: Millis,
        /// When the queue ended it: the operation's time, later than `at` when an expiry
        /// is noticed late. An expired place answers `TOKEN_EXPIRED` for
        /// [`EXPIRED_RETENTION_MS`] from this moment, so a restored store must count from
        /// it too.
        noticed_at: Millis,
    },
    /// An expired place's token stops answering `TOKEN_EXPIRED` (its retention is over).
    Forgotten {
        seq: u64,
    },
    /// New invite codes, none of them seating anyone yet.
    Invited {
        codes: Vec<Box<str>>,
    },
    /// An invite code now seats `holder`, for good.
    InviteBound {
        code: Box<str>,
        holder: InviteHolder,
    },
    /// An inventory item is now in `state` (added, held, released or sold).
    Item {
        id: Box<str>,
        state: ItemState,
    },
    /// A session was extended: `count` extensions so far, adding `extra_ms` in all to its
    /// maximum.
    Extended {
        seq: u64,
        count: u32,
        extra_ms: Millis,
    },
}

/// Whom an invite code seats: a user (who may rejoin with it), or, for a join without a
/// user id, the one place it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum InviteHolder {
    User(Box<str>),
    Place(u64),
}
