//! The phases of a release's delivery, each written to its record before the next begins:
//! build (`received` → `built`), the release command of a push (still `built`: after a crash
//! it runs again, so migrations must be idempotent), try (`tried`), switch the app's spec
//! (`switched`), roll out (`released`).

use std::collections::BTreeMap;

use warden_core::builds::{Builds, Built};
use warden_core::{
    keys, AppSpec, BuildKind, FailReason, Release, ReleaseSource, ReleaseStatus, SpecRelease,
};
use warden_store::{get_json, CasOutcome};

use super::sink::Sink;
use super::{Delivery, Failure, Step};
use crate::Api;

/// Delivers the release from `step`; whether every ready instance ran it before the rollout
/// wait ended.
pub(super) async fn run(
    api: &Api,
    builds: &dyn Builds,
    d: &mut Delivery,
    step: Step,
    sink: &Sink,
) -> Result<bool, Failure> {
    let built = match step {
        Step::Build(p) => Some(build(api, builds, d, p, sink).await?),
        Step::Try(b) => Some(b),
        Step::Rollout => None,
    };
    if let Some(built) = built {
        release_phase(api, builds, d, &built, sink).await?;
        switch(api, builds, d, &built, sink).await?;
    }
    let app = d.release.app.clone();
    let spec = get_json::<AppSpec>(&*api.store, &keys::app_spec(&app))
        .await?
        .map(|(s, _)| s)
        .ok_or_else(|| {
            Failure::new(
                FailReason::AppRemoved,
                format!("app {app:?} was removed meanwhile"),
            )
        })?;
    let rolled_out = match spec.release.as_ref().map(|r| r.number) {
        Some(n) if n == d.release.number => {
            processes(api, builds, &spec, sink).await;
            super::rollout::rolled_out(api, &spec, sink).await
        }
        // Only a release resumed at start gets here: it was switched to, and a newer one has
        // replaced it since. It served; its rollout is the newer one's to wait for.
        _ => {
            sink.line("-----> a newer release serves already: this one's rollout is over");
            false
        }
    };
    d.advance(api, ReleaseStatus::Released).await?;
    Ok(rolled_out)
}

/// Writes the app's process types for the release it now serves (here after the switch, or
/// when a release found `switched` at start resumes) and says what each keeps. A failure
/// is said and left: the release serves, and the next release or restart writes them again.
async fn processes(api: &Api, builds: &dyn Builds, spec: &AppSpec, sink: &Sink) {
    let release = super::processes::release_of(spec);
    match super::processes::sync(api, &spec.name, release, Some(builds)).await {
        Ok(written) => {
            for line in super::processes::summary(&spec.name, &written) {
                sink.line(&line);
            }
        }
        Err(e) => sink.line(&format!(
            "warning: the app's other process types were not updated ({e}); push again to apply them"
        )),
    }
}

/// Builds the pushed source; the release is `built` after, its upload no longer needed.
async fn build(
    api: &Api,
    builds: &dyn Builds,
    d: &mut Delivery,
    prepared: warden_core::builds::Prepared,
    sink: &Sink,
) -> Result<Built, Failure> {
    if prepared.built.is_some() {
        sink.line("-----> this tree was built before: reusing its slug");
    }
    let built = builds.build(prepared, sink.output()).await?;
    let upload = d.release.upload.take();
    d.release.slug = Some(built.slug.clone());
    d.release.kind = Some(built.kind);
    d.release.command = built.command.clone();
    d.release.release_command = built.release.clone();
    d.advance(api, ReleaseStatus::Built).await?;
    Delivery::drop_upload(api, upload);
    Ok(built)
}

/// Runs a push's release command once, against the app's spec as it is now with the release
/// composed in, before its trial. Only a push in phase `built` runs it: config changes and
/// rollbacks reuse a slug whose migration ran when it was pushed (a rollback must not migrate
/// forward), and a push found `tried` after a crash ran it already.
async fn release_phase(
    api: &Api,
    builds: &dyn Builds,
    d: &Delivery,
    built: &Built,
    sink: &Sink,
) -> Result<(), Failure> {
    let is_push = matches!(d.release.source, ReleaseSource::Push { .. });
    if !is_push || d.release.status != ReleaseStatus::Built || d.release.release_command.is_empty()
    {
        return Ok(());
    }
    let app = &d.release.app;
    let current = get_json::<AppSpec>(&*api.store, &keys::app_spec(app))
        .await?
        .map(|(s, _)| s);
    if current.is_none() && d.must_exist {
        return Err(Failure::new(
            FailReason::AppRemoved,
            format!("app {app:?} was removed meanwhile; nothing is applied"),
        ));
    }
    let (spec, _) = compose(builds, current, app, &d.release, built)?;
    sink.line(&format!(
        "-----> release phase: {}",
        d.release.release_command.last().map_or("", String::as_str)
    ));
    builds
        .release_phase(&spec, &d.release.release_command, sink.output())
        .await?;
    Ok(())
}

