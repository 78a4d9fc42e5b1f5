//! Placement that knows the network: groups of hosts at the operator's levels, round-trip times
//! the agents measured, and requests that ask for either ([`NetworkConstraint`]).
//!
//! The VM's host is the cloud's to choose, after the cGPUs are placed. So a request with a
//! network constraint is placed as `local` is, group by group: the policy's best GPU names a
//! group (its host's group at the level), the cGPUs are placed among that group's GPUs, and the
//! VM may then run on that group's hosts only ([`Pool::vm_hosts_for`] says which; the caller
//! hands them to the cloud). A group that cannot take the request, or has no host the VM may
//! run on, is hidden and the next best tried: every group is tried for the request's own level,
//! so a refusal means none could; `nearest`'s extra levels (inside the request's own, or all)
//! try at most [`NEAREST_TRIES`] groups each, being preferences, and stay inside the group of
//! the required level. With a round-trip limit the group is a neighbourhood instead: each host
//! the VM may run on near the best GPU (nearest first), with the GPU hosts within the limit of
//! it (what its agent measured: at most 64). A placement tries at most
//! [`MAX_RTT_VM_HOST_TRIES`] VM hosts, so a request that fits no neighbourhood costs a bounded
//! amount whatever the fleet's size; past the bound it fails now (507, or waits in the queue)
//! though it might have fitted further on.
//!
//! cGPUs added to a running VM (attach, re-homing) go where its host allows: its groups at the
//! preferred levels first, then all the hard constraints admit.
//!
//! Requests without a network constraint never come here: their cost is what it was.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{empty_gpu_room, Filter, Pool};
use crate::error::Error;
use crate::ids::HostId;
use crate::model::{CgpuAssignment, HostKind, HostState, Locality, RcudaEndpoint, Request};
use crate::seeded::SplitMix64;
use crate::topology::{topology_problem, NetworkConstraint, Strength, Topology};

/// Groups `nearest` tries at each level it adds before going out a level.
pub const NEAREST_TRIES: usize = 8;
/// With a round-trip limit: the most hosts the VM may run on that one placement tries, each
/// with its neighbourhood (a bound on what a request no neighbourhood can take costs).
pub const MAX_RTT_VM_HOST_TRIES: usize = 64;

/// Where a host sits in the network, beside its [`super::HostEntry`] (which decisions read at
/// every step, so it stays small): its groups, and what its agent measured.
#[derive(Debug, Default)]
pub(super) struct HostPlace {
    /// Its group at each level (see [`crate::topology`]).
    pub(super) topology: Topology,
    /// Round trips (microseconds) its agent measured to other hosts, by host.
    pub(super) rtt_to: HashMap<u32, u32>,
}

/// Who measured each host: by host, (the measuring host, its round trip).
pub(super) type MeasuredBy = HashMap<u32, Vec<(u32, u32)>>;

/// The hosts' groups at each level.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// The levels hosts carry, innermost first: most groups first, ties by name.
    levels: Vec<String>,
    /// Per level, in `levels`' order: each group's hosts, ascending.
    members: Vec<HashMap<String, Vec<u32>>>,
}

impl Groups {
    fn level(&self, name: &str) -> Option<usize> {
        self.levels.iter().position(|l| l == name)
    }

    /// The hosts of the group `place` is in at `level` (ascending); `None`: it has no group there.
    fn of(&self, place: &HostPlace, level: usize) -> Option<&Vec<u32>> {
        self.members[level].get(place.topology.get(&self.levels[level])?)
    }
}

impl Pool {
    /// Sets where `id` sits in the network. Placements made stay where they are.
    pub fn set_host_topology(&mut self, id: &HostId, topology: Topology) -> Result<(), Error> {
        if let Some((level, why)) = topology_problem(&topology) {
            let at = level.map(|l| format!(" (level {l})")).unwrap_or_default();
            return Err(Error::inventory("topology", format!("host {id}{at}: {why}")));
        }
        let h = self.host_index(id)?;
        if self.places[h as usize].topology != topology {
            self.places[h as usize].topology = topology;
            self.groups.take();
            self.changes += 1;
            self.host_changes += 1;
        }
        Ok(())
    }

