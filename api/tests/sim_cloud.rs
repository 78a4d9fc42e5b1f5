//! `SimCloud` behaves like Nova: its state machine, scheduling, idempotency, deletion, its network
//! hook and its injected faults. Delays run under paused tokio time, so they cost no real time and
//! elapsed times are exact.

use std::collections::{BTreeMap, HashSet};
use std::error::Error as _;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use gpgpums::{HostId, VmId};
use gsaasd::cloud::sim::{SimAddressPool, SimCloud, SimConfig, SimFault, SimVmNetwork, VmPort};
use gsaasd::cloud::{
    Cloud, CloudError, HostConstraint, ServerId, ServerSpec, ServerStatus, VmRequest,
};
use tokio::sync::Notify;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(600);

fn host(name: &str) -> HostId {
    HostId::new(name).unwrap()
}

fn hosts(names: &[&str]) -> Vec<HostId> {
    names.iter().map(|n| host(n)).collect()
}

fn request() -> VmRequest {
    VmRequest {
        name: "vm".to_owned(),
        image: "cirros-0.6.2".to_owned(),
        flavor: "m1.small".to_owned(),
        networks: vec![],
    }
}

fn spec_on(vm: VmId, constraint: HostConstraint) -> ServerSpec {
    ServerSpec {
        vm,
        request: request(),
        user_data: format!("#cloud-config\n# {vm}\n").into_bytes(),
        host: constraint,
        tenant: None,
        checked: None,
        first_attempt: false,
    }
}

fn spec(vm: VmId) -> ServerSpec {
    spec_on(vm, HostConstraint::AnyOf(hosts(&["h1", "h2"]).into()))
}

fn delays() -> SimConfig {
    SimConfig {
        creation_delay_ms: 100,
        activation_delay_ms: 1_000,
        deployment_delay_ms: 500,
        deletion_delay_ms: 200,
        ..SimConfig::default()
    }
}

fn cloud() -> SimCloud {
    SimCloud::new(SimConfig::default(), hosts(&["h1", "h2"]))
}

async fn create_active(cloud: &SimCloud, spec: &ServerSpec) -> (ServerId, HostId, Ipv4Addr) {
    let id = cloud.create_server(spec).await.unwrap();
    let info = cloud.wait_active(&id, LONG).await.unwrap();
    (id, info.host.unwrap(), info.fixed_ip.unwrap())
}

#[tokio::test(start_paused = true)]
async fn server_goes_build_active_deployed_after_the_delays() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    let start = Instant::now();
    let vm = VmId::new_random();

    let id = cloud.create_server(&spec_on(vm, HostConstraint::Pinned(host("h1")))).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert!(uuid::Uuid::parse_str(&id.0).is_ok(), "{id} is not a UUID");
    let info = cloud.server(&id).await.unwrap();
    assert_eq!(
        (info.status, info.host, info.fixed_ip, info.tap),
        (ServerStatus::Build, None, None, None)
    );
    assert_eq!(info.vm, vm);

    let deployed = tokio::spawn({
        let (cloud, id) = (cloud.clone(), id.clone());
        async move {
            cloud.wait_deployed(&id, LONG).await.unwrap();
            start.elapsed()
        }
    });
    let active = cloud.wait_active(&id, LONG).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(1_100));
    assert_eq!(active.status, ServerStatus::Active);
    assert_eq!(active.host, Some(host("h1")));
    assert_eq!(active.fixed_ip, Some(Ipv4Addr::new(10, 77, 0, 2)));
    let tap = active.tap.clone().unwrap();
    assert!(tap.starts_with("tap") && tap.len() == 14, "{tap}");
    assert_eq!(cloud.server(&id).await.unwrap(), active);

    assert_eq!(deployed.await.unwrap(), Duration::from_millis(1_600));
    // Already deployed: answers at once.
    cloud.wait_deployed(&id, Duration::ZERO).await.unwrap();
    assert_eq!(cloud.servers(), vec![active]);
}

