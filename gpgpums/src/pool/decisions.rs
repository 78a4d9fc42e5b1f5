//! Decisions: the policies' views and indexes (over every GPU and over subsets of kinds), the
//! filters a request's constraints come down to, the selection of one GPU, and the bookkeeping
//! every booking and release updates (holders, compute shares, the mix, the pool's limits).

use super::*;

impl Pool {
    pub(super) fn views_for(&mut self, name: &str) -> Result<usize, Error> {
        if let Some(&view) = self.view_by_name.get(name) {
            return Ok(view);
        }
        let policy = self.registry.resolve(name)?;
        let canonical = policy.name();
        let view = match self.view_by_name.get(&canonical) {
            Some(&view) => view,
            None => {
                let indexes = (self.selector == Selector::Indexed).then(|| {
                    let slots = self.gpus.len() as u32;
                    [policy.new_index(slots), policy.new_index(slots)]
                });
                self.views.push(Views::new(policy, indexes));
                let view = self.views.len() - 1;
                if !self.views_stale {
                    for slot in 0..self.gpus.len() as u32 {
                        self.index_into(view, slot);
                    }
                }
                self.view_by_name.insert(canonical, view);
                view
            }
        };
        self.view_by_name.insert(name.to_owned(), view);
        Ok(view)
    }

    pub(super) fn rebuild_views(&mut self) {
        let slots = self.gpus.len() as u32;
        for views in &mut self.views {
            if let Some(indexes) = &mut views.indexes {
                *indexes = [views.policy.new_index(slots), views.policy.new_index(slots)];
            }
            views.drop_subsets();
        }
        self.views_stale = false;
        for view in 0..self.views.len() {
            for slot in 0..slots {
                self.index_into(view, slot);
            }
        }
    }

    pub(super) fn candidate(&self, slot: u32) -> Candidate {
        let gpu = &self.gpus[slot as usize];
        let host = &self.hosts[gpu.host as usize];
        Candidate {
            slot,
            free_mib: gpu.free_mib(),
            total_mib: gpu.spec.memory_mib,
            cgpus: gpu.cgpus,
            jobs: gpu.jobs,
            host_vms: host.vms,
            host_seq: gpu.host,
        }
    }

    /// Whether the slot may take new cGPUs at all: it is untainted and healthy, its host schedulable and the
    /// slot not hidden.
    /// A partition also needs its parent untainted, healthy and holding no cGPU whole; a
    /// partitioned GPU takes none whole.
    pub(super) fn eligible(&self, slot: u32) -> bool {
        let gpu = &self.gpus[slot as usize];
        self.serves(gpu)
            && self.hosts[gpu.host as usize].state == HostState::Schedulable
            && !self.masked[slot as usize]
            && gpu.parent.is_none_or(|p| self.gpus[p as usize].cgpus == 0)
    }

    /// Whether the GPU takes new cGPUs as far as it and its parent go, whatever is booked:
    /// untainted, healthy, not partitioned, and its parent (if a partition) untainted and healthy.
    pub(super) fn serves(&self, gpu: &GpuEntry) -> bool {
        gpu.takes_new()
            && !gpu.is_partitioned()
            && gpu.parent.is_none_or(|p| self.gpus[p as usize].takes_new())
    }

    /// Whether a cGPU on `gpu` would be booked beside one on its parent or on one of its
    /// partitions.
    pub(super) fn booked_with_relatives(&self, gpu: &GpuEntry) -> bool {
        gpu.parent.is_some_and(|p| self.gpus[p as usize].cgpus > 0)
            || gpu.partitions.iter().any(|&p| self.gpus[p as usize].cgpus > 0)
    }

    pub(super) fn index_into(&mut self, view: usize, slot: u32) {
        self.update_indexes(view, slot, true);
    }

    pub(super) fn unindex_from(&mut self, view: usize, slot: u32) {
        self.update_indexes(view, slot, false);
    }

