//! Placement: a request's cGPUs placed all or nothing (anywhere, `local` on one host, or by
//! network), attached, released, detached and restored.

use super::*;

impl Pool {
    /// Builds now what the next decision under `policy` would build first (the policy's indexes
    /// over every GPU, the pool's limits): a service that has just loaded the pool calls it, so
    /// its first launch does not pay for it (some 20 ms at 100,000 GPUs).
    pub fn prepare(&mut self, policy: &str) -> Result<(), Error> {
        self.views_for(policy)?;
        if self.views_stale {
            self.rebuild_views();
        }
        self.limits();
        Ok(())
    }

    /// Places every cGPU of `request` for `vm` under `policy`, or changes nothing.
    pub fn place(&mut self, vm: VmId, request: &Request, policy: &str) -> Result<Placement, Error> {
        if self.vms.contains_key(&vm) {
            return Err(Error::Conflict(format!("VM {vm} already holds cGPUs")));
        }
        let view = self.views_for(policy)?;
        let limits = self.limits();
        validate(request, &limits)?;
        let shortfall = |placeable, no_vm_host| {
            Error::InsufficientCapacity(Shortfall::of(request, placeable, no_vm_host))
        };
        let has_vm_host = match request.locality {
            Locality::Any => limits.schedulable_agent_host,
            Locality::Remote => limits.schedulable_rgpu_host,
            Locality::Local => true,
        };
        if !has_vm_host {
            return Err(shortfall(0, true));
        }
        if self.views_stale {
            self.rebuild_views();
        }
        if !request.network.is_empty() {
            self.check_levels(&request.network)?;
        }
        let filter = self.filter(view, &request.gpu_constraints(), request.ncgpus)?;
        let outcome = match request.locality {
            Locality::Local => self.place_local(request, view, &filter),
            Locality::Any | Locality::Remote if request.network.is_empty() => {
                self.place_on(request, view, &filter, None, &[])
            }
            Locality::Any | Locality::Remote => self
                .place_network(request, view, &filter)
                .map(|cgpus| (cgpus, vm_host_of(request.locality))),
        };
        let (cgpus, vm_host) = match outcome {
            Ok(done) => done,
            Err(placeable) if !self.could_ever_fit(request, None) => {
                return Err(Error::InsufficientCapacity(Shortfall::never_fits(request, placeable)))
            }
            Err(placeable) => return Err(shortfall(placeable, false)),
        };
        let vm_resources = match vm_host {
            VmHost::Pinned(_) => request.vm_resources,
            _ => None,
        };
        let policy = self.views[view].policy.name();
        let placement = Placement { vm, policy, vm_host, cgpus, vm_resources };
        self.hold(vm, &placement.cgpus);
        self.book_vm_resources(&placement);
        self.vms.insert(vm, placement.clone());
        self.changes += 1;
        Ok(placement)
    }