#[tokio::test(start_paused = true)]
async fn waits_time_out_after_their_timeout() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    let start = Instant::now();
    let err = cloud.wait_active(&id, Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(t) if t == Duration::from_millis(300)), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    let err = cloud.wait_deployed(&id, Duration::from_millis(1_000)).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(_)), "{err:?}");
    // The server carries on regardless.
    cloud.wait_deployed(&id, LONG).await.unwrap();
}

#[tokio::test]
async fn pinned_host_is_honoured_and_an_unknown_one_refused() {
    let cloud = SimCloud::new(SimConfig::default(), hosts(&["h1", "h2", "h3"]));
    for name in ["h3", "h1", "h3"] {
        let spec = spec_on(VmId::new_random(), HostConstraint::Pinned(host(name)));
        assert_eq!(create_active(&cloud, &spec).await.1, host(name));
    }

    let vm = VmId::new_random();
    let err = cloud.create_server(&spec_on(vm, HostConstraint::Pinned(host("h9")))).await;
    match err {
        Err(CloudError::Invalid { field: "host", reason }) => {
            assert!(reason.starts_with("No valid host was found"), "{reason}");
            assert!(reason.contains("h9"), "{reason}");
        }
        other => panic!("expected Invalid host, got {other:?}"),
    }
    assert_eq!(cloud.find_server(vm).await.unwrap(), None);
    assert_eq!(cloud.servers().len(), 3);

    // A host that registers later can be used.
    cloud.add_host(host("h9"));
    let spec = spec_on(vm, HostConstraint::Pinned(host("h9")));
    assert_eq!(create_active(&cloud, &spec).await.1, host("h9"));
}

#[tokio::test]
async fn any_of_picks_the_least_loaded_known_host_ties_by_name() {
    let cloud = SimCloud::new(SimConfig::default(), hosts(&["a", "b", "c"]));
    let candidates = HostConstraint::AnyOf(hosts(&["c", "unknown", "b", "a"]).into());
    let mut placed = Vec::new();
    for _ in 0..6 {
        let (id, on, _) =
            create_active(&cloud, &spec_on(VmId::new_random(), candidates.clone())).await;
        placed.push((id, on));
    }
    let order: Vec<&str> = placed.iter().map(|(_, h)| h.as_str()).collect();
    assert_eq!(order, ["a", "b", "c", "a", "b", "c"]);

    // Only the candidates count: "c" is excluded though it is known.
    let (_, on, _) = create_active(
        &cloud,
        &spec_on(VmId::new_random(), HostConstraint::AnyOf(hosts(&["b", "a"]).into())),
    )
    .await;
    assert_eq!(on, host("a"));

    // Deleted servers no longer count.
    for (id, _) in placed.iter().filter(|(_, h)| h.as_str() == "c") {
        cloud.delete_server(id, LONG).await.unwrap();
    }
    let (_, on, _) = create_active(&cloud, &spec_on(VmId::new_random(), candidates)).await;
    assert_eq!(on, host("c"));
    // Candidates in name order (searched, not hashed) weigh the same: a has 3, b 2, c 1.
    let sorted = HostConstraint::AnyOf(hosts(&["b", "c"]).into());
    assert_eq!(create_active(&cloud, &spec_on(VmId::new_random(), sorted)).await.1, host("c"));

    for unknown in [hosts(&["x", "y"]), vec![]] {
        let constraint = HostConstraint::AnyOf(unknown.into());
        let err = cloud.create_server(&spec_on(VmId::new_random(), constraint)).await.unwrap_err();
        assert!(matches!(err, CloudError::Invalid { field: "host", .. }), "{err:?}");
    }

    cloud.set_hosts(hosts(&["z"]));
    assert_eq!(cloud.hosts(), hosts(&["z"]));
    let err = cloud
        .create_server(&spec_on(VmId::new_random(), HostConstraint::Pinned(host("a"))))
        .await
        .unwrap_err();
    assert!(matches!(err, CloudError::Invalid { field: "host", .. }), "{err:?}");

    // Hosts that come back keep their servers' weight (a 3, b 2, c 2); the new one has none.
    cloud.set_hosts(hosts(&["a", "b", "c", "z"]));
    let all = HostConstraint::AnyOf(hosts(&["a", "b", "c", "z"]).into());
    assert_eq!(create_active(&cloud, &spec_on(VmId::new_random(), all.clone())).await.1, host("z"));
    assert_eq!(create_active(&cloud, &spec_on(VmId::new_random(), all)).await.1, host("z"));
    let all = HostConstraint::AnyOf(hosts(&["a", "b", "c", "z"]).into());
    assert_eq!(create_active(&cloud, &spec_on(VmId::new_random(), all)).await.1, host("b"));
}

