//! Launch and terminate as requests: check, reserve, record, and hand the rest to the saga.
//!
//! A launch does everything that can refuse the request before answering: validation, the cloud's
//! check of the VM part, and the atomic reservation of every cGPU with its masked endpoint. A refused
//! request changes nothing. What follows (creating the VM, waiting for it, routes) runs in the saga,
//! and the client follows the VM's state.

use std::sync::Arc;
use std::time::Instant;

use gpgpums::VmId;

use super::App;
use crate::auth::Caller;
use crate::cloud::CloudError;
use crate::cloudinit::{self, RcudaDevice, RcudaEnv};
use crate::db::{self, now_ms, NewVm};
use crate::error::Error;
use crate::metrics::inc;
use crate::model::{CgpuRecord, LaunchSpec, SagaStep, Timings, VmRecord, VmState};

/// A launch request, validated by the HTTP layer for shape.
#[derive(Debug, Clone)]
pub struct LaunchInput {
    pub spec: LaunchSpec,
    pub policy: Option<String>,
    pub idempotency_key: Option<String>,
}

/// A VM with its cGPUs.
#[derive(Debug, Clone)]
pub struct VmDetails {
    pub vm: VmRecord,
    pub cgpus: Vec<CgpuRecord>,
}

const MAX_NAME: usize = 255;
const MAX_NETWORKS: usize = 16;
const MAX_USER_DATA: usize = 64 * 1024;

