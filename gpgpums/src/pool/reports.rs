//! What the pool reports: usage per GPU and host, totals, pages of hosts, holders, and whether
//! a request could ever fit (the hosts' make-ups).

use super::*;

impl Pool {
    pub fn host_state(&self, id: &HostId) -> Option<HostState> {
        self.host_by_id.get(id).map(|&h| self.hosts[h as usize].state)
    }

    /// Every GPU, in pool order.
    pub fn gpu_usage(&self) -> Vec<GpuUsage> {
        self.gpus.iter().map(GpuEntry::usage).collect()
    }

    /// Every host, in registration order.
    pub fn host_usage(&self) -> Vec<HostUsage> {
        self.hosts.iter().map(|h| self.usage_of(h)).collect()
    }

    /// The whole pool's sums, without a report per GPU.
    pub fn totals(&self) -> UsageTotals {
        let mut totals = UsageTotals::default();
        for gpu in &self.gpus {
            totals.allocated_mib += gpu.used_mib;
            totals.cgpus += u64::from(gpu.cgpus);
            if gpu.is_partitioned() {
                // Counted through its partitions.
                continue;
            }
            totals.gpus += 1;
            totals.memory_mib += gpu.spec.memory_mib;
            if gpu.cgpus == 0 && self.hosts[gpu.host as usize].state == HostState::Schedulable {
                totals.idle_gpus += 1;
            }
        }
        totals
    }

    /// A page of hosts: up to `limit` after the host `after` (from the first without it), in
    /// registration order, each with its GPUs in index order. `None`: `after` is not in the pool.
    /// Costs what the page holds, whatever the pool's size.
    pub fn host_page(
        &self,
        after: Option<&HostId>,
        limit: usize,
    ) -> Option<Vec<(HostUsage, Vec<GpuUsage>)>> {
        let start = match after {
            Some(id) => *self.host_by_id.get(id)? as usize + 1,
            None => 0,
        };
        Some(
            self.hosts
                .iter()
                .skip(start)
                .take(limit)
                .map(|h| {
                    let gpus = h.slots.iter().map(|&s| self.gpus[s as usize].usage()).collect();
                    (self.usage_of(h), gpus)
                })
                .collect(),
        )
    }

    /// Who holds the GPU's cGPUs: each VM (or fence) with how many it holds there, in id order.
    /// Empty for a GPU that is not in the pool.
    pub fn holders(&self, gpu: &GpuId) -> Vec<(VmId, u32)> {
        let Some(&slot) = self.gpu_by_id.get(gpu) else { return Vec::new() };
        let mut holders: Vec<(VmId, u32)> = Vec::new();
        let mut ids = self.gpus[slot as usize].holders.clone();
        ids.sort_unstable();
        for id in ids {
            match holders.last_mut() {
                Some((last, n)) if *last == id => *n += 1,
                _ => holders.push((id, 1)),
            }
        }
        holders
    }

    pub(super) fn usage_of(&self, h: &HostEntry) -> HostUsage {
        let gpus = h.slots.iter().map(|&s| &self.gpus[s as usize]);
        // A partitioned GPU counts through its partitions.
        let whole = gpus.clone().filter(|g| !g.is_partitioned());
        HostUsage {
            id: h.id.clone(),
            kind: h.kind,
            state: h.state,
            gpus: whole.clone().count() as u32,
            memory_mib: whole.map(|g| g.spec.memory_mib).sum(),
            allocated_mib: gpus.map(|g| g.used_mib).sum(),
            vms: h.vms,
        }
    }

    pub fn placement(&self, vm: &VmId) -> Option<&Placement> {
        self.vms.get(vm)
    }

    pub fn placements(&self) -> impl Iterator<Item = &Placement> {
        self.vms.values()
    }

    /// The models of the GPUs in the pool, each once, in name order.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// The model of a GPU in the pool.
    pub fn model_of(&self, gpu: &GpuId) -> Option<&str> {
        let slot = *self.gpu_by_id.get(gpu)?;
        Some(&self.gpus[slot as usize].spec.model)
    }

