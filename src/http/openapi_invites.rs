//! The invite codes' operations of the OpenAPI document (`super`): made, and listed back.
//! A document of their own, merged into the whole one before it is completed there.

use super::*;

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(invites, list_invites),
    components(schemas(InviteList, InviteRow, InviteState))
)]
pub(super) struct Doc;

#[utoipa::path(post, path = "/api/v1/admin/events/{event_id}/invites", tag = "admin",
    params(("event_id" = String, Path), ("format" = Option<String>, Query, description = "`csv` for a download")),
    request_body = super::super::admin::InvitesBody,
    responses(
        (status = 200, description = "Fresh invite codes (JSON, or CSV with `?format=csv`)", content(
            (Invites = "application/json"),
            (String = "text/csv"))),
        (status = 400, description = "INVALID_REQUEST", body = ErrorBody),
        (status = 404, description = "EVENT_NOT_FOUND", body = ErrorBody)))]
fn invites() {}

#[utoipa::path(get, path = "/api/v1/admin/events/{event_id}/invites", tag = "admin",
    params(
        ("event_id" = String, Path),
        ("after" = Option<String>, Query, description = "List the codes after this one (the previous page's `next_after`)"),
        ("limit" = Option<u64>, Query, description = "Codes per page (default: the most)"),
        ("format" = Option<String>, Query, description = "`csv` for a download")),
    responses(
        (status = 200, description = "The event's codes in code order, each `unused` or `bound` (with the proven `user_id` it is bound to); JSON, or CSV (`code,state,user_id`) with `Accept: text/csv` or `?format=csv`, whose `Link` header (`rel=\"next\"`) names the next page",
            headers(("Link" = String, description = "On a CSV page that another follows: `<its URI>; rel=\"next\"`")),
            content(
                (InviteList = "application/json"),
                (String = "text/csv"))),
        (status = 400, description = "INVALID_REQUEST: `limit` out of range, an unknown `format`", body = ErrorBody),
        (status = 404, description = "EVENT_NOT_FOUND", body = ErrorBody)))]
fn list_invites() {}
