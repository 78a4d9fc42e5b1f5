//! Long-polling a VM: wait until it settles instead of asking again and again.
//!
//! A client following a launch or a termination would otherwise poll `GET /v1/vms/{id}`, and
//! every poll is an HTTP request and two database reads. With `?wait=` the request parks on a
//! per-VM signal that this process's saga and terminations raise, with the record written, on
//! every write of the VM, and answers with that record once it is settled: one read per wait.
//! Another replica's saga does not reach this process's signal, so a waiter also re-reads every
//! `launch.long_poll_reread_ms`: it never waits past a change by more than that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpgpums::VmId;
use tokio::sync::Notify;

use super::shared::{Extras, ViewVersions, VmDetails};
use super::App;
use crate::auth::Caller;
use crate::error::Error;
use crate::model::{SagaStep, VmRecord, VmState};
use crate::policy::actions;

/// The longest a client may ask to wait.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Per-VM signals; an entry lives while someone waits.
#[derive(Debug, Default)]
pub(crate) struct VmWatchers {
    waiting: Mutex<HashMap<VmId, Watched>>,
}

#[derive(Debug)]
struct Watched {
    signal: Arc<Notify>,
    waiters: usize,
    /// The last write announced.
    written: Option<Announced>,
}

/// A write as announced to waiters.
#[derive(Debug, Clone)]
struct Announced {
    vm: VmRecord,
    /// Its transaction added no queue entry or event of the VM after writing it, so the VM's
    /// `extras_version` as written is the one the transaction left.
    alone: bool,
}

/// One waiter's registration; dropping it unregisters.
struct Watch<'a> {
    watchers: &'a VmWatchers,
    id: VmId,
    signal: Arc<Notify>,
}

impl VmWatchers {
    fn watch(&self, id: VmId) -> Watch<'_> {
        let mut waiting = self.waiting.lock().expect("vm watchers");
        let entry = waiting.entry(id).or_insert_with(|| Watched {
            signal: Arc::new(Notify::new()),
            waiters: 0,
            written: None,
        });
        entry.waiters += 1;
        Watch { watchers: self, id, signal: entry.signal.clone() }
    }

    /// Wakes everyone waiting on `vm`, just written as it is.
    pub(crate) fn changed(&self, vm: &VmRecord) {
        self.announce(vm, false);
    }

    /// [`Self::changed`] for a write whose transaction added no queue entry or event of the VM
    /// after the write: a waiter that read none may answer without reading them.
    pub(crate) fn changed_alone(&self, vm: &VmRecord) {
        self.announce(vm, true);
    }

    fn announce(&self, vm: &VmRecord, alone: bool) {
        if let Some(watched) = self.waiting.lock().expect("vm watchers").get_mut(&vm.id) {
            watched.written = Some(Announced { vm: vm.clone(), alone });
            watched.signal.notify_waiters();
        }
    }
}

impl Watch<'_> {
    /// The last write announced, if it is newer than `version` and left the VM settled.
    fn settled_write(&self, version: i64) -> Option<Announced> {
        let waiting = self.watchers.waiting.lock().expect("vm watchers");
        let written = waiting.get(&self.id)?.written.as_ref()?;
        (written.vm.version > version && settled(&written.vm)).then(|| written.clone())
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut waiting = self.watchers.waiting.lock().expect("vm watchers");
        if let Some(entry) = waiting.get_mut(&self.id) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                waiting.remove(&self.id);
            }
        }
    }
}

/// Whether a VM has reached a state no saga of it will leave on its own.
pub fn settled(vm: &VmRecord) -> bool {
    !matches!(vm.state, VmState::Queued | VmState::Creating | VmState::Deleting)
        && !vm.step.changes_cgpus()
}

impl App {
    /// The VM as [`App::visible_vm`] returns it, once it has settled (`ready` with no attach or
    /// detach under way, `error`, `deleted`) or `wait` has passed, whichever comes first.
    pub async fn visible_vm_settled(
        &self,
        caller: &Caller,
        id: VmId,
        wait: Duration,
    ) -> Result<VmDetails, Error> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        let watch = self.watchers.watch(id);
        loop {
            // Armed before reading, so a write between the read and the wait still wakes us.
            let signal = watch.signal.notified();
            tokio::pin!(signal);
            signal.as_mut().enable();
            let details = self.visible_vm(caller, id, actions::VM_SHOW).await?;
            if settled(&details.vm) {
                return Ok(details);
            }
            let read_version = details.vm.version;
            // Woken by writes that leave it unsettled, wait on without reading.
            let reread = Duration::from_millis(self.config.launch.long_poll_reread_ms);
            let fallback = tokio::time::Instant::now() + reread;
            loop {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return self.visible_vm(caller, id, actions::VM_SHOW).await;
                }
                let timed_out = crate::lanes::parked(tokio::time::timeout_at(
                    deadline.min(fallback),
                    signal.as_mut(),
                ))
                .await
                .is_err();
                if timed_out {
                    break;
                }
                if let Some(Announced { vm, alone }) = watch.settled_write(read_version) {
                    if details.vm.step.changes_cgpus() {
                        // An attach or detach ended: its cGPUs changed, so read them.
                        break;
                    }
                    // What this process just wrote, so no read: the cGPUs are those read above
                    // unless the write ended a saga that released them.
                    let released = vm.step == SagaStep::Done && vm.state != VmState::Ready;
                    let cgpus = if released { Vec::new() } else { details.cgpus };
                    // Nothing added besides the VM since the read that found nothing: none.
                    let extras = match details.extras {
                        Extras::None { versions }
                            if alone && vm.extras_version == details.vm.extras_version =>
                        {
                            let versions = versions
                                .filter(|_| !released)
                                .map(|read| ViewVersions { vm: vm.version, cgpus: read.cgpus });
                            Extras::None { versions }
                        }
                        _ => Extras::Unknown,
                    };
                    return Ok(VmDetails { vm, cgpus, extras });
                }
                signal.set(watch.signal.notified());
                signal.as_mut().enable();
            }
        }
    }
}
