//! Hosts: agents register and heartbeat with their GPU inventory, silent hosts become unavailable,
//! drift in an agent's table is repaired by the reconciler, and locality places VMs where asked.

use crate::{on_both_stores, support};

use std::time::Duration;

use gsaasd::auth::Role;
use serde_json::{json, Value};
use support::{host_report, shared_launch, Store, TestService};

on_both_stores!(
    agents_register_heartbeat_and_only_for_their_own_host,
    silent_hosts_become_unavailable_and_come_back,
    the_reconciler_repairs_an_agent_that_lost_its_table,
    locality_places_the_vm_on_the_gpu_host_or_an_rgpu_host,
);

/// A report from an agent gsaasd never calls (the simulated hosts backend).
fn report(host: &str, kind: &str, gpus: usize) -> Value {
    host_report(host, kind, &format!("http://{host}.invalid:7450"), gpus)
}

async fn totals(t: &TestService) -> Value {
    t.get(&t.member(), "/v1/pool").await.1["totals"].clone()
}

async fn agents_register_heartbeat_and_only_for_their_own_host(store: Store) {
    let t = TestService::start_with(store, |c| {
        c.hosts.backend = gsaasd::config::HostsBackend::Agent;
        c.hosts.agent_url_template = Some("http://{host}.invalid:7450".into());
    })
    .await;
    assert_eq!(totals(&t).await["gpus"], 0, "no inventory with real agents");
    let token = t.agent_token("gpu-a");
    let (status, host) = t.report_host(&token, "gpu-a", &report("gpu-a", "compute-gpu", 2)).await;
    assert_eq!(status, 200, "{host}");
    assert_eq!(host["state"], "schedulable");
    assert_eq!(totals(&t).await["gpus"], 2);
    // A heartbeat with the same inventory changes nothing; a third GPU joins the pool.
    assert_eq!(t.report_host(&token, "gpu-a", &report("gpu-a", "compute-gpu", 2)).await.0, 200);
    assert_eq!(totals(&t).await["gpus"], 2);
    assert_eq!(t.report_host(&token, "gpu-a", &report("gpu-a", "compute-gpu", 3)).await.0, 200);
    assert_eq!(totals(&t).await["memory_mib"], 3 * 4800);
    // Only for its own host, with a matching body, and a host keeps its kind.
    let (status, _) = t.report_host(&token, "gpu-b", &report("gpu-b", "compute-gpu", 1)).await;
    assert_eq!(status, 404);
    let (status, problem) =
        t.report_host(&token, "gpu-a", &report("gpu-b", "compute-gpu", 1)).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("host")), "{problem}");
    let (status, _) = t.report_host(&token, "gpu-a", &report("gpu-a", "compute-rgpu", 0)).await;
    assert_eq!(status, 409);
    let (status, problem) = t.report_host(&token, "gpu-a", &json!({"host": "gpu-a"})).await;
    assert_eq!(status, 422, "{problem}");
    let (status, _) = t.report_host(&t.member(), "gpu-a", &report("gpu-a", "compute-gpu", 3)).await;
    assert_eq!(status, 404, "tenants cannot register hosts");
    // Admins may register any host.
    let (status, _) =
        t.report_host(&t.admin(), "rgpu-a", &report("rgpu-a", "compute-rgpu", 0)).await;
    assert_eq!(status, 200);
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 2, "{hosts}");
}