    /// Locality `local`: hosts are tried in the order of their best GPU under the policy; the first that
    /// takes all cGPUs (and has room for the VM, see `pool/stranding.rs`) wins. A host that cannot is
    /// hidden and the next one tried. A policy that weighs stranding compares the next
    /// [`LOOKAHEAD`] hosts with room by the GPU the VM would strand, least first.
    pub(super) fn place_local(
        &mut self,
        request: &Request,
        view: usize,
        filter: &Filter,
    ) -> Result<(Vec<CgpuAssignment>, VmHost), u32> {
        let lookahead =
            match request.vm_resources.is_some() && self.views[view].policy.weighs_stranding() {
                true => LOOKAHEAD,
                false => 1,
            };
        let mut tried: Vec<u32> = Vec::new();
        // Hosts with room, hidden while compared: (steps stranded, order found, host).
        let mut pending: Vec<(u64, usize, u32)> = Vec::new();
        let mut found = 0;
        let mut misses = 0;
        // Found by a pass over the hosts with room, the next last.
        let mut scanned: Vec<u32> = Vec::new();
        let mut passes = 0u32;
        let mut best_partial = 0;
        let outcome = loop {
            while pending.len() < lookahead && pending.last().is_none_or(|p| p.0 > 0) {
                // After a few hosts without room for the VM, only those with room are looked
                // at: the next hosts' best GPUs, in the policy's order, found in one pass.
                let first = match misses < ROOMLESS_HOSTS_BEFORE_SCAN {
                    true => self.select(view, request, filter, None),
                    false => {
                        if scanned.is_empty() {
                            // More hosts each pass, so hosts that fail cost few passes.
                            let wanted = (16usize << passes.min(10)).max(lookahead);
                            passes += 1;
                            scanned = self.best_hosts_with_room(view, request, filter, wanted);
                            scanned.reverse();
                        }
                        scanned.pop()
                    }
                };
                let Some(first) = first else { break };
                let host = self.gpus[first as usize].host;
                let slots = self.hosts[host as usize].slots.clone();
                self.set_masked(&slots, true);
                tried.push(host);
                if !self.host_has_room(host, request.vm_resources.as_ref()) {
                    misses += 1;
                } else {
                    let steps = match lookahead {
                        1 => 0,
                        _ => self.strand_steps(host, request, first),
                    };
                    pending.push((steps, found, host));
                    found += 1;
                }
            }
            let Some(at) = (0..pending.len()).min_by_key(|&i| (pending[i].0, pending[i].1)) else {
                break Err(best_partial);
            };
            let (_, _, host) = pending.remove(at);
            let slots = self.hosts[host as usize].slots.clone();
            self.set_masked(&slots, false);
            match self.place_on(request, view, filter, Some(&slots), &[]) {
                Ok((cgpus, _)) => {
                    break Ok((cgpus, VmHost::Pinned(self.hosts[host as usize].id.clone())))
                }
                Err(placed) => {
                    best_partial = best_partial.max(placed);
                    self.set_masked(&slots, true);
                }
            }
        };
        for host in tried {
            let slots = self.hosts[host as usize].slots.clone();
            self.set_masked(&slots, false);
        }
        outcome
    }

    /// Places the request's cGPUs one by one, among all GPUs (through the selector) or `within` one
    /// host's slots (by a scan: a host's GPUs are few). `held` are the slots of the cGPUs the VM
    /// already holds (an attach): `distinct_gpus` keeps off them, and they count as the VM's GPUs
    /// and hosts. On failure undoes its own work and returns how many cGPUs it had placed.
    pub(super) fn place_on(
        &mut self,
        request: &Request,
        view: usize,
        filter: &Filter,
        within: Option<&[u32]>,
        held: &[u32],
    ) -> Result<(Vec<CgpuAssignment>, VmHost), u32> {
        let mut chosen: Vec<u32> = Vec::with_capacity(request.ncgpus as usize);
        let mut gpus_used: HashSet<u32> = held.iter().copied().collect();
        let mut hosts_used: HashSet<u32> =
            held.iter().map(|&s| self.gpus[s as usize].host).collect();
        let mut failed = false;
        let mut hidden: Vec<u32> = self.compute_hidden(request);
        if request.distinct_gpus {
            hidden.extend(gpus_used.iter().copied());
        }
        // Those a caller hid stay hidden after.
        if !hidden.is_empty() {
            hidden.retain(|&s| !self.masked[s as usize]);
            hidden.sort_unstable();
            hidden.dedup();
            self.set_masked(&hidden, true);
        }
        // Compute shares taken on each slot by this request so far.
        let mut taking: HashMap<u32, u32> = HashMap::new();
        for _ in 0..request.ncgpus {
            let Some(slot) = self.select(view, request, filter, within) else {
                failed = true;
                break;
            };
            if let Some(percent) = request.compute_percent {
                let taken = taking.entry(slot).or_default();
                *taken += percent;
                if self.gpus[slot as usize].compute_percent + *taken + percent > 100 {
                    self.set_masked(&[slot], true);
                    hidden.push(slot);
                }
            }
            let new_gpu = gpus_used.insert(slot);
            let new_host = hosts_used.insert(self.gpus[slot as usize].host);
            self.take(
                slot,
                request_memory(request, &self.gpus[slot as usize]),
                request.mode,
                new_gpu,
                new_host,
            );
            if request.distinct_gpus {
                self.set_masked(&[slot], true);
                hidden.push(slot);
            }
            chosen.push(slot);
        }
        if !hidden.is_empty() {
            self.set_masked(&hidden, false);
        }
        if failed {
            let booked: Vec<(u32, u64, Mode)> = chosen
                .iter()
                .map(|&s| (s, request_memory(request, &self.gpus[s as usize]), request.mode))
                .collect();
            self.untake_all(&booked, held);
            return Err(chosen.len() as u32);
        }
        let cgpus = chosen
            .iter()
            .enumerate()
            .map(|(j, &slot)| {
                let gpu = &self.gpus[slot as usize];
                CgpuAssignment {
                    index: j as u32,
                    gpu: gpu.spec.id.clone(),
                    host: gpu.spec.host.clone(),
                    memory_mib: request_memory(request, gpu),
                    mode: request.mode,
                    // Validated: 1 to 100.
                    compute_percent: request.compute_percent.map(|p| p.min(100) as u8),
                    rcuda: gpu.spec.rcuda,
                }
            })
            .collect();
        Ok((cgpus, vm_host_of(request.locality)))
    }

