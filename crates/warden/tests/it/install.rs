//! `cargo install --path crates/warden` (the README's way to install) builds the package
//! without its dev-dependencies: a feature that names one makes it fail before compiling.

/// Every `dep/feature` a feature of warden's manifest enables names one of its dependencies,
/// never a dev-dependency (cargo install leaves those out and refuses the manifest).
#[test]
fn every_feature_names_only_real_dependencies() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
    let deps = manifest["dependencies"].as_table().unwrap();
    let features = manifest["features"].as_table().unwrap();
    for (feature, enables) in features {
        for e in enables.as_array().unwrap() {
            let e = e.as_str().unwrap();
            let Some((dep, _)) = e.split_once('/') else {
                continue;
            };
            let dep = dep.trim_start_matches("dep:").trim_end_matches('?');
            assert!(
                deps.contains_key(dep),
                "feature {feature} enables {e}, but {dep} is not in [dependencies]: `cargo install` would fail"
            );
        }
    }
}