    /// Adds the slot's candidate to (or removes it from) the view's indexes it belongs in: the shared
    /// one when it can take a shared cGPU, the exclusive one when it is idle.
    /// So are the subsets' indexes that hold its kind.
    pub(super) fn update_indexes(&mut self, view: usize, slot: u32, insert: bool) {
        if !self.eligible(slot) {
            return;
        }
        let candidate = self.candidate(slot);
        let gpu = &self.gpus[slot as usize];
        let belongs = [gpu.can_take_shared(), gpu.is_idle()];
        let views = &mut self.views[view];
        if let Some(indexes) = &mut views.indexes {
            update_pair(indexes, &candidate, belongs, insert);
        }
        if let Some(subsets) = views.subsets_of_kind.get(gpu.kind as usize) {
            for &at in subsets {
                let subset = views.subsets[at].as_mut().expect("listed subsets are live");
                update_pair(&mut subset.indexes, &candidate, belongs, insert);
            }
        }
    }

    /// Forgets every filter worked out (the kinds or their counts changed).
    pub(super) fn forget_filters(&mut self) {
        self.admissions.clear();
        for views in &mut self.views {
            views.filters.clear();
        }
    }

    /// Which kinds `constraints` admit and their ranks (no subsets: see [`Self::filter`]).
    pub(super) fn admission(&mut self, constraints: &GpuConstraints) -> Arc<Filter> {
        if constraints.is_empty() {
            return self.everything.clone();
        }
        if let Some(filter) = self.admissions.get(constraints) {
            return filter.clone();
        }
        let filter = Arc::new(self.admitted_kinds(constraints));
        if self.admissions.len() >= MAX_CACHED_FILTERS {
            self.admissions.clear();
        }
        self.admissions.insert(constraints.clone(), filter.clone());
        filter
    }

    /// [`Self::admission`] worked out: a pass over the kinds.
    pub(super) fn admitted_kinds(&self, constraints: &GpuConstraints) -> Filter {
        let ranks = self
            .kinds
            .iter()
            .map(|k| constraints.admits(&k.kind).then(|| constraints.rank(&k.kind)))
            .collect();
        Filter { ranks, tiers: Vec::new() }
    }

    /// How a request with `constraints` sees the pool under `view`: the kinds it admits, ranked,
    /// with the indexes that serve them (a kind's own built now when missing; a set of kinds'
    /// own once its merges have cost as much, see the module docs). `cgpus`: how many decisions
    /// the request will make with it. Refuses constraints that no registered GPU meets, naming the
    /// first such. Kept per policy until the kinds change.
    pub(super) fn filter(
        &mut self,
        view: usize,
        constraints: &GpuConstraints,
        cgpus: u32,
    ) -> Result<Arc<Filter>, Error> {
        if constraints.is_empty() {
            return Ok(self.everything.clone());
        }
        if let Some(filter) = self.views[view].filters.get(constraints).cloned() {
            if !self.merges_outgrown(view, &filter, cgpus) {
                // Its subsets were used now, for the least-recently-used count.
                self.decisions += 1;
                let views = &mut self.views[view];
                for tier in &filter.tiers {
                    if let Tier::Subset(at) = tier {
                        let subset = views.subsets[*at].as_mut().expect("a kept filter's are live");
                        subset.last_used = self.decisions;
                    }
                }
                return Ok(filter);
            }
        }
        let filter = Arc::new(self.work_out_filter(view, constraints, cgpus)?);
        let filters = &mut self.views[view].filters;
        if filters.len() >= MAX_CACHED_FILTERS {
            filters.clear();
        }
        filters.insert(constraints.clone(), filter.clone());
        Ok(filter)
    }

    /// Counts the work `cgpus` decisions will cost `filter`'s merged tiers beyond one query each;
    /// whether a tier has now cost what an index of its own would, or has one since (another
    /// filter's decisions built it): then the filter is worked out again, and uses it.
    pub(super) fn merges_outgrown(&mut self, view: usize, filter: &Filter, cgpus: u32) -> bool {
        let mut outgrown = false;
        for tier in &filter.tiers {
            if let Tier::Merged { kinds, .. } = tier {
                if self.views[view].subset_by_kinds.contains_key(kinds) {
                    return true;
                }
                let work = self.merge_work(view, kinds, cgpus);
                outgrown |= work >= self.build_cost(kinds);
            }
        }
        outgrown
    }

    /// Adds the extra queries of `cgpus` merged decisions over `kinds`; the total so far.
    pub(super) fn merge_work(&mut self, view: usize, kinds: &[u32], cgpus: u32) -> u64 {
        let extra = (kinds.len() as u64 - 1) * u64::from(cgpus.max(1));
        self.subset_stats.merged_queries += extra + u64::from(cgpus.max(1));
        let work = &mut self.views[view].merge_work;
        if work.len() >= MAX_CACHED_FILTERS && !work.contains_key(kinds) {
            // Bounded: an attacker's sets start over, and so do everyone's (they only build later).
            work.clear();
        }
        let total = work.entry(kinds.to_vec()).or_default();
        *total += extra;
        *total
    }

