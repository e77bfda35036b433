//! Recalls: an operator marks a revision of a JukeBox bad (no instance
//! installs or upgrades to it; with `move_away`, the instances running it
//! move to the newest selectable revision), or lifts the mark. The scanner
//! writes them in the JukeBox's `spec.recalls` and reads them back.

use axum::{
    Json,
    extract::{Path, State, rejection::JsonRejection},
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use vynil_proto::scanner::v1 as pb;

use super::{App, Ctx, Errors, body, check_subdomain, failed, inputs::Input, non_empty};
use crate::{
    auth::{Role, kubernetes::Check},
    downstream::Service,
    error::ApiError,
};

/// The verb on `jukeboxes` a Kubernetes user needs for a recall that moves
/// instances away (beside `recall`).
pub const MOVE_AWAY_VERB: &str = "recall-move-away";

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct RecallRequest {
    /// The tag recalled, as the catalog lists it.
    pub tag: String,
    /// Why: shown with the revision in the catalog and in each instance's explanation.
    pub reason: String,
    /// Move the instances running it to the newest selectable revision (older or not).
    #[serde(default)]
    pub move_away: bool,
}

/// One recalled revision.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Recall {
    pub tag: String,
    pub reason: String,
    pub move_away: bool,
    /// Who recalled it and when (RFC 3339).
    pub by: Option<String>,
    pub at: Option<String>,
}

/// A JukeBox's recalls, as read back after the change.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Recalls {
    pub jukebox: String,
    pub items: Vec<Recall>,
}

fn recalls(jukebox: String, answer: pb::RecallResponse) -> Json<Recalls> {
    let items = answer
        .recalls
        .into_iter()
        .map(|r| Recall {
            tag: r.tag,
            reason: r.reason,
            move_away: r.move_away,
            by: non_empty(r.by),
            at: non_empty(r.at),
        })
        .collect();
    Json(Recalls { jukebox, items })
}

#[utoipa::path(post, path = "/api/v1/jukeboxes/{jukebox}/recalls", tag = "catalog",
    params(("jukebox" = String, Path)), request_body = RecallRequest,
    responses((status = 200, body = Recalls, description = "the JukeBox's recalls, this one among them"), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn recall(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path(jukebox): Path<String>,
    request: Result<Json<RecallRequest>, JsonRejection>,
) -> Result<Json<Recalls>, ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    let request = body(request)?;
    Input::Tag.check("tag", &request.tag)?;
    if request.reason.trim().is_empty() {
        return Err(ApiError::bad_request("reason", "say why the revision is recalled: it is shown with it"));
    }
    if request.move_away {
        // It moves instances to an older revision and across freezes and
        // windows: an admin's act, not an operator's.
        let check = Check {
            verb: MOVE_AWAY_VERB,
            resource: "jukeboxes",
            namespace: None,
            name: Some(jukebox.clone()),
        };
        let what = "a recall that moves instances away (to an older revision, across freezes and windows)";
        app.auth.may(ctx.principal.as_ref(), what, Role::Admin, &check).await?;
    }
    let asked = pb::RecallRequest {
        jukebox: jukebox.clone(),
        tag: request.tag,
        reason: request.reason,
        move_away: request.move_away,
        caller: String::new(),
    };
    let asked = app.services.request(&ctx, asked);
    let answer = app.services.scanner()?.recall(asked).await.map_err(failed(Service::Scanner))?;
    Ok(recalls(jukebox, answer.into_inner()))
}

#[utoipa::path(delete, path = "/api/v1/jukeboxes/{jukebox}/recalls/{tag}", tag = "catalog",
    params(("jukebox" = String, Path), ("tag" = String, Path)),
    responses((status = 200, body = Recalls, description = "the JukeBox's recalls, this one lifted"), Errors),
    security(("bearer" = []), ("session" = [])))]
pub async fn lift_recall(
    State(app): State<App>,
    Ctx(ctx): Ctx,
    Path((jukebox, tag)): Path<(String, String)>,
) -> Result<Json<Recalls>, ApiError> {
    check_subdomain("jukebox", &jukebox)?;
    Input::Tag.check("tag", &tag)?;
    let asked = app
        .services
        .request(&ctx, pb::LiftRecallRequest { jukebox: jukebox.clone(), tag, caller: String::new() });
    let answer = app.services.scanner()?.lift_recall(asked).await.map_err(failed(Service::Scanner))?;
    Ok(recalls(jukebox, answer.into_inner()))
}
