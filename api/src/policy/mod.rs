//! Who may do what: every action a tenant or an operator takes is a named rule (`gpu:vm:create`),
//! as every OpenStack service names its own, and an operator changes the rules in a policy file
//! in oslo.policy's YAML form (`[auth] policy_file`) without a code change.
//!
//! The defaults are gsaasd's rules as they were before policy files: a project's members act
//! on its VMs, admins (as `[auth] keystone_admin_*` make them, or gsaasd's admin tokens) on
//! everything; `gsaasd policy dump` prints them with what each governs. A file overrides the rules
//! it names and leaves the others at their defaults; it is read once, at start, and any problem
//! in it stops gsaasd with the file's line.
//!
//! A refusal of something the caller may see (its own project's VM, or for admins anything) is
//! 403 naming the rule; of anything else, 404, as if it did not exist: a policy never tells a
//! tenant what other projects have.
//!
//! The agents' routes (registration, token renewal, round-trip targets) and `/metrics` are not
//! governed here: they check their own tokens (an agent's, a scraper's, or an admin's).

pub mod live;
mod rules;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::{Path, PathBuf};

pub use live::{LivePolicy, Reload};
use rules::{Expr, Facts};
pub use rules::{SyntaxError, CREDENTIALS, TARGET_ATTRIBUTES};

use crate::caller::Caller;
use crate::error::Error;

/// A named rule gsaasd checks: an action, or a rule the actions' defaults share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Action(&'static RuleDefault);

/// A rule's default, what it is for, and the operations it governs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RuleDefault {
    pub name: &'static str,
    pub default: &'static str,
    pub description: &'static str,
    pub operations: &'static [&'static str],
}

impl Action {
    pub fn name(self) -> &'static str {
        self.0.name
    }
}

const fn rule(
    name: &'static str,
    default: &'static str,
    description: &'static str,
    operations: &'static [&'static str],
) -> RuleDefault {
    RuleDefault { name, default, description, operations }
}

const ADMIN: &str = "rule:context_is_admin";
const ADMIN_OR_MEMBER: &str = "rule:admin_or_project_member";

