//! The admin audit: every successful admin change (create, update, pause, resume, clear,
//! delete, invites) as one structured log line (target `waitroom::audit`) and one entry in
//! a bounded list that the store keeps ([`Store::append_audit`]: a file in the data dir of
//! the embedded store, one capped list shared by every node on Redis).
//!
//! Only changes that happened are recorded: a refused request (bad input, unknown event, a
//! store that is down) changed nothing, so it has no entry; a wrong admin token never
//! reaches a handler. An entry whose list write fails is still logged (the change itself
//! is done and is answered as done); the log line is the record of last resort.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::core::Millis;
use crate::store::{Store, StoreResult};

/// How many entries the list keeps (the oldest go first).
pub const KEEP: usize = 1000;

/// What an admin did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// `PUT /events/{id}` of an event that did not exist.
    Create,
    /// `PUT /events/{id}` of an existing event.
    Update,
    Pause,
    Resume,
    Clear,
    Delete,
    /// `POST /events/{id}/invites`.
    Invites,
    /// `PUT /events/{id}/inventory`.
    Inventory,
    /// `POST` or `DELETE /events/{id}/announcement`.
    Announce,
    /// `POST /events/{id}/end`.
    End,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Clear => "clear",
            Action::Delete => "delete",
            Action::Invites => "invites",
            Action::Inventory => "inventory",
            Action::Announce => "announce",
            Action::End => "end",
        }
    }
}

/// One setting that a change set: its value before (`null` for a created event) and after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Change {
    pub field: String,
    pub old: Value,
    pub new: Value,
}

/// One entry of the audit list, as `GET /api/v1/admin/audit` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AuditEntry)]
pub struct Entry {
    /// When the change was answered (ms since the epoch).
    #[schema(value_type = u64)]
    pub at: Millis,
    /// The client's address as the per-client limits see it (behind a trusted proxy, the
    /// address it forwarded); `null` when unknown (a test without a socket).
    pub client: Option<String>,
    pub action: Action,
    pub event_id: String,
    /// The settings a create or update set (old → new); empty for the other actions.
    #[serde(default)]
    pub changes: Vec<Change>,
    /// How many places `clear` removed, or how many codes `invites` made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// The fields of two settings objects that differ, by field name. `old` is `None`
/// for an event that did not exist (every field is then a change from `null`). A field
/// absent from one side is `null` there: a cleared setting that is left out when unset
/// (`closes_at`) is a change to `null`.
pub fn changes(old: Option<&Map<String, Value>>, new: &Map<String, Value>) -> Vec<Change> {
    let change = |field: &String, before: &Value, after: &Value| {
        (before != after).then(|| Change {
            field: field.clone(),
            old: before.clone(),
            new: after.clone(),
        })
    };
    let set = new.iter().filter_map(|(field, value)| {
        let before = old.map_or(&Value::Null, |o| o.get(field).unwrap_or(&Value::Null));
        change(field, before, value)
    });
    let cleared = old
        .into_iter()
        .flatten()
        .filter(|(field, _)| !new.contains_key(*field))
        .filter_map(|(field, before)| change(field, before, &Value::Null));
    set.chain(cleared).collect()
}

/// Logs `entry` (target `waitroom::audit`) and appends it to the store's list. A failed
/// list write is logged, not answered: the change it records has happened.
pub async fn record(store: &dyn Store, entry: &Entry) {
    let changes: Vec<String> = entry
        .changes
        .iter()
        .map(|c| format!("{}: {} -> {}", c.field, c.old, c.new))
        .collect();
    tracing::info!(
        target: "waitroom::audit",
        client = entry.client.as_deref().unwrap_or("unknown"),
        action = entry.action.as_str(),
        event_id = %entry.event_id,
        changes = %changes.join(", "),
        count = entry.count,
        "admin change"
    );
    let line = serde_json::to_string(entry).expect("an entry always serialises");
    if let Err(e) = store.append_audit(&line, KEEP).await {
        tracing::error!(target: "waitroom::audit", error = %e, entry = %line,
            "the audit list could not be written; this line is the record");
    }
}

/// The newest `limit` entries, newest first; with `event_id`, only that event's (the
/// filter runs over the whole kept list, so `limit` counts matching entries). Entries the
/// list holds but cannot be read (written by a newer version) are skipped.
pub async fn list(
    store: &dyn Store,
    limit: usize,
    event_id: Option<&str>,
) -> StoreResult<Vec<Entry>> {
    let fetch = if event_id.is_some() { KEEP } else { limit };
    let lines = store.audit_entries(fetch).await?;
    Ok(lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Entry>(l).ok())
        .filter(|e| event_id.is_none_or(|id| e.event_id == id))
        .take(limit)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn changes_list_what_differs_by_name() {
        let old = obj(json!({"name": "a", "max_active": 5, "paused": false}));
        let new = obj(json!({"name": "a", "max_active": 9, "paused": true}));
        let c = changes(Some(&old), &new);
        assert_eq!(
            c,
            [
                Change {
                    field: "max_active".into(),
                    old: json!(5),
                    new: json!(9)
                },
                Change {
                    field: "paused".into(),
                    old: json!(false),
                    new: json!(true)
                },
            ]
        );
        assert_eq!(changes(None, &new).len(), 3, "a creation sets every field");
        assert!(changes(Some(&new), &new).is_empty());
    }

    /// A setting left out of the settings object when unset (`closes_at`) and cleared is a
    /// change to `null`, not nothing.
    #[test]
    fn a_setting_cleared_out_of_the_object_is_a_change() {
        let old = obj(json!({"name": "a", "closes_at": "2030-01-01T00:00:00Z"}));
        let new = obj(json!({"name": "a"}));
        assert_eq!(
            changes(Some(&old), &new),
            [Change {
                field: "closes_at".into(),
                old: json!("2030-01-01T00:00:00Z"),
                new: Value::Null,
            }]
        );
    }
}