    /// Undoes `take` for `booked` cGPUs of one VM, given as (slot, memory, mode); the VM keeps the
    /// cGPUs on the `kept` slots.
    pub(super) fn untake_all(&mut self, booked: &[(u32, u64, Mode)], kept: &[u32]) {
        let mut left_on_gpu: HashMap<u32, u32> = HashMap::new();
        let mut left_on_host: HashMap<u32, u32> = HashMap::new();
        for slot in booked.iter().map(|&(slot, _, _)| slot).chain(kept.iter().copied()) {
            *left_on_gpu.entry(slot).or_default() += 1;
            *left_on_host.entry(self.gpus[slot as usize].host).or_default() += 1;
        }
        for &(slot, memory, mode) in booked.iter().rev() {
            let on_gpu = left_on_gpu.get_mut(&slot).expect("counted above");
            *on_gpu -= 1;
            let last_on_gpu = *on_gpu == 0;
            let on_host =
                left_on_host.get_mut(&self.gpus[slot as usize].host).expect("counted above");
            *on_host -= 1;
            let last_on_host = *on_host == 0;
            self.untake(slot, memory, mode, last_on_gpu, last_on_host);
        }
    }

    /// Releases every cGPU of `vm`, restoring the capacity exactly. Returns what was released; a VM that
    /// holds nothing (already released, or never placed) gives `None`.
    pub fn release(&mut self, vm: &VmId) -> Option<Placement> {
        let placement = self.vms.remove(vm)?;
        let booked: Vec<(u32, u64, Mode)> = placement
            .cgpus
            .iter()
            .map(|c| (self.gpu_by_id[&c.gpu], c.memory_mib, c.mode))
            .collect();
        self.untake_all(&booked, &[]);
        self.unhold(*vm, &placement.cgpus);
        if placement.vm_resources.is_some() {
            self.unbook_vm_resources(vm);
        }
        self.changes += 1;
        Some(placement)
    }