/// Every rule with its default, in the order `gsaasd policy dump` prints them.
pub static DEFAULTS: &[RuleDefault] = &[
    rule(
        "context_is_admin",
        "is_admin:True",
        "An operator: gsaasd's admin tokens, or a Keystone token with a role of \
         [auth] keystone_admin_roles where [auth] keystone_admin_scope says (the system scope, \
         or the one admin project).",
        &[],
    ),
    rule(
        "project_member",
        "project_id:%(project_id)s",
        "Any token scoped to the project of what is acted on.",
        &[],
    ),
    rule("admin_or_project_member", "rule:context_is_admin or rule:project_member", "", &[]),
    rule(
        "gpu:vm:create",
        ADMIN_OR_MEMBER,
        "Launch a VM with cGPUs in the token's project.",
        &["POST /v1/vms"],
    ),
    rule("gpu:vm:list", ADMIN_OR_MEMBER, "List the VMs of the token's project.", &["GET /v1/vms"]),
    rule(
        "gpu:vm:list:all_projects",
        ADMIN,
        "List every project's VMs (and filter them by project).",
        &["GET /v1/vms"],
    ),
    rule("gpu:vm:show", ADMIN_OR_MEMBER, "Show a VM.", &["GET /v1/vms/{id}"]),
    rule(
        "gpu:vm:show:location",
        ADMIN,
        "See where a VM's cGPUs are: their hosts, GPUs and GPU servers (tenants see masked \
         addresses only).",
        &["GET /v1/vms", "GET /v1/vms/{id}"],
    ),
    rule("gpu:vm:delete", ADMIN_OR_MEMBER, "Terminate a VM.", &["DELETE /v1/vms/{id}"]),
    rule("gpu:cgpu:attach", ADMIN_OR_MEMBER, "Attach cGPUs to a VM.", &["POST /v1/vms/{id}/cgpus"]),
    rule(
        "gpu:cgpu:detach",
        ADMIN_OR_MEMBER,
        "Detach a cGPU from a VM.",
        &["DELETE /v1/vms/{id}/cgpus/{index}"],
    ),
    rule(
        "gpu:queue:list",
        ADMIN_OR_MEMBER,
        "The token's project's waiting requests.",
        &["GET /v1/queue"],
    ),
    rule(
        "gpu:queue:list:all_projects",
        ADMIN,
        "Every project's waiting requests.",
        &["GET /v1/queue"],
    ),
    rule(
        "gpu:quota:show",
        ADMIN_OR_MEMBER,
        "Show a project's quota and usage.",
        &["GET /v1/quotas", "GET /v1/quotas/{project}"],
    ),
    rule(
        "gpu:quota:list:all_projects",
        ADMIN,
        "List every project's quota and usage.",
        &["GET /v1/quotas"],
    ),
    rule(
        "gpu:quota:set",
        ADMIN,
        "Set a project's quota, or give it the defaults again (an operator's action on the service: no %(project_id)s).",
        &["PUT /v1/quotas/{project}", "DELETE /v1/quotas/{project}"],
    ),
    rule(
        "gpu:cohort:list",
        ADMIN,
        "List cohorts (projects that lend each other their unused quota), their members' terms and what each lends and borrows.",
        &["GET /v1/cohorts", "GET /v1/cohorts/{name}"],
    ),
    rule(
        "gpu:cohort:set",
        ADMIN,
        "Put projects in a cohort on their terms, or end a cohort (an operator's action on the service: no %(project_id)s).",
        &["PUT /v1/cohorts/{name}", "DELETE /v1/cohorts/{name}"],
    ),
    rule(
        "gpu:usage:show",
        ADMIN_OR_MEMBER,
        "A project's usage of VMs and cGPUs in a period, with its VMs' (billing, show-back).",
        &["GET /v1/usage", "GET /v1/usage/{project}"],
    ),
    rule(
        "gpu:usage:list:all_projects",
        ADMIN,
        "Every project's usage in a period.",
        &["GET /v1/usage"],
    ),
    rule("gpu:pool:show", ADMIN_OR_MEMBER, "The GPU pool's totals.", &["GET /v1/pool"]),
    rule(
        "gpu:pool:show:hosts",
        ADMIN,
        "The GPU pool per host and GPU, with who holds what.",
        &["GET /v1/pool"],
    ),
    rule("gpu:host:list", ADMIN, "List the GPU hosts and their agents.", &["GET /v1/hosts"]),
    rule(
        "gpu:host:drain",
        ADMIN,
        "Drain a host: it takes no new cGPUs.",
        &["POST /v1/hosts/{name}/drain"],
    ),
    rule(
        "gpu:host:undrain",
        ADMIN,
        "Let a drained host take cGPUs again.",
        &["POST /v1/hosts/{name}/undrain"],
    ),
    rule(
        "gpu:host:evacuate",
        ADMIN,
        "Move every cGPU off a host.",
        &["POST /v1/hosts/{name}/evacuate"],
    ),
    rule(
        "gpu:host:forget",
        ADMIN,
        "Forget a host that is gone.",
        &["POST /v1/hosts/{name}/forget"],
    ),
    rule("gpu:fence:list", ADMIN, "List the fences of lost hosts' cGPUs.", &["GET /v1/fences"]),
    rule("gpu:gpu:evacuate", ADMIN, "Move every cGPU off a GPU.", &["POST /v1/gpus/{id}/evacuate"]),
    rule(
        "gpu:gpu:taint",
        ADMIN,
        "Taint a GPU: it takes no new cGPUs.",
        &["POST /v1/gpus/{id}/taint"],
    ),
    rule("gpu:gpu:untaint", ADMIN, "Untaint a GPU.", &["POST /v1/gpus/{id}/untaint"]),
    rule(
        "gpu:task:list",
        ADMIN,
        "List gsaasd's background tasks and how each last ran.",
        &["GET /v1/background-tasks"],
    ),
    rule(
        "gpu:task:activate",
        ADMIN,
        "Run a background task of gsaasd now.",
        &["POST /v1/background-tasks/{name}/activate"],
    ),
];

