//! The end of a sale and the operator's announcement: what an event's settings say about
//! them, and their checks. Pure, like the rest of the core.
//!
//! A sale ends in one of two ways: at `closes_at` (reason [`EndCause::Closed`]), or by the
//! admin's `end` call (any [`EndCause`], with an optional message), which is recorded in the
//! settings as [`SaleEnd`]. Either way the queue rules then (see `queue.rs`):
//! - refuse joins with `EVENT_CLOSED`;
//! - admit nobody from the queue, and answer a waiting place as gone (`TOKEN_NOT_FOUND`)
//!   from that instant, whether or not the sweep removed it yet;
//! - remove the waiting places in bounded batches of [`END_BATCH`], one per tick, so that
//!   ending a queue of a million places is many short steps, never one long one (on Redis a
//!   script blocks the whole server while it runs);
//! - leave admitted and active places alone: their sessions may finish.
//!
//! Being recorded in the settings is what makes both durable and shared by every node, and
//! what tells every node's live followers (a settings change is a relayed notice).

use serde::{Deserialize, Serialize};

use super::look::Texts;
use super::{Millis, QueueError};

/// Most waiting places one tick ends after a sale ended. On Redis a batch is one script
/// (about 4 commands per place, the waiting sets trimmed in bulk) that holds the server
/// while it runs: measured at about 11 µs a place on a busy 2-core machine, so 500 keep a
/// batch near 5 ms, the `status` p99 budget. The scheduler runs the next one after its
/// shortest sleep (5 ms), so other requests go between batches; a million places end in
/// 2,000 ticks, about 20 s, while every one of them already answers as ended.
pub const END_BATCH: usize = 500;

/// Longest announcement or end message, in characters per language.
pub const MAX_MESSAGE_CHARS: usize = 500;

/// Why a sale ended, as answered in `reason` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    /// Everything was sold.
    SoldOut,
    /// The sale is over (also the reason of `closes_at`).
    Closed,
    /// The sale was called off.
    Cancelled,
}

impl EndCause {
    pub const fn as_str(self) -> &'static str {
        match self {
            EndCause::SoldOut => "sold_out",
            EndCause::Closed => "closed",
            EndCause::Cancelled => "cancelled",
        }
    }
}

/// A sale ended by the admin's `end` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaleEnd {
    pub reason: EndCause,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Texts>,
    /// When it ended (ms).
    pub at: Millis,
}

/// The operator's latest message to everyone waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    pub message: Texts,
    /// When it was posted (ms); also what tells one announcement from the next.
    pub at: Millis,
}

/// How an event's sale stands at one instant, if it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended<'a> {
    pub reason: EndCause,
    pub message: Option<&'a Texts>,
    pub at: Millis,
}

/// Whether the sale ended by `now`: the `end` call's record, else `closes_at` once reached.
pub fn sale_ended<'a>(
    ended: Option<&'a SaleEnd>,
    closes_at: Option<Millis>,
    now: Millis,
) -> Option<Ended<'a>> {
    if let Some(e) = ended {
        return Some(Ended {
            reason: e.reason,
            message: e.message.as_ref(),
            at: e.at,
        });
    }
    closes_at.filter(|&t| t <= now).map(|at| Ended {
        reason: EndCause::Closed,
        message: None,
        at,
    })
}

/// Refuses settings that would reopen a sale while places it ended are still waiting to be
/// removed (the sweep takes [`END_BATCH`] a tick): reopened, those places would be
/// waiting again, though each was already told the sale is over. Once the sweep is done
/// nobody is waiting, and `closes_at` may move later or be cleared.
pub fn reopen_allowed(
    old: Option<Ended<'_>>,
    new: Option<Ended<'_>>,
    waiting: u64,
) -> Result<(), QueueError> {
    if waiting > 0 && old.is_some() && new.is_none() {
        Err(QueueError::Invalid(REOPEN_LOCKED.into()))
    } else {
        Ok(())
    }
}

/// Why a reopening was refused.
pub const REOPEN_LOCKED: &str =
    "closes_at cannot move past now or be cleared yet: the places the closed sale ended are still being removed (500 every few milliseconds); they stay ended, so try again in a few seconds";

/// Checks an announcement or end message: at most [`MAX_MESSAGE_CHARS`] per language, no
/// control characters but line breaks. Empty languages count as absent; `None` when neither
/// is left.
pub fn check_message(field: &str, t: &Texts) -> Result<Option<Texts>, QueueError> {
    super::look::check_texts(field, t, MAX_MESSAGE_CHARS, true)
}

/// Parses an RFC 3339 time (`2026-11-23T10:00:00+09:00`) into epoch milliseconds, with an
/// error that names the setting.
pub fn parse_rfc3339(field: &str, s: &str) -> Result<Millis, QueueError> {
    super::schedule::parse_rfc3339(s).ok_or_else(|| {
        QueueError::Invalid(format!(
            "{field} must be an RFC 3339 time between 1970 and 9999, like 2026-11-23T10:00:00+09:00"
        ))
    })
}

/// Epoch milliseconds as RFC 3339 in UTC: the one formatting `opens_at` uses too.
pub use super::schedule::format_rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_refuses_garbage() {
        let ms = parse_rfc3339("closes_at", "2026-11-23T10:00:00+09:00").unwrap();
        assert_eq!(ms, 1_795_395_600_000);
        assert_eq!(format_rfc3339(ms), "2026-11-23T01:00:00Z");
        assert_eq!(
            parse_rfc3339("x", &format_rfc3339(ms + 250)).unwrap(),
            ms + 250
        );
        for bad in [
            "tomorrow",
            "2026-11-23",
            "2026-11-23 10:00",
            "1969-12-31T23:59:59Z",
            "",
        ] {
            assert!(parse_rfc3339("closes_at", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_call_wins_over_the_clock() {
        let end = SaleEnd {
            reason: EndCause::SoldOut,
            message: None,
            at: 5,
        };
        assert_eq!(sale_ended(None, Some(10), 9), None);
        assert_eq!(
            sale_ended(None, Some(10), 10).unwrap().reason,
            EndCause::Closed
        );
        assert_eq!(
            sale_ended(Some(&end), Some(10), 1).unwrap().reason,
            EndCause::SoldOut
        );
        assert_eq!(sale_ended(None, None, u64::MAX), None);
    }

    #[test]
    fn a_sale_reopens_only_once_its_places_are_gone() {
        let closed = sale_ended(None, Some(10), 10);
        let open = sale_ended(None, None, 10);
        assert!(reopen_allowed(closed, open, 1).is_err());
        assert!(reopen_allowed(closed, sale_ended(None, Some(11), 10), 3).is_err());
        assert!(reopen_allowed(closed, open, 0).is_ok());
        assert!(reopen_allowed(closed, sale_ended(None, Some(5), 10), 3).is_ok());
        assert!(reopen_allowed(open, open, 3).is_ok());
        assert!(reopen_allowed(open, closed, 3).is_ok());
    }

    #[test]
    fn messages_are_bounded_and_plain() {
        let t = |en: &str| Texts {
            ko: None,
            en: Some(en.to_string()),
        };
        assert!(check_message("message", &t(&"x".repeat(MAX_MESSAGE_CHARS))).is_ok());
        assert!(check_message("message", &t(&"x".repeat(MAX_MESSAGE_CHARS + 1))).is_err());
        assert!(check_message("message", &t("a\u{7}b")).is_err());
        assert!(check_message("message", &t("two\nlines"))
            .unwrap()
            .is_some());
        assert_eq!(check_message("message", &t("  ")).unwrap(), None);
    }
}
