//! Trust boundaries between gsaasd and host agents, tried as an attacker would: an agent that
//! points gsaasd elsewhere, claims another host's GPUs, lies about its generation, or refuses
//! routes. Each agent here is a real agent core behind its HTTP API (`support::agents`), turned
//! hostile where the test says.

use std::net::SocketAddrV4;
use std::time::Duration;

use crate::on_both_stores;
use crate::support::agents::{agent_cloud, agent_cloud_with, remote_launch, Behaviour, TestAgent};
use crate::support::{host_report, rcuda_address, shared_launch, test_config, Store, TestService};
use gsaasd::auth::Keys;
use gsaasd::config::HostsBackend;
use rodvr_contract::protocol::HostKind;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_and_tenants_data_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| {
        let meta = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        meta.permissions().mode() & 0o777
    };
    let (mut config, dir) = test_config(Store::Sqlite);
    // Left open by an older gsaasd (or a umask of 022): closed at start.
    std::fs::create_dir_all(&config.data_dir).unwrap();
    std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let database = config.data_dir.join("gsaas.sqlite");
    std::fs::write(&database, b"").unwrap();
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o644)).unwrap();
    let user_data = config.data_dir.join("user_data");
    config.cloud.sim_mut().unwrap().record_dir = Some(user_data.clone());
    let t = TestService::start_config(config.clone(), dir).await;
    let member = t.member();
    let mut request = shared_launch(1, 1024);
    request["user_data"] = json!("#!/bin/sh\necho s3cret-token > /root/.credentials\n");
    let id = t.launch(&member, &request).await;
    t.wait_state(&member, &id, "ready").await;

    assert_eq!(mode(&config.data_dir), 0o700);
    for file in ["gsaas.sqlite", "gsaas.sqlite-wal", "gsaas.sqlite-shm", "signing-key.pem"] {
        assert_eq!(mode(&config.data_dir.join(file)), 0o600, "{file}");
    }
    assert_eq!(mode(&user_data), 0o700);
    assert_eq!(mode(&user_data.join(format!("{id}.user_data"))), 0o600);
}

