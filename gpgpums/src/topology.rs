//! Where a host sits in the network: the operator's levels (`zone`, `rack`, `switch`), each
//! with the name of the host's group at that level. Hosts carry it (their agent's config or
//! gsaasd's inventory) and admins see it; tenants never do, as they never learn where their GPUs
//! are.
//!
//! Levels and group names are the operator's own words, so they are checked as names, not
//! text: a level is 1 to [`MAX_LEVEL_LEN`] lowercase letters, digits, `-` and `_`, starting with a
//! letter; a group name 1 to [`MAX_GROUP_LEN`] letters, digits, `.`, `-` and `_`. A host has at
//! most [`MAX_LEVELS`] levels.
//!
//! A request may ask for the network between its VM and its GPUs ([`NetworkConstraint`]): one
//! group at a level (`same: rack`, required or preferred), a longest round-trip time between the
//! VM's host and each GPU's host (as the agents measure it), and the nearest GPUs. The pool keeps
//! the levels in order from the innermost (the level with the most groups: `switch` before
//! `rack` before `zone`), which is what `nearest` walks outwards through.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A host's group at each level it has, by level.
pub type Topology = BTreeMap<String, String>;

/// The most levels a host may have.
pub const MAX_LEVELS: usize = 8;
/// The longest level name.
pub const MAX_LEVEL_LEN: usize = 32;
/// The longest group name.
pub const MAX_GROUP_LEN: usize = 64;

/// The longest round-trip time a request may ask for: 10 s (microseconds).
pub const MAX_RTT_US: u32 = 10_000_000;

/// How firmly a request wants its cGPUs and its VM in one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strength {
    /// No group at the level takes it: it is not placed (507).
    #[default]
    Required,
    /// No group at the level takes it: it is placed without.
    Preferred,
}

impl fmt::Display for Strength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strength::Required => "required",
            Strength::Preferred => "preferred",
        })
    }
}

/// What a request asks of the network between its VM and its GPUs. Locality `local` meets all
/// of it (the VM runs beside its GPUs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConstraint {
    /// Every cGPU and the VM in one group at this level (a level hosts carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same: Option<String>,
    /// Whether `same` must hold or is preferred.
    #[serde(default, skip_serializing_if = "is_required")]
    pub strength: Strength,
    /// The longest round-trip time (microseconds) from the VM's host to each of its GPUs'
    /// hosts, as measured; a pair never measured is too far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rtt_us: Option<u32>,
    /// Prefer GPUs in the VM's innermost group, then the next level out, and so on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nearest: bool,
}

fn is_required(strength: &Strength) -> bool {
    *strength == Strength::Required
}

impl NetworkConstraint {
    /// No constraint: any GPU, the VM anywhere.
    pub const NONE: NetworkConstraint = NetworkConstraint {
        same: None,
        strength: Strength::Required,
        max_rtt_us: None,
        nearest: false,
    };

    pub fn is_empty(&self) -> bool {
        *self == NetworkConstraint::NONE
    }

    /// Whether it limits where the cGPUs may go (beyond ranking).
    pub fn is_hard(&self) -> bool {
        self.required_level().is_some() || self.max_rtt_us.is_some()
    }

    /// The level every cGPU and the VM must share a group at.
    pub fn required_level(&self) -> Option<&str> {
        self.same.as_deref().filter(|_| self.strength == Strength::Required)
    }

    /// What is wrong with it on its own, as `(field, why)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if let Some(level) = &self.same {
            let alone: Topology = [(level.clone(), "g".to_owned())].into();
            if let Some((_, why)) = topology_problem(&alone) {
                problems.push(("network.same", why));
            }
        } else if self.strength != Strength::Required {
            problems.push(("network.strength", "needs a level in network.same".to_owned()));
        }
        match self.max_rtt_us {
            Some(0) => problems.push(("network.max_rtt_us", "must be at least 1".to_owned())),
            Some(us) if us > MAX_RTT_US => problems
                .push(("network.max_rtt_us", format!("{us} is more than {MAX_RTT_US} (10 s)"))),
            _ => {}
        }
        problems
    }
}

