//! The security-clearance lattice (seed 002 §2.1): a linear order of levels, the subsets of a
//! set of categories, or their product.
//!
//! A label's text form is `LEVEL`, `LEVEL:{CAT,CAT}` or, without levels, `{CAT,CAT}`. The
//! canonical form lists categories in lattice order; routing compares canonical strings, so two
//! spellings of one label always reach the same instances.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The lattice definition, stored at `lattice`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Lattice {
    /// Levels from lowest to highest. Empty: no levels, only categories.
    #[serde(default)]
    pub levels: Vec<String>,
    /// Categories; a label holds any subset of them.
    #[serde(default)]
    pub categories: Vec<String>,
}

/// A point of the lattice, as indices into the lattice's levels and categories.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Label {
    level: Option<usize>,
    categories: BTreeSet<usize>,
}

/// Why a lattice or label was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LatticeError {
    /// The lattice has neither levels nor categories.
    #[error("the lattice is empty; give at least one level or category")]
    Empty,
    /// A level or category name is unusable.
    #[error(
        "{0:?} is not a usable level or category name: use letters, digits, spaces, '_' and '-'"
    )]
    BadName(String),
    /// A name appears twice.
    #[error("{0:?} appears twice in the lattice")]
    Duplicate(String),
    /// A label names an unknown level.
    #[error("unknown level {level:?}; the levels are {known}")]
    UnknownLevel {
        /// The level asked for.
        level: String,
        /// The lattice's levels.
        known: String,
    },
    /// A label names an unknown category.
    #[error("unknown category {category:?}; the categories are {known}")]
    UnknownCategory {
        /// The category asked for.
        category: String,
        /// The lattice's categories.
        known: String,
    },
    /// The label text is malformed.
    #[error("label {0:?} is malformed; write LEVEL, LEVEL:{{CAT,CAT}} or {{CAT,CAT}}")]
    Malformed(String),
}

// === impl Label ===

impl Label {
    /// The level's index into the lattice's levels (lowest first); `None` without levels.
    pub fn level(&self) -> Option<usize> {
        self.level
    }

    /// The categories' indices into the lattice's categories, in lattice order.
    pub fn categories(&self) -> impl Iterator<Item = usize> + '_ {
        self.categories.iter().copied()
    }
}

// === impl Lattice ===

impl Lattice {
    /// A linear lattice of `levels`, lowest first.
    pub fn linear<S: Into<String>>(levels: impl IntoIterator<Item = S>) -> Self {
        Self {
            levels: levels.into_iter().map(Into::into).collect(),
            categories: vec![],
        }
    }

    /// Checks names: non-empty, no separators, no duplicates.
    pub fn validate(&self) -> Result<(), LatticeError> {
        if self.levels.is_empty() && self.categories.is_empty() {
            return Err(LatticeError::Empty);
        }
        let mut seen = BTreeSet::new();
        for n in self.levels.iter().chain(&self.categories) {
            let ok = !n.trim().is_empty()
                && n.len() <= 64
                && n.trim() == n
                && n.chars()
                    .all(|c| c.is_alphanumeric() || c == ' ' || c == '_' || c == '-');
            if !ok {
                return Err(LatticeError::BadName(n.clone()));
            }
            if !seen.insert(n.as_str()) {
                return Err(LatticeError::Duplicate(n.clone()));
            }
        }
        Ok(())
    }