/// The action named `name` (a rule of [`DEFAULTS`]); panics on a name that is not there, which
/// a unit test rules out for every name gsaasd uses.
const fn find(name: &'static str) -> Action {
    let mut i = 0;
    while i < DEFAULTS.len() {
        if const_eq(DEFAULTS[i].name, name) {
            return Action(&DEFAULTS[i]);
        }
        i += 1;
    }
    panic!("no such policy rule");
}

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The actions gsaasd checks.
pub mod actions {
    use super::{find, Action};

    pub const VM_CREATE: Action = find("gpu:vm:create");
    pub const VM_LIST: Action = find("gpu:vm:list");
    pub const VM_LIST_ALL: Action = find("gpu:vm:list:all_projects");
    pub const VM_SHOW: Action = find("gpu:vm:show");
    pub const VM_SHOW_LOCATION: Action = find("gpu:vm:show:location");
    pub const VM_DELETE: Action = find("gpu:vm:delete");
    pub const CGPU_ATTACH: Action = find("gpu:cgpu:attach");
    pub const CGPU_DETACH: Action = find("gpu:cgpu:detach");
    pub const QUEUE_LIST: Action = find("gpu:queue:list");
    pub const QUEUE_LIST_ALL: Action = find("gpu:queue:list:all_projects");
    pub const QUOTA_SHOW: Action = find("gpu:quota:show");
    pub const QUOTA_LIST_ALL: Action = find("gpu:quota:list:all_projects");
    pub const QUOTA_SET: Action = find("gpu:quota:set");
    pub const COHORT_LIST: Action = find("gpu:cohort:list");
    pub const COHORT_SET: Action = find("gpu:cohort:set");
    pub const USAGE_SHOW: Action = find("gpu:usage:show");
    pub const USAGE_LIST_ALL: Action = find("gpu:usage:list:all_projects");
    pub const POOL_SHOW: Action = find("gpu:pool:show");
    pub const POOL_SHOW_HOSTS: Action = find("gpu:pool:show:hosts");
    pub const HOST_LIST: Action = find("gpu:host:list");
    pub const HOST_DRAIN: Action = find("gpu:host:drain");
    pub const HOST_UNDRAIN: Action = find("gpu:host:undrain");
    pub const HOST_EVACUATE: Action = find("gpu:host:evacuate");
    pub const HOST_FORGET: Action = find("gpu:host:forget");
    pub const FENCE_LIST: Action = find("gpu:fence:list");
    pub const GPU_EVACUATE: Action = find("gpu:gpu:evacuate");
    pub const GPU_TAINT: Action = find("gpu:gpu:taint");
    pub const GPU_UNTAINT: Action = find("gpu:gpu:untaint");
    pub const TASK_LIST: Action = find("gpu:task:list");
    pub const TASK_ACTIVATE: Action = find("gpu:task:activate");
}

/// What is acted on: a project's (a VM, a quota; a list in the caller's project) or the
/// service's own (hosts, GPUs, the pool's hosts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Project(&'a str),
    Service,
}

impl<'a> Target<'a> {
    /// The caller's own project (what a launch or a list of its project acts on); the service's
    /// for a caller with none.
    pub fn own(caller: &'a Caller) -> Target<'a> {
        caller.project.as_deref().map_or(Target::Service, Target::Project)
    }
}

/// What is wrong with a policy file: where, and why.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("policy file {path}, line {line}: {reason}")]
    Invalid { path: PathBuf, line: usize, reason: String },
}

