//! A person's claims → their clearance and groups: a pure function of the rules, the claims and
//! the lattice.
//!
//! A rule matches when its claim is the string `value` or an array holding it. The person's
//! level is the LOWEST level among matching rules that give one (where rules disagree, the
//! strictest reading wins); categories and groups are the union of the matching rules'. With
//! no matching rule that gives a level (or, in a lattice without levels, no matching rule at
//! all) there is no access: an error naming the claims seen, never a default clearance.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};
use warden_auth::{Lattice, LatticeError};

/// One mapping rule (the type is core's: the config file, the API and the store share it).
pub use warden_core::ClaimRule;

/// What the rules gave a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clearance {
    /// The clearance label, in the lattice's canonical form.
    pub label: String,
    /// The groups, sorted, without duplicates.
    pub groups: Vec<String>,
    /// The matching rules, as `claim=value`, in rule order.
    pub matched: Vec<String>,
    /// The claims the rules consulted and their values as the provider sent them (the deciding
    /// claims, for `users show` and the audit trail).
    pub claims: BTreeMap<String, Vec<String>>,
}

/// Why no clearance could be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// No rule that gives a level matched.
    #[error("no mapping rule matched the claims {seen}; ask an operator for a rule that gives your group a clearance")]
    NoMatch {
        /// The claims the rules consulted, with the values seen (`groups=["eng"]`).
        seen: String,
    },
    /// A rule names a level or category the lattice does not have.
    #[error("mapping rule {claim}={value}: {source}")]
    BadRule {
        /// The rule's claim.
        claim: String,
        /// The rule's value.
        value: String,
        /// What the lattice said.
        source: LatticeError,
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

/// Checks every rule's level and categories against `lattice` (at config load, and again at
/// each mapping: the lattice can change under a running gateway).
pub fn check_rules(rules: &[ClaimRule], lattice: &Lattice) -> Result<(), MappingError> {
    for r in rules {
        let bad = |source| MappingError::BadRule {
            claim: r.claim.clone(),
            value: r.value.clone(),
            source,
        };
        if let Some(l) = &r.level {
            if !lattice.levels.contains(l) {
                return Err(bad(LatticeError::UnknownLevel {
                    level: l.clone(),
                    known: lattice.levels.join(" < "),
                }));
            }
        }
        for c in &r.categories {
            if !lattice.categories.contains(c) {
                return Err(bad(LatticeError::UnknownCategory {
                    category: c.clone(),
                    known: lattice.categories.join(", "),
                }));
            }
        }
    }
    Ok(())
}

/// Maps `claims` to a clearance by `rules` (module doc).
pub fn map_claims(
    rules: &[ClaimRule],
    claims: &Map<String, Value>,
    lattice: &Lattice,
) -> Result<Clearance, MappingError> {
    check_rules(rules, lattice)?;
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut level: Option<usize> = None;
    let mut any = false;
    let mut categories = BTreeSet::new();
    let mut groups = BTreeSet::new();
    let mut matched = vec![];
    for r in rules {
        let values = strings(claims.get(&r.claim));
        let hit = values.contains(&r.value);
        seen.entry(r.claim.clone()).or_insert(values);
        if !hit {
            continue;
        }
        any = true;
        matched.push(format!("{}={}", r.claim, r.value));
        if let Some(l) = &r.level {
            let i = lattice.levels.iter().position(|x| x == l);
            level = match (level, i) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        categories.extend(r.categories.iter().cloned());
        groups.extend(r.groups.iter().cloned());
    }
    let decided = if lattice.levels.is_empty() {
        any
    } else {
        level.is_some()
    };
    if !decided {
        let seen_text = seen
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(MappingError::NoMatch {
            seen: if seen_text.is_empty() {
                "(no rules)".into()
            } else {
                seen_text
            },
        });
    }
    // Categories in lattice order, then the canonical text through the lattice itself.
    let cats: Vec<&str> = lattice
        .categories
        .iter()
        .filter(|c| categories.contains(*c))
        .map(String::as_str)
        .collect();
    let text = match level {
        Some(l) if lattice.categories.is_empty() => lattice.levels[l].clone(),
        Some(l) => format!("{}:{{{}}}", lattice.levels[l], cats.join(",")),
        None => format!("{{{}}}", cats.join(",")),
    };
    let label = lattice
        .canonical(&text)
        .map_err(|source| MappingError::BadRule {
            claim: "(result)".into(),
            value: text.clone(),
            source,
        })?;
    Ok(Clearance {
        label,
        groups: groups.into_iter().collect(),
        matched,
        claims: seen,
    })
}

#[cfg(test)]
mod tests;
