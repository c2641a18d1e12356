//! The proof-of-work gate of `join`: an event with `pow_difficulty` > 0 answers a join that
//! brings no valid, unspent solution with `428` and a fresh challenge (see [`crate::pow`]).
//!
//! The difficulty is read from this node's event catalog (no store call); a solution costs
//! one store call (its single-use claim) only once every stateless check passed, so
//! forged, expired or unsolved attempts never reach the store.

use serde::Deserialize;

use super::error::{AppError, AppResult};
use crate::app::AppState;
use crate::core::EventConfig;
use crate::pow::PowError;

/// `"pow": {"prefix", "nonce"}` of a join body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct PowSolution {
    pub prefix: String,
    pub nonce: String,
}

/// Lets the join through when the event asks no work (or is closed: the store then says
/// so, rather than asking for work that cannot help), or when `solution` solves one of our
/// challenges for this event and was not spent before, on any node.
///
/// `config`: the event's settings as the join handler read them (not read again here).
pub async fn check(
    state: &AppState,
    config: &EventConfig,
    event_id: &str,
    solution: Option<&PowSolution>,
) -> AppResult<()> {
    let now = state.clock.now();
    let rate = match config.pow_auto_above {
        Some(_) => state.join_rates.hit(event_id, now),
        None => 0,
    };
    // New challenges follow the load; a solution must meet the configured floor only, so
    // work done a moment before a surge still counts (it is single-use and expires anyway).
    let bits = crate::pow::difficulty(config.pow_difficulty, rate, config.pow_auto_above);
    if bits == 0 || !config.accept_joins {
        return Ok(());
    }
    // A sale that has ended answers `EVENT_CLOSED` (with the end's reason) without asking
    // for work, and from the settings in hand: without work asked, joins must not reach
    // the store either (a flood after the end would otherwise meet no cost at all).
    if let Some(end) = config.sale_ended(now) {
        return Err(AppError::SaleEnded(
            Box::new(AppError::EventClosed),
            end.reason.as_str(),
        ));
    }
    let fresh = || Box::new(state.pow.issue(event_id, bits, now));
    let Some(s) = solution else {
        return Err(AppError::PowRequired(fresh()));
    };
    let solved = state
        .pow
        .check(event_id, config.pow_difficulty, &s.prefix, &s.nonce, now)
        .map_err(|e| AppError::PowInvalid(e, fresh()))?;
    let first = state
        .store
        .claim_once(event_id, &solved.claim_key, solved.expires_at, now)
        .await?;
    if !first {
        return Err(AppError::PowInvalid(PowError::Reused, fresh()));
    }
    Ok(())
}