fn check_text(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.trim().is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(field, format!("must be at most {max} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    Ok(())
}

fn validate(spec: &LaunchSpec) -> Result<(), Error> {
    if !spec.vm.name.is_empty() {
        check_text("name", &spec.vm.name, MAX_NAME)?;
    }
    check_text("image", &spec.vm.image, MAX_NAME)?;
    check_text("flavor", &spec.vm.flavor, MAX_NAME)?;
    if spec.vm.networks.len() > MAX_NETWORKS {
        return Err(Error::invalid("networks", format!("at most {MAX_NETWORKS} networks")));
    }
    for (i, network) in spec.vm.networks.iter().enumerate() {
        check_text(&format!("networks[{i}]"), network, MAX_NAME)?;
    }
    if let Some(user_data) = &spec.user_data {
        if user_data.len() > MAX_USER_DATA {
            return Err(Error::invalid(
                "user_data",
                format!("must be at most {MAX_USER_DATA} bytes"),
            ));
        }
    }
    Ok(())
}

/// FNV-1a: a stable digest of a request, to recognise a retried launch.
fn digest(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

pub(crate) fn cloud_error(e: CloudError) -> Error {
    match e {
        CloudError::Invalid { field, reason } => Error::invalid(field, reason),
        CloudError::Quota(reason) => Error::Conflict(format!("cloud quota exceeded: {reason}")),
        e => Error::unavailable("cloud", e),
    }
}

/// The rCUDA environment a VM gets for its cGPUs.
pub fn rcuda_env(cgpus: &[CgpuRecord]) -> RcudaEnv {
    RcudaEnv {
        devices: cgpus
            .iter()
            .map(|c| RcudaDevice {
                address: c.masked_address,
                port: c.masked_port,
                gpu_number: c.rcuda_gpu_number,
            })
            .collect(),
    }
}

impl App {
    /// Launches a VM: see the module docs. Returns the VM and whether this call created it (false
    /// for a retry with the same Idempotency-Key).
    pub async fn launch(
        self: &Arc<Self>,
        caller: &Caller,
        input: LaunchInput,
    ) -> Result<(VmDetails, bool), Error> {
        let received = Instant::now();
        let project = caller.tenant_project()?.to_owned();
        validate(&input.spec)?;
        let policy = input.policy.clone().unwrap_or_else(|| self.config.default_policy.clone());
        let request_digest = digest(
            serde_json::to_string(&(&input.spec, &policy)).expect("request serializes").as_bytes(),
        );
        if let Some(key) = &input.idempotency_key {
            check_text("Idempotency-Key", key, MAX_NAME)?;
            if let Some(existing) = self.replay(&project, key, &request_digest).await? {
                return Ok((existing, false));
            }
        }
        self.cloud.check(&input.spec.vm).await.map_err(|e| {
            inc(&self.metrics.launches_refused);
            cloud_error(e)
        })?;
        let check = received.elapsed().as_secs_f64();

        let id = VmId::new_random();
        let now = now_ms();
        let mut spec = input.spec.clone();
        if spec.vm.name.trim().is_empty() {
            spec.vm.name = format!("gsaas-{}", &id.to_string()[..8]);
        }
        let record = VmRecord {
            id,
            project: project.clone(),
            owner: caller.subject.clone(),
            name: spec.vm.name.clone(),
            spec,
            policy: policy.clone(),
            state: VmState::Creating,
            error: None,
            step: SagaStep::CreateVm,
            server_id: None,
            host: None,
            fixed_ip: None,
            tap: None,
            routes_on: false,
            timings: Timings { check: Some(check), ..Timings::default() },
            created_ms: now,
            updated_ms: now,
            version: 0,
        };
        let masking = self.config.masking.clone();
        let instance = self.instance.clone();
        let lease_ms = self.lease_ms();
        let key = input.idempotency_key.clone();
        let stored_digest = request_digest.clone();
        let reserved = self
            .with_pool(move |pool, tx| {
                Box::pin(async move {
                    let mut record = record;
                    let started = Instant::now();
                    let placement = pool.place(id, &record.spec.gpus, &policy)?;
                    record.timings.gpu_selection = Some(started.elapsed().as_secs_f64());
                    let cgpus = placement
                        .cgpus
                        .iter()
                        .map(|c| {
                            let std::net::IpAddr::V4(rcuda_address) = c.rcuda.address else {
                                return Err(Error::internal(format!("GPU {} has a non-IPv4 rCUDA address", c.gpu)));
                            };
                            Ok(CgpuRecord {
                                vm: id,
                                index: c.index,
                                gpu: c.gpu.clone(),
                                host: c.host.clone(),
                                memory_mib: c.memory_mib,
                                mode: c.mode,
                                masked_address: masking.address,
                                masked_port: masking.base_port + c.index as u16,
                                rcuda_address,
                                rcuda_port: c.rcuda.port,
                                rcuda_gpu_number: c.rcuda.gpu_number,
                            })
                        })
                        .collect::<Result<Vec<_>, Error>>()?;
                    let user_data = cloudinit::user_data(
                        &rcuda_env(&cgpus),
                        record.spec.user_data.as_deref().map(str::as_bytes),
                    )
                    .map_err(|e| Error::invalid("user_data", e.to_string()))?;
                    if cloudinit::base64_len(user_data.len()) > cloudinit::NOVA_USER_DATA_MAX_BASE64 {
                        return Err(Error::invalid(
                            "user_data",
                            format!(
                                "with the rCUDA environment of {} cGPUs it exceeds the cloud's limit of {} bytes \
                                 (base64)",
                                cgpus.len(),
                                cloudinit::NOVA_USER_DATA_MAX_BASE64
                            ),
                        ));
                    }
                    record.policy = placement.policy.clone();
                    db::insert_vm(
                        tx,
                        NewVm {
                            record: &record,
                            idempotency_key: key.as_deref(),
                            request_digest: Some(&stored_digest),
                            saga_owner: &instance,
                            lease_until_ms: now_ms() + lease_ms,
                        },
                    )
                    .await?;
                    for cgpu in &cgpus {
                        db::insert_cgpu(tx, cgpu).await?;
                    }
                    Ok(VmDetails { vm: record, cgpus })
                })
            })
            .await;
        let details = match reserved {
            Ok(details) => details,
            Err(Error::Conflict(_)) if input.idempotency_key.is_some() => {
                // A concurrent retry with the same key won the race.
                let key = input.idempotency_key.as_deref().unwrap_or_default();
                return match self.replay(&project, key, &request_digest).await? {
                    Some(existing) => Ok((existing, false)),
                    None => Err(Error::Conflict(
                        "a concurrent launch with this Idempotency-Key failed".into(),
                    )),
                };
            }
            Err(e) => {
                inc(&self.metrics.launches_refused);
                return Err(e);
            }
        };
        inc(&self.metrics.launches_accepted);
        if let Some(seconds) = details.vm.timings.gpu_selection {
            self.metrics.decision_seconds.observe(seconds);
        }
        self.spawn_saga_from(id, Some(details.clone()));
        Ok((details, true))
    }

    /// The VM an earlier launch with `key` created, if the request is the same.
    async fn replay(
        &self,
        project: &str,
        key: &str,
        request_digest: &str,
    ) -> Result<Option<VmDetails>, Error> {
        let mut conn = self.db.pool().acquire().await?;
        let Some((id, stored_digest)) = db::vm_by_idempotency_key(&mut conn, project, key).await?
        else {
            return Ok(None);
        };
        if stored_digest != request_digest {
            return Err(Error::invalid(
                "Idempotency-Key",
                "was already used for a different launch request",
            ));
        }
        drop(conn);
        self.details(id).await
    }

    pub(crate) async fn details(&self, id: VmId) -> Result<Option<VmDetails>, Error> {
        let mut conn = self.db.pool().acquire().await?;
        let Some(vm) = db::vm(&mut conn, id).await? else { return Ok(None) };
        let cgpus = db::cgpus_of(&mut conn, id).await?;
        Ok(Some(VmDetails { vm, cgpus }))
    }

    /// A VM the caller may see: its project's, or any for admins. Anything else is "not found".
    pub async fn visible_vm(&self, caller: &Caller, id: VmId) -> Result<VmDetails, Error> {
        let project = caller.tenant_project()?;
        match self.details(id).await? {
            Some(details) if caller.is_admin() || details.vm.project == project => Ok(details),
            _ => Err(Error::vm_not_found(&id)),
        }
    }

    /// The caller's project's VMs; admins see every project's, or `project`'s.
    pub async fn list_vms(
        &self,
        caller: &Caller,
        project: Option<&str>,
    ) -> Result<Vec<VmDetails>, Error> {
        let own = caller.tenant_project()?;
        let filter = if caller.is_admin() { project } else { Some(own) };
        let mut conn = self.db.pool().acquire().await?;
        let vms = db::vms(&mut conn, filter).await?;
        let mut out = Vec::with_capacity(vms.len());
        for vm in vms {
            let cgpus = db::cgpus_of(&mut conn, vm.id).await?;
            out.push(VmDetails { vm, cgpus });
        }
        Ok(out)
    }

    /// Terminates a VM (idempotent): withdraws its routes, deletes it, releases its cGPUs.
    pub async fn terminate(
        self: &Arc<Self>,
        caller: &Caller,
        id: VmId,
    ) -> Result<VmDetails, Error> {
        loop {
            let mut details = self.visible_vm(caller, id).await?;
            let vm = &mut details.vm;
            if matches!(vm.state, VmState::Deleting | VmState::Deleted) {
                if vm.step != SagaStep::Done {
                    self.spawn_saga(id);
                }
                return Ok(details);
            }
            vm.state = VmState::Deleting;
            if vm.step == SagaStep::Done {
                // Routes off in the same write; the saga's withdraw step then only pushes.
                vm.step = SagaStep::WithdrawRoutes;
                vm.routes_on = false;
            }
            vm.updated_ms = now_ms();
            // One conditional UPDATE, atomic by itself, that also claims the saga if nobody runs it.
            let now = now_ms();
            let claim =
                db::Claim { owner: &self.instance, now_ms: now, until_ms: now + self.lease_ms() };
            let mut conn = self.db.write_conn().await?;
            let written = db::update_vm_and_claim(&mut conn, vm, claim).await?;
            drop(conn);
            if let Some(claimed) = written {
                self.watchers.changed(vm);
                inc(&self.metrics.terminations);
                self.wake_saga(id);
                self.spawn_saga_from(id, claimed.then(|| details.clone()));
                return Ok(details);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_stable_and_differ() {
        assert_eq!(digest(b"abc"), digest(b"abc"));
        assert_ne!(digest(b"abc"), digest(b"abd"));
        assert_eq!(digest(b""), "cbf29ce484222325");
    }
}