#[tokio::test(start_paused = true)]
async fn create_is_idempotent_per_vm_even_concurrently() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    let spec = spec(VmId::new_random());
    let (first, second) = tokio::join!(cloud.create_server(&spec), cloud.create_server(&spec));
    let id = first.unwrap();
    assert_eq!(second.unwrap(), id);
    cloud.wait_active(&id, LONG).await.unwrap();
    assert_eq!(cloud.create_server(&spec).await.unwrap(), id);
    assert_eq!(cloud.servers().len(), 1);

    // Another VM gets another server.
    let other = cloud.create_server(&spec_on(VmId::new_random(), spec.host.clone())).await.unwrap();
    assert_ne!(other, id);
    assert_eq!(cloud.servers().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn find_server_recovers_a_creation_whose_caller_went_away() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    let vm = VmId::new_random();
    assert_eq!(cloud.find_server(vm).await.unwrap(), None);

    // The caller is cancelled during the creation delay; the server exists and activates.
    let spec = spec(vm);
    let cancelled =
        tokio::time::timeout(Duration::from_millis(10), cloud.create_server(&spec)).await;
    assert!(cancelled.is_err());
    let id = cloud.find_server(vm).await.unwrap().expect("server was created");
    assert_eq!(cloud.wait_active(&id, LONG).await.unwrap().vm, vm);
    assert_eq!(cloud.create_server(&spec).await.unwrap(), id);

    cloud.delete_server(&id, LONG).await.unwrap();
    assert_eq!(cloud.find_server(vm).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn delete_waits_for_the_removal_is_idempotent_and_then_not_found() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    let vm = VmId::new_random();
    let id = cloud.create_server(&spec(vm)).await.unwrap();
    cloud.wait_active(&id, LONG).await.unwrap();

    let start = Instant::now();
    let (first, second) =
        tokio::join!(cloud.delete_server(&id, LONG), cloud.delete_server(&id, LONG));
    first.unwrap();
    second.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(200));

    assert!(matches!(cloud.server(&id).await, Err(CloudError::NotFound(_))));
    assert!(matches!(cloud.wait_active(&id, LONG).await, Err(CloudError::NotFound(_))));
    assert!(matches!(cloud.wait_deployed(&id, LONG).await, Err(CloudError::NotFound(_))));
    assert_eq!(cloud.user_data(&id), None);
    assert!(cloud.servers().is_empty());
    cloud.delete_server(&id, LONG).await.unwrap();
    cloud.delete_server(&ServerId("no-such-server".to_owned()), LONG).await.unwrap();

    // A new server for the same VM is a new server.
    let again = cloud.create_server(&spec(vm)).await.unwrap();
    assert_ne!(again, id);
}

