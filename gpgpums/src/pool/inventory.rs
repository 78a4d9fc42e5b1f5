//! The pool's inventory: hosts and GPUs joining and leaving, their states, taints, health and
//! attributes, and the kinds and orders derived from them.

use super::*;

impl Pool {
    /// Registers a host at the end of the pool order. Registering it again with the same kind is a no-op.
    pub fn add_host(&mut self, id: HostId, kind: HostKind) -> Result<(), Error> {
        if let Some(&h) = self.host_by_id.get(&id) {
            let existing = self.hosts[h as usize].kind;
            if existing == kind {
                return Ok(());
            }
            return Err(Error::Conflict(format!("host {id} is already registered as {existing}")));
        }
        let seq = u32::try_from(self.hosts.len()).expect("fewer than 2^32 hosts");
        self.host_by_id.insert(id.clone(), seq);
        self.hosts.push(HostEntry {
            id,
            kind,
            state: HostState::Schedulable,
            slots: vec![],
            vms: 0,
            offers: None,
            taken: Resources::default(),
        });
        self.places.push(network::HostPlace::default());
        self.groups.take();
        self.inventory_changed();
        self.changes += 1;
        self.host_changes += 1;
        Ok(())
    }

    /// Registers a GPU on a compute-gpu host. Registering the same GPU again is a no-op.
    pub fn add_gpu(&mut self, spec: GpuSpec) -> Result<(), Error> {
        if let Some(&slot) = self.gpu_by_id.get(&spec.id) {
            if self.gpus[slot as usize].spec == spec {
                return Ok(());
            }
            return Err(Error::Conflict(format!(
                "GPU {} is already registered with other properties",
                spec.id
            )));
        }
        let &host = self.host_by_id.get(&spec.host).ok_or_else(|| {
            Error::inventory(
                "host",
                format!("GPU {}: host {} is not registered", spec.id, spec.host),
            )
        })?;
        let entry = &self.hosts[host as usize];
        if entry.kind != HostKind::ComputeGpu {
            return Err(Error::inventory(
                "host",
                format!(
                    "GPU {}: host {} is {}, only compute-gpu hosts hold GPUs",
                    spec.id, spec.host, entry.kind
                ),
            ));
        }
        if entry.slots.iter().any(|&s| self.gpus[s as usize].spec.index == spec.index) {
            return Err(Error::inventory(
                "index",
                format!(
                    "GPU {}: host {} already has a GPU with index {}",
                    spec.id, spec.host, spec.index
                ),
            ));
        }
        if spec.memory_mib == 0 {
            return Err(Error::inventory(
                "memory_mib",
                format!("GPU {}: must be at least 1 MiB", spec.id),
            ));
        }
        if let Some((field, reason)) = spec.attributes.problems().into_iter().next() {
            return Err(Error::inventory(field, format!("GPU {}: {reason}", spec.id)));
        }
        let parent = self.partition_parent(&spec)?;
        if let Some(parent) = parent {
            let parent = &self.gpus[parent as usize];
            if !parent.is_partitioned() {
                // Its first partition: it counts through them from now on.
                self.count_kind(parent.kind, false);
            }
        }
        let kind = self.kind_of(&spec);
        let key = (host, spec.index);
        let at = self.gpus.partition_point(|g| (g.host, g.spec.index) < key);
        let gpu = GpuEntry {
            spec,
            host,
            kind,
            taint: None,
            health: None,
            used_mib: 0,
            exclusive: false,
            cgpus: 0,
            jobs: 0,
            holders: Vec::new(),
            parent,
            partitions: Vec::new(),
            compute_percent: 0,
            compute_cgpus: 0,
        };
        self.changes += 1;
        if at < self.gpus.len() {
            // Lands inside the pool order: every later slot moves.
            self.gpus.insert(at, gpu);
            self.renumber();
            return Ok(());
        }
        let slot = u32::try_from(at).expect("fewer than 2^32 GPUs");
        self.gpu_by_id.insert(gpu.spec.id.clone(), slot);
        self.hosts[host as usize].slots.push(slot);
        self.gpus.push(gpu);
        self.masked.push(false);
        self.inventory_changed();
        if let Some(parent) = parent {
            // Partitioned now: the parent takes no cGPU whole.
            self.reindexing(&[parent], |pool| pool.gpus[parent as usize].partitions.push(slot));
        }
        if !self.views_stale {
            for view in 0..self.views.len() {
                self.index_into(view, slot);
            }
        }
        Ok(())
    }

