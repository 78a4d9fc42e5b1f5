//! The launch saga's forward steps ([`LaunchStep`]): create the server with cloud-init carrying
//! the masked rCUDA environment (the request checked the VM part with the cloud), wait for ACTIVE (learn host, fixed IP and
//! tap), then wait for the VM's network while the host's routes are pushed. Their undo is
//! [`super::terminate`]'s: withdraw the routes, delete the server, release the cGPUs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpgpums::{HostId, Locality};
use tokio::sync::Notify;

use super::{cloud_failure, Handed, Progress, StepError};
use crate::app::shared::vm_user_data;
use crate::app::App;
use crate::cloud::{HostConstraint, ServerSpec};
use crate::db::now_ms;
use crate::error::Error;
use crate::model::{LaunchStep, SagaStep, VmRecord, VmState};

impl App {
    /// Runs the launch's `step`.
    pub(super) async fn launch_step(
        self: &Arc<Self>,
        step: LaunchStep,
        vm: &mut VmRecord,
        handed: &mut Handed,
        first_creation: &mut bool,
        wake: &Notify,
    ) -> Result<Progress, StepError> {
        match step {
            LaunchStep::CreateVm => {
                // Not recorded: the cloud finds the server it created for a VM, so a creation
                // repeated after a crash gets the same one (recorded with its host, WaitActive).
                self.create_vm(vm, handed, std::mem::take(first_creation)).await?;
                return Ok(Progress::Unrecorded);
            }
            LaunchStep::WaitActive => {
                self.wait_active(vm, wake).await?;
                // The server is up: a delegation has done its work (ended no sooner, as the
                // server's build uses the credential it was created with).
                self.spawn_end_delegation(vm.id, None);
            }
            LaunchStep::ConfigureRoutes => self.configure_routes(vm, wake).await?,
        }
        Ok(Progress::ToRecord)
    }

    pub(super) async fn create_vm(
        &self,
        vm: &mut VmRecord,
        handed: &mut Handed,
        first_attempt: bool,
    ) -> Result<(), StepError> {
        let started = Instant::now();
        let cgpus = match handed.cgpus.take() {
            Some(cgpus) => cgpus,
            None => self.db.cgpus_of(vm.id).await?,
        };
        // Built where the cGPUs were placed; a resumed saga builds the same from what is stored.
        let user_data = match handed.user_data.take() {
            Some(user_data) => user_data,
            None => vm_user_data(&self.config, vm, &cgpus)
                .map_err(|e| StepError::Failed(format!("user_data: {e}")))?,
        };
        let host = match vm.spec.gpus.locality {
            Locality::Local => {
                let host = cgpus
                    .first()
                    .map(|c| c.host.clone())
                    .ok_or_else(|| StepError::Failed("local VM without cGPUs".into()))?;
                HostConstraint::Pinned(host)
            }
            Locality::Any | Locality::Remote if !vm.spec.gpus.network.is_empty() => {
                let gpu_hosts: Vec<HostId> = cgpus.iter().map(|c| c.host.clone()).collect();
                let request = vm.spec.gpus.clone();
                let hosts = self
                    .read_pool(move |pool| pool.vm_hosts_for(&request, &gpu_hosts))
                    .await?
                    .unwrap_or_default();
                if hosts.is_empty() {
                    return Err(StepError::Failed(
                        "no schedulable host may run the VM within its network constraint now"
                            .into(),
                    ));
                }
                HostConstraint::OnlyOf(hosts.into())
            }
            Locality::Remote => HostConstraint::AnyOf(self.vm_hosts(true).await?),
            Locality::Any => HostConstraint::AnyOf(self.vm_hosts(false).await?),
        };
        let tenant = self.tenant_credential(vm.id).await?;
        let request = vm.spec.vm.clone();
        let checked = vm.spec.resolved.clone();
        let spec =
            ServerSpec { vm: vm.id, request, user_data, host, tenant, checked, first_attempt };
        let server =
            self.cloud.create_server(&spec).await.map_err(|e| cloud_failure("create", &e))?;
        // Created: what follows is the service user's, and the tenant's token is not kept.
        self.sagas.tenant_tokens.lock().expect("tenant tokens").remove(&vm.id);
        vm.server_id = Some(server);
        vm.timings.vm_creation = Some(started.elapsed().as_secs_f64());
        vm.step = SagaStep::Launch(LaunchStep::WaitActive);
        Ok(())
    }

