//! Hosts that run their GPUs' servers, one per cGPU (`[gpu_servers] managed`), behind real agent
//! cores over HTTP whose servers are simulated (ports only): gsaasd lists each cGPU in its GPU
//! host's table, routes it only once its server accepts and only to that server's port, moves
//! the route when the server moves, and ends the server with its cGPU. An agent's report names
//! only its own cGPUs' servers.

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use crate::on_both_stores;
use crate::support::agents::{managed_agent_cloud, remote_launch, TestAgent};
use crate::support::openstack::eventually;
use crate::support::{rcuda_address, Store};
use rodvr_contract::protocol::{RouteTable, ServerState};
use serde_json::{json, Value};

on_both_stores!(
    each_cgpu_is_routed_to_its_own_server_from_launch_to_termination,
    a_server_that_moves_or_stops_accepting_moves_or_withdraws_its_route,
    an_agent_reports_only_its_own_cgpus_servers,
    a_vm_on_its_gpus_host_reaches_a_new_server_in_one_push,
);

/// Waits (bounded: 10 s) until `agent`'s table satisfies `done`.
async fn table_until(agent: &TestAgent, done: impl Fn(&RouteTable) -> bool) -> RouteTable {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(table) = agent.table().filter(|t| done(t)) {
            return table;
        }
        assert!(Instant::now() < deadline, "never got there: {:#?}", agent.table());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The routes' targets, in the table's order.
fn targets(table: &RouteTable) -> Vec<SocketAddrV4> {
    table.routes.iter().map(|r| r.target).collect()
}

async fn each_cgpu_is_routed_to_its_own_server_from_launch_to_termination(store: Store) {
    let (t, vm_host, gpu_host) = managed_agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(2)).await;
    t.wait_state(&member, &id, "ready").await;
    // Two servers of 1,024 MiB on the GPU host; the VM's two routes go to their ports, on the
    // GPU host's server address.
    let served = gpu_host.table().unwrap().servers;
    assert_eq!(served.len(), 2, "{served:?}");
    assert!(served.iter().all(|s| s.memory_mib == Some(1024)), "{served:?}");
    // Each takes its VM's host only, at that host's GPU-network address.
    assert!(served.iter().all(|s| s.clients == [rcuda_address("crg-a")]), "{served:?}");
    let address = rcuda_address("cg-1");
    let ports: Vec<u16> = gpu_host.servers().iter().map(|s| s.live_port().unwrap()).collect();
    assert_eq!(ports, [20000, 20001]);
    let table = vm_host.table().unwrap();
    assert_eq!(
        targets(&table),
        ports.iter().map(|p| SocketAddrV4::new(address, *p)).collect::<Vec<_>>()
    );
    assert!(table.lost.is_empty());
    // An attach: a third server, and its route to it.
    t.attach_one_and_wait(&member, &id, 2048, 3).await;
    let served = gpu_host.table().unwrap().servers;
    assert_eq!(
        served.iter().map(|s| s.memory_mib).collect::<Vec<_>>(),
        [Some(1024); 2].into_iter().chain([Some(2048)]).collect::<Vec<_>>()
    );
    assert_eq!(targets(&vm_host.table().unwrap())[2], SocketAddrV4::new(address, 20002));
    // A detach: its server ends with it; the others keep theirs.
    t.detach_and_wait(&member, &id, 0, 2).await;
    table_until(&gpu_host, |t| t.servers.len() == 2).await;
    // The agent takes a table, then brings its servers to it: they stop a moment later.
    let left = eventually("the detached cGPU's server stopped", || async {
        Some(gpu_host.servers()).filter(|s| s.len() == 2)
    })
    .await;
    assert_eq!(
        left.iter().map(|s| (s.index, s.port)).collect::<Vec<_>>(),
        [(1, Some(20001)), (2, Some(20002))]
    );
    // The termination ends the rest.
    t.terminate_and_wait(&member, &id).await;
    table_until(&gpu_host, |t| t.servers.is_empty()).await;
    eventually("the servers stopped", || async { gpu_host.servers().is_empty().then_some(()) })
        .await;
}

/// A VM on the host that runs its cGPUs' servers: gsaasd does not know a new server's port when
/// it pushes the table, so the table asks the agent to route the cGPU itself once its server
/// accepts (`lost[].here`); an attach takes one push, not a second after the port is recorded.
async fn a_vm_on_its_gpus_host_reaches_a_new_server_in_one_push(store: Store) {
    let (t, _vm_host, gpu_host) = managed_agent_cloud(store, 2).await;
    let member = t.member();
    let mut request = remote_launch(1);
    request["locality"] = json!("local");
    let id = t.launch(&member, &request).await;
    t.wait_state(&member, &id, "ready").await;
    let vm_ip = gpu_host
        .table()
        .unwrap()
        .vms_without_cgpus
        .first()
        .map_or_else(|| gpu_host.table().unwrap().routes[0].vm_ip, |p| p.vm_ip);
    assert_eq!(gpu_host.environment(vm_ip).unwrap().devices.len(), 1);
    let pushes = gpu_host.pushes();
    t.attach_one_and_wait(&member, &id, 1024, 2).await;
    assert_eq!(gpu_host.pushes(), pushes + 1, "an attach took more than one push");
    let table = gpu_host.table().unwrap();
    assert!(table.lost.iter().all(|l| l.here.is_some()), "{:?}", table.lost);
    let env = gpu_host.environment(vm_ip).unwrap();
    assert_eq!(env.devices.len(), 2, "{env:?}");
    assert!(env.missing.is_empty(), "{env:?}");
    // gsaasd recorded the ports the answer gave: the next table routes to them itself.
    let ports: Vec<(u32, u16)> =
        gpu_host.servers().iter().map(|s| (s.index, s.live_port().unwrap())).collect();
    t.detach_and_wait(&member, &id, 0, 1).await;
    let table = table_until(&gpu_host, |t| t.routes.len() == 1 && t.lost.is_empty()).await;
    let port = ports.iter().find(|(index, _)| *index == 1).unwrap().1;
    assert_eq!(targets(&table), [SocketAddrV4::new(rcuda_address("cg-1"), port)]);
    t.terminate_and_wait(&member, &id).await;
}