    /// What building the index of `kinds` costs, in index operations: its GPUs, and a floor.
    pub(super) fn build_cost(&self, kinds: &[u32]) -> u64 {
        8 + kinds.iter().map(|&k| u64::from(self.kinds[k as usize].gpus)).sum::<u64>()
    }

    /// [`Self::filter`] worked out: a pass over the kinds, and the indexes found or built.
    pub(super) fn work_out_filter(
        &mut self,
        view: usize,
        constraints: &GpuConstraints,
        cgpus: u32,
    ) -> Result<Filter, Error> {
        let mut filter = self.admitted_kinds(constraints);
        if filter.is_everything() {
            return Ok(filter);
        }
        let admitted = |(k, rank): (&KindEntry, &Option<i32>)| k.gpus > 0 && rank.is_some();
        if !self.kinds.iter().zip(&filter.ranks).any(admitted) {
            return Err(self.unmet(constraints));
        }
        let mut ranks: Vec<i32> = filter.ranks.iter().flatten().copied().collect();
        ranks.sort_unstable_by(|a, b| b.cmp(a));
        ranks.dedup();
        if ranks.len() == 1 && filter.ranks.iter().all(Option::is_some) {
            // Every kind admitted, all alike: no constraint at all, in effect.
            return Ok(Filter::default());
        }
        if self.selector != Selector::Indexed {
            return Ok(filter);
        }
        self.decisions += 1;
        for rank in ranks {
            // Kinds without GPUs have nothing to index.
            let kinds: Vec<u32> = (0..)
                .zip(&filter.ranks)
                .filter(|&(kind, r)| *r == Some(rank) && self.kinds[kind as usize].gpus > 0)
                .map(|(kind, _)| kind)
                .collect();
            if kinds.is_empty() {
                continue;
            }
            let tier = if kinds.len() == 1 {
                Tier::Subset(self.kind_subsets(view, &kinds)[0])
            } else if let Some(&at) = self.views[view].subset_by_kinds.get(&kinds) {
                self.views[view].subsets[at].as_mut().expect("mapped subsets are live").last_used =
                    self.decisions;
                Tier::Subset(at)
            } else if self.merge_work(view, &kinds, cgpus) >= self.build_cost(&kinds) {
                self.views[view].merge_work.remove(&kinds);
                Tier::Subset(self.subset(view, kinds))
            } else {
                let subsets = self.kind_subsets(view, &kinds);
                Tier::Merged { kinds, subsets }
            };
            filter.tiers.push(tier);
        }
        Ok(filter)
    }

    /// The subsets of one kind each of `kinds` (sorted), those missing built now in one pass over
    /// the GPUs.
    pub(super) fn kind_subsets(&mut self, view: usize, kinds: &[u32]) -> Vec<usize> {
        let missing: Vec<u32> = kinds
            .iter()
            .copied()
            .filter(|&k| !self.views[view].subset_by_kinds.contains_key(&vec![k]))
            .collect();
        if !missing.is_empty() {
            self.build_subsets(view, missing.iter().map(|&k| vec![k]).collect());
        }
        let views = &self.views[view];
        kinds.iter().map(|&k| views.subset_by_kinds[&vec![k]]).collect()
    }

    /// The subset of `view` over the GPUs of `kinds` (sorted, several), built now; drops the
    /// least recently used set when [`MAX_SUBSETS`] are live, unless this decision uses them all.
    pub(super) fn subset(&mut self, view: usize, kinds: Vec<u32>) -> usize {
        let now = self.decisions;
        let views = &mut self.views[view];
        let live = views.subsets.iter().flatten().filter(|s| !s.is_one_kind()).count();
        if live >= MAX_SUBSETS {
            let oldest = (views.subsets.iter().enumerate())
                .filter_map(|(at, s)| s.as_ref().map(|s| (s, at)))
                .filter(|(s, _)| !s.is_one_kind() && s.last_used < now)
                .map(|(s, at)| (s.last_used, at))
                .min();
            if let Some((_, at)) = oldest {
                let gone = views.subsets[at].take().expect("found live");
                views.subset_by_kinds.remove(&gone.kinds);
                for &kind in &gone.kinds {
                    views.subsets_of_kind[kind as usize].retain(|&s| s != at);
                }
                // Kept filters may name it.
                views.filters.clear();
            }
        }
        self.build_subsets(view, vec![kinds])[0]
    }