/// The first thing wrong with `topology`, as the level it is at (`None`: the whole) and why.
pub fn topology_problem(topology: &Topology) -> Option<(Option<String>, String)> {
    if topology.len() > MAX_LEVELS {
        return Some((None, format!("{} levels are more than {MAX_LEVELS}", topology.len())));
    }
    for (level, group) in topology {
        let shown = |text: &str| text.chars().take(MAX_GROUP_LEN + 1).collect::<String>();
        let level_fine = level.len() <= MAX_LEVEL_LEN
            && level.starts_with(|c: char| c.is_ascii_lowercase())
            && level
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !level_fine {
            return Some((
                None,
                format!(
                    "{:?} is no level name: 1 to {MAX_LEVEL_LEN} lowercase letters, digits, '-' \
                     and '_', starting with a letter",
                    shown(level)
                ),
            ));
        }
        let group_fine = !group.is_empty()
            && group.len() <= MAX_GROUP_LEN
            && group.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !group_fine {
            return Some((
                Some(level.clone()),
                format!(
                    "{:?} is no group name: 1 to {MAX_GROUP_LEN} letters, digits, '.', '-' and '_'",
                    shown(group)
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_constraints_are_checked_on_their_own() {
        assert!(NetworkConstraint::default().problems().is_empty());
        let rack = NetworkConstraint { same: Some("rack".into()), ..NetworkConstraint::NONE };
        assert!(rack.problems().is_empty() && rack.is_hard());
        let preferred = NetworkConstraint { strength: Strength::Preferred, ..rack.clone() };
        assert!(preferred.problems().is_empty() && !preferred.is_hard());
        let cases = [
            (NetworkConstraint { same: Some("Rack 1".into()), ..rack.clone() }, "network.same"),
            (NetworkConstraint { same: None, ..preferred }, "network.strength"),
            (NetworkConstraint { max_rtt_us: Some(0), ..rack.clone() }, "network.max_rtt_us"),
            (NetworkConstraint { max_rtt_us: Some(MAX_RTT_US + 1), ..rack }, "network.max_rtt_us"),
        ];
        for (constraint, field) in cases {
            assert_eq!(constraint.problems().first().map(|p| p.0), Some(field), "{constraint:?}");
        }
        let text = r#"{"same":"rack","strength":"preferred","max_rtt_us":300,"nearest":true}"#;
        let parsed: NetworkConstraint = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&parsed).unwrap(), text);
        assert!(serde_json::from_str::<NetworkConstraint>(r#"{"sam":"rack"}"#).is_err());
    }

    fn topology(pairs: &[(&str, &str)]) -> Topology {
        pairs.iter().map(|(l, g)| ((*l).to_owned(), (*g).to_owned())).collect()
    }

    #[test]
    fn levels_and_groups_are_names() {
        assert_eq!(topology_problem(&topology(&[("zone", "z1"), ("rack", "R12.a")])), None);
        assert_eq!(topology_problem(&Topology::new()), None);
        for level in ["", "Rack", "1rack", "ra ck", &"r".repeat(33)] {
            let (at, why) = topology_problem(&topology(&[(level, "r1")])).expect(level);
            assert_eq!(at, None, "{level:?}");
            assert!(why.contains("no level name"), "{why}");
        }
        for group in ["", "r 1", "r1\n", "r\u{202e}1", &"g".repeat(65)] {
            let (at, why) = topology_problem(&topology(&[("rack", group)])).expect(group);
            assert_eq!(at.as_deref(), Some("rack"), "{group:?}");
            assert!(why.contains("no group name"), "{why}");
        }
        let many: Topology = (0..9).map(|i| (format!("l{i}"), "g".to_owned())).collect();
        assert!(topology_problem(&many).unwrap().1.contains("more than 8"));
    }
}
