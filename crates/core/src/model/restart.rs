//! Restarts an operator asked for (`POST /v1/apps/{name}/restart`): counts kept in the app's
//! spec, which the generation of each label's instances includes (`AppSpec::generation`). A
//! count going up makes every running instance of the app (or of one label) outdated, and the
//! agents replace them as they roll out a changed spec: the new one ready first, then the old
//! one drained. No release is made; the store carries the change to every node.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How many restarts were asked for, of the whole app and of single labels.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Restarts {
    /// Restarts of every label of the app.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub app: u64,
    /// Restarts of one label (its canonical spelling), by label.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// === impl Restarts ===

impl Restarts {
    /// Whether no restart was ever asked for (the spec then leaves the field out).
    pub fn is_none(&self) -> bool {
        self.app == 0 && self.labels.is_empty()
    }

    /// What instances of `label` take into their generation: `None` when nothing was
    /// restarted there, so that specs from before restarts keep their generation (and an
    /// upgrade replaces no instance).
    pub(crate) fn of(&self, label: &str) -> Option<(u64, u64)> {
        let l = self.labels.get(label).copied().unwrap_or(0);
        (self.app != 0 || l != 0).then_some((self.app, l))
    }

    /// Asks for one more restart of `label`, or of the whole app; the new count.
    pub fn bump(&mut self, label: Option<&str>) -> u64 {
        let n = match label {
            Some(l) => self.labels.entry(l.to_owned()).or_insert(0),
            None => &mut self.app,
        };
        *n = n.saturating_add(1);
        *n
    }
}

#[cfg(test)]
mod tests {
    use crate::AppSpec;

    #[test]
    fn a_restart_changes_the_generation_of_what_it_restarts_only() {
        let mut spec = AppSpec::new("a", vec!["./run".into()]);
        let (public, secret) = (spec.generation("public"), spec.generation("secret"));
        assert_eq!(public, secret, "no restart: one generation for every label");
        spec.restarts.bump(Some("public"));
        assert_ne!(spec.generation("public"), public);
        assert_eq!(spec.generation("secret"), secret);
        let once = spec.generation("public");
        spec.restarts.bump(None);
        assert_ne!(spec.generation("public"), once);
        assert_ne!(spec.generation("secret"), secret);
    }

    #[test]
    fn specs_without_restarts_read_and_write_as_before() {
        let spec = AppSpec::new("a", vec!["./run".into()]);
        let json = serde_json::to_string(&spec).unwrap();
        assert!(!json.contains("restarts"), "{json}");
        let back: AppSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
    }
}