    /// Adds `request.ncgpus` cGPUs to the VM under `policy` (the paper's progressive attach), or
    /// changes nothing. A VM that holds no cGPUs (all detached) gets a new placement. `on_host`
    /// is the VM's host when it has one: the new cGPUs go on it for a `local` VM, where the
    /// request's network constraint allows around it for others, anywhere otherwise. They take the lowest indexes the VM does not use,
    /// so a live cGPU never changes its index, and come last in the VM's list (attach order).
    pub fn attach(
        &mut self,
        vm: VmId,
        request: &Request,
        policy: &str,
        on_host: Option<&HostId>,
    ) -> Result<Vec<CgpuAssignment>, Error> {
        let view = self.views_for(policy)?;
        let limits = self.limits();
        // The VM's own CPU and memory count only where it takes its first cGPUs again (below).
        let anywhere = Request { locality: Locality::Any, vm_resources: None, ..request.clone() };
        validate(&anywhere, &limits)?;
        let held: Vec<u32> = self
            .vms
            .get(&vm)
            .map(|p| p.cgpus.iter().map(|c| self.gpu_by_id[&c.gpu]).collect())
            .unwrap_or_default();
        let total = held.len() as u64 + u64::from(request.ncgpus);
        if total > u64::from(MAX_CGPUS_PER_VM) {
            return Err(Error::invalid(
                "ncgpus",
                format!(
                    "the VM holds {} cGPUs: {} more would be {total}, more than the \
                     {MAX_CGPUS_PER_VM} a VM may have",
                    held.len(),
                    request.ncgpus
                ),
            ));
        }
        let layer = request.constraints.remoting;
        if let Some(problem) = layer.and_then(|r| r.attach_problem(held.len(), request.ncgpus)) {
            return Err(Error::invalid("ncgpus", problem));
        }
        let shortfall =
            |placeable| Error::InsufficientCapacity(Shortfall::of(request, placeable, false));
        let tiers: Vec<Option<Vec<u32>>> = match on_host {
            Some(host) if request.locality == Locality::Local => {
                let Some(&h) = self.host_by_id.get(host) else { return Err(shortfall(0)) };
                let slots = &self.hosts[h as usize].slots;
                let mps = |&s: &u32| self.kinds[self.gpus[s as usize].kind as usize].kind.mps;
                if request.compute_percent.is_some() && !slots.iter().any(mps) {
                    return Err(Error::invalid(
                        "compute_percent",
                        "the VM's GPU host does not run MPS, which a compute share needs; \
                         leave compute_percent out to time-slice",
                    ));
                }
                vec![Some(slots.clone())]
            }
            Some(host) if !request.network.is_empty() => {
                self.check_levels(&request.network)?;
                self.near_tiers(&request.network, host)
            }
            _ => vec![None],
        };
        if self.views_stale {
            self.rebuild_views();
        }
        let filter = self.filter(view, &request.gpu_constraints(), request.ncgpus)?;
        let mut placed = Err(0);
        for within in &tiers {
            placed = self.place_on(request, view, &filter, within.as_deref(), &held);
            if placed.is_ok() {
                break;
            }
        }
        let (mut cgpus, _) = match placed {
            Ok(placed) => placed,
            Err(placeable) if !self.could_ever_attach(request, on_host) => {
                return Err(Error::InsufficientCapacity(Shortfall::never_fits(request, placeable)))
            }
            Err(placeable) => return Err(shortfall(placeable)),
        };
        let policy = self.views[view].policy.name();
        let placement = self.vms.entry(vm).or_insert_with(|| Placement {
            vm,
            policy,
            vm_host: match on_host {
                Some(host) if request.locality == Locality::Local => VmHost::Pinned(host.clone()),
                _ => vm_host_of(request.locality),
            },
            cgpus: Vec::new(),
            vm_resources: None,
        });
        // A local VM that held no cGPU (all detached) books its CPU and memory on its host again.
        let rebook = placement.cgpus.is_empty()
            && matches!(placement.vm_host, VmHost::Pinned(_))
            && request.locality == Locality::Local
            && request.vm_resources.is_some();
        if rebook {
            placement.vm_resources = request.vm_resources;
        }
        let used: HashSet<u32> = placement.cgpus.iter().map(|c| c.index).collect();
        let mut free = (0..).filter(|i| !used.contains(i));
        for cgpu in &mut cgpus {
            cgpu.index = free.next().expect("indexes are unbounded");
        }
        placement.cgpus.extend(cgpus.iter().cloned());
        self.hold(vm, &cgpus);
        if rebook {
            let placement = self.vms[&vm].clone();
            self.book_vm_resources(&placement);
        }
        self.changes += 1;
        Ok(cgpus)
    }

