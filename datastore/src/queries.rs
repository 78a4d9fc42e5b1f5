//! The datastore's queries as methods, the only way other crates reach them: on a connection of
//! the method's own ([`Db`]: a read, or a write that is one statement and so atomic by itself),
//! or inside a pool change ([`PoolChange`]: the writes of bookings and inventory, and the reads
//! their decisions need, in the transaction that bumped the pool generation). Each method runs
//! the function of the same name in this crate's modules; no connection or transaction leaves
//! the crate.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddrV4;

use gpgpums::queue::Head;
use gpgpums::{
    CohortName, GpuAttributes, GpuId, HostId, HostKind, HostState, ProjectId, Quota, Resources,
    TicketId, Topology, VmId,
};
use gsaas_clouds::cloud::ServerId;
use rodvr_contract::protocol::ServerSpec;

use crate::model::*;
use crate::*;

/// `pub async fn name(&self, args..) -> Result<out, Error>` on [`Db`] (each on a connection of
/// its own) or on [`PoolChange`] (in its transaction), for each query listed, running the
/// function of that name.
macro_rules! queries {
    (impl Db { $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $out:ty;)* }) => {
        impl Db {
            $(
                #[doc = concat!("`", stringify!($name), "` on a connection of its own.")]
                pub async fn $name(&self, $($arg: $ty),*) -> Result<$out, Error> {
                    $name(&mut *self.connection().await?, $($arg),*).await
                }
            )*
        }
    };
    (impl PoolChange { $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $out:ty;)* }) => {
        impl PoolChange {
            $(
                #[doc = concat!("`", stringify!($name), "` in this pool change.")]
                pub async fn $name(&mut self, $($arg: $ty),*) -> Result<$out, Error> {
                    $name(&mut self.tx, $($arg),*).await
                }
            )*
        }
    };
}

