//! The contract's version, and what skew between gsaasd and its agents is allowed.
//!
//! Every request and answer between gsaasd and an agent carries its sender's protocol in the
//! `RODVR-Protocol` header; one without it speaks the unversioned protocol of before, `1`. The
//! skew policy is Nova's for its computes, turned around for a controller that pushes: **gsaasd
//! is upgraded first, agents after it, at most one version behind.** So gsaasd `N` takes agents
//! of `N-1` and `N`, and an agent `N` takes a controller of `N` and `N+1`. Anything else is
//! refused with 409 and a message saying which side to upgrade, before the request does
//! anything: a table or a report in a shape the other side would misread is never applied.
//!
//! A protocol version changes when either side would misread the other's messages; a field
//! added with a default (`#[serde(default)]`) that older peers may ignore does not need one.

use std::fmt;

/// The header both sides send their protocol version in.
pub const HEADER: &str = "rodvr-protocol";

/// The protocol this build speaks. 1 was the unversioned protocol (before this header); 2 is the
/// same messages with the header, so it takes and is taken by 1; 3 adds the servers an agent
/// runs per cGPU (a table's `servers`, a report's `managed`): an agent that runs them must not
/// take tables from a gsaasd that would leave them out, and gsaasd gives servers only to agents
/// that report them, so it still takes agents of 2.
pub const PROTOCOL: u32 = 3;

/// What a message without the header speaks.
pub const UNVERSIONED: u32 = 1;

/// A peer outside the skew policy, or a header that is not a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skew {
    /// The header is not a number.
    Unreadable(String),
    /// An agent older than gsaasd allows (more than one version behind).
    AgentTooOld { agent: u32, controller: u32 },
    /// An agent newer than its gsaasd (agents are upgraded after gsaasd).
    AgentTooNew { agent: u32, controller: u32 },
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skew::Unreadable(value) => {
                write!(f, "{HEADER} header {value:?} is not a protocol version (a whole number)")
            }
            Skew::AgentTooOld { agent, controller } => write!(
                f,
                "rodvr-agent protocol {agent} is too old for gsaasd protocol {controller}: agents \
                 may be at most one version behind gsaasd; upgrade the agent"
            ),
            Skew::AgentTooNew { agent, controller } => write!(
                f,
                "rodvr-agent protocol {agent} is newer than gsaasd protocol {controller}: upgrade \
                 gsaasd first, then the agents"
            ),
        }
    }
}

impl std::error::Error for Skew {}

/// The version a header value says (`None`: no header, the unversioned protocol).
pub fn read(value: Option<&str>) -> Result<u32, Skew> {
    match value {
        None => Ok(UNVERSIONED),
        Some(v) => v.trim().parse().map_err(|_| Skew::Unreadable(v.chars().take(32).collect())),
    }
}

/// Whether an agent of `agent` may work with a controller of `controller`: the controller at the
/// agent's version or one above.
pub fn check(agent: u32, controller: u32) -> Result<(), Skew> {
    if agent > controller {
        Err(Skew::AgentTooNew { agent, controller })
    } else if controller - agent > 1 {
        Err(Skew::AgentTooOld { agent, controller })
    } else {
        Ok(())
    }
}

/// gsaasd's check of an agent's request or answer (its header's value).
pub fn check_agent(header: Option<&str>) -> Result<u32, Skew> {
    let agent = read(header)?;
    check(agent, PROTOCOL).map(|()| agent)
}

/// An agent's check of its controller's request or answer (its header's value).
pub fn check_controller(header: Option<&str>) -> Result<u32, Skew> {
    let controller = read(header)?;
    check(PROTOCOL, controller).map(|()| controller)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_may_trail_the_controller_by_one_version_and_never_lead_it() {
        assert_eq!(check(2, 2), Ok(()));
        assert_eq!(check(1, 2), Ok(()), "the agent one behind");
        assert_eq!(check(1, 3), Err(Skew::AgentTooOld { agent: 1, controller: 3 }));
        assert_eq!(check(3, 2), Err(Skew::AgentTooNew { agent: 3, controller: 2 }));
        assert_eq!(read(None), Ok(UNVERSIONED), "no header: the unversioned protocol");
        assert_eq!(check_agent(Some("2")), Ok(2), "agents of before the servers are taken");
        assert!(check_agent(None).is_err(), "agents of before the header are two behind");
        assert_eq!(
            check_controller(Some("2")),
            Err(Skew::AgentTooNew { agent: 3, controller: 2 }),
            "a gsaasd of before is older than this agent: gsaasd is upgraded first"
        );
        assert!(matches!(check_agent(Some("x")), Err(Skew::Unreadable(_))));
        assert!(check_agent(Some("99")).unwrap_err().to_string().contains("upgrade gsaasd first"));
        assert!(check_controller(Some("5")).unwrap_err().to_string().contains("upgrade the agent"));
        assert_eq!(check_controller(Some("4")), Ok(4), "a controller one ahead");
    }
}