async fn silent_hosts_become_unavailable_and_come_back(store: Store) {
    let t = TestService::start_with(store, |c| {
        c.hosts.backend = gsaasd::config::HostsBackend::Agent;
        c.hosts.agent_url_template = Some("http://{host}.invalid:7450".into());
        c.hosts.heartbeat_timeout_secs = 0;
    })
    .await;
    let token = t.agent_token("gpu-a");
    t.report_host(&token, "gpu-a", &report("gpu-a", "compute-gpu", 1)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let status = t.service().app.reconcile_once().await;
    assert_eq!(status.hosts_marked_unavailable, 1, "{status:?}");
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(hosts["hosts"][0]["state"], "unavailable");
    let (code, _) = t.post(&t.member(), "/v1/vms", &shared_launch(1, 1024)).await;
    assert_eq!(code, 507, "an unavailable host takes no new cGPUs");
    // The next heartbeat brings it back.
    t.report_host(&token, "gpu-a", &report("gpu-a", "compute-gpu", 1)).await;
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(hosts["hosts"][0]["state"], "schedulable");
    // A drained host stays drained across heartbeats.
    t.post(&t.admin(), "/v1/hosts/gpu-a/drain", &json!({})).await;
    t.report_host(&token, "gpu-a", &report("gpu-a", "compute-gpu", 1)).await;
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(hosts["hosts"][0]["state"], "drained");
}

async fn the_reconciler_repairs_an_agent_that_lost_its_table(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let id = t.launch(&token, &shared_launch(1, 1024)).await;
    let vm = t.wait_state(&token, &id, "ready").await;
    let (_, admin_vm) = t.get(&t.admin(), &format!("/v1/vms/{id}")).await;
    let host_name = admin_vm["host"].as_str().unwrap().to_owned();
    let app = &t.service().app;
    let host =
        app.hosts().await.unwrap().into_iter().find(|h| h.name.as_str() == host_name).unwrap();
    let generation = host.applied_generation;
    assert!(generation > 0);
    // The host's agent restarts without its state (a wiped disk): it holds nothing.
    let agents = app.in_process_agents().expect("in-process agents");
    agents.forget(&host.name);
    assert_eq!(app.agents.applied_generation(&host).await.unwrap(), None);
    let status = app.reconcile_once().await;
    assert_eq!(status.tables_pushed, 1, "{status:?}");
    assert!(status.last_error.is_none(), "{status:?}");
    let host =
        app.hosts().await.unwrap().into_iter().find(|h| h.name.as_str() == host_name).unwrap();
    assert!(host.applied_generation > generation);
    let masked: std::net::SocketAddrV4 =
        vm["cgpus"][0]["masked_endpoint"].as_str().unwrap().parse().unwrap();
    let source: std::net::Ipv4Addr = vm["fixed_ip"].as_str().unwrap().parse().unwrap();
    let admin = gsaasd::auth::Caller::new("ops", Some("ops".into()), Role::Admin);
    let tap = app
        .visible_vm(&admin, id.parse().unwrap(), gsaasd::policy::actions::VM_SHOW)
        .await
        .unwrap()
        .vm
        .tap;
    let target = agents.resolve(&host, source, tap.as_deref().unwrap_or(""), masked);
    assert_eq!(
        target.map(|t| t.to_string()),
        admin_vm["cgpus"][0]["rcuda_endpoint"].as_str().map(str::to_owned)
    );
    // Nothing drifted: the next pass pushes nothing.
    assert_eq!(app.reconcile_once().await.tables_pushed, 0);
}

async fn locality_places_the_vm_on_the_gpu_host_or_an_rgpu_host(store: Store) {
    let t = TestService::start(store).await;
    let token = t.member();
    let mut local = shared_launch(2, 1024);
    local["locality"] = json!("local");
    let mut remote = shared_launch(2, 1024);
    remote["locality"] = json!("remote");
    let local = t.launch(&token, &local).await;
    let remote = t.launch(&token, &remote).await;
    for (id, expect_gpu_host) in [(local, true), (remote, false)] {
        t.wait_state(&token, &id, "ready").await;
        let (_, vm) = t.get(&t.admin(), &format!("/v1/vms/{id}")).await;
        let host = vm["host"].as_str().unwrap();
        assert_eq!(host == "compute-gpu", expect_gpu_host, "{vm}");
        assert!(expect_gpu_host || host.ends_with("-rgpu"), "{vm}");
    }
}

/// The skew policy (rodvr-contract's `version`): gsaasd takes agents of its protocol and one
/// below; an agent further behind, or ahead of gsaasd, is refused with 409 saying which side to
/// upgrade, and its report changes nothing. A report without the header (admins' tools, agents
/// of before it) registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_outside_the_skew_policy_are_refused_naming_the_side_to_upgrade() {
    use rodvr_contract::version::{HEADER, PROTOCOL};
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.hosts.backend = gsaasd::config::HostsBackend::Agent;
        c.hosts.agent_url_template = Some("http://{host}.invalid:7450".into());
    })
    .await;
    let token = t.agent_token("gpu-a");
    let register = |protocol: Option<String>| {
        let mut req = t.http.put(t.url("/v1/hosts/gpu-a")).bearer_auth(&token).json(&report(
            "gpu-a",
            "compute-gpu",
            2,
        ));
        if let Some(p) = protocol {
            req = req.header(HEADER, p);
        }
        req.send()
    };
    for (protocol, says) in [
        (Some((PROTOCOL + 1).to_string()), "upgrade gsaasd first"),
        (Some((PROTOCOL - 2).to_string()), "upgrade the agent"),
        (Some("1.5".to_owned()), "is not a protocol version"),
    ] {
        let answer = register(protocol.clone()).await.unwrap();
        assert_eq!(answer.status(), 409, "agent protocol {protocol:?}");
        assert_eq!(answer.headers()[HEADER], PROTOCOL.to_string().as_str());
        let problem: Value = answer.json().await.unwrap();
        assert!(problem["detail"].as_str().unwrap().contains(says), "{protocol:?}: {problem}");
        assert_eq!(totals(&t).await["gpus"], 0, "a refused report changes nothing");
    }
    for protocol in [None, Some((PROTOCOL - 1).to_string()), Some(PROTOCOL.to_string())] {
        let answer = register(protocol.clone()).await.unwrap();
        assert_eq!(answer.status(), 200, "agent protocol {protocol:?}");
    }
    assert_eq!(totals(&t).await["gpus"], 2);
}