/// With TLS, tenants, agents and gsaasd talk over https, each trusting only the deployment's CA:
/// an agent impostor with another CA's certificate at a host's address gets no token and no table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_gsaasd_and_its_agents_trust_only_the_configured_ca() {
    use crate::support::certs::Ca;
    use gsaas_infra::httpd::{http_client, TlsFiles};
    let (mut config, dir) = test_config(Store::Sqlite);
    let ca = Ca::new("gsaas test CA");
    let names = ["127.0.0.1", "localhost"];
    let (ca_path, cert, key) = ca.write(&dir, "gsaasd", &names);
    let tls = |prefix: &str, ca: &Ca| {
        let (_, cert, key) = ca.write(&dir, prefix, &names);
        Some(TlsFiles { cert, key })
    };
    config.tls = Some(TlsFiles { cert, key });
    config.hosts.backend = HostsBackend::Agent;
    config.hosts.agent_ca = Some(ca_path.clone());
    let keys = Keys::load_or_create(&config.signing_key_path()).unwrap();
    let public = keys.public_pem();
    let vm_host = TestAgent::start_tls("crg-a", HostKind::ComputeRgpu, public, tls("a", &ca)).await;
    let impostor = Ca::new("an impostor's CA");
    let fake =
        TestAgent::start_tls("crg-b", HostKind::ComputeRgpu, public, tls("b", &impostor)).await;
    let gpu_host = TestAgent::start_tls("cg-1", HostKind::ComputeGpu, public, tls("g", &ca)).await;
    for (host, agent) in [("crg-a", &vm_host), ("crg-b", &fake), ("cg-1", &gpu_host)] {
        assert!(agent.url.starts_with("https://"));
        config.hosts.agent_urls.insert(host.parse().unwrap(), agent.url.clone());
    }
    let mut t = TestService::start_config(config, dir.clone()).await;
    assert!(t.url("").starts_with("https://"));
    // Plain HTTP, or a client that does not trust the CA, gets nowhere.
    let plain = t.url("/healthz").replacen("https://", "http://", 1);
    assert!(t.http.get(&plain).send().await.is_err());
    assert!(t.http.get(t.url("/healthz")).send().await.is_err(), "the system CAs do not vouch");
    t.http = http_client(Some(&ca_path)).unwrap();
    for (host, kind, gpus) in [("cg-1", "compute-gpu", 1), ("crg-a", "compute-rgpu", 0)] {
        let token = t.agent_token(host);
        let (status, body) =
            t.report_host(&token, host, &host_report(host, kind, "ignored", gpus)).await;
        assert_eq!(status, 200, "{body}");
    }
    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm_host.routes().len(), 1);

    // The impostor holds crg-b's address; crg-b's VMs cannot be routed, and it learns nothing.
    let (status, body) = t.post(&t.admin(), "/v1/hosts/crg-a/drain", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let token = t.agent_token("crg-b");
    let (status, body) =
        t.report_host(&token, "crg-b", &host_report("crg-b", "compute-rgpu", "x", 0)).await;
    assert_eq!(status, 200, "{body}");
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "error").await;
    assert_eq!(fake.requests(), 0, "the impostor got a request, and with it a token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_vm_tells_its_tenant_nothing_about_where_its_gpus_are() {
    use gsaasd::cloud::sim::SimFault;
    let t = TestService::start(Store::Sqlite).await;
    let sim = t.service().sim.clone().expect("the simulated cloud");
    // The cloud's fault names hosts, a GPU and an rCUDA server, as a real cloud's may.
    sim.inject(SimFault::ActivationFails(
        "Build of instance failed on compute-gpu (XID 79 on compute-gpu:gpu0, rCUDA \
         10.78.0.1:8308 unreachable from compute0-rgpu)."
            .into(),
    ));
    let member = t.member();
    let id = t.launch(&member, &shared_launch(1, 1024)).await;
    let vm = t.wait_state(&member, &id, "error").await;
    let error = vm["error"].as_str().unwrap();
    for secret in ["compute-gpu", "compute0-rgpu", "gpu0", "10.78.0.1", "8308"] {
        assert!(!error.contains(secret), "{secret} in {error:?}");
    }
    assert!(error.contains("Build of instance failed") && error.contains("XID 79"), "{error}");
    for (_, vm) in [t.get(&member, "/v1/vms").await, t.get(&t.admin(), "/v1/vms").await] {
        assert!(!vm.to_string().contains("compute-gpu (XID"), "{vm}");
    }
}

on_both_stores!(
    gsaasd_reaches_an_agent_only_where_its_config_says,
    hosts_report_only_their_own_gpus_at_routable_endpoints,
    an_agent_claiming_an_impossible_generation_cannot_corrupt_gsaasd,
    a_gpu_whose_routes_an_agent_refuses_takes_no_new_cgpus,
    an_agent_cannot_claim_another_hosts_rcuda_server,
    an_agent_that_never_confirms_holds_fences_only_so_long,
    a_hung_agent_holds_the_reconciler_no_longer_than_a_push,
);

/// An agent that takes connections and never answers (a stopped process, or a hostile one) is
/// given `launch.agent_timeout_ms` by each reconciler pass, as a push is, not the HTTP client's
/// 30 s: a pass waits for its slowest check, and every host's heartbeat expiry, re-homing and
/// fences wait for the pass.
async fn a_hung_agent_holds_the_reconciler_no_longer_than_a_push(store: Store) {
    let (t, vm_host, _) = agent_cloud_with(store, 1, |c| c.launch.agent_timeout_ms = 300).await;
    vm_host.set(Behaviour::Hung);
    let app = &t.service().app;
    // Bounded: without the check's timeout the pass takes the client's 30 s.
    let status = tokio::time::timeout(Duration::from_secs(10), app.reconcile_once())
        .await
        .expect("a reconciler pass waited on a hung agent past every bound");
    let error = status.last_error.expect("the hung agent is an error of the pass");
    assert_eq!(error, "host agent unavailable");
    // Once it answers again, passes are clean.
    vm_host.set(Behaviour::Honest);
    let status = app.reconcile_once().await;
    assert!(status.last_error.is_none(), "{status:?}");
}