    /// Makes a subset over each of `sets` (sorted kinds) and fills them in one pass over the GPUs.
    pub(super) fn build_subsets(&mut self, view: usize, sets: Vec<Vec<u32>>) -> Vec<usize> {
        let now = self.decisions;
        let kind_count = self.kinds.len();
        let slots = self.gpus.len() as u32;
        let views = &mut self.views[view];
        views.subsets_of_kind.resize_with(kind_count, Vec::new);
        let mut made = Vec::with_capacity(sets.len());
        for kinds in sets {
            let policy = &views.policy;
            let subset = Subset {
                kinds: kinds.clone(),
                indexes: [policy.new_index(slots), policy.new_index(slots)],
                last_used: now,
            };
            let at = match views.subsets.iter().position(Option::is_none) {
                Some(at) => {
                    views.subsets[at] = Some(subset);
                    at
                }
                None => {
                    views.subsets.push(Some(subset));
                    views.subsets.len() - 1
                }
            };
            for &kind in &kinds {
                views.subsets_of_kind[kind as usize].push(at);
            }
            views.subset_by_kinds.insert(kinds, at);
            made.push(at);
        }
        self.subset_stats.builds += made.len() as u64;
        if self.indexes_live() {
            // Per kind, the new subsets its GPUs go in.
            let mut into: Vec<Vec<usize>> = vec![Vec::new(); kind_count];
            for &at in &made {
                let subset = self.views[view].subsets[at].as_ref().expect("made above");
                for &kind in &subset.kinds {
                    into[kind as usize].push(at);
                }
            }
            for slot in 0..slots {
                let gpu = &self.gpus[slot as usize];
                let into = &into[gpu.kind as usize];
                if into.is_empty() || !self.eligible(slot) {
                    continue;
                }
                self.subset_stats.built_gpus += into.len() as u64;
                let belongs = [gpu.can_take_shared(), gpu.is_idle()];
                let candidate = self.candidate(slot);
                for &at in into {
                    let subset = self.views[view].subsets[at].as_mut().expect("made above");
                    update_pair(&mut subset.indexes, &candidate, belongs, true);
                }
            }
        }
        made
    }

    /// The refusal of constraints that no registered GPU meets: the first hard constraint (in
    /// [`GpuConstraints::hard_checks`] order) that, with those before it, leaves none.
    pub(super) fn unmet(&self, constraints: &GpuConstraints) -> Error {
        let mut left: Vec<&GpuKind> =
            self.kinds.iter().filter(|k| k.gpus > 0).map(|k| &k.kind).collect();
        if left.is_empty() {
            return Error::invalid("gpu_model", "the pool has no GPU");
        }
        let checks = constraints.hard_checks(left[0]).count();
        for check in 0..checks {
            let field = constraints.hard_checks(left[0]).nth(check).expect("counted").0;
            let before = left.clone();
            left.retain(|kind| constraints.hard_checks(kind).nth(check).is_some_and(|c| c.1));
            if !left.is_empty() {
                continue;
            }
            let models = |kinds: &[&GpuKind]| {
                let mut models: Vec<&str> = kinds.iter().map(|k| k.model.as_str()).collect();
                models.sort_unstable();
                models.dedup();
                models.truncate(16);
                models.join(", ")
            };
            let among = if check == 0 { String::new() } else { format!(" of {}", models(&before)) };
            let reason = match field {
                "remoting" => {
                    format!("no GPU in the pool speaks {}", constraints.remoting.expect("checked"))
                }
                "gpu_model" => format!(
                    "no GPU in the pool is a {}; its models: {}",
                    constraints.models.join(" or "),
                    models(&before)
                ),
                "min_compute_capability" => format!(
                    "no GPU{among} has compute capability {} or higher",
                    constraints.min_compute_capability.expect("checked")
                ),
                "min_cuda_version" => format!(
                    "no GPU{among} has a driver for CUDA {} or higher",
                    constraints.min_cuda_version.expect("checked")
                ),
                "traits.required" => {
                    format!("no GPU{among} has every trait of {}", constraints.required.join(", "))
                }
                "traits.forbidden" => format!(
                    "every GPU{among} that meets the other constraints has a trait of {}",
                    constraints.forbidden.join(", ")
                ),
                _ => format!(
                    "no GPU{among} that meets the other constraints is on a host that runs MPS, \
                     which a compute share needs; leave compute_percent out to time-slice"
                ),
            };
            return Error::invalid(field, reason);
        }
        Error::invalid("gpu_model", "no GPU in the pool meets these constraints")
    }

