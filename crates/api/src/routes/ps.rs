//! `GET /v1/apps/{name}/ps`: an app's process types, `web` and its release's Procfile's
//! others (each a derived spec, `deliver/processes.rs`), with how many instances each keeps
//! and runs per label.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::Json;
use warden_api_types::{ProcessLabel, ProcessType};
use warden_core::{keys, AppSpec, InstanceRecord, InstanceState};

use crate::error::ApiError;
use crate::Api;

/// `GET /v1/apps/{name}/ps`
pub async fn show(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<Json<Vec<ProcessType>>, ApiError> {
    let Some((web, _)) = warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .filter(|(s, _)| s.process.is_none())
    else {
        return Err(ApiError::no_app(&name));
    };
    let instances = super::instances::all(&api).await?;
    let mut out = vec![kind_of("web", &web, &instances)];
    for spec in crate::deliver::processes::of_app(&api, &name).await? {
        if let Some(p) = &spec.process {
            out.push(kind_of(&p.kind, &spec, &instances));
        }
    }
    Ok(Json(out))
}

/// Process type `kind`, run by `spec`: its counts and its ready instances per label.
fn kind_of(kind: &str, spec: &AppSpec, instances: &[InstanceRecord]) -> ProcessType {
    let mut labels: BTreeMap<&str, (u32, u32)> = spec
        .desired
        .iter()
        .map(|(l, n)| (l.as_str(), (*n, 0)))
        .collect();
    for i in instances
        .iter()
        .filter(|i| i.app == spec.name && i.state == InstanceState::Ready)
    {
        labels.entry(i.label.as_str()).or_default().1 += 1;
    }
    ProcessType {
        kind: kind.to_owned(),
        command: spec.command.clone(),
        labels: labels
            .into_iter()
            .map(|(label, (desired, running))| ProcessLabel {
                label: label.to_owned(),
                desired,
                running,
            })
            .collect(),
    }
}