    /// Replaces the round-trip times (microseconds) measured from `from` to other hosts.
    /// Hosts not registered are skipped, and counted in the answer.
    pub fn set_host_rtts(
        &mut self,
        from: &HostId,
        rtts: impl IntoIterator<Item = (HostId, u32)>,
    ) -> Result<usize, Error> {
        let h = self.host_index(from)?;
        let mut known = HashMap::new();
        let mut unknown = 0;
        for (to, us) in rtts {
            match self.host_by_id.get(&to) {
                Some(&t) if t != h => {
                    known.insert(t, us);
                }
                Some(_) => {}
                None => unknown += 1,
            }
        }
        if self.places[h as usize].rtt_to != known {
            self.places[h as usize].rtt_to = known;
            self.measured_by.take();
            self.changes += 1;
        }
        Ok(unknown)
    }

    /// A round trip from `from` to `to` derived from where they sit, for hosts whose agents
    /// measure none (the embedded default's in-process hosts), as the network simulator
    /// (`examples/network.rs`) models a fleet: 50 µs within their innermost shared group, 150 µs
    /// one level out, 500 µs the level after, 2,000 µs beyond (0 to itself). `None`: a host is
    /// not registered, or either has no topology.
    pub fn nominal_rtt_us(&self, from: &HostId, to: &HostId) -> Option<u32> {
        let (&f, &t) = (self.host_by_id.get(from)?, self.host_by_id.get(to)?);
        if f == t {
            return Some(0);
        }
        let (a, b) = (&self.places[f as usize].topology, &self.places[t as usize].topology);
        if a.is_empty() || b.is_empty() {
            return None;
        }
        let groups = self.groups();
        let shared = |level: &String| a.get(level).is_some_and(|group| b.get(level) == Some(group));
        Some(match groups.levels.iter().position(shared) {
            Some(0) => 50,
            Some(1) => 150,
            Some(2) => 500,
            _ => 2_000,
        })
    }

    /// The levels hosts carry, innermost first.
    pub fn levels(&self) -> Vec<String> {
        self.groups().levels.clone()
    }

    /// The round-trip time from `from` to `to` as measured (0 to itself).
    pub fn rtt_us(&self, from: &HostId, to: &HostId) -> Option<u32> {
        self.reach(*self.host_by_id.get(from)?, *self.host_by_id.get(to)?)
    }

    /// The compute-gpu hosts whose round trips `host`'s agent should measure, at most `max`:
    /// those sharing its innermost group first, then the next level out, then the rest; among
    /// equals in an order of `host`'s own (a hash of both), so that a fleet's hosts do not all
    /// measure the same few. Each with the rCUDA endpoint of a GPU that serves (its first if
    /// none does) to connect to. Not `host` itself. `None`: `host` is not registered.
    pub fn rtt_targets(&self, host: &HostId, max: usize) -> Option<Vec<(HostId, RcudaEndpoint)>> {
        let &from = self.host_by_id.get(host)?;
        let groups = self.groups();
        let topology = &self.places[from as usize].topology;
        let distance = |h: u32| {
            let other = &self.places[h as usize].topology;
            groups
                .levels
                .iter()
                .position(|level| topology.get(level).is_some_and(|g| other.get(level) == Some(g)))
                .unwrap_or(groups.levels.len())
        };
        let shuffle = |h: u32| SplitMix64::new(u64::from(from) << 32 | u64::from(h)).next_u64();
        let mut targets: Vec<(usize, u64, u32)> = (0..self.hosts.len() as u32)
            .filter(|&h| h != from && self.hosts[h as usize].kind == HostKind::ComputeGpu)
            .filter(|&h| !self.hosts[h as usize].slots.is_empty())
            .map(|h| (distance(h), shuffle(h), h))
            .collect();
        targets.sort_unstable();
        let targets = targets
            .into_iter()
            .take(max)
            .map(|(_, _, h)| {
                let host = &self.hosts[h as usize];
                let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
                let serving = gpus.clone().find(|gpu| self.serves(gpu));
                let gpu = serving.or_else(|| gpus.clone().next()).expect("a host with GPUs");
                (host.id.clone(), gpu.spec.rcuda)
            })
            .collect();
        Some(targets)
    }