    /// Releases the VM's cGPU `index`, restoring its capacity exactly; the VM keeps the others. A
    /// VM left with none holds no placement. `None`: the VM holds no such cGPU.
    pub fn detach(&mut self, vm: &VmId, index: u32) -> Option<CgpuAssignment> {
        let cgpu = self.take_from(vm, index)?;
        self.changes += 1;
        Some(cgpu)
    }

    /// Records a placement decided earlier (loaded from storage), checking that it still fits. Recording
    /// the same placement again is a no-op; all-or-nothing like [`Pool::place`].
    pub fn restore(&mut self, placement: Placement) -> Result<(), Error> {
        if let Some(existing) = self.vms.get(&placement.vm) {
            if *existing == placement {
                return Ok(());
            }
            return Err(Error::Conflict(format!("VM {} already holds other cGPUs", placement.vm)));
        }
        if let Some(resources) = placement.vm_resources {
            let pinned_here = match &placement.vm_host {
                VmHost::Pinned(host) => self.host_by_id.contains_key(host),
                _ => false,
            };
            if let Some((_, why)) = resources.problem().filter(|_| pinned_here) {
                return Err(Error::Conflict(format!("VM {}: {why}", placement.vm)));
            }
            if !pinned_here {
                return Err(Error::Conflict(format!(
                    "VM {}: CPU and memory booked on no host of the pool",
                    placement.vm
                )));
            }
        }
        let mut slots = Vec::with_capacity(placement.cgpus.len());
        for cgpu in &placement.cgpus {
            let slot = *self.gpu_by_id.get(&cgpu.gpu).ok_or_else(|| {
                Error::Conflict(format!("VM {}: GPU {} is not in the pool", placement.vm, cgpu.gpu))
            })?;
            if self.gpus[slot as usize].spec.host != cgpu.host {
                return Err(Error::Conflict(format!(
                    "VM {}: GPU {} is on host {}, not {}",
                    placement.vm, cgpu.gpu, self.gpus[slot as usize].spec.host, cgpu.host
                )));
            }
            slots.push(slot);
        }
        let mut gpus_used = HashSet::new();
        let mut hosts_used = HashSet::new();
        let mut booked: Vec<(u32, u64, Mode)> = Vec::with_capacity(slots.len());
        let mut computing: HashMap<u32, u32> = HashMap::new();
        for (cgpu, &slot) in placement.cgpus.iter().zip(&slots) {
            let gpu = &self.gpus[slot as usize];
            // Shares booked on the GPU with this placement's so far (none: no map entry).
            let computes = match cgpu.compute_percent {
                Some(percent) => {
                    let computes = computing.entry(slot).or_insert(gpu.compute_percent);
                    *computes += u32::from(percent);
                    *computes
                }
                None => 0,
            };
            let fits = match cgpu.mode {
                Mode::Exclusive => {
                    gpu.is_idle()
                        && cgpu.memory_mib == gpu.spec.memory_mib
                        && cgpu.compute_percent.is_none()
                }
                Mode::Shared => {
                    !gpu.exclusive && cgpu.memory_mib <= gpu.free_mib() && computes <= 100
                }
            } && !self.booked_with_relatives(gpu);
            if !fits || cgpu.memory_mib == 0 {
                self.untake_all(&booked, &[]);
                return Err(Error::Conflict(format!(
                    "VM {}: cGPU {} ({} MiB, {}) does not fit on GPU {}",
                    placement.vm, cgpu.index, cgpu.memory_mib, cgpu.mode, cgpu.gpu
                )));
            }
            let new_gpu = gpus_used.insert(slot);
            let new_host = hosts_used.insert(gpu.host);
            self.take(slot, cgpu.memory_mib, cgpu.mode, new_gpu, new_host);
            booked.push((slot, cgpu.memory_mib, cgpu.mode));
        }
        self.hold_on(placement.vm, &placement.cgpus, &slots);
        // What the host offers may have shrunk since: the VM runs there, so it is booked anyway.
        self.book_vm_resources(&placement);
        self.vms.insert(placement.vm, placement);
        self.changes += 1;
        Ok(())
    }
}
