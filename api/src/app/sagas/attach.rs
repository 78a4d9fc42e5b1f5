//! The attach saga's step: the host's table with the new cGPUs, then they go live. Its undo is a
//! detach of the same cGPUs ([`super::detach`]), which a failed push turns it into. The request
//! side (booking the cGPUs) is [`crate::app::elastic`]'s.

use super::{Progress, StepError};
use crate::app::App;
use crate::db::{now_ms, VmWrite};
use crate::error::Error;
use crate::metrics::inc;
use crate::model::{CgpuState, SagaStep, VmRecord};

impl App {
    /// The saga's attach step: the host's table with the new cGPUs, then they go live. A failed
    /// push turns the attach into a detach of the new cGPUs (the outer error: storage failed, to
    /// be retried). Interrupted when the VM changed meanwhile (reload and decide again).
    pub(super) async fn attach_step(&self, vm: &mut VmRecord) -> Result<Progress, StepError> {
        let host = vm.host.clone().ok_or_else(|| Error::internal("a ready VM without a host"))?;
        let pushed = self.push_servers_and_routes(vm.id, &host).await;
        let mut next = vm.clone();
        let to = match &pushed {
            Ok(()) => {
                next.step = SagaStep::Done;
                CgpuState::Live
            }
            Err(e) => {
                tracing::warn!(vm = %vm.id, error = %crate::error::ErrorChain(e), "attach failed; detaching");
                next.step = SagaStep::Detach;
                let reason = self.tenant_message(&e.to_string()).await;
                next.error =
                    Some(format!("attaching cGPUs failed, so they are detached: {reason}"));
                CgpuState::Detaching
            }
        };
        next.updated_ms = now_ms();
        let mut write = [VmWrite { vm: next, claim: None }];
        if !self.db.end_attach(&mut write, to).await? {
            return Err(StepError::Interrupted);
        }
        let [VmWrite { vm: written, .. }] = write;
        let elapsed = (written.updated_ms - vm.updated_ms).max(0) as f64 / 1000.0;
        match pushed {
            Ok(()) => {
                inc(&self.metrics.elastic.attaches_done);
                self.metrics.elastic.attach_seconds.observe(elapsed);
                // The VM may have more attaches waiting, held back while this one ran.
                self.trigger_queue();
            }
            Err(_) => inc(&self.metrics.elastic.attaches_failed),
        }
        *vm = written;
        self.watchers.changed(vm);
        Ok(Progress::Recorded)
    }
}