    /// The hosts a VM of `request` may run on now that its cGPUs are on `gpu_hosts`: its
    /// locality's hosts, in the group of them all at the required level, within the round-trip
    /// limit of each, and in the innermost group of them all that has one at a preferred level
    /// (`nearest`: any level). In pool order. `None`: the request asks nothing of the network
    /// (or is `local`), so its locality alone decides. Empty: no host will do.
    pub fn vm_hosts_for(&self, request: &Request, gpu_hosts: &[HostId]) -> Option<Vec<HostId>> {
        if request.locality == Locality::Local || request.network.is_empty() {
            return None;
        }
        let mut hosts = self.host_indexes(gpu_hosts)?;
        hosts.sort_unstable();
        hosts.dedup();
        let groups = self.groups();
        let set = self.vm_host_set(request, &groups, &hosts);
        Some(set.into_iter().map(|h| self.hosts[h as usize].id.clone()).collect())
    }

    /// Whether a VM of `request` running on `vm_host`, its cGPUs on `gpu_hosts`, meets the hard
    /// part of its network constraint: one group with them all at the required level, each
    /// within the round-trip limit. Preferences and the hosts' states do not count: the cloud
    /// has put the VM there already.
    pub fn meets_network(&self, request: &Request, vm_host: &HostId, gpu_hosts: &[HostId]) -> bool {
        if request.locality == Locality::Local || !request.network.is_hard() {
            return true;
        }
        let Some(&v) = self.host_by_id.get(vm_host) else { return false };
        let Some(hosts) = self.host_indexes(gpu_hosts) else { return false };
        let network = &request.network;
        let same_group = network.required_level().is_none_or(|level| {
            let group = self.places[v as usize].topology.get(level);
            group.is_some()
                && hosts.iter().all(|&g| self.places[g as usize].topology.get(level) == group)
        });
        same_group && hosts.iter().all(|&g| self.within(v, g, network.max_rtt_us))
    }

    /// A request's network level no host carries: 422 naming it.
    pub(super) fn check_levels(&mut self, network: &NetworkConstraint) -> Result<(), Error> {
        let Some(level) = &network.same else { return Ok(()) };
        let groups = self.groups();
        if groups.level(level).is_some() {
            return Ok(());
        }
        let known = if groups.levels.is_empty() {
            "no host has a topology".to_owned()
        } else {
            format!("the levels hosts have are {}", groups.levels.join(", "))
        };
        Err(Error::invalid("network.same", format!("no host is in a {level:?} group: {known}")))
    }

    /// Locality `any` or `remote` with a network constraint (see the module docs): the request's
    /// levels in turn, innermost first, then (unless a level is required) anywhere.
    pub(super) fn place_network(
        &mut self,
        request: &Request,
        view: usize,
        filter: &Filter,
    ) -> Result<Vec<CgpuAssignment>, u32> {
        let groups = self.groups();
        let network = &request.network;
        let own = network.same.as_deref().and_then(|l| groups.level(l));
        let required = own.filter(|_| network.strength == Strength::Required);
        let mut attempts: Vec<(Option<usize>, Option<usize>)> = Vec::new();
        for level in 0..groups.levels.len() {
            if Some(level) == own {
                attempts.push((Some(level), None));
                if required.is_some() {
                    break;
                }
            } else if network.nearest {
                attempts.push((Some(level), Some(NEAREST_TRIES)));
            }
        }
        if required.is_none() {
            attempts.push((None, None));
        }
        let mut best = 0;
        for (level, bound) in attempts {
            let outcome = match (level, network.max_rtt_us) {
                (None, None) => self.place_on(request, view, filter, None, &[]).map(|(c, _)| c),
                _ => self.place_in_groups(request, view, filter, &groups, level, required, bound),
            };
            match outcome {
                Ok(cgpus) => return Ok(cgpus),
                Err(placed) => best = best.max(placed),
            }
        }
        Err(best)
    }