    /// What `cgpus` hold, in all and per model of their GPUs (a GPU no longer in the pool counts
    /// in the totals only).
    pub fn holding<'a>(&self, cgpus: impl IntoIterator<Item = &'a CgpuAssignment>) -> Holding {
        let mut holding = Holding::default();
        for cgpu in cgpus {
            match self.model_of(&cgpu.gpu) {
                Some(model) => holding.add(model, cgpu),
                None => holding.usage = Usage::of_cgpus([cgpu]).plus(holding.usage),
            }
        }
        holding
    }

    /// What one GPU holds and whether it takes new cGPUs (untainted, on a schedulable host, and
    /// admitted by `constraints`), for the queue's preemption planning. `None`: no such GPU.
    pub(crate) fn room(&self, gpu: &GpuId, constraints: &GpuConstraints) -> Option<Room> {
        let slot = *self.gpu_by_id.get(gpu)?;
        let entry = &self.gpus[slot as usize];
        let host = &self.hosts[entry.host as usize];
        let admitted =
            constraints.is_empty() || constraints.admits(&self.kinds[entry.kind as usize].kind);
        Some(Room {
            slot,
            host: host.id.clone(),
            takes_new: admitted && self.eligible(slot),
            memory_mib: entry.spec.memory_mib,
            free_mib: entry.free_mib(),
            exclusive: entry.exclusive,
            cgpus: entry.cgpus,
            compute_percent: entry.compute_percent,
            compute_cgpus: entry.compute_cgpus,
        })
    }

    /// For a GPU partitioned while cGPUs held it whole (bookings from before its partitions,
    /// which keep them all unused until they end): its host, how many cGPUs it holds, and
    /// whether one of its partitions could take a cGPU of `request` once they are gone. `None`:
    /// not such a GPU.
    pub(crate) fn partitioned_room(
        &self,
        gpu: &GpuId,
        request: &Request,
    ) -> Option<(HostId, u32, bool)> {
        let slot = *self.gpu_by_id.get(gpu)?;
        let entry = &self.gpus[slot as usize];
        if !entry.is_partitioned() || entry.cgpus == 0 {
            return None;
        }
        let host = &self.hosts[entry.host as usize];
        let constraints = request.gpu_constraints();
        let takes = |part: &GpuEntry| {
            part.takes_new()
                && (constraints.is_empty()
                    || constraints.admits(&self.kinds[part.kind as usize].kind))
                && request.gpu_memory_mib.is_none_or(|mib| part.spec.memory_mib >= mib)
        };
        let fits = host.state == HostState::Schedulable
            && entry.takes_new()
            && entry.partitions.iter().any(|&p| takes(&self.gpus[p as usize]));
        Some((host.id.clone(), entry.cgpus, fits))
    }

    /// The GPU `gpu` is a partition of, if it is one.
    pub(crate) fn parent_of(&self, gpu: &GpuId) -> Option<&GpuId> {
        let slot = *self.gpu_by_id.get(gpu)?;
        let parent = self.gpus[slot as usize].parent?;
        Some(&self.gpus[parent as usize].spec.id)
    }

    /// Whether `request` could be placed were every booking gone: on today's GPUs that take new
    /// cGPUs (untainted, healthy, on schedulable hosts), with its locality and distinct-GPU rules,
    /// `on_host` when given (an attach to a `local` VM). A request that fails this waits for
    /// nothing that any release could bring, so a queue should not take it. Costs one pass over
    /// the GPUs after each inventory change, then one over the hosts' make-ups (a fleet has few).
    pub fn could_ever_fit(&mut self, request: &Request, on_host: Option<&HostId>) -> bool {
        let n = u64::from(request.ncgpus);
        let filter = self.admission(&request.gpu_constraints());
        if let Some(host) = on_host {
            let Some(&h) = self.host_by_id.get(host) else { return false };
            let host = &self.hosts[h as usize];
            let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
            let room: u64 = gpus
                .filter(|gpu| self.serves(gpu) && filter.rank(gpu.kind).is_some())
                .map(|gpu| empty_gpu_room(gpu.spec.memory_mib, request))
                .sum();
            let vm_fits = match (host.offers, request.vm_resources) {
                (Some(offers), Some(need)) => offers.has_room(&Resources::default(), &need),
                _ => true,
            };
            return host.state == HostState::Schedulable && room >= n && vm_fits;
        }
        if request.locality != Locality::Local && request.network.is_hard() {
            return self.could_ever_fit_network(request, &filter);
        }
        let limits = self.limits();
        let (total, one_host) = self.empty_room(request, &filter);
        match request.locality {
            Locality::Local => one_host >= n,
            Locality::Any => limits.schedulable_agent_host && total >= n,
            Locality::Remote => limits.schedulable_rgpu_host && total >= n,
        }
    }

    /// [`Self::could_ever_fit`] for cGPUs added to a running VM (which needs no host to run on):
    /// on `on_host`, the VM's host, for a `local` VM; where its network constraint allows around
    /// it for others; anywhere otherwise.
    pub fn could_ever_attach(&mut self, request: &Request, on_host: Option<&HostId>) -> bool {
        match on_host {
            Some(_) if request.locality == Locality::Local => self.could_ever_fit(request, on_host),
            Some(host) if request.network.is_hard() => {
                let filter = self.admission(&request.gpu_constraints());
                self.could_ever_attach_near(request, &filter, host)
            }
            _ => {
                let filter = self.admission(&request.gpu_constraints());
                self.empty_room(request, &filter).0 >= u64::from(request.ncgpus)
            }
        }
    }

    /// Whether `request` might fit were every VM gone but one project's: `own_usage` (what it
    /// holds, at most, on the GPUs `request` may use), on `own`'s VMs (asked for only when that
    /// usage is large enough to matter), but for the cGPUs `reclaiming` (being taken back, as
    /// good as gone). `false` means it could not: only its own project's VMs stand in its way. An upper bound ([`Self::empty_room`]'s total, less what `own`'s cGPUs
    /// take from the GPUs they are on; network constraints, hosts and relatives of partitioned
    /// GPUs are not looked at).
    pub fn could_fit_beside(
        &mut self,
        request: &Request,
        own_usage: &Usage,
        own: impl FnOnce() -> Vec<VmId>,
        reclaiming: &[(VmId, u32)],
    ) -> bool {
        let n = u64::from(request.ncgpus);
        let filter = self.admission(&request.gpu_constraints());
        let total = self.empty_room(request, &filter).0;
        // A cGPU of m MiB takes at most ceil(m / r) of a GPU's room for cGPUs of r MiB (an
        // exclusive one's m is its GPU's memory), and one from a GPU that takes one cGPU each:
        // in a pool of many projects, far less than there is.
        let most_taken = match request.gpu_memory_mib {
            Some(mib) if mib > 0 && request.mode != Mode::Exclusive && !request.distinct_gpus => {
                (own_usage.memory_mib / mib).saturating_add(own_usage.cgpus)
            }
            _ => own_usage.cgpus,
        };
        if total.saturating_sub(most_taken) >= n {
            return true;
        }
        self.room_beside(request, &filter, total, &own(), reclaiming) >= n
    }

    /// [`Self::could_fit_beside`]'s room: `total` less what `own`'s cGPUs take.
    fn room_beside(
        &self,
        request: &Request,
        filter: &Filter,
        total: u64,
        own: &[VmId],
        reclaiming: &[(VmId, u32)],
    ) -> u64 {
        // What `own` holds on each GPU: memory, and whether a cGPU is exclusive.
        let mut held: HashMap<u32, (u64, bool)> = HashMap::new();
        for placement in own.iter().filter_map(|vm| self.vms.get(vm)) {
            let kept = |c: &&CgpuAssignment| !reclaiming.contains(&(placement.vm, c.index));
            for cgpu in placement.cgpus.iter().filter(kept) {
                let Some(&slot) = self.gpu_by_id.get(&cgpu.gpu) else { continue };
                let entry = held.entry(slot).or_default();
                entry.0 = entry.0.saturating_add(cgpu.memory_mib);
                entry.1 |= cgpu.mode == Mode::Exclusive;
            }
        }
        let taken: u64 = held
            .into_iter()
            .filter_map(|(slot, (mib, exclusive))| {
                let gpu = &self.gpus[slot as usize];
                let host = &self.hosts[gpu.host as usize];
                let counted = host.state == HostState::Schedulable
                    && host.kind == HostKind::ComputeGpu
                    && self.serves(gpu)
                    && filter.rank(gpu.kind).is_some();
                counted.then(|| {
                    let empty = empty_gpu_room(gpu.spec.memory_mib, request);
                    let beside = if exclusive || request.mode == Mode::Exclusive {
                        0
                    } else {
                        empty_gpu_room(gpu.spec.memory_mib.saturating_sub(mib), request)
                    };
                    empty.saturating_sub(beside)
                })
            })
            .sum();
        total.saturating_sub(taken)
    }

    /// How many cGPUs of `request`'s kind the schedulable compute-gpu hosts could hold were they
    /// empty: in all, and on the one that could hold the most.
    pub(super) fn empty_room(&mut self, request: &Request, filter: &Filter) -> (u64, u64) {
        self.makeups().iter().fold((0, 0), |(total, best), m| {
            let room = m.room(request, filter);
            (total.saturating_add(room.saturating_mul(m.hosts)), best.max(room))
        })
    }

    /// The make-ups of the schedulable compute-gpu hosts (see [`HostMakeup`]).
    pub(super) fn makeups(&mut self) -> &[HostMakeup] {
        if self.makeups.is_none() {
            // Per make-up, how many hosts and the most any offers (`None`: one's is unknown, so
            // only GPUs bind there).
            let mut by_makeup: HashMap<GpusByKindMib, (u64, Option<Resources>)> = HashMap::new();
            for host in &self.hosts {
                if host.state != HostState::Schedulable || host.kind != HostKind::ComputeGpu {
                    continue;
                }
                let mut by_kind_mib: BTreeMap<(u32, u64), u64> = BTreeMap::new();
                let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
                for gpu in gpus.filter(|gpu| self.serves(gpu)) {
                    *by_kind_mib.entry((gpu.kind, gpu.spec.memory_mib)).or_default() += 1;
                }
                let entry = by_makeup.entry(by_kind_mib.into_iter().collect());
                let (hosts, most) = entry.or_insert((0, host.offers));
                *hosts += 1;
                *most = match (*most, host.offers) {
                    (Some(a), Some(b)) => Some(Resources::new(
                        a.cpu_milli.max(b.cpu_milli),
                        a.memory_mib.max(b.memory_mib),
                    )),
                    _ => None,
                };
            }
            let mut makeups: Vec<HostMakeup> = by_makeup
                .into_iter()
                .map(|(gpus_by_kind_mib, (hosts, offers))| HostMakeup {
                    gpus_by_kind_mib,
                    offers,
                    hosts,
                })
                .collect();
            makeups.sort_by(|a, b| a.gpus_by_kind_mib.cmp(&b.gpus_by_kind_mib));
            self.makeups = Some(makeups);
        }
        self.makeups.as_deref().expect("computed above")
    }

    /// Forgets what was derived from the inventory (limits, capacities) after it changed.
    pub(super) fn inventory_changed(&mut self) {
        self.limits = None;
        self.makeups = None;
        self.size = None;
    }

    /// The memory of the pool's largest GPU (or partition): the most an exclusive cGPU can hold.
    pub fn largest_gpu_mib(&mut self) -> u64 {
        self.limits().max_gpu_mib
    }

    /// The GPUs' memory and number (a partitioned GPU counts once, through its partitions), as
    /// [`Self::totals`] sums them: what a project without limits is measured against
    /// ([`crate::QuotaLedger::shares`]). Costs one pass over the GPUs after each inventory change.
    pub fn size(&mut self) -> PoolSize {
        if let Some(size) = self.size {
            return size;
        }
        let whole = self.gpus.iter().filter(|gpu| !gpu.is_partitioned());
        let size = whole.fold(PoolSize::default(), |size, gpu| PoolSize {
            memory_mib: size.memory_mib + gpu.spec.memory_mib,
            gpus: size.gpus + 1,
        });
        self.size = Some(size);
        size
    }
}