    /// Schedulable hosts a VM may run on: compute-rGPU hosts, or every host with an agent.
    async fn vm_hosts(&self, rgpu_only: bool) -> Result<Arc<[HostId]>, Error> {
        if let Some(hosts) = self.directory_vm_hosts(rgpu_only) {
            return Ok(hosts);
        }
        let hosts = self.db.hosts().await?;
        Ok(crate::app::pool::vm_hosts_of(
            hosts.iter().map(|h| (&h.name, h.kind, h.state)),
            rgpu_only,
        ))
    }

    async fn host_has_agent(&self, host: &HostId) -> Result<bool, Error> {
        if let Some((kind, _)) = self.directory_host(host) {
            return Ok(kind.has_agent());
        }
        Ok(self.db.host(host).await?.is_some_and(|h| h.kind.has_agent()))
    }

    pub(super) async fn wait_active(
        &self,
        vm: &mut VmRecord,
        wake: &Notify,
    ) -> Result<(), StepError> {
        let started = Instant::now();
        let server = vm
            .server_id
            .clone()
            .ok_or_else(|| StepError::Failed("no server to wait for".into()))?;
        let timeout = Duration::from_secs(self.config.launch.active_timeout_secs);
        let info = tokio::select! {
            info = self.cloud.wait_active(&server, timeout) => info.map_err(|e| cloud_failure("activation", &e))?,
            _ = wake.notified() => return Err(StepError::Interrupted),
        };
        let host = info
            .host
            .ok_or_else(|| StepError::Failed("the cloud reported no host for the VM".into()))?;
        if !self.host_has_agent(&host).await? {
            tracing::warn!(vm = %vm.id, %host, "the cloud put the VM on a host without a RODVR agent");
            return Err(StepError::Failed(
                "the cloud put the VM on a host without a RODVR agent, where its cGPUs cannot be \
                 routed"
                    .into(),
            ));
        }
        if vm.spec.gpus.locality != Locality::Local && vm.spec.gpus.network.is_hard() {
            let gpu_hosts: Vec<HostId> =
                self.db.cgpus_of(vm.id).await?.into_iter().map(|c| c.host).collect();
            let (request, on) = (vm.spec.gpus.clone(), host.clone());
            let meets = self.read_pool(move |pool| pool.meets_network(&request, &on, &gpu_hosts));
            if !meets.await? {
                tracing::warn!(vm = %vm.id, %host, "the cloud put the VM outside its network constraint");
                return Err(StepError::Failed(
                    "the cloud put the VM on a host outside its network constraint".into(),
                ));
            }
        }
        if info.fixed_ip.is_none() || info.tap.is_none() {
            return Err(StepError::Failed(
                "the cloud reported no fixed IPv4 address or no tap device for the VM's port: \
                 GSaaS routes cGPUs only to packets from both"
                    .into(),
            ));
        }
        vm.host = Some(host);
        vm.fixed_ip = info.fixed_ip;
        vm.tap = info.tap;
        vm.timings.vm_activation = Some(started.elapsed().as_secs_f64());
        vm.step = SagaStep::Launch(LaunchStep::ConfigureRoutes);
        // Recorded with the host and address, in the same write: the next step pushes them.
        vm.routes_on = true;
        Ok(())
    }

    pub(super) async fn configure_routes(
        &self,
        vm: &mut VmRecord,
        wake: &Notify,
    ) -> Result<(), StepError> {
        let host =
            vm.host.clone().ok_or_else(|| StepError::Failed("no host to configure".into()))?;
        let server = vm.server_id.clone().ok_or_else(|| StepError::Failed("no server".into()))?;
        if !vm.routes_on {
            vm.routes_on = true;
            if !self.save(vm).await? {
                return Err(StepError::Interrupted);
            }
        }
        let deploy_timeout = Duration::from_secs(self.config.launch.deploy_timeout_secs);
        let deployment = async {
            let started = Instant::now();
            self.cloud.wait_deployed(&server, deploy_timeout).await.map(|()| started.elapsed())
        };
        let routes = async {
            let started = Instant::now();
            self.push_servers_and_routes(vm.id, &host).await.map(|()| started.elapsed())
        };
        let (deployed, routed) = tokio::select! {
            both = async { tokio::join!(deployment, routes) } => both,
            _ = wake.notified() => return Err(StepError::Interrupted),
        };
        let routed = routed?;
        let deployed = deployed.map_err(|e| cloud_failure("deployment", &e))?;
        vm.timings.vm_deployment = Some(deployed.as_secs_f64());
        vm.timings.rodvr_configuration = Some(routed.as_secs_f64());
        let since_recorded = (now_ms() - vm.created_ms).max(0) as f64 / 1000.0;
        vm.timings.total = Some(vm.timings.check.unwrap_or(0.0) + since_recorded);
        vm.state = VmState::Ready;
        vm.step = SagaStep::Done;
        Ok(())
    }
}