/// The GPU host's report, with `change` made to its servers.
fn report_with(gpu_host: &TestAgent, change: impl Fn(&mut Vec<Value>)) -> Value {
    let mut report = gpu_host.report();
    change(report["managed"]["servers"].as_array_mut().unwrap());
    report
}

async fn a_server_that_moves_or_stops_accepting_moves_or_withdraws_its_route(store: Store) {
    let (t, vm_host, gpu_host) = managed_agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(2)).await;
    t.wait_state(&member, &id, "ready").await;
    let address = rcuda_address("cg-1");
    let token = t.agent_token("cg-1");
    // The first server restarted on another port: the route follows at the next heartbeat.
    let moved = report_with(&gpu_host, |servers| servers[0]["port"] = json!(20500));
    let (status, body) = t.report_host(&token, "cg-1", &moved).await;
    assert_eq!(status, 200, "{body}");
    let table = table_until(&vm_host, |t| {
        t.routes.first().is_some_and(|r| r.target == SocketAddrV4::new(address, 20500))
    })
    .await;
    assert_eq!(targets(&table)[1], SocketAddrV4::new(address, 20001), "the other stays");
    // The second stopped accepting (in its backoff): no route to it, and its VM lists it as
    // missing, rather than a route to a port where nothing of it listens.
    // It was ended for holding more GPU memory than its share: an event on the VM (naming
    // neither host nor GPU) and an alert on the host, once however often it is reported.
    let down = report_with(&gpu_host, |servers| {
        servers[0]["port"] = json!(20500);
        servers[1]["state"] = json!("backoff");
        servers[1]["over_share_ends"] = json!(1);
        servers[1].as_object_mut().unwrap().remove("port");
    });
    for _ in 0..2 {
        let (status, body) = t.report_host(&token, "cg-1", &down).await;
        assert_eq!(status, 200, "{body}");
    }
    let table = table_until(&vm_host, |t| t.routes.len() == 1).await;
    assert_eq!(table.lost.iter().map(|l| l.index).collect::<Vec<_>>(), [1]);
    let env = vm_host.environment(table.routes[0].vm_ip).unwrap();
    assert_eq!(env.devices.len(), 1);
    let vm =
        t.wait_vm(&member, &id, |vm| vm["events"].as_array().is_some_and(|e| !e.is_empty())).await;
    let events: Vec<&Value> =
        vm["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "gpu_memory").collect();
    assert_eq!(events.len(), 1, "{vm}");
    let said = events[0]["detail"].as_str().unwrap();
    assert!(said.contains("cGPU 1 held more GPU memory than its share"), "{said}");
    assert!(!said.contains("cg-1") && !said.contains("GPU-"), "{said}");
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    let host = hosts["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "cg-1").unwrap();
    let alerts: Vec<&Value> = host["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "server_over_share")
        .collect();
    assert_eq!(alerts.len(), 1, "{host}");
    // Back: its route too.
    let (status, _) = t.report_host(&token, "cg-1", &gpu_host.report()).await;
    assert_eq!(status, 200);
    let table = table_until(&vm_host, |t| t.routes.len() == 2).await;
    assert_eq!(
        targets(&table),
        [SocketAddrV4::new(address, 20000), SocketAddrV4::new(address, 20001)]
    );
    assert_eq!(gpu_host.servers().iter().filter(|s| s.state == ServerState::Ready).count(), 2);
}

async fn an_agent_reports_only_its_own_cgpus_servers(store: Store) {
    let (t, vm_host, gpu_host) = managed_agent_cloud(store, 2).await;
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let before = vm_host.table().unwrap();
    let token = t.agent_token("cg-1");
    // A server on a GPU the report does not have: refused whole, naming it.
    let foreign = report_with(&gpu_host, |servers| {
        servers[0]["gpu"] = json!("cg-2:GPU-0");
    });
    let (status, body) = t.report_host(&token, "cg-1", &foreign).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("managed.servers[0].gpu"), "{body}");
    // A server for a cGPU that is not on its GPUs (a VM it made up, another index): taken as a
    // report, but nothing of it is believed.
    let made_up = report_with(&gpu_host, |servers| {
        let mut other = servers[0].clone();
        other["vm"] = json!(gpgpums::VmId::new_random().to_string());
        other["port"] = json!(20900);
        let mut extra = servers[0].clone();
        extra["index"] = json!(7);
        extra["port"] = json!(20901);
        servers.push(other);
        servers.push(extra);
    });
    let (status, body) = t.report_host(&token, "cg-1", &made_up).await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(vm_host.table().unwrap().routes, before.routes, "no route moved");
    // Another host's agent cannot report this host's servers (its token is for itself).
    let (status, _) = t.report_host(&t.agent_token("crg-a"), "cg-1", &gpu_host.report()).await;
    assert_eq!(status, 404);
}