#[tokio::test(start_paused = true)]
async fn delete_times_out_but_the_removal_carries_on() {
    let config = SimConfig { deletion_delay_ms: 5_000, ..SimConfig::default() };
    let cloud = SimCloud::new(config, hosts(&["h1"]));
    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    let err = cloud.delete_server(&id, Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(_)), "{err:?}");
    // Still there while deleting, gone after.
    assert!(cloud.server(&id).await.is_ok());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(matches!(cloud.server(&id).await, Err(CloudError::NotFound(_))));
}

#[tokio::test(start_paused = true)]
async fn deleting_a_server_wakes_its_waiters_with_not_found() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    let waiters = [
        tokio::spawn({
            let (cloud, id) = (cloud.clone(), id.clone());
            async move { cloud.wait_active(&id, LONG).await.map(|_| ()) }
        }),
        tokio::spawn({
            let (cloud, id) = (cloud.clone(), id.clone());
            async move { cloud.wait_deployed(&id, LONG).await }
        }),
    ];
    cloud.delete_server(&id, LONG).await.unwrap();
    for waiter in waiters {
        let result = waiter.await.unwrap();
        assert!(matches!(result, Err(CloudError::NotFound(_))), "{result:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn activation_failure_puts_the_server_in_error_once() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    cloud.inject(SimFault::ActivationFails("Exceeded maximum number of retries".to_owned()));
    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    let err = cloud.wait_active(&id, LONG).await.unwrap_err();
    assert!(
        matches!(&err, CloudError::ServerFailed(f) if f == "Exceeded maximum number of retries"),
        "{err:?}"
    );
    let err = cloud.wait_deployed(&id, LONG).await.unwrap_err();
    assert!(matches!(err, CloudError::ServerFailed(_)), "{err:?}");
    let info = cloud.server(&id).await.unwrap();
    assert_eq!(info.status, ServerStatus::Error("Exceeded maximum number of retries".to_owned()));
    assert_eq!(info.fixed_ip, None);
    // An ERROR server can be deleted.
    cloud.delete_server(&id, LONG).await.unwrap();

    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    cloud.wait_deployed(&id, LONG).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn deploy_timeout_leaves_an_active_server_that_never_deploys() {
    let cloud = SimCloud::new(delays(), hosts(&["h1"]));
    cloud.inject(SimFault::DeployTimeout);
    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    cloud.wait_active(&id, LONG).await.unwrap();
    let err = cloud.wait_deployed(&id, Duration::from_secs(3_600)).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(_)), "{err:?}");

    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    cloud.wait_deployed(&id, LONG).await.unwrap();
}

#[tokio::test]
async fn create_faults_fire_once_each_in_order_and_create_nothing() {
    let cloud = cloud();
    cloud.inject(SimFault::CreateUnavailable);
    cloud.inject(SimFault::CreateQuota);
    cloud.inject(SimFault::CreateInvalid { field: "flavor", reason: "no such flavor".to_owned() });
    let vm = VmId::new_random();

    let err = cloud.create_server(&spec(vm)).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    let err = cloud.create_server(&spec(vm)).await.unwrap_err();
    assert!(matches!(err, CloudError::Quota(_)), "{err:?}");
    let err = cloud.create_server(&spec(vm)).await.unwrap_err();
    assert!(
        matches!(&err, CloudError::Invalid { field: "flavor", reason } if reason == "no such flavor")
    );
    assert_eq!(cloud.find_server(vm).await.unwrap(), None);
    assert!(cloud.servers().is_empty());

    let id = cloud.create_server(&spec(vm)).await.unwrap();
    assert_eq!(cloud.find_server(vm).await.unwrap(), Some(id));
}

