use proptest::prelude::*;
use serde_json::json;

use super::*;

fn lattice() -> Lattice {
    Lattice {
        levels: vec!["public".into(), "internal".into(), "secret".into()],
        categories: vec!["finance".into(), "hr".into()],
    }
}

fn rule(value: &str, level: Option<&str>, cats: &[&str], groups: &[&str]) -> ClaimRule {
    ClaimRule {
        claim: "groups".into(),
        value: value.into(),
        level: level.map(Into::into),
        categories: cats.iter().map(|s| s.to_string()).collect(),
        groups: groups.iter().map(|s| s.to_string()).collect(),
    }
}

fn claims(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn lowest_level_wins_and_categories_unite() {
    let rules = [
        rule("finance", Some("secret"), &["finance"], &["finance"]),
        rule("staff", Some("internal"), &["hr"], &["staff"]),
        rule("other", Some("public"), &[], &[]),
    ];
    let c = map_claims(
        &rules,
        &claims(json!({"groups": ["finance", "staff"]})),
        &lattice(),
    )
    .unwrap();
    assert_eq!(c.label, "internal:{finance,hr}");
    assert_eq!(c.groups, ["finance", "staff"]);
    assert_eq!(c.matched, ["groups=finance", "groups=staff"]);
    assert_eq!(c.claims["groups"], ["finance", "staff"]);
}

#[test]
fn string_claim_matches() {
    let rules = [ClaimRule {
        claim: "department".into(),
        ..rule("hr", Some("secret"), &[], &[])
    }];
    let c = map_claims(&rules, &claims(json!({"department": "hr"})), &lattice()).unwrap();
    assert_eq!(c.label, "secret:{}");
}

#[test]
fn no_level_no_access_and_error_names_claims() {
    // A rule that gives categories but no level does not let a person in on its own.
    let rules = [rule("finance", None, &["finance"], &[])];
    let e = map_claims(&rules, &claims(json!({"groups": ["finance"]})), &lattice()).unwrap_err();
    assert!(e.to_string().contains(r#"groups=["finance"]"#), "{e}");
    let e = map_claims(&rules, &claims(json!({})), &lattice()).unwrap_err();
    assert!(matches!(e, MappingError::NoMatch { .. }));
}

#[test]
fn unknown_level_or_category_refused() {
    let e = map_claims(
        &[rule("x", Some("topsecret"), &[], &[])],
        &claims(json!({"groups": ["x"]})),
        &lattice(),
    )
    .unwrap_err();
    assert!(matches!(e, MappingError::BadRule { .. }), "{e}");
    let e = check_rules(&[rule("x", Some("public"), &["legal"], &[])], &lattice()).unwrap_err();
    assert!(e.to_string().contains("legal"), "{e}");
}

#[test]
fn categories_only_lattice() {
    let l = Lattice {
        levels: vec![],
        categories: vec!["finance".into()],
    };
    let c = map_claims(
        &[rule("f", None, &["finance"], &[])],
        &claims(json!({"groups": "f"})),
        &l,
    )
    .unwrap();
    assert_eq!(c.label, "{finance}");
    assert!(map_claims(&[rule("f", None, &[], &[])], &claims(json!({})), &l).is_err());
}

fn arb_rule() -> impl Strategy<Value = ClaimRule> {
    (
        0..4usize,
        proptest::option::of(0..3usize),
        proptest::collection::vec(0..2usize, 0..3),
    )
        .prop_map(|(v, l, cs)| {
            let levels = ["public", "internal", "secret"];
            let cats = ["finance", "hr"];
            ClaimRule {
                claim: "groups".into(),
                value: format!("g{v}"),
                level: l.map(|i| levels[i].to_owned()),
                categories: cs.iter().map(|&i| cats[i].to_owned()).collect(),
                groups: vec![format!("grp{v}")],
            }
        })
}

proptest! {
    /// The level is the minimum over matching rules with a level; categories the union;
    /// no such rule, no access; the rules' order never matters.
    #[test]
    fn mapping_is_the_strictest_reading(
        rules in proptest::collection::vec(arb_rule(), 0..6),
        held in proptest::collection::btree_set(0..5usize, 0..4),
    ) {
        let l = lattice();
        let groups: Vec<String> = held.iter().map(|i| format!("g{i}")).collect();
        let c = claims(json!({ "groups": groups }));
        let matching: Vec<&ClaimRule> = rules.iter().filter(|r| groups.contains(&r.value)).collect();
        let min = matching
            .iter()
            .filter_map(|r| r.level.as_ref())
            .map(|lv| l.levels.iter().position(|x| x == lv).unwrap())
            .min();
        let got = map_claims(&rules, &c, &l);
        match min {
            None => prop_assert!(got.is_err()),
            Some(m) => {
                let got = got.unwrap();
                let label = l.parse(&got.label).unwrap();
                prop_assert_eq!(label.level(), Some(m));
                let want: BTreeSet<usize> = matching
                    .iter()
                    .flat_map(|r| r.categories.iter())
                    .map(|c| l.categories.iter().position(|x| x == c).unwrap())
                    .collect();
                prop_assert_eq!(label.categories().collect::<BTreeSet<_>>(), want);
                let mut reversed = rules.clone();
                reversed.reverse();
                let again = map_claims(&reversed, &c, &l).unwrap();
                prop_assert_eq!(again.label, got.label);
                prop_assert_eq!(again.groups, got.groups);
            }
        }
    }
}