/// The rules in force: the defaults, with a policy file's over them.
#[derive(Debug, Clone)]
pub struct Policy {
    rules: HashMap<&'static str, Expr>,
    /// Rules a file defines that gsaasd does not check itself (aliases the others name).
    aliases: HashMap<String, Expr>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::parse("", Path::new("(defaults)")).expect("the default rules parse")
    }
}

impl Policy {
    /// The defaults, with the rules of the file at `path` (if any) over them.
    pub fn load(path: Option<&Path>) -> Result<Policy, PolicyError> {
        let Some(path) = path else { return Ok(Policy::default()) };
        let text = std::fs::read_to_string(path)
            .map_err(|source| PolicyError::Read { path: path.to_owned(), source })?;
        Policy::parse(&text, path)
    }

    /// The defaults with the rules of `text` (a policy file's content, from `path`) over them.
    pub fn parse(text: &str, path: &Path) -> Result<Policy, PolicyError> {
        let invalid = |line: usize, reason: String| PolicyError::Invalid {
            path: path.to_owned(),
            line,
            reason,
        };
        let entries: Vec<(String, serde_norway::Value)> = if text.trim().is_empty() {
            Vec::new()
        } else {
            serde_norway::from_str::<Option<Entries>>(text)
                .map_err(|e| {
                    let line = e.location().map_or(1, |l| l.line());
                    invalid(line, format!("not a YAML map of rule names to rules: {e}"))
                })?
                .map(|entries| entries.0)
                .unwrap_or_default()
        };
        // A rule written twice: YAML keeps the last copy, so a stale copy further down would
        // silently win. Both lines are named; the operator keeps the one meant.
        let mut written: BTreeMap<String, serde_norway::Value> = BTreeMap::new();
        for (name, value) in entries {
            if written.contains_key(&name) {
                let lines = lines_of(text, &name);
                let (first, second) = (lines.first().copied().unwrap_or(1), lines.get(1).copied());
                let second = second.unwrap_or(first);
                return Err(invalid(
                    second,
                    format!(
                        "{name:?} is written twice, on lines {first} and {second}: only one copy \
                         can be in force, remove the other"
                    ),
                ));
            }
            written.insert(name, value);
        }
        let mut rules: HashMap<&'static str, Expr> = DEFAULTS
            .iter()
            .map(|d| (d.name, rules::parse(d.default).expect("a default rule parses")))
            .collect();
        let mut aliases = HashMap::new();
        let mut lines = HashMap::new();
        for (name, value) in &written {
            let line = line_of(text, name);
            lines.insert(name.as_str(), line);
            let serde_norway::Value::String(rule) = value else {
                return Err(invalid(line, format!("{name:?}: a rule is a string")));
            };
            let expr = rules::parse(rule).map_err(|e| invalid(line, format!("{name:?}: {e}")))?;
            match DEFAULTS.iter().find(|d| d.name == name) {
                Some(default) => {
                    rules.insert(default.name, expr);
                }
                None => {
                    aliases.insert(name.clone(), expr);
                }
            }
        }
        let policy = Policy { rules, aliases };
        // The file's rules in the file's order: the first problem is named, always the same.
        let mut in_file: Vec<(&str, usize)> =
            written.keys().map(|name| (name.as_str(), lines[name.as_str()])).collect();
        in_file.sort_by_key(|(name, line)| (*line, *name));
        // Every rule named exists (the defaults name only defaults: only the file's can dangle).
        for (name, line) in &in_file {
            let expr = policy.expr(name).expect("a rule of the file is defined");
            if let Some(target) = expr.rules().into_iter().find(|t| policy.expr(t).is_none()) {
                return Err(invalid(
                    *line,
                    format!("{name:?} names rule:{target}, which no rule defines"),
                ));
            }
        }
        // Every rule of the file is gsaasd's or named by one.
        let named: std::collections::HashSet<&str> =
            policy.all().flat_map(|(_, expr)| expr.rules()).collect();
        for (name, line) in &in_file {
            if policy.aliases.contains_key(*name) && !named.contains(name) {
                return Err(invalid(
                    *line,
                    format!(
                        "unknown rule name {name:?}: gsaasd checks none by that name and no \
                         rule names it (gsaasd policy dump lists gsaasd's rules)"
                    ),
                ));
            }
        }
        // No rule names itself (the defaults do not loop: a loop goes through a rule of the file).
        for (name, line) in &in_file {
            if policy.cycles_from(name) {
                return Err(invalid(*line, format!("{name:?} names itself through rule: checks")));
            }
        }
        Ok(policy)
    }