/// gsaasd with real-agent hosts: a compute-GPU host `cg-1` with `gpus` GPUs (registered by its
/// agent) and a compute-rGPU host `crg-a` for the VMs; each agent's URL pinned in gsaasd's config.
/// Returns gsaasd, the VM host's agent and the GPU host's agent.
async fn gsaasd_reaches_an_agent_only_where_its_config_says(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 1).await;
    // The VM host's agent (or whoever holds its token) reports a URL of its choosing: a server that
    // would take the host's controller tokens and route tables.
    let keys = &t.service().app.keys;
    let trap = TestAgent::start("crg-a", HostKind::ComputeRgpu, keys.public_pem()).await;
    let token = t.agent_token("crg-a");
    let (status, host) =
        t.report_host(&token, "crg-a", &host_report("crg-a", "compute-rgpu", &trap.url, 0)).await;
    assert_eq!(status, 200, "{host}");
    assert_eq!(host["agent_url"], vm_host.url.as_str(), "the pinned URL, not the reported one");

    let member = t.member();
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    assert_eq!(vm_host.routes().len(), 1, "the routes went to the pinned agent");
    assert_eq!(trap.requests(), 0, "gsaasd called the address an agent reported");

    // A host with no URL in gsaasd's config is refused, however valid its token.
    let token = t.agent_token("crg-b");
    let (status, problem) =
        t.report_host(&token, "crg-b", &host_report("crg-b", "compute-rgpu", &trap.url, 0)).await;
    assert_eq!(status, 409, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("hosts.agent_urls"), "{problem}");
    let (_, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 2, "{hosts}");
    assert_eq!(trap.requests(), 0);
}

async fn hosts_report_only_their_own_gpus_at_routable_endpoints(store: Store) {
    let (t, _, gpu_host) = agent_cloud(store, 2).await;
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    let before = pool["hosts"].clone();
    let token = t.agent_token("cg-1");
    type Change = dyn Fn(&mut Value);
    let cases: [(&str, &Change); 8] = [
        ("gpus[1].id", &|r| r["gpus"][1]["id"] = json!("cg-2:gpu0")),
        ("gpus[0].id", &|r| r["gpus"][0]["id"] = json!("GPU-1")),
        ("gpus[1].rcuda", &|r| r["gpus"][1]["rcuda"]["port"] = json!(0)),
        ("gpus[0].rcuda", &|r| r["gpus"][0]["rcuda"]["address"] = json!("100.127.0.9")),
        ("gpus[0].rcuda", &|r| r["gpus"][0]["rcuda"]["address"] = json!("127.0.0.1")),
        ("gpus[1].rcuda", &|r| r["gpus"][1]["rcuda"] = r["gpus"][0]["rcuda"].clone()),
        ("gpus[0].memory_mib", &|r| r["gpus"][0]["memory_mib"] = json!(u64::MAX)),
        ("applied_generation", &|r| r["applied_generation"] = json!(u64::MAX)),
    ];
    for (field, change) in cases {
        let mut body = host_report("cg-1", "compute-gpu", &gpu_host.url, 2);
        change(&mut body);
        let (status, problem) = t.report_host(&token, "cg-1", &body).await;
        assert_eq!((status, problem["field"].as_str()), (422, Some(field)), "{body}: {problem}");
    }
    // Nothing of the refused reports reached the pool; the real owner of the id keeps it.
    let (_, pool) = t.get(&t.admin(), "/v1/pool").await;
    assert_eq!(pool["hosts"], before);
    let token = t.agent_token("cg-2");
    let mut body = host_report("cg-2", "compute-gpu", &gpu_host.url, 1);
    body["gpus"][0]["id"] = json!("cg-1:GPU-0");
    let (status, problem) = t.report_host(&token, "cg-2", &body).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("gpus[0].id")), "{problem}");
}