    /// Removes an unused GPU (a failed or withdrawn device).
    pub fn remove_gpu(&mut self, id: &GpuId) -> Result<GpuSpec, Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        let gpu = &self.gpus[slot as usize];
        if gpu.cgpus > 0 {
            return Err(Error::Conflict(format!("GPU {id} still backs {} cGPU(s)", gpu.cgpus)));
        }
        if gpu.is_partitioned() {
            return Err(Error::Conflict(format!(
                "GPU {id} has {} partition(s): they leave the pool first",
                gpu.partitions.len()
            )));
        }
        if let Some(parent) = gpu.parent {
            let parent = &self.gpus[parent as usize];
            if parent.partitions.len() == 1 {
                // Its last partition: whole again.
                self.count_kind(parent.kind, true);
            }
        }
        let removed = self.gpus.remove(slot as usize);
        self.count_kind(removed.kind, false);
        self.forget_filters();
        self.changes += 1;
        self.renumber();
        Ok(removed.spec)
    }

    /// The slot of the GPU that `spec` is a partition of, checked: registered, on the same host,
    /// whole itself, and with room for it (a partition no bigger than its parent, its parent's
    /// partitions together no bigger either). `None` for a whole GPU.
    pub(super) fn partition_parent(&self, spec: &GpuSpec) -> Result<Option<u32>, Error> {
        let Some(partition) = &spec.partition else { return Ok(None) };
        let id = &spec.id;
        if let Some(problem) = profile_name_problem(&partition.profile) {
            return Err(Error::inventory("partition.profile", format!("GPU {id}: {problem}")));
        }
        let bad = |reason: String| Err(Error::inventory("partition.parent", reason));
        let Some(&slot) = self.gpu_by_id.get(&partition.parent) else {
            return bad(format!("GPU {id}: its parent GPU {} is not registered", partition.parent));
        };
        let parent = &self.gpus[slot as usize];
        if parent.spec.host != spec.host {
            return bad(format!(
                "GPU {id}: its parent GPU {} is on host {}, not {}",
                partition.parent, parent.spec.host, spec.host
            ));
        }
        if parent.spec.partition.is_some() {
            return bad(format!(
                "GPU {id}: its parent GPU {} is a partition itself",
                partition.parent
            ));
        }
        let taken: u64 =
            parent.partitions.iter().map(|&p| self.gpus[p as usize].spec.memory_mib).sum();
        let whole = parent.spec.memory_mib;
        if spec.memory_mib > whole - taken.min(whole) {
            let reason = if spec.memory_mib > whole {
                format!(
                    "GPU {id}: a partition of {} MiB is bigger than its parent GPU {} ({whole} MiB)",
                    spec.memory_mib, partition.parent
                )
            } else {
                format!(
                    "GPU {id}: with its {} MiB, the partitions of GPU {} would have {} MiB of its \
                     {whole}",
                    spec.memory_mib,
                    partition.parent,
                    taken + spec.memory_mib
                )
            };
            return Err(Error::inventory("memory_mib", reason));
        }
        Ok(Some(slot))
    }

    /// The kind of the GPU `spec` describes, registered as one more of it.
    pub(super) fn kind_of(&mut self, spec: &GpuSpec) -> u32 {
        // A host's GPUs come one after another and are mostly alike: the last kind first, by
        // what makes it (not the UUID), before working out a key (a loaded pool adds 100,000).
        if let Some((kind, model, last)) = &self.last_kind {
            let a = &spec.attributes;
            if *model == spec.model
                && last.compute_capability == a.compute_capability
                && last.cuda_version == a.cuda_version
                && last.traits == a.traits
                && last.remoting == a.remoting
                && last.mps == a.mps
            {
                let kind = *kind;
                self.count_kind(kind, true);
                return kind;
            }
        }
        let key = GpuKind::of(&spec.model, &spec.attributes);
        let kind = match self.kind_by_key.get(&key) {
            Some(&kind) => kind,
            None => {
                let kind = u32::try_from(self.kinds.len()).expect("fewer than 2^32 kinds");
                self.kinds.push(KindEntry { kind: key.clone(), gpus: 0 });
                self.kind_by_key.insert(key, kind);
                self.forget_filters();
                kind
            }
        };
        self.count_kind(kind, true);
        let attributes = GpuAttributes { uuid: None, ..spec.attributes.clone() };
        self.last_kind = Some((kind, spec.model.clone(), attributes));
        kind
    }

    /// One GPU more (`up`) or fewer of `kind`; the models and the filters worked out follow
    /// when it gains its first or loses its last.
    pub(super) fn count_kind(&mut self, kind: u32, up: bool) {
        let gpus = &mut self.kinds[kind as usize].gpus;
        *gpus = if up { *gpus + 1 } else { *gpus - 1 };
        if *gpus == u32::from(up) {
            self.forget_filters();
            let mut models: Vec<String> =
                self.kinds.iter().filter(|k| k.gpus > 0).map(|k| k.kind.model.clone()).collect();
            models.sort_unstable();
            models.dedup();
            self.models = models;
        }
    }

    pub(super) fn renumber(&mut self) {
        self.gpu_by_id.clear();
        for host in &mut self.hosts {
            host.slots.clear();
        }
        for (slot, gpu) in self.gpus.iter().enumerate() {
            let slot = u32::try_from(slot).expect("fewer than 2^32 GPUs");
            self.gpu_by_id.insert(gpu.spec.id.clone(), slot);
            self.hosts[gpu.host as usize].slots.push(slot);
        }
        for gpu in &mut self.gpus {
            gpu.partitions.clear();
        }
        for slot in 0..self.gpus.len() {
            let parent = self.gpus[slot].spec.partition.as_ref().map(|p| self.gpu_by_id[&p.parent]);
            self.gpus[slot].parent = parent;
            if let Some(parent) = parent {
                self.gpus[parent as usize].partitions.push(slot as u32);
            }
        }
        self.masked = vec![false; self.gpus.len()];
        self.views_stale = true;
        self.inventory_changed();
    }

    /// Drains, undrains or marks a host unavailable. Its cGPUs stay; it only stops taking new ones.
    pub fn set_host_state(&mut self, id: &HostId, state: HostState) -> Result<(), Error> {
        let &host = self
            .host_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("host", format!("host {id} is not registered")))?;
        self.reindexing_host(host as usize, |pool| pool.hosts[host as usize].state = state);
        self.inventory_changed();
        self.changes += 1;
        self.host_changes += 1;
        Ok(())
    }

    /// Taints a GPU with a reason, or untaints it (`None`): a tainted GPU keeps its cGPUs but
    /// takes no new ones.
    pub fn set_gpu_taint(&mut self, id: &GpuId, taint: Option<String>) -> Result<(), Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        self.reindexing_with_partitions(slot, |pool| pool.gpus[slot as usize].taint = taint);
        // The limits do not depend on taints; the make-ups do.
        self.makeups = None;
        self.changes += 1;
        Ok(())
    }

    /// Marks a GPU unhealthy with why its host says so, or healthy (`None`): like a taint, an
    /// unhealthy GPU keeps its cGPUs but takes no new ones.
    pub fn set_gpu_health(&mut self, id: &GpuId, health: Option<String>) -> Result<(), Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        self.reindexing_with_partitions(slot, |pool| pool.gpus[slot as usize].health = health);
        self.makeups = None;
        self.changes += 1;
        Ok(())
    }

    /// Records what the GPU now is (a driver upgrade, an operator's new traits): it keeps the
    /// cGPUs it backs, and new ones see its new kind.
    pub fn set_gpu_attributes(
        &mut self,
        id: &GpuId,
        attributes: GpuAttributes,
    ) -> Result<(), Error> {
        let &slot = self
            .gpu_by_id
            .get(id)
            .ok_or_else(|| Error::inventory("gpu", format!("GPU {id} is not registered")))?;
        if let Some((field, reason)) = attributes.problems().into_iter().next() {
            return Err(Error::inventory(field, format!("GPU {id}: {reason}")));
        }
        let mut spec = self.gpus[slot as usize].spec.clone();
        spec.attributes = attributes;
        let old = self.gpus[slot as usize].kind;
        let partitioned = self.gpus[slot as usize].is_partitioned();
        let kind = self.kind_of(&spec);
        self.reindexing(&[slot], |pool| {
            let gpu = &mut pool.gpus[slot as usize];
            gpu.spec = spec;
            gpu.kind = kind;
        });
        self.file_compute(slot);
        // A partitioned GPU counts in no kind (see `KindEntry::gpus`).
        self.count_kind(if partitioned { kind } else { old }, false);
        self.forget_filters();
        self.makeups = None;
        self.changes += 1;
        Ok(())
    }
}