#[tokio::test]
async fn check_delete_and_lookup_faults_fire_once() {
    let cloud = cloud();
    cloud.inject(SimFault::CheckUnavailable);
    assert!(matches!(cloud.check(&request(), None).await, Err(CloudError::Unavailable { .. })));
    cloud.check(&request(), None).await.unwrap();

    let vm = VmId::new_random();
    let (id, _, _) = create_active(&cloud, &spec(vm)).await;
    cloud.inject(SimFault::ServerLookupUnavailable);
    cloud.inject(SimFault::ServerLookupUnavailable);
    assert!(matches!(cloud.server(&id).await, Err(CloudError::Unavailable { .. })));
    assert!(matches!(cloud.find_server(vm).await, Err(CloudError::Unavailable { .. })));
    assert!(cloud.server(&id).await.is_ok());
    assert_eq!(cloud.find_server(vm).await.unwrap(), Some(id.clone()));

    cloud.inject(SimFault::DeleteUnavailable);
    assert!(matches!(cloud.delete_server(&id, LONG).await, Err(CloudError::Unavailable { .. })));
    assert_eq!(cloud.server(&id).await.unwrap().status, ServerStatus::Active);
    cloud.delete_server(&id, LONG).await.unwrap();
    assert!(matches!(cloud.server(&id).await, Err(CloudError::NotFound(_))));
}

#[tokio::test]
async fn freed_addresses_are_reused() {
    let cloud = cloud();
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(create_active(&cloud, &spec(VmId::new_random())).await);
    }
    let ips: Vec<Ipv4Addr> = servers.iter().map(|s| s.2).collect();
    assert_eq!(ips, [2, 3, 4].map(|d| Ipv4Addr::new(10, 77, 0, d)));
    cloud.delete_server(&servers[1].0, LONG).await.unwrap();
    let (_, _, ip) = create_active(&cloud, &spec(VmId::new_random())).await;
    assert_eq!(ip, Ipv4Addr::new(10, 77, 0, 3));
    let (_, _, ip) = create_active(&cloud, &spec(VmId::new_random())).await;
    assert_eq!(ip, Ipv4Addr::new(10, 77, 0, 5));
}

#[tokio::test]
async fn an_exhausted_address_pool_fails_the_server() {
    let config =
        SimConfig { fixed_ip_range: "192.168.5.0/30".parse().unwrap(), ..SimConfig::default() };
    let cloud = SimCloud::new(config, hosts(&["h1"]));
    let (first, _, ip) = create_active(&cloud, &spec(VmId::new_random())).await;
    assert_eq!(ip, Ipv4Addr::new(192, 168, 5, 2));

    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    match cloud.wait_active(&id, LONG).await {
        Err(CloudError::ServerFailed(fault)) => {
            assert!(fault.contains("no free fixed IP address left in 192.168.5.0/30"), "{fault}");
        }
        other => panic!("expected ServerFailed, got {other:?}"),
    }
    cloud.delete_server(&id, LONG).await.unwrap();
    cloud.delete_server(&first, LONG).await.unwrap();
    let (_, _, ip) = create_active(&cloud, &spec(VmId::new_random())).await;
    assert_eq!(ip, Ipv4Addr::new(192, 168, 5, 2));
}