    /// Parses a label's text form.
    pub fn parse(&self, text: &str) -> Result<Label, LatticeError> {
        let text = text.trim();
        let malformed = || LatticeError::Malformed(text.to_owned());
        let (level_part, cat_part) = if let Some(rest) = text.strip_prefix('{') {
            (None, Some(rest))
        } else if let Some((l, c)) = text.split_once(':') {
            (
                Some(l.trim()),
                Some(c.trim().strip_prefix('{').ok_or_else(malformed)?),
            )
        } else {
            (Some(text), None)
        };
        let level = match level_part {
            Some(l) => Some(self.levels.iter().position(|x| x == l).ok_or_else(|| {
                LatticeError::UnknownLevel {
                    level: l.to_owned(),
                    known: self.levels.join(" < "),
                }
            })?),
            None => None,
        };
        if level.is_none() && !self.levels.is_empty() {
            return Err(LatticeError::UnknownLevel {
                level: String::new(),
                known: self.levels.join(" < "),
            });
        }
        let mut categories = BTreeSet::new();
        if let Some(c) = cat_part {
            let inner = c.strip_suffix('}').ok_or_else(malformed)?;
            for name in inner.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let i = self
                    .categories
                    .iter()
                    .position(|x| x == name)
                    .ok_or_else(|| LatticeError::UnknownCategory {
                        category: name.to_owned(),
                        known: self.categories.join(", "),
                    })?;
                categories.insert(i);
            }
        }
        Ok(Label { level, categories })
    }

    /// The canonical text form of `label`.
    pub fn format(&self, label: &Label) -> String {
        let cats = || {
            let names: Vec<&str> = label
                .categories
                .iter()
                .map(|&i| self.categories[i].as_str())
                .collect();
            format!("{{{}}}", names.join(","))
        };
        match (label.level, self.categories.is_empty()) {
            (Some(l), true) => self.levels[l].clone(),
            (Some(l), false) => format!("{}:{}", self.levels[l], cats()),
            (None, _) => cats(),
        }
    }

    /// Parses and re-formats: the canonical spelling of a label text.
    pub fn canonical(&self, text: &str) -> Result<String, LatticeError> {
        Ok(self.format(&self.parse(text)?))
    }

    /// True when information may flow from `a` to `b` (`a` ≤ `b`).
    pub fn flows_to(&self, a: &Label, b: &Label) -> bool {
        a.level <= b.level && a.categories.is_subset(&b.categories)
    }

    /// The least upper bound of `a` and `b`.
    pub fn join(&self, a: &Label, b: &Label) -> Label {
        Label {
            level: a.level.max(b.level),
            categories: a.categories.union(&b.categories).copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nato() -> Lattice {
        Lattice::linear([
            "UNCLASSIFIED",
            "RESTRICTED",
            "CONFIDENTIAL",
            "SECRET",
            "TOP SECRET",
        ])
    }

    #[test]
    fn linear_order_and_join() {
        let l = nato();
        l.validate().expect("valid");
        let conf = l.parse("CONFIDENTIAL").expect("parses");
        let ts = l.parse("TOP SECRET").expect("parses");
        assert!(l.flows_to(&conf, &ts));
        assert!(!l.flows_to(&ts, &conf));
        assert_eq!(l.format(&l.join(&conf, &ts)), "TOP SECRET");
        assert!(matches!(
            l.parse("COSMIC"),
            Err(LatticeError::UnknownLevel { .. })
        ));
    }

    #[test]
    fn subsets_and_products() {
        let l = Lattice {
            levels: vec![],
            categories: vec!["A".into(), "B".into(), "C".into()],
        };
        let ab = l.parse("{B, A}").expect("parses");
        assert_eq!(l.format(&ab), "{A,B}");
        let c = l.parse("{C}").expect("parses");
        assert!(!l.flows_to(&ab, &c) && !l.flows_to(&c, &ab), "incomparable");
        assert_eq!(l.format(&l.join(&ab, &c)), "{A,B,C}");
        assert_eq!(l.canonical("{}").expect("bottom"), "{}");

        let p = Lattice {
            levels: vec!["LOW".into(), "HIGH".into()],
            categories: vec!["X".into(), "Y".into()],
        };
        assert_eq!(p.canonical("HIGH:{Y,X}").expect("parses"), "HIGH:{X,Y}");
        assert_eq!(p.canonical("LOW").expect("parses"), "LOW:{}");
        let a = p.parse("LOW:{X}").expect("parses");
        let b = p.parse("HIGH:{Y}").expect("parses");
        assert_eq!(p.format(&p.join(&a, &b)), "HIGH:{X,Y}");
        assert!(matches!(
            p.parse("HIGH:{Z}"),
            Err(LatticeError::UnknownCategory { .. })
        ));
        assert!(matches!(p.parse("HIGH:X"), Err(LatticeError::Malformed(_))));
        assert!(matches!(
            p.parse("{X}"),
            Err(LatticeError::UnknownLevel { .. })
        ));
    }

    #[test]
    fn bad_lattices_are_refused() {
        assert_eq!(Lattice::default().validate(), Err(LatticeError::Empty));
        assert!(matches!(
            Lattice::linear(["A", "A"]).validate(),
            Err(LatticeError::Duplicate(_))
        ));
        assert!(matches!(
            Lattice::linear(["A:B"]).validate(),
            Err(LatticeError::BadName(_))
        ));
    }
}
