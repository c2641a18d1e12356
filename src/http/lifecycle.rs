//! The admin's calls around the sale itself (`core::lifecycle`): the announcement to everyone
//! waiting, and the end of the sale; and the `reason` that end-user errors carry after it.
//!
//! Both calls are settings updates of the store (`update_event`; the end through
//! `end_sale`, the same update that also counts the places it ends), never creations: that
//! is what makes them durable, shared by every node and told to every node's live followers
//! (the store's `EventChanged` notice). The waiting places of an ended sale answer
//! `TOKEN_NOT_FOUND` at once and are removed by the scheduler's ticks in bounded batches.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use super::body::{Announced, AnnouncementBody, EndedBody, SaleEnded};
use super::error::{AppError, AppResult};
use super::extract::{AppJson, AppPath, NoBody};
use super::guard::Caller;
use super::records;
use crate::app::AppState;
use crate::audit::{Action, Change};
use crate::core::lifecycle::check_message;
use crate::core::{validate_event_id, Announcement, EndCause, EventPatch, SaleEnd, Texts};

/// `POST /admin/events/{id}/announcement`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnnounceBody {
    #[serde(deserialize_with = "crate::core::config::object")]
    pub message: Texts,
}

/// `POST /admin/events/{id}/end`
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndBody {
    pub reason: EndCause,
    #[serde(default, deserialize_with = "crate::core::config::optional_object")]
    pub message: Option<Texts>,
}

/// A message that is given needs a text (the announcement's rule, which the end's message
/// follows too: `{}` or blank texts are refused, not read as "no message").
fn needed_message(m: &Texts) -> AppResult<Texts> {
    check_message("message", m)?
        .ok_or_else(|| AppError::invalid("message needs a text in ko or en"))
}

fn event_id(AppPath(id): AppPath<String>) -> AppResult<String> {
    validate_event_id(&id)?;
    Ok(id)
}

/// The audit's record of a change: what it replaced (read just before it) and what it set.
fn change(field: &str, old: &impl serde::Serialize, new: &impl serde::Serialize) -> Vec<Change> {
    vec![Change {
        field: field.into(),
        old: serde_json::to_value(old).unwrap_or_default(),
        new: serde_json::to_value(new).unwrap_or_default(),
    }]
}

/// The event's announcement as the audit records it (its message), before a change.
async fn announced_before(state: &AppState, id: &str, now: u64) -> AppResult<Option<Texts>> {
    let config = state.store.get_event(id, now).await?.config;
    Ok(config.announcement.map(|a| a.message))
}

/// `POST /events/{event_id}/announcement`: posts the message to everyone waiting (live
/// `announcement`, and `status`), replacing the previous one.
pub async fn announce(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    AppJson(body): AppJson<AnnounceBody>,
) -> AppResult<Json<Announced>> {
    let id = event_id(path)?;
    let _one = records::one_change_at_a_time(&id).await;
    let message = needed_message(&body.message)?;
    let a = Announcement {
        message,
        at: state.clock.now(),
    };
    let old = announced_before(&state, &id, a.at).await?;
    let patch = EventPatch {
        announcement: Some(Some(a.clone())),
        ..EventPatch::default()
    };
    state.store.update_event(&id, &patch, a.at).await?;
    // As after a `PUT`: this node's next read of the event has the announcement.
    state.events.forget(&id);
    let body = AnnouncementBody::new(&a);
    let changes = change("announcement", &old, &body.message);
    records::audit(&state, &caller, Action::Announce, &id, changes, None).await;
    Ok(Json(Announced {
        event_id: id,
        announcement: Some(body),
    }))
}

/// `DELETE /events/{event_id}/announcement`: no announcement any more (pushed as
/// `announcement` with `message: null`).
pub async fn clear_announcement(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    _: NoBody,
) -> AppResult<Json<Announced>> {
    let id = event_id(path)?;
    let _one = records::one_change_at_a_time(&id).await;
    let patch = EventPatch {
        announcement: Some(None),
        ..EventPatch::default()
    };
    let now = state.clock.now();
    let old = announced_before(&state, &id, now).await?;
    state.store.update_event(&id, &patch, now).await?;
    state.events.forget(&id);
    let changes = change("announcement", &old, &serde_json::Value::Null);
    records::audit(&state, &caller, Action::Announce, &id, changes, None).await;
    Ok(Json(Announced {
        event_id: id,
        announcement: None,
    }))
}

/// `POST /events/{event_id}/end`: ends the sale now. Joins answer `409 EVENT_CLOSED`, the
/// waiting places end (live `ended`), admitted and active places may finish. Calling it
/// again changes the reason and message, not the moment.
pub async fn end(
    State(state): State<AppState>,
    caller: Caller,
    path: AppPath<String>,
    AppJson(body): AppJson<EndBody>,
) -> AppResult<Json<SaleEnded>> {
    let id = event_id(path)?;
    // Checked like an announcement's (API.md): given, it needs a text, so `{}` or blank
    // texts are refused rather than read as "no message" on a call that cannot be undone.
    let message = body.message.as_ref().map(needed_message).transpose()?;
    let _one = records::one_change_at_a_time(&id).await;
    let now = state.clock.now();
    // What the end replaced and the places it ended are read by the step that applies it:
    // a join landing between a separate read and the end would be ended but not counted,
    // and once ended the scheduler may remove the places at any moment.
    let end = SaleEnd {
        reason: body.reason,
        message,
        at: now,
    };
    let applied = state.store.end_sale(&id, end, now).await?;
    state.events.forget(&id);
    let old = EndedBody::of(&applied.before, now);
    let waiting = applied.waiting;
    let ended = EndedBody::of(&applied.config, now)
        .ok_or_else(|| AppError::Internal("an ended sale reads as running".into()))?;
    let changes = change("ended", &old, &ended);
    records::audit(&state, &caller, Action::End, &id, changes, Some(waiting)).await;
    Ok(Json(SaleEnded {
        event_id: id,
        ended,
        waiting,
    }))
}

/// Adds `error.reason` to `TOKEN_NOT_FOUND` and `EVENT_CLOSED` when the event's sale has
/// ended, so a client tells "sold out" from "your place lapsed". The settings come from
/// this node's catalog (no store call once it knows of the end). Its copy may be older
/// than the end, until the store's change notice reaches this node (on Redis, another
/// node's end): when the copy says the sale runs, the store's settings decide, so every
/// node answers the reason from the end on. Not this node's clock alone: the settings the
/// store answers carry its record that an operation (on any node) found the sale over by
/// `closes_at` (`EventConfig::end_seen_at`), the record by which the store itself refused,
/// so a node whose clock is behind that end gives the reason too. That read happens only on
/// these two errors and only while the copy says the sale runs.
pub async fn explain(state: &AppState, event_id: &str, e: AppError) -> AppError {
    if !matches!(e, AppError::TokenNotFound | AppError::EventClosed) {
        return e;
    }
    let now = state.clock.now();
    let reason = match state.events.config(event_id, now).await {
        Ok(c) => match c.sale_ended(now) {
            Some(end) => Some(end.reason),
            None => match state.store.get_event(event_id, now).await {
                Ok(fresh) => fresh.config.sale_ended(now).map(|end| end.reason),
                Err(_) => None,
            },
        },
        Err(_) => None,
    };
    match reason {
        Some(r) => AppError::SaleEnded(Box::new(e), r.as_str()),
        None => e,
    }
}