    fn all(&self) -> impl Iterator<Item = (&str, &Expr)> {
        self.rules
            .iter()
            .map(|(n, e)| (*n, e))
            .chain(self.aliases.iter().map(|(n, e)| (n.as_str(), e)))
    }

    fn expr(&self, name: &str) -> Option<&Expr> {
        self.rules.get(name).or_else(|| self.aliases.get(name))
    }

    /// Whether following `rule:` checks from `start` comes back to it (every rule reachable is
    /// followed, however deep).
    fn cycles_from(&self, start: &str) -> bool {
        let mut stack: Vec<&str> = vec![start];
        let mut seen = std::collections::HashSet::new();
        while let Some(name) = stack.pop() {
            let Some(expr) = self.expr(name) else { continue };
            for next in expr.rules() {
                if next == start {
                    return true;
                }
                if seen.insert(next) {
                    stack.push(next);
                }
            }
        }
        false
    }

    /// How deep `rule:` checks may nest: no chain without a loop is longer than the rules.
    fn depth_limit(&self) -> usize {
        self.rules.len() + self.aliases.len() + 1
    }

    /// Whether `caller` may take `action` on `target`.
    pub fn allows(&self, action: Action, caller: &Caller, target: Target<'_>) -> bool {
        if caller.scope.internal {
            return true;
        }
        let facts = Evaluation { policy: self, caller, target, depth: std::cell::Cell::new(0) };
        facts.rule(action.name())
    }

    /// [`Policy::allows`], or the refusal: 403 naming the rule for what the caller may see (its
    /// own project's, or an admin's anything), otherwise 404.
    pub fn authorize(
        &self,
        action: Action,
        caller: &Caller,
        target: Target<'_>,
    ) -> Result<(), Error> {
        if self.allows(action, caller, target) {
            return Ok(());
        }
        let sees = caller.is_admin()
            || matches!(target, Target::Project(p) if caller.project.as_deref() == Some(p));
        if sees {
            Err(Error::Forbidden(format!("the policy does not allow {}", action.name())))
        } else {
            Err(Error::NotFound { kind: "resource", id: String::new() })
        }
    }

    /// Whose VMs (queue entries, quotas) a list shows the caller: every project's (`None`) where
    /// `all` allows it, else its own where `own` does.
    pub fn list_scope<'c>(
        &self,
        caller: &'c Caller,
        own: Action,
        all: Action,
    ) -> Result<Option<&'c str>, Error> {
        if self.allows(all, caller, Target::own(caller)) {
            return Ok(None);
        }
        self.authorize(own, caller, Target::own(caller))?;
        match caller.project.as_deref() {
            Some(project) => Ok(Some(project)),
            None => Err(Error::NotFound { kind: "resource", id: String::new() }),
        }
    }
}

/// One rule's evaluation for a caller and a target.
struct Evaluation<'a> {
    policy: &'a Policy,
    caller: &'a Caller,
    target: Target<'a>,
    depth: std::cell::Cell<usize>,
}