/// Tries the release against the app's spec as it is now, then switches the spec to it by
/// compare-and-swap; a spec that changed meanwhile is read again and the release tried
/// against it. Never changes the spec of an app that a newer release serves already.
async fn switch(
    api: &Api,
    builds: &dyn Builds,
    d: &mut Delivery,
    built: &Built,
    sink: &Sink,
) -> Result<(), Failure> {
    let app = d.release.app.clone();
    let number = d.release.number;
    for _attempt in 0..8 {
        let current = get_json::<AppSpec>(&*api.store, &keys::app_spec(&app)).await?;
        let revision = current.as_ref().map(|(_, r)| *r);
        let current = current.map(|(s, _)| s);
        match current.as_ref().and_then(|s| s.release.as_ref()) {
            Some(newer) if newer.number > number => {
                return Err(Failure::new(
                    FailReason::Superseded,
                    format!(
                        "release {} serves already, made after this one; this one is not applied",
                        newer.number
                    ),
                ))
            }
            // Switched before the node stopped, and killed before it could say so.
            Some(same) if same.number == number && same.slug == built.slug => {
                d.release.config = current.as_ref().map(|s| s.env.clone()).unwrap_or_default();
                return d.advance(api, ReleaseStatus::Switched).await;
            }
            _ if current.is_none() && d.must_exist => {
                return Err(Failure::new(
                    FailReason::AppRemoved,
                    format!("app {app:?} was removed meanwhile; nothing is applied"),
                ))
            }
            _ => {}
        }
        let (spec, config) = compose(builds, current, &app, &d.release, built)?;
        if built.kind != BuildKind::Static {
            let label = crate::routes::lattice::current(api)
                .await
                .ok()
                .and_then(|l| l.levels.first().cloned())
                .ok_or_else(|| Failure::new(FailReason::Refused, "no clearance lattice is defined yet; define it first with `warden lattice set`"))?;
            sink.line(&format!(
                "-----> trying release {number} (one instance, label {label})"
            ));
            builds.trial(&spec, &label).await?;
            sink.line("-----> the instance is ready");
            d.advance(api, ReleaseStatus::Tried).await?;
        }
        let bytes = serde_json::to_vec(&spec)
            .map_err(|e| Failure::new(FailReason::Node, format!("cannot encode the spec: {e}")))?;
        if revision.is_none() {
            // A new app adopts no process type left by an earlier app of the name (a crash
            // mid-`apps rm`): it would keep that one's counts and run its code.
            super::processes::remove_all(api, &app).await?;
        }
        match api
            .store
            .compare_and_swap(&keys::app_spec(&app), revision, Some(bytes), None)
            .await?
        {
            CasOutcome::Done(rev) => {
                d.switched = true;
                api.applied(&keys::app_spec(&app), rev).await;
                d.release.config = config;
                return d.advance(api, ReleaseStatus::Switched).await;
            }
            CasOutcome::Conflict { .. } => {
                sink.line("the app changed meanwhile; applying the release to its new spec");
            }
        }
    }
    Err(Failure::new(
        FailReason::Conflict,
        "the app's spec kept changing; push again",
    ))
}