    /// Tries groups at `level` (`None`: round-trip neighbourhoods alone) in the order of their
    /// best GPU, at most `bound` of them, hiding each that fails until the end. Every group is
    /// cut to the best GPU's host's group at the `required` level. With a round-trip limit, the
    /// VM hosts near the best GPU are tried in turn (nearest first), each with the GPU hosts
    /// within the limit of it; a VM host is tried once (what it failed to take it cannot take
    /// later, as the hidden GPUs only grow), and at most [`MAX_RTT_VM_HOST_TRIES`] in all.
    #[allow(clippy::too_many_arguments)]
    fn place_in_groups(
        &mut self,
        request: &Request,
        view: usize,
        filter: &Filter,
        groups: &Groups,
        level: Option<usize>,
        required: Option<usize>,
        bound: Option<usize>,
    ) -> Result<Vec<CgpuAssignment>, u32> {
        let max = request.network.max_rtt_us;
        let measured_by = max.map(|_| self.measured_by());
        let mut hidden: Vec<u32> = Vec::new();
        let mut tried_vm_hosts: HashSet<u32> = HashSet::new();
        let mut best = 0;
        let mut tries = 0;
        let outcome = loop {
            if bound.is_some_and(|b| tries >= b) || tried_vm_hosts.len() >= MAX_RTT_VM_HOST_TRIES {
                break Err(best);
            }
            let Some(first) = self.select(view, request, filter, None) else { break Err(best) };
            tries += 1;
            let around = self.gpus[first as usize].host;
            // The hosts the group holds (`None`: every host), ascending.
            let place = &self.places[around as usize];
            let group_at = |l: usize| groups.of(place, l).cloned().unwrap_or_default();
            let mut members: Option<Vec<u32>> = level.or(required).map(group_at);
            if let (Some(r), Some(l), Some(hosts)) = (required, level, members.as_mut()) {
                if r != l {
                    let outer = group_at(r);
                    hosts.retain(|h| outer.binary_search(h).is_ok());
                }
            }
            let in_group = |h: &u32| members.as_ref().is_none_or(|m| m.binary_search(h).is_ok());
            let mut placed = Err(0);
            let mut exhausted = true;
            match (max, &measured_by) {
                (Some(max), Some(measured_by)) => {
                    let mut vm_hosts: Vec<(u32, u32)> = measured_by
                        .get(&around)
                        .into_iter()
                        .flatten()
                        .copied()
                        .filter(|&(_, us)| us <= max)
                        .chain(std::iter::once((around, 0)))
                        .filter(|&(h, _)| {
                            in_group(&h)
                                && self.takes_vm(h, request.locality)
                                && !tried_vm_hosts.contains(&h)
                        })
                        .map(|(h, us)| (us, h))
                        .collect();
                    vm_hosts.sort_unstable();
                    for &(_, h) in &vm_hosts {
                        if tried_vm_hosts.len() >= MAX_RTT_VM_HOST_TRIES {
                            exhausted = false;
                            break;
                        }
                        tried_vm_hosts.insert(h);
                        let near: Vec<u32> = std::iter::once(h)
                            .chain(
                                self.places[h as usize]
                                    .rtt_to
                                    .iter()
                                    .filter(|&(_, &us)| us <= max)
                                    .map(|(&g, _)| g),
                            )
                            .filter(|g| in_group(g))
                            .collect();
                        let within = self.slots_of(&near);
                        placed = self.place_on(request, view, filter, Some(&within), &[]);
                        match placed {
                            Ok(_) => break,
                            Err(n) => best = best.max(n),
                        }
                    }
                }
                _ => {
                    let members = members.as_deref().unwrap_or_default();
                    if members.iter().any(|&h| self.takes_vm(h, request.locality)) {
                        let within = self.slots_of(members);
                        placed = self.place_on(request, view, filter, Some(&within), &[]);
                    }
                }
            }
            match placed {
                Ok((cgpus, _)) => break Ok(cgpus),
                Err(_) if !exhausted => break Err(best),
                Err(n) => {
                    best = best.max(n);
                    // Without a limit the whole group failed; with one, every VM host near the
                    // best GPU's host did: that host is no use to any other.
                    let hide = match (&members, max) {
                        (Some(members), None) if !members.is_empty() => self.slots_of(members),
                        _ => self.hosts[around as usize].slots.clone(),
                    };
                    self.set_masked(&hide, true);
                    hidden.extend(hide);
                }
            }
        };
        self.set_masked(&hidden, false);
        outcome
    }