    /// Runs `change`, which may alter anything the slots' candidates depend on, keeping indexes right.
    pub(super) fn reindexing(&mut self, slots: &[u32], change: impl FnOnce(&mut Self)) {
        self.reindexing_views(slots, false, change);
    }

    /// [`Self::reindexing`], in the views whose policy ranks by host load only when
    /// `host_load_only` (`change` alters nothing else).
    pub(super) fn reindexing_views(
        &mut self,
        slots: &[u32],
        host_load_only: bool,
        change: impl FnOnce(&mut Self),
    ) {
        let live = self.indexes_live();
        let touched = |pool: &Self, view: usize| {
            !host_load_only || pool.views[view].policy.ranks_by_host_load()
        };
        if live {
            for view in 0..self.views.len() {
                if !touched(self, view) {
                    continue;
                }
                for &slot in slots {
                    self.unindex_from(view, slot);
                }
            }
        }
        change(self);
        if live {
            for view in 0..self.views.len() {
                if !touched(self, view) {
                    continue;
                }
                for &slot in slots {
                    self.index_into(view, slot);
                }
            }
        }
    }

    /// [`Self::reindexing`] over every slot of `host`.
    pub(super) fn reindexing_host(&mut self, host: usize, change: impl FnOnce(&mut Self)) {
        if self.indexes_live() {
            let slots = self.hosts[host].slots.clone();
            self.reindexing(&slots, change);
        } else {
            change(self);
        }
    }

    /// Changes the host's count of VMs (`change`), re-indexing its GPUs only for the policies
    /// that rank by it: the others' indexes hold nothing that depends on it.
    pub(super) fn changing_host_load(&mut self, host: usize, change: impl FnOnce(&mut Self)) {
        let ranked = self.views.iter().any(|v| v.policy.ranks_by_host_load());
        if self.indexes_live() && ranked {
            let slots = self.hosts[host].slots.clone();
            self.reindexing_views(&slots, true, change);
        } else {
            change(self);
        }
    }

    /// Whether indexes exist and are kept current (not while stale: the next decision rebuilds them).
    pub(super) fn indexes_live(&self) -> bool {
        !self.views_stale && self.selector == Selector::Indexed && !self.views.is_empty()
    }

    pub(super) fn set_masked(&mut self, slots: &[u32], masked: bool) {
        self.reindexing(slots, |pool| {
            for &slot in slots {
                pool.masked[slot as usize] = masked;
            }
        });
    }

    /// Records `vm` as the holder of `cgpus` on their GPUs, with their compute shares.
    pub(super) fn hold(&mut self, vm: VmId, cgpus: &[CgpuAssignment]) {
        let slots: Vec<u32> = cgpus.iter().map(|cgpu| self.gpu_by_id[&cgpu.gpu]).collect();
        self.hold_on(vm, cgpus, &slots);
    }

    /// [`Self::hold`] with the cGPUs' slots known.
    pub(super) fn hold_on(&mut self, vm: VmId, cgpus: &[CgpuAssignment], slots: &[u32]) {
        for (cgpu, &slot) in cgpus.iter().zip(slots) {
            let gpu = &mut self.gpus[slot as usize];
            gpu.holders.push(vm);
            if let Some(percent) = cgpu.compute_percent {
                gpu.compute_percent += u32::from(percent);
                gpu.compute_cgpus += 1;
            }
            self.file_compute(slot);
        }
    }

    /// Undoes [`Pool::hold`], after the cGPUs' bookings were undone.
    pub(super) fn unhold(&mut self, vm: VmId, cgpus: &[CgpuAssignment]) {
        for cgpu in cgpus {
            let slot = self.gpu_by_id[&cgpu.gpu];
            let gpu = &mut self.gpus[slot as usize];
            if let Some(at) = gpu.holders.iter().position(|h| *h == vm) {
                gpu.holders.swap_remove(at);
            }
            if let Some(percent) = cgpu.compute_percent {
                gpu.compute_percent -= u32::from(percent);
                gpu.compute_cgpus -= 1;
            }
            self.file_compute(slot);
        }
    }

