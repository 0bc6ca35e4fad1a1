//! A Procfile's other process types (`worker:`, `clock:`): each runs as a derived spec, an
//! [`AppSpec`] named `APP~TYPE` whose `process` says which app and type it is.

use serde::{Deserialize, Serialize};

use super::{AppSpec, SpecError};
use crate::name::{process_app, validate_name, validate_process_type};

/// What a derived spec runs: process type `kind` of app `app`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcessOf {
    /// The app whose release it runs, whose database it reaches and whose operators manage it.
    pub app: String,
    /// The Procfile line's name (`worker`, `clock`, ...).
    pub kind: String,
}

// === impl ProcessOf ===

impl ProcessOf {
    /// Checks that `spec`, which names this, is what a process type's spec may be: named
    /// `APP~TYPE` after valid names, serving nothing (no hosts, no static files).
    pub(super) fn validate(&self, spec: &AppSpec) -> Result<(), SpecError> {
        validate_name("app", &self.app)?;
        validate_process_type(&self.kind).map_err(SpecError::Process)?;
        let name = process_app(&self.app, &self.kind);
        if spec.name != name {
            return Err(SpecError::Process(format!(
                "a process type's spec is named {name:?}"
            )));
        }
        if !spec.hosts.is_empty() || spec.static_dir.is_some() {
            return Err(SpecError::Process(
                "a process type serves nothing: it has no hosts and no static files".into(),
            ));
        }
        Ok(())
    }
}

// === impl AppSpec ===

impl AppSpec {
    /// Whether its instances listen for connections: a web app's do; a process type's
    /// (`worker`, `clock`) do not, and are ready once started and still running.
    pub fn listens(&self) -> bool {
        self.process.is_none()
    }

    /// The app whose database and operators this spec's instances have: its own, or for a
    /// process type its app's.
    pub fn owning_app(&self) -> &str {
        self.process.as_ref().map_or(&self.name, |p| &p.app)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derived_spec_is_named_after_its_app_and_type_and_serves_nothing() {
        let mut spec = AppSpec::new(process_app("demo", "worker"), vec!["./work".into()]);
        spec.process = Some(ProcessOf {
            app: "demo".into(),
            kind: "worker".into(),
        });
        assert_eq!(spec.validate(), Ok(()));
        assert!(!spec.listens());
        assert_eq!(spec.owning_app(), "demo");
        let mut hosted = spec.clone();
        hosted.hosts = vec!["w.example".into()];
        assert!(matches!(hosted.validate(), Err(SpecError::Process(_))));
        let mut misnamed = spec;
        misnamed.name = "other~worker".into();
        assert!(matches!(misnamed.validate(), Err(SpecError::Process(_))));
        // Without `process`, the name is an app's, which `~` can never be.
        misnamed.process = None;
        assert!(matches!(misnamed.validate(), Err(SpecError::Name(_))));
    }
}
