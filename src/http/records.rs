//! The admin API's records (behind the admin token, like the rest of `/api/v1/admin`):
//! an event's figures over time (`GET /events/{id}/history`, as JSON or CSV) and the audit
//! list of admin changes (`GET /audit`); and [`audit`], which the mutating admin handlers
//! call once their change has happened.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::body::{HistoryBody, Settings};
use super::error::{AppError, AppResult};
use super::extract::{AppPath, AppQuery};
use super::guard::Caller;
use crate::app::AppState;
use crate::audit::{self, Action, Change, Entry};
use crate::core::{validate_event_id, EventConfig};
use crate::history::{Sample, STEP_MS};

/// Default `limit` of `GET /audit`.
pub const DEFAULT_AUDIT_LIMIT: usize = 100;
/// Longest `step` of a history, in seconds (one sample a day).
pub const MAX_STEP_SEC: u64 = 86_400;

/// Admin changes of one event, one at a time on this node: what a change reads first (the
/// settings before, for the audit), the change itself and its audit entry happen together,
/// so entries are listed in the order their changes took effect and a racing change cannot
/// make an update read as a creation. Locks by a hash of the event id, 64 of them, so the
/// table never grows; two events sharing one only wait for each other's admin calls.
pub async fn one_change_at_a_time(event_id: &str) -> tokio::sync::MutexGuard<'static, ()> {
    use std::hash::BuildHasher;
    static LOCKS: std::sync::LazyLock<(std::hash::RandomState, Vec<tokio::sync::Mutex<()>>)> =
        std::sync::LazyLock::new(|| {
            (
                std::hash::RandomState::new(),
                (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            )
        });
    LOCKS.1[(LOCKS.0.hash_one(event_id) % 64) as usize]
        .lock()
        .await
}

/// Records a change that happened: one log line and one audit entry (see [`crate::audit`]).
pub async fn audit(
    state: &AppState,
    caller: &Caller,
    action: Action,
    event_id: &str,
    changes: Vec<Change>,
    count: Option<u64>,
) {
    let entry = Entry {
        at: state.clock.now(),
        client: caller.ip.map(|ip| ip.to_string()),
        action,
        event_id: event_id.to_string(),
        changes,
        count,
    };
    audit::record(state.store.as_ref(), &entry).await;
}

/// The settings as the API shows them (the user-token secret hidden), as a JSON object:
/// what an audit entry compares, so a secret never reaches the log or the list.
pub fn settings_object(config: EventConfig) -> Map<String, Value> {
    match serde_json::to_value(Settings::from(config)) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// Only samples at or after this time (ms since the epoch).
    #[serde(default, deserialize_with = "blank_is_none")]
    pub since: Option<u64>,
    /// Seconds between the samples answered: the last sample of each span (at least 10).
    #[serde(default, deserialize_with = "blank_is_none")]
    pub step: Option<u64>,
    #[serde(default, deserialize_with = "blank_is_none")]
    pub format: Option<String>,
}

/// A query parameter given empty (`?since=&step=`, as API.md writes these URLs and as a
/// form sends an empty field) is the parameter left out: its default, not a `400`.
fn blank_is_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match Option::<String>::deserialize(d)?.as_deref() {
        None | Some("") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// `GET /events/{event_id}/history?since=&step=&format=json|csv`
pub async fn history(
    state: State<AppState>,
    path: AppPath<String>,
    q: AppQuery<HistoryQuery>,
) -> AppResult<Response> {
    let csv = match q.0.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(_) => return Err(AppError::invalid("format must be json or csv")),
    };
    answer_history(state, path, q, csv).await
}

/// `GET /events/{event_id}/history.csv?since=&step=`
pub async fn history_csv(
    state: State<AppState>,
    path: AppPath<String>,
    q: AppQuery<HistoryQuery>,
) -> AppResult<Response> {
    if q.0.format.as_deref().is_some_and(|f| f != "csv") {
        return Err(AppError::invalid("history.csv is always csv"));
    }
    answer_history(state, path, q, true).await
}

async fn answer_history(
    State(state): State<AppState>,
    AppPath(id): AppPath<String>,
    AppQuery(q): AppQuery<HistoryQuery>,
    csv: bool,
) -> AppResult<Response> {
    validate_event_id(&id)?;
    let step_sec = q.step.unwrap_or(STEP_MS / 1000);
    if !(STEP_MS / 1000..=MAX_STEP_SEC).contains(&step_sec) {
        return Err(AppError::invalid(format!(
            "step must be between {} and {MAX_STEP_SEC} seconds",
            STEP_MS / 1000
        )));
    }
    // An unknown (or just deleted) event is not found, whatever this node still holds;
    // one created since the last sample has an empty history.
    state.store.get_event(&id, state.clock.now()).await?;
    let samples = state
        .history
        .samples(&id, q.since.unwrap_or(0), step_sec * 1000)
        .unwrap_or_default();
    if !csv {
        return Ok(Json(HistoryBody {
            event_id: id,
            step_sec,
            samples,
        })
        .into_response());
    }
    let disposition = format!("attachment; filename=\"history-{id}.csv\"");
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        to_csv(&samples),
    )
        .into_response())
}

/// The samples as CSV: a header, then one row per sample, its time both as ms and as UTC.
fn to_csv(samples: &[Sample]) -> String {
    let mut out = String::from(
        "at,time_utc,waiting,admitted,active,capacity,admitted_last_minute,joins,admissions,completed,expired\n",
    );
    for s in samples {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{}\n",
            s.at,
            utc(s.at),
            s.waiting,
            s.admitted,
            s.active,
            s.capacity,
            s.admitted_last_minute,
            s.joins,
            s.admissions,
            s.completed,
            s.expired
        ));
    }
    out
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (days to a civil date after Howard
/// Hinnant's `civil_from_days`; a date crate for one column would be a heavy dependency).
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    #[serde(default, deserialize_with = "blank_is_none")]
    pub limit: Option<usize>,
    /// Only this event's entries.
    #[serde(default, deserialize_with = "blank_is_none")]
    pub event: Option<String>,
}

/// `GET /audit?limit=&event=`: the newest admin changes first.
pub async fn audit_list(
    State(state): State<AppState>,
    AppQuery(q): AppQuery<AuditQuery>,
) -> AppResult<Json<Vec<Entry>>> {
    let limit = q.limit.unwrap_or(DEFAULT_AUDIT_LIMIT);
    if !(1..=audit::KEEP).contains(&limit) {
        return Err(AppError::invalid(format!(
            "limit must be between 1 and {}",
            audit::KEEP
        )));
    }
    if let Some(id) = &q.event {
        validate_event_id(id)?;
    }
    let entries = audit::list(state.store.as_ref(), limit, q.event.as_deref()).await?;
    Ok(Json(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14T22:13:20Z");
        assert_eq!(utc(4_102_444_799_000), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn csv_has_a_header_and_a_row_per_sample() {
        let s = Sample {
            at: 1_700_000_000_000,
            waiting: 3,
            ..Sample::default()
        };
        let text = to_csv(&[s, s]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("at,time_utc,waiting,"));
        assert_eq!(
            lines[1],
            "1700000000000,2023-11-14T22:13:20Z,3,0,0,0,0,0,0,0,0"
        );
    }
}
