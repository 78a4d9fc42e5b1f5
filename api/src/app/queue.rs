//! The queue as requests and views see it: what a VM waits for and its events (read in batches
//! for every view a poll answers), a project's queue, and cancelling a queued launch. The rounds
//! that serve the queue are background work ([`super::background::queue_rounds`]).

use std::collections::HashMap;
use std::sync::Arc;

use gpgpums::VmId;

use super::background::queue_rounds::ended;
use super::batch::{fail_all, Queued};
use super::pool::BoxFuture;
pub use super::shared::{QueueAndEvents, QueueEntry};
use super::App;
use crate::auth::Caller;
use crate::db::{self, now_ms, VmWrite, Written};
use crate::error::Error;
use crate::model::{VmRecord, VmState};
use crate::policy::actions;

impl App {
    /// What `vms` wait for in the queue, and their last `events_per_vm` events: what a page of
    /// VMs, or a batch of single VMs' views, shows, in two queries per
    /// [`db::MAX_ROWS`](crate::db) VMs.
    pub async fn queue_and_events(
        &self,
        vms: &[VmId],
        events_per_vm: usize,
    ) -> Result<QueueAndEvents, Error> {
        let (places, events) = self.db.queue_places_and_events(vms, events_per_vm).await?;
        let mut entries: HashMap<VmId, Vec<QueueEntry>> = HashMap::new();
        for place in places {
            entries.entry(place.vm).or_default().push(QueueEntry {
                position: place.position,
                queued: place.queued,
                enqueued_ms: place.enqueued_ms,
                deadline_ms: place.deadline_ms,
            });
        }
        Ok(QueueAndEvents { entries, events })
    }

    /// The VM's requests in the queue and its latest events, read in the next batch.
    pub async fn view_extras(&self, vm: VmId) -> Result<ViewExtras, Error> {
        self.batchers.view_extras.submit(vm).await
    }

    /// The queue as `caller` may see it: its project's requests (an admin's: every project's) in
    /// queue order, and how many requests wait at each priority in all.
    pub async fn queue_of(
        &self,
        caller: &Caller,
    ) -> Result<(Vec<db::QueueRow>, Vec<(i64, i64)>), Error> {
        let project =
            self.policy.list_scope(caller, actions::QUEUE_LIST, actions::QUEUE_LIST_ALL)?;
        let rows = self.db.queue_rows(project).await?;
        let lengths = self.db.queue_lengths().await?;
        Ok((rows, lengths))
    }

    /// Cancels a queued launch: the VM ends `deleted` and leaves the queue. `Stale`: it changed
    /// meanwhile (it started, or another termination won), and nothing was written.
    pub(crate) async fn cancel_queued(
        self: &Arc<Self>,
        vm: &VmRecord,
    ) -> Result<(VmRecord, Written), Error> {
        let mut write = [ended(vm, VmState::Deleted, String::new(), now_ms())];
        write[0].vm.error = None;
        if self.db.cancel_queued(&mut write).await? {
            let [VmWrite { vm: cancelled, .. }] = write;
            self.watchers.changed(&cancelled);
            self.spawn_end_delegation(vm.id, None);
            return Ok((cancelled, Written::Done { claimed: false }));
        }
        Ok((vm.clone(), Written::Stale))
    }
}

/// What a VM's view shows besides the VM: its requests in the queue and its latest events.
#[derive(Debug, Default)]
pub struct ViewExtras {
    pub entries: Vec<QueueEntry>,
    pub events: Vec<db::VmEvent>,
}

/// Reads one batch of views' extras (the [`super::batch::Batcher`] task's work): every view a
/// poll answers needs them, so they are read for many VMs at once, as the VMs are.
pub(crate) fn read_view_extras(
    app: Arc<App>,
    queued: Vec<Queued<VmId, ViewExtras>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut ids: Vec<VmId> = queued.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        let per_vm = usize::try_from(db::EVENTS_PER_VM).unwrap_or(usize::MAX);
        match app.queue_and_events(&ids, per_vm).await {
            Ok(QueueAndEvents { entries, events }) => {
                for (id, reply) in queued {
                    let extras = ViewExtras {
                        entries: entries.get(&id).cloned().unwrap_or_default(),
                        events: events.get(&id).cloned().unwrap_or_default(),
                    };
                    let _ = reply.send(Ok(extras));
                }
            }
            Err(e) => fail_all(queued, e),
        }
    })
}