    /// Puts `slot`'s GPU in the sets [`Self::compute_hidden`] reads, or takes it out, after its
    /// bookings or kind changed.
    pub(super) fn file_compute(&mut self, slot: u32) {
        let gpu = &self.gpus[slot as usize];
        let plain = !gpu.exclusive && gpu.cgpus > gpu.compute_cgpus;
        let mps = self.kinds[gpu.kind as usize].kind.mps;
        let file = |set: &mut BTreeSet<GpuId>, member: bool| {
            if member != set.contains(&gpu.spec.id) {
                if member {
                    set.insert(gpu.spec.id.clone());
                } else {
                    set.remove(&gpu.spec.id);
                }
            }
        };
        file(&mut self.compute_gpus, gpu.compute_cgpus > 0);
        file(&mut self.plain_on_mps, plain && mps);
    }

    /// The GPUs a cGPU of `request` may not take for the compute shares on them: a cGPU with a
    /// share takes no GPU whose shares would pass 100 percent, nor an MPS GPU with cGPUs
    /// without (they would use its SMs unbounded); a shared cGPU without a share takes no GPU
    /// with shares. Empty, at no cost, while no GPU holds a share.
    pub(super) fn compute_hidden(&self, request: &Request) -> Vec<u32> {
        let slot = |id: &GpuId| self.gpu_by_id[id];
        match (request.compute_percent, request.mode) {
            (Some(percent), Mode::Shared) => {
                let room = 100 - percent.min(100);
                let full = self
                    .compute_gpus
                    .iter()
                    .map(slot)
                    .filter(|&s| self.gpus[s as usize].compute_percent > room);
                full.chain(self.plain_on_mps.iter().map(slot)).collect()
            }
            (None, Mode::Shared) => self.compute_gpus.iter().map(slot).collect(),
            _ => Vec::new(),
        }
    }

    /// [`Self::reindexing`] for a change of `slot`'s taint, health or bookings, which changes
    /// its partitions' eligibility too.
    pub(super) fn reindexing_with_partitions(&mut self, slot: u32, change: impl FnOnce(&mut Self)) {
        let partitions = &self.gpus[slot as usize].partitions;
        if partitions.is_empty() {
            self.reindexing(&[slot], change);
        } else {
            let slots: Vec<u32> = std::iter::once(slot).chain(partitions.iter().copied()).collect();
            self.reindexing(&slots, change);
        }
    }

    /// Books one cGPU on `slot`. `new_gpu`/`new_host`: the VM had no cGPU on this GPU/host before.
    pub(super) fn take(
        &mut self,
        slot: u32,
        memory: u64,
        mode: Mode,
        new_gpu: bool,
        new_host: bool,
    ) {
        self.reindexing_with_partitions(slot, |pool| {
            let gpu = &mut pool.gpus[slot as usize];
            gpu.used_mib += memory;
            gpu.cgpus += 1;
            gpu.exclusive = mode == Mode::Exclusive;
            gpu.jobs += u32::from(new_gpu);
        });
        self.mix.count(Mix::percent_of(memory, self.gpus[slot as usize].spec.memory_mib), true);
        if new_host {
            let host = self.gpus[slot as usize].host as usize;
            self.changing_host_load(host, |pool| pool.hosts[host].vms += 1);
        }
    }

    pub(super) fn untake(
        &mut self,
        slot: u32,
        memory: u64,
        mode: Mode,
        last_on_gpu: bool,
        last_on_host: bool,
    ) {
        self.reindexing_with_partitions(slot, |pool| {
            let gpu = &mut pool.gpus[slot as usize];
            gpu.used_mib -= memory;
            gpu.cgpus -= 1;
            if mode == Mode::Exclusive {
                gpu.exclusive = false;
            }
            gpu.jobs -= u32::from(last_on_gpu);
        });
        self.mix.count(Mix::percent_of(memory, self.gpus[slot as usize].spec.memory_mib), false);
        if last_on_host {
            let host = self.gpus[slot as usize].host as usize;
            self.changing_host_load(host, |pool| pool.hosts[host].vms -= 1);
        }
    }

