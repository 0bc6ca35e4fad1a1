use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn claims(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn rule(value: &str, role: RuleRole, apps: &[&str]) -> OperatorRule {
    OperatorRule {
        claim: "groups".into(),
        value: value.into(),
        role,
        apps: apps.iter().map(|a| a.to_string()).collect(),
    }
}

/// The brief's example: platform → owner, shop-devs → deployer of shop, staff → viewer.
fn example() -> Vec<OperatorRule> {
    vec![
        rule("platform", RuleRole::Owner, &[]),
        rule("shop-devs", RuleRole::Deployer, &["shop"]),
        rule("blog-devs", RuleRole::Deployer, &["blog", "shop"]),
        rule("staff", RuleRole::Viewer, &[]),
    ]
}

#[test]
fn groups_give_their_roles_and_deployer_apps_are_united() {
    let r = map_operator(&example(), &claims(json!({"groups": ["platform"]}))).unwrap();
    assert_eq!(r.roles, vec![Role::Owner]);
    let r = map_operator(
        &example(),
        &claims(json!({"groups": ["staff", "blog-devs", "shop-devs"]})),
    )
    .unwrap();
    assert_eq!(
        r.roles,
        vec![
            Role::Deployer {
                apps: vec!["blog".into(), "shop".into()]
            },
            Role::Viewer
        ]
    );
    assert_eq!(
        r.matched,
        ["groups=shop-devs", "groups=blog-devs", "groups=staff"]
    );
    // A string claim matches as a one-element array does.
    let r = map_operator(&example(), &claims(json!({"groups": "staff"}))).unwrap();
    assert_eq!(r.roles, vec![Role::Viewer]);
}

#[test]
fn no_match_is_no_access_naming_the_claims_seen() {
    let e = map_operator(&example(), &claims(json!({"groups": ["sales"]}))).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, OperatorRuleError::NoMatch { .. }), "{e:?}");
    assert!(text.contains(r#"groups=["sales"]"#), "{text}");
    assert!(map_operator(&[], &claims(json!({"groups": ["platform"]}))).is_err());
    assert!(map_operator(&example(), &claims(json!({}))).is_err());
}

#[test]
fn rules_that_cannot_be_meant_are_refused() {
    assert!(check_operator_rules(&[rule("x", RuleRole::Deployer, &[])]).is_err());
    assert!(check_operator_rules(&[rule("x", RuleRole::Deployer, &["Bad App"])]).is_err());
    assert!(check_operator_rules(&[rule("x", RuleRole::Owner, &["shop"])]).is_err());
    assert!(check_operator_rules(&[rule("x", RuleRole::Viewer, &["shop"])]).is_err());
    assert!(check_operator_rules(&example()).is_ok());
    // As written in a config file.
    let parsed: OperatorRule = serde_json::from_value(
        json!({"claim": "groups", "value": "shop-devs", "role": "deployer", "apps": ["shop"]}),
    )
    .unwrap();
    assert_eq!(parsed, example()[1]);
    assert!(serde_json::from_value::<OperatorRule>(
        json!({"claim": "groups", "value": "x", "role": "admin"})
    )
    .is_err());
}

#[test]
fn operator_names_are_valid_names() {
    let c = claims(json!({"preferred_username": "Alice.Smith@corp"}));
    assert_eq!(
        operator_name(&c, "preferred_username", "s1"),
        "alice-smith-corp"
    );
    assert_eq!(
        operator_name(&c, "email", "S1"),
        "s1",
        "sub when the claim is absent"
    );
    assert_eq!(operator_name(&claims(json!({})), "x", "--"), "u");
    let long = "a".repeat(100);
    assert_eq!(operator_name(&claims(json!({})), "x", &long).len(), 63);
}

fn arb_rule() -> impl Strategy<Value = OperatorRule> {
    (
        0..4usize,
        0..3usize,
        proptest::collection::btree_set(0..3usize, 1..3),
    )
        .prop_map(|(v, role, apps)| {
            let role = [RuleRole::Owner, RuleRole::Deployer, RuleRole::Viewer][role];
            let names = ["a", "b", "c"];
            OperatorRule {
                claim: "groups".into(),
                value: format!("g{v}"),
                role,
                apps: match role {
                    RuleRole::Deployer => apps.iter().map(|&i| names[i].to_owned()).collect(),
                    _ => vec![],
                },
            }
        })
}

proptest! {
    /// Owner exactly when an owner rule matches; deployer apps the union of the matching
    /// deployer rules'; viewer exactly when a viewer rule matches; no match, no access; the
    /// rules' order never changes the roles.
    #[test]
    fn roles_combine_as_documented(
        rules in proptest::collection::vec(arb_rule(), 0..6),
        held in proptest::collection::btree_set(0..5usize, 0..4),
    ) {
        let groups: Vec<String> = held.iter().map(|i| format!("g{i}")).collect();
        let c = claims(json!({ "groups": groups }));
        let matching: Vec<&OperatorRule> =
            rules.iter().filter(|r| groups.contains(&r.value)).collect();
        let got = map_operator(&rules, &c);
        if matching.is_empty() {
            prop_assert!(got.is_err());
            return Ok(());
        }
        let got = got.unwrap();
        let owner = matching.iter().any(|r| r.role == RuleRole::Owner);
        let viewer = matching.iter().any(|r| r.role == RuleRole::Viewer);
        let apps: BTreeSet<String> = matching
            .iter()
            .filter(|r| r.role == RuleRole::Deployer)
            .flat_map(|r| r.apps.iter().cloned())
            .collect();
        prop_assert_eq!(got.roles.contains(&Role::Owner), owner);
        prop_assert_eq!(got.roles.contains(&Role::Viewer), viewer);
        let deployed: Option<BTreeSet<String>> = got.roles.iter().find_map(|r| match r {
            Role::Deployer { apps } => Some(apps.iter().cloned().collect()),
            _ => None,
        });
        prop_assert_eq!(deployed, (!apps.is_empty()).then_some(apps));
        let mut reversed = rules.clone();
        reversed.reverse();
        prop_assert_eq!(map_operator(&reversed, &c).unwrap().roles, got.roles);
    }
}