#[tokio::test]
async fn check_and_create_name_the_refused_field() {
    let cloud = cloud();
    let cases = [
        ("image", VmRequest { image: "windows".to_owned(), ..request() }, "windows"),
        ("flavor", VmRequest { flavor: "m1.huge".to_owned(), ..request() }, "m1.huge"),
        (
            "networks",
            VmRequest { networks: vec!["private".to_owned(), "public".to_owned()], ..request() },
            "public",
        ),
    ];
    for (field, bad, value) in cases {
        match cloud.check(&bad, None).await {
            Err(CloudError::Invalid { field: f, reason }) => {
                assert_eq!(f, field);
                assert!(reason.contains(value), "{reason}");
            }
            other => panic!("expected Invalid {field}, got {other:?}"),
        }
        let spec = ServerSpec { request: bad, ..spec(VmId::new_random()) };
        let err = cloud.create_server(&spec).await.unwrap_err();
        assert!(matches!(err, CloudError::Invalid { field: f, .. } if f == field), "{err:?}");
    }
    let err = cloud
        .check(&VmRequest { image: "windows".to_owned(), ..request() }, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "image: \"windows\" not found; known images: cirros-0.6.2, ubuntu-22.04"
    );
    assert!(cloud.servers().is_empty());
    cloud
        .check(&VmRequest { networks: vec!["private".to_owned()], ..request() }, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn user_data_is_kept_and_written_to_the_record_dir() {
    let dir = std::env::temp_dir().join(format!("gsaas-sim-cloud-{}", uuid::Uuid::new_v4()));
    let config = SimConfig { record_dir: Some(dir.join("nested")), ..SimConfig::default() };
    let cloud = SimCloud::new(config, hosts(&["h1"]));
    let vm = VmId::new_random();
    let spec = ServerSpec { user_data: b"#!/bin/sh\necho \xe2\x9c\x93\n".to_vec(), ..spec(vm) };
    let id = cloud.create_server(&spec).await.unwrap();

    assert_eq!(cloud.user_data(&id), Some(spec.user_data.clone()));
    let path = cloud.user_data_path(vm).unwrap();
    assert_eq!(path, dir.join("nested").join(format!("{vm}.user_data")));
    assert_eq!(std::fs::read(&path).unwrap(), spec.user_data);
    let files: Vec<_> = std::fs::read_dir(dir.join("nested")).unwrap().collect();
    assert_eq!(files.len(), 1, "no partial files left behind");
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(cloud.user_data(&ServerId("unknown".to_owned())), None);
    assert_eq!(SimCloud::new(SimConfig::default(), vec![]).user_data_path(vm), None);
}

#[tokio::test]
async fn an_unwritable_record_dir_fails_the_create_with_its_cause() {
    let file = std::env::temp_dir().join(format!("gsaas-sim-cloud-{}", uuid::Uuid::new_v4()));
    std::fs::write(&file, b"not a directory").unwrap();
    let config = SimConfig { record_dir: Some(file.clone()), ..SimConfig::default() };
    let cloud = SimCloud::new(config, hosts(&["h1"]));
    let vm = VmId::new_random();
    let err = cloud.create_server(&spec(vm)).await.unwrap_err();
    std::fs::remove_file(&file).unwrap();
    assert!(matches!(err, CloudError::Unavailable { source: Some(_), .. }), "{err:?}");
    assert!(err.source().unwrap().is::<std::io::Error>());
    assert_eq!(cloud.find_server(vm).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_get_distinct_addresses_and_spread() {
    let cloud = Arc::new(SimCloud::new(SimConfig::default(), hosts(&["h1", "h2", "h3", "h4"])));
    let constraint = HostConstraint::AnyOf(hosts(&["h1", "h2", "h3", "h4"]).into());
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (cloud, spec) =
                (Arc::clone(&cloud), spec_on(VmId::new_random(), constraint.clone()));
            tokio::spawn(async move { create_active(&cloud, &spec).await })
        })
        .collect();
    let mut ips = HashSet::new();
    let mut per_host: BTreeMap<HostId, usize> = BTreeMap::new();
    for task in tasks {
        let (_, on, ip) = task.await.unwrap();
        assert!(ips.insert(ip), "{ip} handed out twice");
        *per_host.entry(on).or_default() += 1;
    }
    assert_eq!(ips.len(), 200);
    assert_eq!(per_host.values().copied().collect::<Vec<_>>(), [50; 4]);
    assert_eq!(cloud.servers().len(), 200);
}

/// A network hook whose attach can be held and whose detach can be made to fail.
#[derive(Debug)]
struct ScriptedNetwork {
    pool: SimAddressPool,
    hold_attach: Option<Notify>,
    attaching: Notify,
    detached: Notify,
    failing_detaches: AtomicU32,
    events: Mutex<Vec<String>>,
}

impl ScriptedNetwork {
    fn new(hold_attach: bool) -> Self {
        Self {
            pool: SimAddressPool::new("10.9.0.0/24".parse().unwrap()),
            hold_attach: hold_attach.then(Notify::new),
            attaching: Notify::new(),
            detached: Notify::new(),
            failing_detaches: AtomicU32::new(0),
            events: Mutex::new(Vec::new()),
        }
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
}

#[async_trait]
impl SimVmNetwork for ScriptedNetwork {
    async fn attach(&self, _: &ServerId, vm: VmId, host: &HostId) -> Result<VmPort, CloudError> {
        self.attaching.notify_one();
        if let Some(hold) = &self.hold_attach {
            hold.notified().await;
        }
        let port = VmPort::new(self.pool.allocate()?);
        self.events.lock().unwrap().push(format!("attach {vm} on {host}: {}", port.fixed_ip));
        Ok(port)
    }

    async fn detach(&self, _: &ServerId, host: &HostId, port: &VmPort) -> Result<(), CloudError> {
        let failing = self.failing_detaches.load(Ordering::SeqCst);
        if failing > 0 {
            self.failing_detaches.store(failing - 1, Ordering::SeqCst);
            return Err(CloudError::Unavailable {
                reason: "removing the namespace".to_owned(),
                source: Some(Box::new(std::io::Error::other("device busy"))),
            });
        }
        self.pool.release(port.fixed_ip);
        self.events.lock().unwrap().push(format!("detach on {host}: {}", port.fixed_ip));
        self.detached.notify_one();
        Ok(())
    }
}

#[tokio::test]
async fn the_network_hook_binds_and_releases_ports() {
    let network = Arc::new(ScriptedNetwork::new(false));
    let cloud = SimCloud::with_network(SimConfig::default(), hosts(&["h1"]), network.clone());
    let vm = VmId::new_random();
    let (id, _, ip) = create_active(&cloud, &spec(vm)).await;
    assert_eq!(ip, Ipv4Addr::new(10, 9, 0, 2));
    assert_eq!(network.events(), [format!("attach {vm} on h1: 10.9.0.2")]);

    network.failing_detaches.store(1, Ordering::SeqCst);
    let err = cloud.delete_server(&id, LONG).await.unwrap_err();
    assert_eq!(err.to_string(), format!("cloud unavailable: deleting server {id} failed"));
    let chain: Vec<String> =
        std::iter::successors(err.source(), |e| (*e).source()).map(ToString::to_string).collect();
    assert_eq!(chain, ["cloud unavailable: removing the namespace", "device busy"]);
    let info = cloud.server(&id).await.unwrap();
    assert!(
        matches!(&info.status, ServerStatus::Error(f) if f.contains("device busy")),
        "{info:?}"
    );
    assert_eq!(info.fixed_ip, Some(ip));

    cloud.delete_server(&id, LONG).await.unwrap();
    assert!(matches!(cloud.server(&id).await, Err(CloudError::NotFound(_))));
    assert_eq!(network.events()[1], "detach on h1: 10.9.0.2");
}

#[tokio::test(start_paused = true)]
async fn a_port_bound_after_the_server_was_deleted_is_released() {
    let network = Arc::new(ScriptedNetwork::new(true));
    let cloud = SimCloud::with_network(delays(), hosts(&["h1"]), network.clone());
    let id = cloud.create_server(&spec(VmId::new_random())).await.unwrap();
    network.attaching.notified().await;

    cloud.delete_server(&id, LONG).await.unwrap();
    assert!(network.events().is_empty());
    network.hold_attach.as_ref().unwrap().notify_one();
    // The lifecycle task releases the port it got.
    tokio::time::timeout(LONG, network.detached.notified())
        .await
        .expect("the orphaned port was released");
    let events = network.events();
    assert!(events[0].starts_with("attach"), "{events:?}");
    assert_eq!(events[1], "detach on h1: 10.9.0.2");
    assert!(cloud.servers().is_empty());
}
