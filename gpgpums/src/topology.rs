//! Where a host sits in the network: the operator's levels (`zone`, `rack`, `switch`), each
//! with the name of the host's group at that level. Hosts carry it (their agent's config or
//! gsaasd's inventory) and admins see it; tenants never do, as they never learn where their GPUs
//! are.
//!
//! Levels and group names are the operator's own words, so they are checked as names, not
//! text: a level is 1 to [`MAX_LEVEL_LEN`] lowercase letters, digits, `-` and `_`, starting with a
//! letter; a group name 1 to [`MAX_GROUP_LEN`] letters, digits, `.`, `-` and `_`. A host has at
//! most [`MAX_LEVELS`] levels.

use std::collections::BTreeMap;

/// A host's group at each level it has, by level.
pub type Topology = BTreeMap<String, String>;

/// The most levels a host may have.
pub const MAX_LEVELS: usize = 8;
/// The longest level name.
pub const MAX_LEVEL_LEN: usize = 32;
/// The longest group name.
pub const MAX_GROUP_LEN: usize = 64;

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
