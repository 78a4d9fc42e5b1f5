//! The undo steps: they carry out a termination and unwind a launch that failed. Withdraw the
//! VM's routes from its host (fencing its cGPUs if the host's agent cannot confirm, see
//! [`crate::app::fences`]), delete its server, then release its cGPUs in the same write that ends
//! the saga. Each treats "not found" as done, so a crash anywhere repeats them safely.

use std::time::Duration;

use gpgpums::HostId;

use super::{cloud_failure, Progress, StepError};
use crate::app::bookings::{Ending, VM_CHANGED};
use crate::app::App;
use crate::cloud::CloudError;
use crate::db::now_ms;
use crate::error::Error;
use crate::metrics::inc;
use crate::model::{SagaStep, TerminateStep, VmRecord, VmState};

impl App {
    /// Runs the termination's `step`. `fence_on`: the host whose agent could not confirm the
    /// withdrawal (its cGPUs stay booked under a fence).
    pub(super) async fn terminate_step(
        self: &std::sync::Arc<Self>,
        step: TerminateStep,
        vm: &mut VmRecord,
        fence_on: &mut Option<HostId>,
    ) -> Result<Progress, StepError> {
        match step {
            TerminateStep::WithdrawRoutes => self.withdraw_routes_step(vm, fence_on).await,
            TerminateStep::DeleteServer => self.delete_server_step(vm).await,
            TerminateStep::ReleaseGpus => self.release_gpus_step(vm, fence_on).await,
        }
    }

    /// Routes off in the VM's record, then the host's table without them. `fence_on`: the host
    /// whose agent could not confirm (its cGPUs stay booked under a fence).
    pub(super) async fn withdraw_routes_step(
        &self,
        vm: &mut VmRecord,
        fence_on: &mut Option<HostId>,
    ) -> Result<Progress, StepError> {
        if let Some(host) = vm.host.clone() {
            if vm.routes_on {
                vm.routes_on = false;
                if !self.save(vm).await? {
                    return Err(StepError::Interrupted);
                }
            }
            *fence_on = self.withdraw_routes(&host).await?;
        }
        vm.step = SagaStep::Terminate(TerminateStep::DeleteServer);
        Ok(Progress::Unrecorded)
    }

    /// Deletes the VM's server (the one recorded, or the one the cloud finds for the VM).
    pub(super) async fn delete_server_step(
        &self,
        vm: &mut VmRecord,
    ) -> Result<Progress, StepError> {
        let server = match vm.server_id.clone() {
            Some(server) => Some(server),
            None => self.cloud.find_server(vm.id).await.map_err(|e| cloud_failure("delete", &e))?,
        };
        if let Some(server) = server {
            let timeout = Duration::from_secs(self.config.launch.active_timeout_secs);
            match self.cloud.delete_server(&server, timeout).await {
                Ok(()) | Err(CloudError::NotFound(_)) => {}
                Err(e) => return Err(cloud_failure("delete", &e)),
            }
        }
        vm.step = SagaStep::Terminate(TerminateStep::ReleaseGpus);
        Ok(Progress::Unrecorded)
    }

    /// Releases the VM's cGPUs and ends the saga, in one transaction.
    pub(super) async fn release_gpus_step(
        self: &std::sync::Arc<Self>,
        vm: &mut VmRecord,
        fence_on: &mut Option<HostId>,
    ) -> Result<Progress, StepError> {
        self.spawn_end_delegation(vm.id, None);
        let server_hosts = self.server_hosts_of(vm.id).await?;
        // The release and the VM's end in one transaction: if the VM changed meanwhile (a
        // termination of a VM unwinding from an error), neither is written and the saga reads
        // the VM again.
        let mut ended = vm.clone();
        if ended.state == VmState::Deleting {
            ended.state = VmState::Deleted;
        }
        ended.step = SagaStep::Done;
        ended.updated_ms = now_ms();
        let ending = Ending { ended, fence_on: fence_on.take() };
        let ended = match self.release(ending).await {
            Ok(ended) => ended,
            Err(Error::Conflict(reason)) if reason == VM_CHANGED => {
                return Err(StepError::Interrupted)
            }
            Err(e) => return Err(e.into()),
        };
        // The release's batch adds no queue entry or event of an ending VM.
        self.watchers.changed_alone(&ended);
        // Its cGPUs' servers end (their hosts' tables no longer list them).
        self.stop_servers(server_hosts);
        if ended.state == VmState::Deleted {
            inc(&self.metrics.terminations_done);
        }
        *vm = ended;
        Ok(Progress::Recorded)
    }
}