async fn an_agent_claiming_an_impossible_generation_cannot_corrupt_gsaasd(store: Store) {
    let (t, vm_host, _) = agent_cloud(store, 1).await;
    let member = t.member();
    // The VM host's agent answers every push with "I hold a newer table", and claims to hold
    // generation 2^63 - 1: catching up past it would overflow gsaasd's next generation.
    vm_host.set(Behaviour::ClaimGeneration(i64::MAX as u64));
    let id = t.launch(&member, &remote_launch(1)).await;
    let vm = t.wait_state(&member, &id, "error").await;
    assert!(!vm["error"].as_str().unwrap().contains("crg-a"), "the error locates the VM: {vm}");
    let (status, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(status, 200, "{hosts}");
    for host in hosts["hosts"].as_array().unwrap() {
        let generation = host["routes_generation"].as_u64().unwrap();
        assert!(generation < 100, "{host}");
    }
    // Once the host has an honest agent again, its VMs are routed as before.
    vm_host.set(Behaviour::Honest);
    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
}

/// The GPU of `id` in an admin's pool view.
fn pool_gpu(pool: &Value, id: &str) -> Value {
    let hosts = pool["hosts"].as_array().unwrap();
    let mut gpus = hosts.iter().flat_map(|h| h["gpus"].as_array().unwrap().iter());
    gpus.find(|g| g["id"] == id).cloned().unwrap_or_else(|| panic!("no {id} in {pool}"))
}

async fn fence_count(t: &TestService) -> usize {
    t.get(&t.admin(), "/v1/fences").await.1["fences"].as_array().unwrap().len()
}

/// The alerts an admin sees on `host`.
async fn host_alerts(t: &TestService, host: &str) -> Vec<Value> {
    let (status, hosts) = t.get(&t.admin(), "/v1/hosts").await;
    assert_eq!(status, 200, "{hosts}");
    let hosts = hosts["hosts"].as_array().unwrap();
    let host = hosts.iter().find(|h| h["name"] == host).unwrap_or_else(|| panic!("no {host}"));
    host["alerts"].as_array().unwrap().clone()
}

/// A host's agent can take only its own GPUs out of service: one that refuses routes blaming
/// another host's GPU taints nothing (it is recorded against the refusing host, for admins),
/// while the GPU host's own agent refusing its GPU taints it.
async fn a_gpu_whose_routes_an_agent_refuses_takes_no_new_cgpus(store: Store) {
    let (t, vm_host, gpu_host) = agent_cloud(store, 2).await;
    let (member, admin) = (t.member(), t.admin());
    // The VM host's agent refuses routes to the first GPU's rCUDA server, which is cg-1's: first
    // fit picks that GPU for every remote launch.
    let gpu0 = SocketAddrV4::new(rcuda_address("cg-1"), 8308);
    vm_host.set(Behaviour::RefuseTarget(gpu0));
    let failed = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &failed, "error").await;
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool_gpu(&pool, "cg-1:GPU-0")["taint"], Value::Null, "crg-a tainted cg-1's GPU");
    let alerts = host_alerts(&t, "crg-a").await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["kind"], "foreign_refusal");
    assert!(alerts[0]["detail"].as_str().unwrap().contains(&gpu0.to_string()), "{alerts:?}");
    assert!(host_alerts(&t, "cg-1").await.is_empty());
    vm_host.set(Behaviour::Honest);

    // cg-1's own agent refuses routes to its own GPU-0 (a VM of its own, local): GPU-0 is tainted.
    gpu_host.set(Behaviour::RefuseTarget(gpu0));
    let mut local = shared_launch(1, 1024);
    local["locality"] = json!("local");
    local["policy"] = json!("first-fit");
    let failed = t.launch(&member, &local).await;
    t.wait_state(&member, &failed, "error").await;
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    let taint = pool_gpu(&pool, "cg-1:GPU-0")["taint"].as_str().unwrap_or_default().to_owned();
    assert!(taint.contains("cg-1") && taint.contains("refused"), "{pool}");
    gpu_host.set(Behaviour::Honest);

    let id = t.launch(&member, &remote_launch(1)).await;
    t.wait_state(&member, &id, "ready").await;
    let (_, vm) = t.get(&admin, &format!("/v1/vms/{id}")).await;
    assert_eq!(vm["cgpus"][0]["gpu"], "cg-1:GPU-1", "{vm}");

    // Admins lift the taint; nobody else can, or learns the GPU exists.
    let untaint = "/v1/gpus/cg-1:GPU-0/untaint";
    assert_eq!(t.post(&member, untaint, &json!({})).await.0, 404);
    assert_eq!(t.post(&admin, "/v1/gpus/cg-9:GPU-0/untaint", &json!({})).await.0, 404);
    let (status, body) = t.post(&admin, "/v1/gpus/cg-1:GPU-1/taint", &json!({"reason": " "})).await;
    assert_eq!((status, body["field"].as_str()), (422, Some("reason")), "{body}");
    let (status, body) = t.post(&admin, untaint, &json!({})).await;
    assert_eq!((status, &body["taint"]), (200, &Value::Null), "{body}");
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool_gpu(&pool, "cg-1:GPU-0")["taint"], Value::Null);
    let (status, body) =
        t.post(&admin, "/v1/gpus/cg-1:GPU-0/taint", &json!({"reason": "XID 79"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["taint"], "ops: XID 79");
}

/// An rCUDA endpoint belongs to one GPU of one host: the agent of another host that registers
/// a GPU at it (the same device, or another device of the same rCUDA server) is refused with 409,
/// changes nothing, and admins see the attempt on both hosts. Two tenants' exclusive cGPUs can
/// then never be routed to one device.
async fn an_agent_cannot_claim_another_hosts_rcuda_server(store: Store) {
    let (t, _, gpu_host) = agent_cloud_with(store, 1, |c| {
        c.hosts.agent_url_template = Some("http://{host}.invalid:7450".into());
    })
    .await;
    let admin = t.admin();
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    let before = pool["hosts"].clone();
    let victim = SocketAddrV4::new(rcuda_address("cg-1"), 8308);
    let token = t.agent_token("cg-2");
    for gpu_number in [0, 1] {
        let mut claim = host_report("cg-2", "compute-gpu", &gpu_host.url, 1);
        claim["gpus"][0]["rcuda"] =
            json!({"address": victim.ip().to_string(), "port": 8308, "gpu_number": gpu_number});
        let (status, problem) = t.report_host(&token, "cg-2", &claim).await;
        assert_eq!(status, 409, "device {gpu_number}: {problem}");
        assert!(problem["detail"].as_str().unwrap().contains("another host"), "{problem}");
    }
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["hosts"], before, "a refused claim changed the pool");
    let alerts = host_alerts(&t, "cg-1").await;
    assert_eq!(alerts.len(), 2, "{alerts:?}");
    assert!(alerts.iter().all(|a| a["kind"] == "endpoint_conflict"), "{alerts:?}");
    assert!(alerts[0]["detail"].as_str().unwrap().contains("cg-2"), "{alerts:?}");

    // Registered with a GPU of its own, cg-2 still cannot add cg-1's server to its report.
    let honest = host_report("cg-2", "compute-gpu", &gpu_host.url, 1);
    assert_eq!(t.report_host(&token, "cg-2", &honest).await.0, 200);
    let mut claim = host_report("cg-2", "compute-gpu", &gpu_host.url, 2);
    claim["gpus"][1]["rcuda"] =
        json!({"address": victim.ip().to_string(), "port": 8308, "gpu_number": 3});
    let (status, problem) = t.report_host(&token, "cg-2", &claim).await;
    assert_eq!(status, 409, "{problem}");
    let (_, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(pool["totals"]["gpus"], 2, "{pool}");
    let alerts = host_alerts(&t, "cg-2").await;
    assert!(alerts.iter().any(|a| a["kind"] == "endpoint_conflict"), "{alerts:?}");

    // Two exclusive launches get two devices.
    let member = t.member();
    let mut exclusive = remote_launch(1);
    exclusive["mode"] = json!("exclusive");
    exclusive.as_object_mut().unwrap().remove("gpu_memory_mib");
    let a = t.launch(&member, &exclusive).await;
    let b = t.launch(&t.token("beta", gsaasd::auth::Role::Member), &exclusive).await;
    let (_, a) = t.get(&admin, &format!("/v1/vms/{a}")).await;
    let (_, b) = t.get(&admin, &format!("/v1/vms/{b}")).await;
    let endpoint = |vm: &Value| vm["cgpus"][0]["rcuda_endpoint"].as_str().unwrap().to_owned();
    assert_ne!(endpoint(&a), endpoint(&b), "{a} {b}");
}

/// Replicas on one database cannot be raced into a shared endpoint: each registration runs in
/// the pool's transaction, and the database's unique index refuses a second claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_refuse_a_claim_on_an_endpoint_the_other_registered() {
    let (a, b) = TestService::two_replicas().await;
    let endpoint = |host: &str| {
        let mut report = host_report(host, "compute-gpu", "http://unused.invalid:7450", 1);
        report["gpus"][0]["rcuda"] = json!({"address": "10.78.9.9", "port": 8308, "gpu_number": 0});
        report
    };
    let (status, body) = a.report_host(&a.admin(), "gpu-a", &endpoint("gpu-a")).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = b.report_host(&b.admin(), "gpu-b", &endpoint("gpu-b")).await;
    assert_eq!(status, 409, "{body}");
    let (_, hosts) = a.get(&a.admin(), "/v1/hosts").await;
    let names: Vec<&Value> =
        hosts["hosts"].as_array().unwrap().iter().map(|h| &h["name"]).collect();
    assert!(names.contains(&&json!("gpu-a")) && !names.contains(&&json!("gpu-b")), "{hosts}");
}