    /// For cGPUs of a VM running on `vm_host`: the slots to try in turn, the preferred levels'
    /// groups first, then all its hard constraints admit (`None`: any GPU).
    pub(super) fn near_tiers(
        &mut self,
        network: &NetworkConstraint,
        vm_host: &HostId,
    ) -> Vec<Option<Vec<u32>>> {
        let Some(&at) = self.host_by_id.get(vm_host) else { return vec![Some(Vec::new())] };
        let groups = self.groups();
        let group_of = |pool: &Pool, level: usize| groups.of(&pool.places[at as usize], level);
        let allowed: Option<Vec<u32>> = network.is_hard().then(|| {
            let required = network.required_level().and_then(|l| groups.level(l));
            let hosts: Vec<u32> = match required {
                Some(level) => group_of(self, level).cloned().unwrap_or_default(),
                None => (0..self.hosts.len() as u32).collect(),
            };
            hosts.into_iter().filter(|&g| self.within(at, g, network.max_rtt_us)).collect()
        });
        let mut tiers = Vec::new();
        for level in narrowing_levels(network, &groups) {
            if let Some(members) = group_of(self, level) {
                let hosts: Vec<u32> = members
                    .iter()
                    .copied()
                    .filter(|h| allowed.as_ref().is_none_or(|a| a.binary_search(h).is_ok()))
                    .collect();
                tiers.push(Some(self.slots_of(&hosts)));
            }
        }
        tiers.push(allowed.map(|hosts| self.slots_of(&hosts)));
        tiers
    }

    /// [`Pool::could_ever_fit`] for a request with a hard network constraint, placed anew: some
    /// group (or a VM host's neighbourhood) has a host the VM may run on and, were every booking
    /// gone, room enough. One pass over the GPUs, then over the groups or the measured pairs.
    pub(super) fn could_ever_fit_network(&mut self, request: &Request, filter: &Filter) -> bool {
        let n = u64::from(request.ncgpus);
        let room: Vec<u64> = self
            .hosts
            .iter()
            .map(|host| {
                if host.state != HostState::Schedulable || host.kind != HostKind::ComputeGpu {
                    return 0;
                }
                let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
                gpus.filter(|gpu| self.serves(gpu) && filter.rank(gpu.kind).is_some())
                    .map(|gpu| empty_gpu_room(gpu.spec.memory_mib, request))
                    .fold(0u64, u64::saturating_add)
            })
            .collect();
        let groups = self.groups();
        let required = request.network.required_level().and_then(|l| groups.level(l));
        let Some(max) = request.network.max_rtt_us else {
            let Some(level) = required else { return true };
            return groups.members[level].values().any(|members| {
                members.iter().any(|&h| self.takes_vm(h, request.locality))
                    && members.iter().map(|&h| room[h as usize]).fold(0, u64::saturating_add) >= n
            });
        };
        let level_name = required.map(|level| groups.levels[level].as_str());
        (0..self.hosts.len() as u32).filter(|&h| self.takes_vm(h, request.locality)).any(|h| {
            let host = &self.places[h as usize];
            let group = level_name.map(|name| (name, host.topology.get(name)));
            let same_group = |g: u32| match group {
                None => true,
                Some((_, None)) => false,
                Some((name, Some(group))) => {
                    self.places[g as usize].topology.get(name) == Some(group)
                }
            };
            let near = host.rtt_to.iter().filter(|&(_, &us)| us <= max).map(|(&g, _)| g);
            let reachable = std::iter::once(h).chain(near).filter(|&g| same_group(g));
            reachable.map(|g| room[g as usize]).fold(0, u64::saturating_add) >= n
        })
    }

    /// [`Pool::could_ever_attach`] for a VM on `vm_host` with a hard network constraint.
    pub(super) fn could_ever_attach_near(
        &mut self,
        request: &Request,
        filter: &Filter,
        vm_host: &HostId,
    ) -> bool {
        let Some(Some(slots)) = self.near_tiers(&request.network, vm_host).pop() else {
            return true;
        };
        let room: u64 = slots
            .iter()
            .map(|&s| &self.gpus[s as usize])
            .filter(|gpu| {
                self.serves(gpu)
                    && self.hosts[gpu.host as usize].state == HostState::Schedulable
                    && filter.rank(gpu.kind).is_some()
            })
            .map(|gpu| empty_gpu_room(gpu.spec.memory_mib, request))
            .fold(0, u64::saturating_add);
        room >= u64::from(request.ncgpus)
    }