queries! {
impl Db {
    fn loans() -> Vec<gpgpums::Loan>;
    fn served_cgpus_on(hosts: &[HostId]) -> BTreeMap<HostId, Vec<ServerSpec>>;
    fn managed_gpu_hosts_of(vm: VmId) -> Vec<HostId>;
    fn hosts_of_vms(vms: &BTreeSet<VmId>) -> BTreeSet<HostId>;
    fn any_managed_gpu() -> bool;
    fn vms_with_cgpus_by_id(wanted: &[(VmId, Option<i64>)]) -> Vec<ReadVm>;
    fn list_position(id: VmId) -> Option<ListPosition>;
    fn vm_page(filter: &VmFilter<'_>, after: Option<&ListPosition>, limit: usize) -> Vec<(VmRecord, Vec<CgpuRecord>)>;
    fn update_vms(writes: &mut [VmWrite]) -> Vec<Written>;
    fn vm(id: VmId) -> Option<VmRecord>;
    fn vms_on_servers(servers: &[ServerId]) -> Vec<VmServer>;
    fn vms_with_servers() -> Vec<VmServer>;
    fn vm_state_counts() -> Vec<(String, i64)>;
    fn vm_by_idempotency_key(project: &str, key: &str) -> Option<(VmId, String)>;
    fn sagas_to_resume(now: i64) -> Vec<VmId>;
    fn claim_saga(vm: VmId, owner: &str, now: i64, until_ms: i64) -> bool;
    fn release_saga(vm: VmId, owner: &str) -> ();
    fn dequeue_vms(vms: &[VmId]) -> ();
    fn queue_places_and_events(vms: &[VmId], per_vm: usize) -> (Vec<QueuePlace>, HashMap<VmId, Vec<VmEvent>>);
    fn queue_rows(project: Option<&str>) -> Vec<QueueRow>;
    fn queue_lengths() -> Vec<(i64, i64)>;
    fn configure_notifier(publishing: bool, now_ms: i64) -> ();
    fn take_notifier_lease(owner: &str, now_ms: i64, until_ms: i64) -> bool;
    fn waiting_notifications(limit: usize) -> Vec<NotificationRecord>;
    fn waiting_notification_count() -> i64;
    fn insert_host_alert(host: &HostId, alert: &HostAlert) -> ();
    fn host_alerts() -> HashMap<HostId, Vec<HostAlert>>;
    fn usage_by_project(period: Period, project: Option<&str>) -> BTreeMap<String, UsageLine>;
    fn usage_by_vm(period: Period, project: &str) -> Vec<VmUsageLine>;
    fn cgpu_spans(period: Period, projects: &[&str]) -> Vec<Span>;
    fn usage_totals(now_ms: i64) -> Vec<(String, CgpuTime)>;
    fn revoke_token(id: &str, expires_ms: i64, now_ms: i64) -> ();
    fn revoked_tokens(now_ms: i64) -> HashSet<String>;
    fn pool_generation() -> i64;
    fn cgpus_of(vm: VmId) -> Vec<CgpuRecord>;
    fn attach_by_idempotency_key(project: &str, key: &str) -> Option<(VmId, String)>;
    fn insert_delegation(vm: VmId, trust: &str, now_ms: i64) -> ();
    fn delegation_of(vm: VmId) -> Option<String>;
    fn delete_delegation(vm: VmId) -> ();
    fn delegations_to_end(limit: i64) -> Vec<VmId>;
    fn counted_vms(projects: Option<&[&ProjectId]>) -> HashMap<ProjectId, u64>;
    fn failed_gpus_in_use() -> Vec<GpuId>;
    fn has_recoverable_lost_cgpus() -> bool;
    fn recover_lost_cgpus() -> Vec<(VmId, u32)>;
    fn fences() -> Vec<FenceRecord>;
    fn releasable_fences(opened_before_ms: i64) -> Vec<ReleasableFence>;
    fn fenced_per_gpu() -> BTreeMap<GpuId, u32>;
    fn gpus() -> Vec<GpuRecord>;
    fn gpus_of_host(host: &HostId) -> Vec<GpuRecord>;
    fn rcuda_endpoint_holder(gpu: &GpuRecord) -> Option<GpuRecord>;
    fn gpu_serving(host: &HostId, endpoint: SocketAddrV4) -> Option<GpuId>;
    fn hosts() -> Vec<HostRecord>;
    fn host(name: &HostId) -> Option<HostRecord>;
    fn touch_host(name: &HostId, agent_url: Option<&str>, now: i64) -> ();
    fn touch_hosts(names: &[HostId], now: i64) -> ();
    fn raise_routes_generation(name: &HostId, generation: u64) -> ();
    fn set_applied_generations(applied: &[(HostId, u64)]) -> ();
}
}

queries! {
impl PoolChange {
    fn insert_vms_with_cgpus(new: &[NewVm<'_>], cgpus: &[CgpuRecord]) -> ();
    fn update_vms(writes: &mut [VmWrite]) -> Vec<Written>;
    fn update_vms_releasing_cgpus(writes: &mut [VmWrite]) -> Vec<Written>;
    fn vm(id: VmId) -> Option<VmRecord>;
    fn enqueue(new: NewTicket<'_>) -> TicketId;
    fn queued_vms() -> Vec<QueuedVm>;
    fn dequeue(tickets: &[TicketId]) -> ();
    fn set_head(reset: &BTreeSet<ProjectId>, head: Option<&Head>, awaiting_reclaim: bool) -> ();
    fn pass_head(ticket: TicketId, passes: u32, max_passes: u32, now_ms: i64) -> ();
    fn waiting_in_project(project: &str) -> u64;
    fn preemptible_vms() -> BTreeMap<VmId, i32>;
    fn reclaim_cgpu(vm: VmId, index: u32, now_ms: i64) -> bool;
    fn reclaiming_cgpus(since_ms: i64) -> Vec<(VmId, u32)>;
    fn loans() -> Vec<gpgpums::Loan>;
    fn insert_event(vm: VmId, event: &VmEvent) -> ();
    fn read_pool_rows() -> PoolRows;
    fn insert_cgpus(cgpus: &[CgpuRecord]) -> ();
    fn cgpus_of(vm: VmId) -> Vec<CgpuRecord>;
    fn delete_cgpus(vms: &[VmId]) -> ();
    fn set_cgpu_states(vm: VmId, index: Option<u32>, from: CgpuState, to: CgpuState) -> u64;
    fn delete_cgpus_in_state(vm: VmId, state: CgpuState) -> Vec<u32>;
    fn insert_attach_key(project: &str, key: &str, vm: VmId, digest: &str, now_ms: i64) -> ();
    fn set_quota(project: &ProjectId, quota: Option<&Quota>, now_ms: i64) -> ();
    fn set_cohort(name: &CohortName, members: Option<&Members>, now_ms: i64) -> ();
    fn counted_vms(projects: Option<&[&ProjectId]>) -> HashMap<ProjectId, u64>;
    fn insert_fence(fence: &FenceRecord, which: Fenced) -> Vec<u32>;
    fn move_cgpu(vm: VmId, index: u32, gpu: &GpuId) -> ();
    fn cgpus_on_gpus(gpus: &[GpuId]) -> Vec<CgpuRecord>;
    fn releasable_fences(opened_before_ms: i64) -> Vec<ReleasableFence>;
    fn delete_fences(ids: &[FenceId]) -> ();
    fn gpus_of_host(host: &HostId) -> Vec<GpuRecord>;
    fn insert_gpu(gpu: &GpuRecord) -> ();
    fn rcuda_endpoint_holder(gpu: &GpuRecord) -> Option<GpuRecord>;
    fn claim_rcuda_endpoint(id: &GpuId) -> ();
    fn delete_gpu(id: &GpuId) -> ();
    fn set_gpu_taint(id: &GpuId, taint: Option<&str>) -> bool;
    fn set_gpu_health(id: &GpuId, health: Option<&str>) -> ();
    fn set_gpu_attributes(id: &GpuId, attributes: &GpuAttributes) -> ();
    fn set_host_local_vms(name: &HostId, offers: Option<Resources>) -> ();
    fn host(name: &HostId) -> Option<HostRecord>;
    fn insert_host(name: &HostId, kind: HostKind, agent_url: Option<&str>, topology: &Topology, now: i64) -> ();
    fn set_host_topology(name: &HostId, topology: &Topology) -> ();
    fn set_host_rtts(name: &HostId, rtt_us: &BTreeMap<HostId, u32>, now: i64) -> ();
    fn touch_host(name: &HostId, agent_url: Option<&str>, now: i64) -> ();
    fn set_host_servers(name: &HostId, managed: bool, gpu_address: Option<std::net::Ipv4Addr>) -> ();
    fn set_host_state(name: &HostId, state: HostState, drained: bool) -> ();
    fn next_routes_generations(hosts: &[HostId]) -> Vec<HostRecord>;
    fn forget_host(name: &HostId) -> ();
}
}