impl Facts for Evaluation<'_> {
    fn credential(&self, key: &str) -> Vec<String> {
        let caller = self.caller;
        let one = |v: Option<&String>| v.into_iter().cloned().collect();
        match key {
            "user_id" => vec![caller.subject.clone()],
            "project_id" => one(caller.project.as_ref()),
            "project_name" => one(caller.scope.project_name.as_ref()),
            "project_domain_id" => one(caller.scope.project_domain_id.as_ref()),
            "system_scope" => {
                if caller.scope.system {
                    vec!["all".to_owned()]
                } else {
                    Vec::new()
                }
            }
            "is_admin" => vec![if caller.is_admin() { "True" } else { "False" }.to_owned()],
            "roles" => caller.scope.roles.clone(),
            _ => Vec::new(),
        }
    }

    fn target(&self, attribute: &str) -> Option<String> {
        match (attribute, self.target) {
            ("project_id", Target::Project(project)) => Some(project.to_owned()),
            _ => None,
        }
    }

    fn rule(&self, name: &str) -> bool {
        let Some(expr) = self.policy.expr(name) else { return false };
        let depth = self.depth.get();
        // Unreachable: a policy with a loop does not load.
        if depth >= self.policy.depth_limit() {
            return false;
        }
        self.depth.set(depth + 1);
        let verdict = expr.eval(self);
        self.depth.set(depth);
        verdict
    }
}

/// The line of `text` on which the key `name` is written (1 if not found): the name (quoted or
/// not), then `:` and white space or the line's end (so `gpu:vm:list` is not found on the line of
/// `gpu:vm:list:all_projects`).
fn line_of(text: &str, name: &str) -> usize {
    lines_of(text, name).first().copied().unwrap_or(1)
}

/// Every line of `text` on which the key `name` is written (see [`line_of`]).
fn lines_of(text: &str, name: &str) -> Vec<usize> {
    let forms = [format!("\"{name}\""), format!("'{name}'"), name.to_owned()];
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim_start();
            forms.iter().any(|form| {
                line.strip_prefix(form.as_str())
                    .map(str::trim_start)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .is_some_and(|after| after.is_empty() || after.starts_with(char::is_whitespace))
            })
        })
        .map(|(i, _)| i + 1)
        .collect()
}

