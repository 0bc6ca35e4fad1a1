//! A person's claims → their operator roles (`operator_rules` of an `[[oidc]]` table): a pure
//! function of the rules and the claims.
//!
//! A rule matches when its claim is the string `value` or an array holding it (as the
//! clearance rules match). How the matching rules combine:
//! - **owner** only if a rule giving `owner` matches: no other rule, however many, adds up to it;
//! - **deployer** of the union of the apps of every matching `deployer` rule (one role, apps
//!   sorted, without duplicates);
//! - **viewer** if a rule giving `viewer` matches.
//!
//! The roles come out in that order whatever the rules' order, so the same claims always give
//! the same roles (an operator's generation changes only when the roles really do). No matching
//! rule means no operator access: an error naming the claims seen, never a default role.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use warden_core::Role;

/// The role a rule gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleRole {
    /// Everything.
    Owner,
    /// Push, config, rollback, scale and logs of the rule's `apps`.
    Deployer,
    /// Read only.
    Viewer,
}

/// One operator rule, as written in the config file:
/// `{ claim = "groups", value = "shop-devs", role = "deployer", apps = ["shop"] }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorRule {
    /// The claim looked at (`groups`, `roles`, …).
    pub claim: String,
    /// The value that makes the rule match: the claim's string, or one of its array's strings.
    pub value: String,
    /// The role the rule gives.
    pub role: RuleRole,
    /// The apps a `deployer` rule gives (required there, refused on the other roles).
    #[serde(default)]
    pub apps: Vec<String>,
}

/// What the rules gave a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorRoles {
    /// The roles, in the order owner, deployer, viewer (module doc).
    pub roles: Vec<Role>,
    /// The matching rules, as `claim=value`, in rule order.
    pub matched: Vec<String>,
}

/// Why a person gets no operator roles, or a rule is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperatorRuleError {
    /// No rule matched.
    #[error("no operator rule matched the claims {seen}; ask an owner to add your group to the provider's operator_rules")]
    NoMatch {
        /// The claims the rules consulted, with the values seen (`groups=["eng"]`).
        seen: String,
    },
    /// A rule is not usable as written.
    #[error("operator rule {claim}={value}: {reason}")]
    BadRule {
        /// The rule's claim.
        claim: String,
        /// The rule's value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// The strings of claim `v`: a string, or an array's strings (other members ignored).
fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
        _ => vec![],
    }
}

/// Checks each rule: a deployer rule names valid apps, the other roles name none (at config
/// load, so a mistake stops `warden up` rather than a sign-in).
pub fn check_operator_rules(rules: &[OperatorRule]) -> Result<(), OperatorRuleError> {
    for r in rules {
        let bad = |reason: String| OperatorRuleError::BadRule {
            claim: r.claim.clone(),
            value: r.value.clone(),
            reason,
        };
        match r.role {
            RuleRole::Deployer if r.apps.is_empty() => {
                return Err(bad(
                    "a deployer rule names its apps: apps = [\"shop\"]".into()
                ))
            }
            RuleRole::Deployer => {
                for a in &r.apps {
                    warden_core::validate_name("app", a).map_err(|e| bad(e.to_string()))?;
                }
            }
            RuleRole::Owner | RuleRole::Viewer if !r.apps.is_empty() => {
                return Err(bad(
                    "only a deployer rule names apps (owner and viewer cover every app)".into(),
                ))
            }
            RuleRole::Owner | RuleRole::Viewer => {}
        }
    }
    Ok(())
}

/// Maps `claims` to operator roles by `rules` (module doc).
pub fn map_operator(
    rules: &[OperatorRule],
    claims: &Map<String, Value>,
) -> Result<OperatorRoles, OperatorRuleError> {
    check_operator_rules(rules)?;
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (mut owner, mut viewer) = (false, false);
    let mut apps = BTreeSet::new();
    let mut matched = vec![];
    for r in rules {
        let values = strings(claims.get(&r.claim));
        let hit = values.contains(&r.value);
        seen.entry(r.claim.clone()).or_insert(values);
        if !hit {
            continue;
        }
        matched.push(format!("{}={}", r.claim, r.value));
        match r.role {
            RuleRole::Owner => owner = true,
            RuleRole::Deployer => apps.extend(r.apps.iter().cloned()),
            RuleRole::Viewer => viewer = true,
        }
    }
    if matched.is_empty() {
        let seen = seen
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(OperatorRuleError::NoMatch {
            seen: if seen.is_empty() {
                "(no operator rules)".into()
            } else {
                seen
            },
        });
    }
    let mut roles = vec![];
    if owner {
        roles.push(Role::Owner);
    }
    if !apps.is_empty() {
        roles.push(Role::Deployer {
            apps: apps.into_iter().collect(),
        });
    }
    if viewer {
        roles.push(Role::Viewer);
    }
    Ok(OperatorRoles { roles, matched })
}

/// warden's operator name for the person: the `username_claim` (else `sub`), lower-cased, every
/// character outside `a-z 0-9 - _` made `-`, leading non-alphanumerics dropped, at most 63
/// bytes. Unlike provider users' names it carries no `_<provider>` suffix: an operator is one
/// person whatever way they sign in, and a local operator of that name is never taken over
/// (the API refuses the sign-in).
pub fn operator_name(claims: &Map<String, Value>, username_claim: &str, sub: &str) -> String {
    let raw = claims
        .get(username_claim)
        .and_then(Value::as_str)
        .unwrap_or(sub);
    let mut name: String = raw
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => c,
            _ => '-',
        })
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .collect();
    name.truncate(63);
    if name.is_empty() {
        name.push('u');
    }
    name
}

#[cfg(test)]
mod tests;