/// An agent that never confirms its routes withdrawn (answers every push with an error while its
/// host heartbeats on) keeps the GPUs fenced at most `hosts.fence_timeout_secs`: then they are
/// placeable again, and admins get an alert on that host.
async fn an_agent_that_never_confirms_holds_fences_only_so_long(store: Store) {
    let (t, vm_host, _) = agent_cloud_with(store, 1, |c| c.hosts.fence_timeout_secs = 1).await;
    let member = t.member();
    let mut exclusive = remote_launch(1);
    exclusive["mode"] = json!("exclusive");
    exclusive.as_object_mut().unwrap().remove("gpu_memory_mib");
    let id = t.launch(&member, &exclusive).await;
    t.wait_state(&member, &id, "ready").await;
    vm_host.set(Behaviour::Down);
    t.delete(&member, &format!("/v1/vms/{id}")).await;
    t.wait_state(&member, &id, "deleted").await;
    assert_eq!(fence_count(&t).await, 1);
    let (status, _) = t.post(&member, "/v1/vms", &exclusive).await;
    assert_eq!(status, 507, "the fenced GPU is not placeable");
    assert!(host_alerts(&t, "crg-a").await.is_empty());

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = t.service().app.reconcile_once().await;
    assert_eq!(status.fences_released, 1, "{status:?}");
    assert_eq!(fence_count(&t).await, 0);
    let alerts = host_alerts(&t, "crg-a").await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["kind"], "fence_expired");
    let (status, problem) = t.post(&member, "/v1/vms", &exclusive).await;
    assert_eq!(status, 202, "the GPU is placeable again: {problem}");
}

