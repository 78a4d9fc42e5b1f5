//! The detach saga's step: the host's table without the `detaching` cGPUs (the agent cuts their
//! connections), then their bookings go in the write that ends the step. The request side is
//! [`crate::app::elastic`]'s; a queue round's preemption starts the same step.

use super::{Progress, StepError};
use crate::app::bookings::{Ending, VM_CHANGED};
use crate::app::App;
use crate::db::now_ms;
use crate::error::Error;
use crate::metrics::inc;
use crate::model::{SagaStep, VmRecord};

impl App {
    /// The saga's detach step: the host's table without the `detaching` cGPUs (the agent cuts
    /// their connections), then their bookings go with the step's end. Interrupted when the VM
    /// changed meanwhile.
    pub(super) async fn detach_step(
        self: &std::sync::Arc<Self>,
        vm: &mut VmRecord,
    ) -> Result<Progress, StepError> {
        let host = vm.host.clone().ok_or_else(|| Error::internal("a ready VM without a host"))?;
        let fence_on = self.withdraw_routes(&host).await?;
        let server_hosts = self.server_hosts_of(vm.id).await?;
        let ended = VmRecord { step: SagaStep::Done, updated_ms: now_ms(), ..vm.clone() };
        let ended = match self.release_detached(Ending { ended, fence_on }).await {
            Ok(ended) => ended,
            Err(Error::Conflict(reason)) if reason == VM_CHANGED => {
                return Err(StepError::Interrupted)
            }
            Err(e) => return Err(e.into()),
        };
        // The detached cGPUs' servers end (their hosts' tables no longer list them).
        self.stop_servers(server_hosts);
        inc(&self.metrics.elastic.detaches_done);
        let elapsed = (ended.updated_ms - vm.updated_ms).max(0) as f64 / 1000.0;
        self.metrics.elastic.detach_seconds.observe(elapsed);
        *vm = ended;
        self.watchers.changed(vm);
        Ok(Progress::Recorded)
    }
}