    fn vm_host_set(&self, request: &Request, groups: &Groups, gpu_hosts: &[u32]) -> Vec<u32> {
        let network = &request.network;
        let mut candidates: Vec<u32> =
            (0..self.hosts.len() as u32).filter(|&h| self.takes_vm(h, request.locality)).collect();
        let Some(&first) = gpu_hosts.first() else { return candidates };
        let shared_group = |level: usize| {
            let members = groups.of(&self.places[first as usize], level)?;
            gpu_hosts.iter().all(|g| members.binary_search(g).is_ok()).then_some(members)
        };
        if let Some(level) = network.required_level() {
            match groups.level(level).and_then(shared_group) {
                Some(members) => candidates.retain(|h| members.binary_search(h).is_ok()),
                None => return Vec::new(),
            }
        }
        if let Some(max) = network.max_rtt_us {
            candidates.retain(|&h| gpu_hosts.iter().all(|&g| self.within(h, g, Some(max))));
        }
        for level in narrowing_levels(network, groups) {
            if let Some(members) = shared_group(level) {
                let narrowed: Vec<u32> = candidates
                    .iter()
                    .copied()
                    .filter(|h| members.binary_search(h).is_ok())
                    .collect();
                if !narrowed.is_empty() {
                    return narrowed;
                }
            }
        }
        candidates
    }

    fn groups(&self) -> Arc<Groups> {
        Arc::clone(self.groups.get_or_init(|| {
            let mut by_level: BTreeMap<&str, HashMap<String, Vec<u32>>> = BTreeMap::new();
            for (h, place) in self.places.iter().enumerate() {
                for (level, group) in &place.topology {
                    let level = by_level.entry(level).or_default();
                    level.entry(group.clone()).or_default().push(h as u32);
                }
            }
            let mut levels: Vec<(&str, HashMap<String, Vec<u32>>)> = by_level.into_iter().collect();
            levels.sort_by(|(a, ga), (b, gb)| gb.len().cmp(&ga.len()).then_with(|| a.cmp(b)));
            Arc::new(Groups {
                levels: levels.iter().map(|(l, _)| (*l).to_owned()).collect(),
                members: levels.into_iter().map(|(_, m)| m).collect(),
            })
        }))
    }

    /// Who measured each host, by host: (the measuring host, its round trip).
    fn measured_by(&self) -> Arc<MeasuredBy> {
        Arc::clone(self.measured_by.get_or_init(|| {
            let mut index = MeasuredBy::new();
            for (from, place) in self.places.iter().enumerate() {
                for (&to, &us) in &place.rtt_to {
                    index.entry(to).or_default().push((from as u32, us));
                }
            }
            Arc::new(index)
        }))
    }

    /// Each host's index; `None` when one is not registered.
    fn host_indexes(&self, hosts: &[HostId]) -> Option<Vec<u32>> {
        hosts.iter().map(|h| self.host_by_id.get(h).copied()).collect()
    }

    fn host_index(&self, id: &HostId) -> Result<u32, Error> {
        self.host_by_id
            .get(id)
            .copied()
            .ok_or_else(|| Error::inventory("host", format!("host {id} is not registered")))
    }

    /// The measured round-trip time from `from` to `to` (0 to itself).
    fn reach(&self, from: u32, to: u32) -> Option<u32> {
        if from == to {
            return Some(0);
        }
        self.places[from as usize].rtt_to.get(&to).copied()
    }

    /// Whether `to` is within `max` of `from` (any host is without a limit).
    fn within(&self, from: u32, to: u32, max: Option<u32>) -> bool {
        max.is_none_or(|max| self.reach(from, to).is_some_and(|us| us <= max))
    }

    /// Whether a VM of `locality` may run on host `h` now.
    fn takes_vm(&self, h: u32, locality: Locality) -> bool {
        let host = &self.hosts[h as usize];
        host.state == HostState::Schedulable
            && match locality {
                Locality::Remote => host.kind == HostKind::ComputeRgpu,
                Locality::Any | Locality::Local => host.kind.has_agent(),
            }
    }

    fn slots_of(&self, hosts: &[u32]) -> Vec<u32> {
        hosts.iter().flat_map(|&h| self.hosts[h as usize].slots.iter().copied()).collect()
    }
}

/// The levels whose groups a request prefers, innermost first: every level with `nearest`, its
/// own level when preferred.
fn narrowing_levels(network: &NetworkConstraint, groups: &Groups) -> Vec<usize> {
    if network.nearest {
        return (0..groups.levels.len()).collect();
    }
    match (&network.same, network.strength) {
        (Some(level), Strength::Preferred) => groups.level(level).into_iter().collect(),
        _ => Vec::new(),
    }
}
