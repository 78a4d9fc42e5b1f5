//! Long-polling a VM: wait until it settles instead of asking again and again.
//!
//! A client following a launch or a termination would otherwise poll `GET /v1/vms/{id}`, and
//! every poll is an HTTP request and two database reads. With `?wait=` the request parks on a
//! per-VM signal that this process's saga and terminations raise on every write of the VM, and
//! reads the VM again only then. Another replica's saga does not reach this process's signal, so
//! a waiter also re-reads at a slow fallback interval: it never waits past a change by more than
//! that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpgpums::VmId;
use tokio::sync::Notify;

use super::vms::VmDetails;
use super::App;
use crate::auth::Caller;
use crate::error::Error;
use crate::model::VmState;

/// How often a waiter re-reads a VM whose saga may run in another replica.
const FALLBACK_READ: Duration = Duration::from_millis(250);
/// The longest a client may ask to wait.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Per-VM signals with their number of waiters; an entry lives while someone waits.
#[derive(Debug, Default)]
pub(crate) struct VmWatchers {
    waiting: Mutex<HashMap<VmId, (Arc<Notify>, usize)>>,
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
        let entry = waiting.entry(id).or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Watch { watchers: self, id, signal: entry.0.clone() }
    }

    /// Wakes everyone waiting on `id` (the VM was written).
    pub(crate) fn changed(&self, id: VmId) {
        if let Some((signal, _)) = self.waiting.lock().expect("vm watchers").get(&id) {
            signal.notify_waiters();
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut waiting = self.watchers.waiting.lock().expect("vm watchers");
        if let Some(entry) = waiting.get_mut(&self.id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                waiting.remove(&self.id);
            }
        }
    }
}

/// Whether a VM has reached a state no saga of it will leave on its own.
pub fn settled(state: VmState) -> bool {
    !matches!(state, VmState::Creating | VmState::Deleting)
}

impl App {
    /// The VM as [`App::visible_vm`] returns it, once it has settled (`ready`, `error`,
    /// `deleted`) or `wait` has passed, whichever comes first.
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
            let details = self.visible_vm(caller, id).await?;
            let now = tokio::time::Instant::now();
            if settled(details.vm.state) || now >= deadline {
                return Ok(details);
            }
            let _ = tokio::time::timeout_at(deadline.min(now + FALLBACK_READ), signal).await;
        }
    }
}