/// The app's spec running `release` of slug `built`, and the config vars it runs with: the
/// current spec (or a new app's defaults) with the release's command; a push keeps the app's
/// config vars as they are now (a `config set` during its build stays), a config change or a
/// rollback brings its own. A static site clears the command and is served from the slug; a
/// static directory an earlier static release set is dropped.
fn compose(
    builds: &dyn Builds,
    current: Option<AppSpec>,
    app: &str,
    release: &Release,
    built: &Built,
) -> Result<(AppSpec, BTreeMap<String, String>), Failure> {
    let mut spec = match current {
        Some(spec) => spec,
        None => {
            let mut spec = AppSpec::new(app, Vec::new());
            // Its database was made when the push was taken.
            spec.data = release.data.unwrap_or(false);
            spec
        }
    };
    // An app awaiting its first release (made by a config change or by this push) takes the
    // data its release asks for: its database was made when the push was taken.
    if spec.awaits_release() && release.data == Some(true) {
        spec.data = true;
    }
    // Checked when the push was taken too; an app made or remade meanwhile is checked here.
    if release.data.is_some_and(|d| d != spec.data) {
        return Err(Failure::new(
            FailReason::Refused,
            crate::routes::apps::data_fixed(app, spec.data),
        ));
    }
    let earlier_static = spec
        .release
        .as_ref()
        .and_then(|r| builds.built(&r.slug))
        .map(|b| b.dir)
        .map(|d| d.display().to_string());
    if earlier_static.is_some() && spec.static_dir == earlier_static {
        spec.static_dir = None;
        spec.static_prefix = AppSpec::new(app, Vec::new()).static_prefix;
    }
    spec.release = Some(SpecRelease {
        number: release.number,
        slug: built.slug.clone(),
        archive: Some(built.archive.clone()),
    });
    spec.workdir = None;
    spec.command = built.command.clone();
    if let Some(groups) = &release.groups {
        spec.groups = groups.clone();
    }
    match &release.source {
        ReleaseSource::Push { .. } => {}
        // Only the keys it changed: a change made to the others since it was asked for (an
        // env PATCH, another node's `config set`, while this one was built, tried or waited
        // for its node's restart) stays.
        ReleaseSource::Config { changed } => {
            for key in changed {
                match release.config.get(key) {
                    Some(v) => spec.env.insert(key.clone(), v.clone()),
                    None => spec.env.remove(key),
                };
            }
        }
        ReleaseSource::Rollback { .. } => spec.env = release.config.clone(),
    }
    if built.kind == BuildKind::Static {
        spec.static_dir = Some(built.dir.display().to_string());
        spec.static_prefix = "/".into();
        spec.desired.clear();
        spec.warm.clear();
    }
    spec.validate().map_err(|e| {
        Failure::new(
            FailReason::Refused,
            format!("the release does not make a usable app: {e}"),
        )
    })?;
    let config = spec.env.clone();
    Ok((spec, config))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use warden_core::builds::{BuildError, Output, Prepared, ReleasePhaseError, TrialError};

    use super::*;

    /// Knows no slug: `compose` asks it only about an earlier static release.
    struct NoSlugs;

    #[async_trait::async_trait]
    impl Builds for NoSlugs {
        async fn prepare(
            &self,
            _: &str,
            _: &Path,
            _: &str,
            _: Option<BuildKind>,
        ) -> Result<Prepared, BuildError> {
            unreachable!("compose prepares nothing")
        }
        async fn build(&self, _: Prepared, _: Output) -> Result<Built, BuildError> {
            unreachable!("compose builds nothing")
        }
        async fn trial(&self, _: &AppSpec, _: &str) -> Result<(), TrialError> {
            unreachable!("compose tries nothing")
        }
        async fn release_phase(
            &self,
            _: &AppSpec,
            _: &[String],
            _: Output,
        ) -> Result<(), ReleasePhaseError> {
            unreachable!("compose runs nothing")
        }
        fn built(&self, _: &str) -> Option<Built> {
            None
        }
    }

    fn release(source: ReleaseSource, config: &[(&str, &str)]) -> Release {
        Release {
            app: "demo".into(),
            number: 3,
            source,
            slug: Some("a".repeat(64)),
            kind: Some(BuildKind::Procfile),
            command: vec!["./run".into()],
            release_command: Vec::new(),
            config: config
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            by: "test".into(),
            at_ms: 0,
            status: ReleaseStatus::Built,
            reason: None,
            error: None,
            node: None,
            upload: None,
            new_app: false,
            groups: None,
            data: None,
        }
    }

    fn built() -> Built {
        Built {
            slug: "a".repeat(64),
            kind: BuildKind::Procfile,
            command: vec!["./run".into()],
            release: Vec::new(),
            processes: BTreeMap::new(),
            dir: PathBuf::from("/nowhere"),
            archive: "b".repeat(64),
            cached: true,
        }
    }

    /// The app as it is now: KEEP was changed (an env PATCH) after the config release that
    /// sets NEW and unsets OLD was asked for, with the env of that moment.
    fn current() -> AppSpec {
        let mut spec = AppSpec::new("demo", vec!["./run".into()]);
        for (k, v) in [("KEEP", "changed since"), ("OLD", "x")] {
            spec.env.insert(k.into(), v.into());
        }
        spec
    }

    #[test]
    fn a_config_release_applies_only_the_keys_it_changed() {
        let asked = release(
            ReleaseSource::Config {
                changed: vec!["NEW".into(), "OLD".into()],
            },
            &[("KEEP", "as it was"), ("NEW", "1")],
        );
        let (spec, config) = compose(&NoSlugs, Some(current()), "demo", &asked, &built()).unwrap();
        let want: BTreeMap<String, String> = [("KEEP", "changed since"), ("NEW", "1")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(spec.env, want);
        assert_eq!(config, want);
    }

    #[test]
    fn a_rollback_brings_back_its_whole_config() {
        let back = release(ReleaseSource::Rollback { to: 1 }, &[("KEEP", "as it was")]);
        let (spec, _) = compose(&NoSlugs, Some(current()), "demo", &back, &built()).unwrap();
        assert_eq!(spec.env.len(), 1);
        assert_eq!(spec.env["KEEP"], "as it was");
    }
}