    /// The policy's choice for the next cGPU, among all GPUs or among `within`.
    /// The policy's choice for the next cGPU, among all GPUs or among `within`, of the kinds
    /// `filter` admits: the highest rank first, the policy's order among equals.
    pub(super) fn select(
        &self,
        view: usize,
        request: &Request,
        filter: &Filter,
        within: Option<&[u32]>,
    ) -> Option<u32> {
        let need = request_need(request);
        let mode = request.mode;
        let query = Query { need_mib: need, exclusive: mode == Mode::Exclusive, mix: &self.mix };
        if let Some(slots) = within {
            return self.scan(view, mode, need, filter, slots.iter().copied());
        }
        let all = 0..self.gpus.len() as u32;
        match self.selector {
            Selector::Indexed => {
                let views = &self.views[view];
                if filter.is_everything() {
                    let indexes = views.indexes.as_ref().expect("indexed views have indexes");
                    return indexes[index_for(mode)].best_for(&query);
                }
                let best = |at: usize| {
                    let subset = views.subsets[at].as_ref().expect("a filter's subsets are live");
                    subset.indexes[index_for(mode)].best_for(&query)
                };
                filter.tiers.iter().find_map(|tier| match tier {
                    Tier::Subset(at) => best(*at),
                    Tier::Merged { subsets, .. } => subsets
                        .iter()
                        .filter_map(|&at| best(at))
                        .map(|slot| self.candidate(slot))
                        .min_by(|a, b| views.policy.compare_for(&query, a, b))
                        .map(|c| c.slot),
                })
            }
            Selector::Scan => self.scan(view, mode, need, filter, all),
            Selector::SortEachRequest => {
                let policy = &self.views[view].policy;
                let mut candidates: Vec<(i32, Candidate)> = all
                    .filter(|&s| self.eligible(s) && self.gpus[s as usize].takes(mode))
                    .filter_map(|s| {
                        Some((filter.rank(self.gpus[s as usize].kind)?, self.candidate(s)))
                    })
                    .collect();
                candidates.sort_by(|(ra, a), (rb, b)| {
                    rb.cmp(ra).then_with(|| policy.compare_for(&query, a, b))
                });
                candidates.iter().find(|(_, c)| c.free_mib >= need).map(|(_, c)| c.slot)
            }
        }
    }

    pub(super) fn scan(
        &self,
        view: usize,
        mode: Mode,
        need: u64,
        filter: &Filter,
        slots: impl Iterator<Item = u32>,
    ) -> Option<u32> {
        let policy = &self.views[view].policy;
        let query = Query { need_mib: need, exclusive: mode == Mode::Exclusive, mix: &self.mix };
        slots
            .filter(|&s| {
                self.eligible(s)
                    && self.gpus[s as usize].takes(mode)
                    && self.gpus[s as usize].free_mib() >= need
            })
            .filter_map(|s| Some((filter.rank(self.gpus[s as usize].kind)?, self.candidate(s))))
            .min_by(|(ra, a), (rb, b)| rb.cmp(ra).then_with(|| policy.compare_for(&query, a, b)))
            .map(|(_, c)| c.slot)
    }

    pub(super) fn limits(&mut self) -> Limits {
        if let Some(limits) = self.limits {
            return limits;
        }
        let mut limits = Limits::default();
        for host in &self.hosts {
            let schedulable = host.state == HostState::Schedulable;
            limits.rgpu_host_registered |= host.kind == HostKind::ComputeRgpu;
            limits.schedulable_rgpu_host |= schedulable && host.kind == HostKind::ComputeRgpu;
            limits.schedulable_agent_host |= schedulable && host.kind.has_agent();
            // A partitioned GPU counts through its partitions.
            let gpus = host.slots.iter().map(|&s| &self.gpus[s as usize]);
            let gpus = gpus.filter(|g| !g.is_partitioned());
            limits.max_gpus_per_host = limits.max_gpus_per_host.max(gpus.clone().count() as u32);
            let memory: u64 = gpus.map(|g| g.spec.memory_mib).sum();
            limits.max_host_mib = limits.max_host_mib.max(memory);
        }
        let whole = self.gpus.iter().filter(|g| !g.is_partitioned());
        limits.max_gpu_mib = whole.map(|g| g.spec.memory_mib).max().unwrap_or(0);
        self.limits = Some(limits);
        limits
    }
}