/// A YAML map's entries in the file's order, every copy of a key kept (a map type keeps one).
struct Entries(Vec<(String, serde_norway::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of rule names to rules")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// The defaults as a policy file, every rule commented out with what it is for and the
/// operations it governs, as `oslopolicy-sample-generator` writes them: uncommenting a line
/// changes nothing until its rule is edited.
pub fn dump() -> String {
    let credentials: Vec<String> =
        CREDENTIALS[..CREDENTIALS.len() - 1].iter().map(|c| format!("{c}:")).collect();
    let attributes: Vec<String> = TARGET_ATTRIBUTES.iter().map(|a| format!("%({a})s")).collect();
    let header = format!(
        "Credentials a rule may name: role:NAME, {}. Target attributes: {} (the project of the \
         VM or quota acted on, or of the token for launches and lists; operators' actions on \
         hosts, GPUs and quotas have none).",
        credentials.join(", "),
        attributes.join(", ")
    );
    let mut out = String::from(
        "# GSaaS policy: the rules gsaasd checks, with their defaults.\n\
         # Uncomment and edit a rule to change it; set [auth] policy_file to this file.\n",
    );
    for line in wrap(&header, 98) {
        let _ = writeln!(out, "# {line}");
    }
    out.push('\n');
    for d in DEFAULTS {
        if !d.description.is_empty() {
            for line in wrap(d.description, 98) {
                let _ = writeln!(out, "# {line}");
            }
        }
        for operation in d.operations {
            let (method, path) = operation.split_once(' ').unwrap_or(("", operation));
            let _ = writeln!(out, "# {method:<7} {path}");
        }
        let _ = writeln!(out, "#\"{}\": \"{}\"\n", d.name, d.default);
    }
    out
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(word.to_owned());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::{Role, Scope};

    fn keystone(project: &str, roles: &[&str], admin: bool) -> Caller {
        let mut caller = Caller::new(
            "user",
            Some(project.to_owned()),
            if admin { Role::Admin } else { Role::Member },
        );
        caller.scope =
            Scope { roles: roles.iter().map(|r| (*r).to_owned()).collect(), ..Scope::default() };
        caller
    }

    fn policy(text: &str) -> Result<Policy, String> {
        Policy::parse(text, Path::new("policy.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn the_defaults_are_the_rules_before_policy_files() {
        let p = Policy::default();
        let member = keystone("p1", &["reader"], false);
        let admin = keystone("ops", &["admin"], true);
        let agent = Caller::new("host-1", None, Role::Agent);
        use actions::*;
        for action in [VM_CREATE, VM_LIST, VM_SHOW, VM_DELETE, CGPU_ATTACH, QUOTA_SHOW, POOL_SHOW] {
            assert!(p.allows(action, &member, Target::Project("p1")), "{}", action.name());
            assert!(!p.allows(action, &member, Target::Project("p2")), "{}", action.name());
            assert!(p.allows(action, &admin, Target::Project("p2")), "{}", action.name());
            assert!(!p.allows(action, &agent, Target::Project("p2")), "{}", action.name());
        }
        for action in [VM_LIST_ALL, VM_SHOW_LOCATION, HOST_DRAIN, GPU_TAINT, QUOTA_SET, FENCE_LIST]
        {
            assert!(!p.allows(action, &member, Target::Project("p1")), "{}", action.name());
            assert!(p.allows(action, &admin, Target::Service), "{}", action.name());
        }
        // Refusals: 403 for what the caller sees, 404 for what it does not.
        let refused = p.authorize(HOST_DRAIN, &member, Target::Service).unwrap_err();
        assert!(matches!(refused, Error::NotFound { .. }), "{refused:?}");
        assert_eq!(p.list_scope(&member, VM_LIST, VM_LIST_ALL).unwrap(), Some("p1"),);
        assert_eq!(p.list_scope(&admin, VM_LIST, VM_LIST_ALL).unwrap(), None);
    }

    #[test]
    fn every_action_gsaasd_checks_has_a_default_and_the_dump_parses_back() {
        let _ = [actions::VM_CREATE, actions::GPU_UNTAINT];
        let dumped = dump();
        let uncommented: String = dumped
            .lines()
            .filter_map(|l| l.strip_prefix("#\""))
            .map(|l| format!("\"{l}\n"))
            .collect();
        let p = policy(&uncommented).unwrap();
        assert_eq!(p.rules.len(), DEFAULTS.len());
        assert!(p.aliases.is_empty());
        for d in DEFAULTS {
            assert!(dumped.contains(&format!("#\"{}\": \"{}\"", d.name, d.default)), "{}", d.name);
        }
    }

    #[test]
    fn an_operator_narrows_launches_to_members_and_takes_drain_from_a_project() {
        let p = policy(
            "# readers look, members launch\n\
             \"gpu:vm:create\": \"role:member and project_id:%(project_id)s\"\n\
             gpu:vm:list: \"(role:reader or role:member) and project_id:%(project_id)s or rule:context_is_admin\"\n\
             'gpu:host:drain': \"rule:context_is_admin and not rule:in_ops\"\n\
             in_ops: \"project_id:ops\"\n",
        )
        .unwrap();
        use actions::*;
        let reader = keystone("p1", &["reader"], false);
        let member = keystone("p1", &["member"], false);
        assert!(p.allows(VM_LIST, &reader, Target::Project("p1")));
        assert!(!p.allows(VM_CREATE, &reader, Target::Project("p1")));
        let refused = p.authorize(VM_CREATE, &reader, Target::Project("p1")).unwrap_err();
        assert!(
            matches!(&refused, Error::Forbidden(m) if m.contains("gpu:vm:create")),
            "{refused:?}"
        );
        assert!(p.allows(VM_CREATE, &member, Target::Project("p1")));
        let ops_admin = keystone("ops", &["admin"], true);
        let other_admin = keystone("infra", &["admin"], true);
        assert!(!p.allows(HOST_DRAIN, &ops_admin, Target::Service));
        assert!(p.allows(HOST_DRAIN, &other_admin, Target::Service));
        let refused = p.authorize(HOST_DRAIN, &ops_admin, Target::Service).unwrap_err();
        assert!(matches!(refused, Error::Forbidden(_)), "{refused:?}");
        // The rules the file does not name keep their defaults.
        assert!(p.allows(HOST_UNDRAIN, &ops_admin, Target::Service));
    }

    #[test]
    fn problems_in_a_file_are_named_with_their_line() {
        for (text, says) in [
            (
                "gpu:vm:create: \"role:member\"\ngpu:vm:creat: \"role:member\"\n",
                "line 2: unknown rule name \"gpu:vm:creat\"",
            ),
            ("\n\ngpu:vm:list: \"role:member and\"\n", "line 3: \"gpu:vm:list\": the rule ends"),
            ("gpu:vm:list: \"rule:nowhere\"\n", "line 1: \"gpu:vm:list\" names rule:nowhere"),
            ("a: \"rule:b\"\nb: \"rule:a\"\ngpu:vm:list: \"rule:a\"\n", "names itself"),
            ("gpu:vm:list: [\"role:member\"]\n", "line 1: \"gpu:vm:list\": a rule is a string"),
            ("gpu:vm:list: \"x\n  - : [\n", "not a YAML map"),
            ("- gpu:vm:list\n", "not a YAML map"),
            (
                "\"gpu:vm:show\": \"rule:admin_or_project_member\"\n# later\n'gpu:vm:show': \"@\"\n",
                "line 3: \"gpu:vm:show\" is written twice, on lines 1 and 3",
            ),
        ] {
            let error = policy(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
            assert!(error.contains("policy.yaml"), "{error}");
        }
        // An empty file, or one of comments, changes nothing.
        assert!(policy("# nothing\n").is_ok());
        // A name that starts another's is found on its own line.
        let text = "gpu:vm:list:all_projects: \"@\"\n\"gpu:vm:list\": \"role:\"\n";
        assert!(policy(text).unwrap_err().contains("line 2"), "{}", policy(text).unwrap_err());
        // A loop through a default is named on the file's line that makes it.
        let text = "\n\"admin_or_project_member\": \"rule:gpu:vm:create\"\n";
        let error = policy(text).unwrap_err();
        assert!(error.contains("line 2") && error.contains("names itself"), "{error}");
        // However long.
        let mut text: String = (0..40).map(|i| format!("a{i}: \"rule:a{}\"\n", i + 1)).collect();
        text.push_str("a40: \"rule:a0\"\n\"gpu:vm:list\": \"rule:a0\"\n");
        assert!(policy(&text).unwrap_err().contains("names itself"));
        // A long chain without a loop is fine, and followed to its end.
        let mut text: String = (0..40).map(|i| format!("a{i}: \"rule:a{}\"\n", i + 1)).collect();
        text.push_str("a40: \"role:member\"\n\"gpu:vm:list\": \"rule:a0\"\n");
        let p = policy(&text).unwrap();
        let member = keystone("p1", &["member"], false);
        assert!(p.allows(actions::VM_LIST, &member, Target::Project("p1")));
    }

    #[test]
    fn gsaasds_own_work_is_not_subject_to_the_policy() {
        let p = policy("\"gpu:vm:delete\": \"!\"\n").unwrap();
        assert!(p.allows(actions::VM_DELETE, &Caller::internal(), Target::Project("p1")));
        let admin = keystone("ops", &["admin"], true);
        assert!(!p.allows(actions::VM_DELETE, &admin, Target::Project("p1")));
    }
}