/// A hostile agent that answers a push with an error body that never ends (50 MB raised gsaasd's
/// memory fivefold): gsaasd reads at most the first 64 KiB of it, keeps a short message, and
/// hangs up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_endless_error_body_is_cut_off() {
    use rodvr_contract::client::{AgentClient, MAX_ERROR_BYTES, MAX_ERROR_MESSAGE_CHARS};
    use rodvr_contract::protocol::RouteTable;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let agent = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = conn.read(&mut request).await;
        let head = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\
                    Transfer-Encoding: chunked\r\n\r\n";
        conn.write_all(head.as_bytes()).await.unwrap();
        let chunk = format!("10000\r\n{{\"error\": \"{}\r\n", "a".repeat(0x10000 - 11));
        let mut sent = 0usize;
        // Until the client hangs up (or 1 GiB: it read everything).
        while sent < 1 << 30 {
            if conn.write_all(chunk.as_bytes()).await.is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    let (config, dir) = test_config(Store::Sqlite);
    let keys = Keys::load_or_create(&config.signing_key_path()).unwrap();
    let host = gpgpums::HostId::new("cg-1").unwrap();
    let client = AgentClient::new(format!("http://{addr}"), host, keys.agent_signer());
    let table = RouteTable {
        generation: 1,
        routes: vec![],
        metadata: None,
        vms_without_cgpus: vec![],
        lost: vec![],
        servers: vec![],
    };
    let pushed = tokio::time::timeout(Duration::from_secs(20), client.put_routes(&table)).await;
    let err = pushed.expect("gsaasd kept reading an endless error body").unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(err.to_string().chars().count() < MAX_ERROR_MESSAGE_CHARS + 200, "{err}");
    let sent = tokio::time::timeout(Duration::from_secs(20), agent).await.unwrap().unwrap();
    assert!(sent < 256 * MAX_ERROR_BYTES, "it read {sent} bytes");
    let _ = std::fs::remove_dir_all(dir);
}
