//! End to end on a REAL OpenStack: gsaasd (Keystone mode, Nova backend) against the Keystone,
//! Nova (fake virt driver, hosts gpu-host-1 and rgpu-host-1), Glance and Placement of
//! `scripts/openstack-dev.sh`, which `scripts/test.sh` starts and names in `GSAAS_OPENSTACK_CLOUDS`.
//! Tenants call gsaasd with their real Keystone tokens (`X-Auth-Token`); what happened in Nova is
//! checked through Nova's own API as admin. Only Neutron is a stand-in (it reports each server's
//! port on the host Nova placed the server on).

use crate::support;

use base64::Engine as _;
use reqwest::Method;
use serde_json::{json, Value};
use support::openstack::{
    client, eventually, inventory_named, Admin, Gsaasd, Login, BETA_NETWORK, BETA_PRIVATE_IMAGE,
    FLAVOR, GPU_HOST, IMAGE, RGPU_HOST,
};

/// A flavor no fake compute node can hold (4 TB of RAM; the fake driver reports 800 GB).
const HUGE_FLAVOR: &str = "gsaas.e2e-huge";

fn launch_body(name: &str, flavor: &str, ncgpus: u32, locality: &str) -> Value {
    json!({
        "name": name, "image": IMAGE, "flavor": flavor, "ncgpus": ncgpus,
        "gpu_memory_mib": 1024, "mode": "shared", "locality": locality,
    })
}

/// The pool as a tenant sees it: (cGPUs placed, MiB allocated).
async fn pool_use(gsaasd: &Gsaasd, token: &str) -> (u64, u64) {
    let (status, pool) = gsaasd.get("/v1/pool", token).await;
    assert_eq!(status, 200, "{pool}");
    (
        pool["totals"]["cgpus"].as_u64().expect("cgpus"),
        pool["totals"]["allocated_mib"].as_u64().expect("allocated_mib"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_launch_on_real_nova_and_terminate() {
    let http = client();
    let admin = Admin::new().await;
    let alpha = Login::new(&http, "alpha").await;
    let beta = Login::new(&http, "beta").await;
    let gsaasd = Gsaasd::start(4).await;

    // Alpha launches a VM with 2 cGPUs next to its GPUs (locality local).
    let id = gsaasd.launch(&alpha.token, &launch_body("e2e-local", FLAVOR, 2, "local")).await;
    let vm = gsaasd.until(&id, &alpha.token, &["ready", "error"]).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    assert_eq!(vm["project"], alpha.project_id.as_str(), "{vm}");
    let server_id = vm["server_id"].as_str().expect("a server id").to_owned();
    let timings = &vm["timings"];
    for stage in
        ["check", "gpu_selection", "vm_creation", "vm_activation", "vm_deployment", "total"]
    {
        assert!(timings[stage].as_f64().is_some_and(|s| s > 0.0), "{stage}: {timings}");
    }

    // Nova really has the server, on gpu-host-1, created from the flavor and image asked for, in
    // alpha's own project: in alpha's `openstack server list`, not in beta's.
    let (status, server) = admin.server(&server_id).await;
    assert_eq!(status, 200, "{server}");
    assert_eq!(server["status"], "ACTIVE", "{server}");
    assert_eq!(server["tenant_id"], alpha.project_id.as_str(), "{server}");
    assert!(alpha.own_servers(&http).await.contains(&server_id), "not in alpha's servers");
    assert!(!beta.own_servers(&http).await.contains(&server_id), "in beta's servers");
    assert_eq!(server["OS-EXT-SRV-ATTR:host"], GPU_HOST, "{server}");
    assert_eq!(server["flavor"]["original_name"], FLAVOR, "{server}");
    assert_eq!(server["metadata"]["gsaas_vm_id"], id.as_str(), "{server}");
    assert!(server["tags"]
        .as_array()
        .is_some_and(|t| t.contains(&json!(format!("gsaas-vm-{id}")))));

    // Its user_data carries the rCUDA environment: 2 devices, the VM's masked cGPU endpoints.
    let user_data = server["OS-EXT-SRV-ATTR:user_data"].as_str().expect("admins see user_data");
    let user_data = base64::engine::general_purpose::STANDARD.decode(user_data).unwrap();
    let user_data = String::from_utf8(user_data).unwrap();
    assert!(user_data.contains("RCUDA_DEVICE_COUNT=2"), "{user_data}");
    let cgpus = vm["cgpus"].as_array().expect("cgpus");
    assert_eq!(cgpus.len(), 2, "{vm}");
    for (j, cgpu) in cgpus.iter().enumerate() {
        let endpoint = cgpu["masked_endpoint"].as_str().expect("masked endpoint");
        let (address, port) = endpoint.split_once(':').expect("address:port");
        let device = format!("RCUDA_DEVICE_{j}={address}@{port}:");
        assert!(user_data.contains(&device), "{device} not in {user_data}");
        let env = vm["rcuda_env"][format!("RCUDA_DEVICE_{j}")].as_str().expect("rcuda_env");
        assert!(user_data.contains(&format!("RCUDA_DEVICE_{j}={env}")), "{env}: {user_data}");
    }
    assert_eq!(vm["rcuda_env"]["RCUDA_DEVICE_COUNT"], "2", "{vm}");

    // The fixed IP is the server's port's, which Neutron binds to the host Nova chose.
    let ports = admin.ports(&server_id).await;
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["binding:host_id"], GPU_HOST, "{ports:?}");
    assert_eq!(vm["fixed_ip"], ports[0]["fixed_ips"][0]["ip_address"], "{vm} {ports:?}");
    // The admin (the service user's Keystone admin role) sees the VM's host in gsaasd too.
    let (status, admin_view) = gsaasd.get(&format!("/v1/vms/{id}"), &admin.login.token).await;
    assert_eq!((status, &admin_view["host"]), (200, &json!(GPU_HOST)), "{admin_view}");
    assert_eq!(pool_use(&gsaasd, &alpha.token).await, (2, 2048));

    // Beta's token neither sees alpha's VM nor can end it.
    let (status, body) = gsaasd.get(&format!("/v1/vms/{id}"), &beta.token).await;
    assert_eq!(status, 404, "{body}");
    let (status, listed) = gsaasd.get("/v1/vms", &beta.token).await;
    assert_eq!(status, 200, "{listed}");
    assert!(listed["vms"].as_array().expect("vms").iter().all(|v| v["id"] != id.as_str()));
    let (status, body) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{id}"), &beta.token, None).await;
    assert_eq!(status, 404, "{body}");
    let (status, listed) = gsaasd.get("/v1/vms", &alpha.token).await;
    assert_eq!(status, 200, "{listed}");
    assert!(listed["vms"].as_array().expect("vms").iter().any(|v| v["id"] == id.as_str()));

    // A VM with remote cGPUs goes to the compute-rGPU host.
    let remote = gsaasd.launch(&beta.token, &launch_body("e2e-remote", FLAVOR, 1, "remote")).await;
    let remote_vm = gsaasd.until(&remote, &beta.token, &["ready", "error"]).await;
    assert_eq!(remote_vm["state"], "ready", "{remote_vm}");
    let (status, server) = admin.server(remote_vm["server_id"].as_str().unwrap()).await;
    assert_eq!((status, &server["OS-EXT-SRV-ATTR:host"]), (200, &json!(RGPU_HOST)), "{server}");

    // Alpha terminates: Nova's server is gone and the cGPUs are back.
    for (vm, token) in [(&id, &alpha.token), (&remote, &beta.token)] {
        let (status, body) =
            gsaasd.call(Method::DELETE, &format!("/v1/vms/{vm}"), token, None).await;
        assert_eq!(status, 202, "{body}");
    }
    let vm = gsaasd.until(&id, &alpha.token, &["deleted", "error"]).await;
    assert_eq!(vm["state"], "deleted", "{vm}");
    assert_eq!(admin.server(&server_id).await.0, 404);
    assert!(admin.servers_of_vm(&id).await.is_empty());
    let remote_vm = gsaasd.until(&remote, &beta.token, &["deleted", "error"]).await;
    assert_eq!(remote_vm["state"], "deleted", "{remote_vm}");
    assert_eq!(admin.server(remote_vm["server_id"].as_str().unwrap()).await.0, 404);
    assert_eq!(pool_use(&gsaasd, &alpha.token).await, (0, 0));
}

/// A launch that waits in the queue is created as its tenant when GPUs free, even after the
/// tenant's token is gone (revoked here, as at a logout): through a Keystone trust the tenant
/// delegated at the launch, which ends once the server is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_launch_is_created_as_its_tenant_through_a_trust() {
    let http = client();
    let admin = Admin::new().await;
    let alpha = Login::new(&http, "alpha").await;
    let beta = Login::new(&http, "beta").await;
    let gsaasd = Gsaasd::start(1).await;
    let exclusive = |name: &str, queue: bool| {
        json!({"name": name, "image": IMAGE, "flavor": FLAVOR, "ncgpus": 1, "mode": "exclusive",
               "locality": "local", "queue": queue})
    };
    let first = gsaasd.launch(&alpha.token, &exclusive("e2e-first", false)).await;
    assert_eq!(gsaasd.until(&first, &alpha.token, &["ready", "error"]).await["state"], "ready");

    // Beta's launch waits; Keystone holds beta's trust for it, and beta logs out.
    let (status, queued) = gsaasd
        .call(Method::POST, "/v1/vms", &beta.token, Some(&exclusive("e2e-queued", true)))
        .await;
    assert_eq!((status, queued["state"].as_str()), (202, Some("queued")), "{queued}");
    let queued = queued["id"].as_str().unwrap().to_owned();
    // Other tests delegate for beta too: this launch's trust, by its id.
    let trust_id = {
        let app = &gsaasd.service.as_ref().unwrap().app;
        let mut conn = app.db.conn().await.unwrap();
        gsaasd::db::delegation_of(&mut conn, queued.parse().unwrap()).await.unwrap().unwrap()
    };
    let trusts = beta.own_trusts(&http).await;
    let trust = trusts.iter().find(|t| t["id"] == trust_id.as_str()).expect("the launch's trust");
    assert_eq!(trust["project_id"], beta.project_id.as_str(), "{trust}");
    assert_eq!(trust["impersonation"], true, "{trust}");
    assert!(trust["expires_at"].is_string(), "a trust that never ends: {trust}");
    beta.revoke(&http).await;
    let beta = Login::new(&http, "beta").await;

    // GPUs free: the launch starts, and its server is beta's, created as beta.
    let (status, _) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{first}"), &alpha.token, None).await;
    assert_eq!(status, 202);
    let vm = gsaasd.until(&queued, &beta.token, &["ready", "error"]).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    let server_id = vm["server_id"].as_str().unwrap();
    let (status, server) = admin.server(server_id).await;
    assert_eq!(status, 200, "{server}");
    assert_eq!(server["tenant_id"], beta.project_id.as_str(), "{server}");
    assert_eq!(server["user_id"], beta.user_id.as_str(), "{server}");
    assert!(beta.own_servers(&http).await.contains(&server_id.to_owned()));

    // The trust has done its work and is gone.
    eventually("the trust deleted", || async {
        let trusts = beta.own_trusts(&http).await;
        trusts.iter().all(|t| t["id"] != trust_id.as_str()).then_some(())
    })
    .await;
    let (status, _) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{queued}"), &beta.token, None).await;
    assert_eq!(status, 202);
    assert_eq!(gsaasd.until(&queued, &beta.token, &["deleted", "error"]).await["state"], "deleted");
}

/// Keystone trusts cannot outlive their use: one made with `queue_timeout_secs = 0` (a queue
/// that waits for ever) still has an expiry; a trust whose deletion failed (gsaasd's
/// delegation row left for a launch that ended) is deleted in Keystone by the next reconciler
/// pass, and only then is its row forgotten; `gsaasd db purge` never forgets an undeleted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_trusts_always_end_and_a_failed_deletion_is_retried() {
    let http = client();
    let alpha = Login::new(&http, "alpha").await;
    let beta = Login::new(&http, "beta").await;
    let gsaasd = Gsaasd::start_configured(1, |c| c.queue.queue_timeout_secs = 0).await;
    let app = gsaasd.service.as_ref().unwrap().app.clone();
    // Beta's trusts by id (other tests delegate for beta too).
    let trust_of = |id: String| {
        let (http, beta) = (&http, &beta);
        async move { beta.own_trusts(http).await.into_iter().find(|t| t["id"] == id.as_str()) }
    };
    let delegation_of = |vm: gpgpums::VmId| {
        let app = app.clone();
        async move {
            let mut conn = app.db.conn().await.unwrap();
            gsaasd::db::delegation_of(&mut conn, vm).await.unwrap()
        }
    };
    let exclusive = |name: &str, queue: bool| {
        json!({"name": name, "image": IMAGE, "flavor": FLAVOR, "ncgpus": 1, "mode": "exclusive",
               "locality": "local", "queue": queue})
    };
    let first = gsaasd.launch(&alpha.token, &exclusive("e2e-holder", false)).await;
    assert_eq!(gsaasd.until(&first, &alpha.token, &["ready", "error"]).await["state"], "ready");
    let (status, queued) = gsaasd
        .call(Method::POST, "/v1/vms", &beta.token, Some(&exclusive("e2e-waits", true)))
        .await;
    assert_eq!((status, queued["state"].as_str()), (202, Some("queued")), "{queued}");
    let queued = queued["id"].as_str().unwrap().to_owned();
    let trust_id = delegation_of(queued.parse().unwrap()).await.expect("a delegation");
    let trust = trust_of(trust_id.clone()).await.expect("the trust in Keystone");
    assert!(trust["expires_at"].is_string(), "a trust that never ends: {trust}");
    let (status, _) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{queued}"), &beta.token, None).await;
    assert_eq!(status, 202);
    gsaasd.until(&queued, &beta.token, &["deleted"]).await;
    eventually("the cancelled launch's trust deleted", || {
        let trust = trust_of(trust_id.clone());
        async move { trust.await.is_none().then_some(()) }
    })
    .await;

    // A deletion that failed leaves the trust and its row behind (made here as gsaasd makes
    // them, for the launch that ended): purge keeps the row and the VM; the next pass deletes the
    // trust, and only then do they go.
    let tenant = gsaasd::cloud::TenantToken {
        token: beta.token.clone(),
        user_id: beta.user_id.clone(),
        project_id: beta.project_id.clone(),
    };
    let until = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let delegation = app.cloud.delegate(&tenant, Some(until)).await.expect("a trust");
    let orphan: gpgpums::VmId = queued.parse().unwrap();
    let mut conn = app.db.conn().await.unwrap();
    gsaasd::db::insert_delegation(&mut conn, orphan, &delegation.0, 0).await.unwrap();
    drop(conn);
    assert!(trust_of(delegation.0.clone()).await.is_some());
    let purge = || gsaasd::db::purge_deleted_vms(&app.db, i64::MAX, 100, false);
    assert_eq!(purge().await.unwrap().vms, 0, "a VM with an undeleted trust was purged");
    assert_eq!(delegation_of(orphan).await.as_deref(), Some(delegation.0.as_str()), "purged");
    let status = app.reconcile_once().await;
    assert_eq!(status.delegations_ended, 1, "{status:?}");
    assert!(trust_of(delegation.0.clone()).await.is_none(), "the trust lives on");
    assert_eq!(delegation_of(orphan).await, None);
    assert_eq!(purge().await.unwrap().vms, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_nova_cannot_place_unwinds_the_launch() {
    let http = client();
    let admin = Admin::new().await;
    admin.ensure_flavor(HUGE_FLAVOR, 4_000_000).await;
    let alpha = Login::new(&http, "alpha").await;
    let gsaasd = Gsaasd::start(4).await;

    // Nova accepts the request, then its scheduler finds no host: the server goes to ERROR.
    let id = gsaasd.launch(&alpha.token, &launch_body("e2e-huge", HUGE_FLAVOR, 3, "local")).await;
    let vm = gsaasd.until(&id, &alpha.token, &["ready", "error"]).await;
    assert_eq!(vm["state"], "error", "{vm}");
    let reason = vm["error"].as_str().expect("an error message");
    assert!(reason.contains("No valid host was found"), "Nova's reason expected: {reason}");
    let server_id = vm["server_id"].as_str().expect("Nova created a server").to_owned();

    // The unwinding deletes Nova's server and gives the cGPUs back.
    eventually("Nova's server deleted", || async {
        (admin.server(&server_id).await.0 == 404).then_some(())
    })
    .await;
    assert!(admin.servers_of_vm(&id).await.is_empty());
    eventually("the cGPUs released", || async {
        (pool_use(&gsaasd, &alpha.token).await == (0, 0)).then_some(())
    })
    .await;
    let (status, vm) = gsaasd.get(&format!("/v1/vms/{id}"), &alpha.token).await;
    assert_eq!((status, &vm["state"]), (200, &json!("error")), "{vm}");

    // A flavor Nova does not have is refused before anything is reserved or created.
    let (status, body) = gsaasd
        .call(
            Method::POST,
            "/v1/vms",
            &alpha.token,
            Some(&launch_body("x", "no-such-flavor", 1, "local")),
        )
        .await;
    assert!((400..500).contains(&status), "{status} {body}");
    assert!(body.to_string().contains("no-such-flavor"), "{body}");
    assert_eq!(pool_use(&gsaasd, &alpha.token).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_nova_does_not_know_unwinds_the_launch() {
    let http = client();
    let admin = Admin::new().await;
    let alpha = Login::new(&http, "alpha").await;
    // gsaasd's inventory names a compute-GPU host that is not one of Nova's.
    let gsaasd = Gsaasd::start_with(inventory_named("gpu-host-9", 2)).await;

    // Locality local sends the server to the cGPUs' host's zone: Nova refuses the request (400).
    let id = gsaasd.launch(&alpha.token, &launch_body("e2e-nohost", FLAVOR, 2, "local")).await;
    let vm = gsaasd.until(&id, &alpha.token, &["ready", "error"]).await;
    assert_eq!(vm["state"], "error", "{vm}");
    let reason = vm["error"].as_str().expect("an error message");
    // The host's availability zone does not exist: Nova refuses the server, and the tenant's
    // message does not name the host.
    assert!(reason.contains("availability zone"), "{reason}");
    assert!(!reason.contains("gpu-host-9"), "{reason}");
    assert!(vm["server_id"].is_null(), "{vm}");
    assert!(admin.servers_of_vm(&id).await.is_empty());
    eventually("the cGPUs released", || async {
        (pool_use(&gsaasd, &alpha.token).await == (0, 0)).then_some(())
    })
    .await;
}

/// Nova, Glance and Neutron authorize a tenant's launch as the tenant: another project's private
/// image or network is refused before anything is reserved, the owner's is not; a gsaasd token,
/// which names no project of the cloud, launches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_use_only_their_own_images_and_networks() {
    let http = client();
    let admin = Admin::new().await;
    let alpha = Login::new(&http, "alpha").await;
    let beta = Login::new(&http, "beta").await;
    let gsaasd = Gsaasd::start(4).await;

    let mut private = launch_body("e2e-private", FLAVOR, 1, "local");
    private["image"] = json!(BETA_PRIVATE_IMAGE);
    let (status, problem) =
        gsaasd.call(Method::POST, "/v1/vms", &alpha.token, Some(&private)).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("image")), "{problem}");
    let mut network = launch_body("e2e-network", FLAVOR, 1, "local");
    network["networks"] = json!([BETA_NETWORK]);
    let (status, problem) =
        gsaasd.call(Method::POST, "/v1/vms", &alpha.token, Some(&network)).await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("networks")), "{problem}");
    assert_eq!(pool_use(&gsaasd, &alpha.token).await, (0, 0), "nothing was reserved");

    // gsaasd's own tokens name no Keystone project.
    let app = &gsaasd.service.as_ref().expect("running").app;
    let jwt = app.keys.issue(
        "alpha",
        Some(&alpha.project_id),
        gsaasd::auth::Role::Member,
        std::time::Duration::from_secs(600),
    );
    let (status, problem) = gsaasd
        .call(Method::POST, "/v1/vms", &jwt, Some(&launch_body("e2e-jwt", FLAVOR, 1, "local")))
        .await;
    assert_eq!((status, problem["field"].as_str()), (422, Some("token")), "{problem}");

    // Beta boots its own private image, in its own project.
    let id = gsaasd.launch(&beta.token, &private).await;
    let vm = gsaasd.until(&id, &beta.token, &["ready", "error"]).await;
    assert_eq!(vm["state"], "ready", "{vm}");
    let server_id = vm["server_id"].as_str().expect("a server").to_owned();
    let (_, server) = admin.server(&server_id).await;
    assert_eq!(server["tenant_id"], beta.project_id.as_str(), "{server}");
    let (status, body) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{id}"), &beta.token, None).await;
    assert_eq!(status, 202, "{body}");
    let vm = gsaasd.until(&id, &beta.token, &["deleted", "error"]).await;
    assert_eq!(vm["state"], "deleted", "{vm}");
    assert_eq!(admin.server(&server_id).await.0, 404);
}

/// Cloud drift on the real Nova (issue [4/5]): a server live-migrated to the other fake compute
/// takes its routes along, and a server deleted in Nova ends its VM and frees its cGPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_live_migrated_or_deleted_in_nova_are_followed() {
    let http = client();
    let admin = Admin::new().await;
    let alpha = Login::new(&http, "alpha").await;
    let gsaasd = Gsaasd::start(4).await;
    let app = gsaasd.service.as_ref().expect("running").app.clone();
    let moving = gsaasd.launch(&alpha.token, &launch_body("e2e-moving", FLAVOR, 1, "remote")).await;
    let doomed = gsaasd.launch(&alpha.token, &launch_body("e2e-doomed", FLAVOR, 1, "remote")).await;
    let before = gsaasd.until(&moving, &alpha.token, &["ready", "error"]).await;
    assert_eq!(before["state"], "ready", "{before}");
    let doomed_vm = gsaasd.until(&doomed, &alpha.token, &["ready", "error"]).await;
    assert_eq!(doomed_vm["state"], "ready", "{doomed_vm}");
    assert_eq!(pool_use(&gsaasd, &alpha.token).await, (2, 2048));
    // The first look at Nova sees both as they are: nothing to follow.
    let status = app.reconcile_once().await;
    assert_eq!((status.servers_moved, status.servers_deleted), (0, 0), "{status:?}");

    // An operator live-migrates one to the other compute host (forced past the scheduler: the
    // dev cloud's hosts are availability zones of their own).
    let server = before["server_id"].as_str().expect("a server").to_owned();
    let compute = admin.login.endpoint("compute");
    let answer = admin
        .http
        .post(format!("{compute}/servers/{server}/action"))
        .header("X-Auth-Token", &admin.login.token)
        .header("OpenStack-API-Version", "compute 2.67")
        .json(&json!({"os-migrateLive": {"host": GPU_HOST, "block_migration": "auto", "force": true}}))
        .send()
        .await
        .expect("Nova answers");
    assert_eq!(answer.status().as_u16(), 202, "{:?}", answer.text().await);
    eventually("the live migration", || async {
        let (_, server) = admin.server(&server).await;
        (server["OS-EXT-SRV-ATTR:host"] == GPU_HOST && server["status"] == "ACTIVE").then_some(())
    })
    .await;
    let admin_view = eventually("gsaasd following the VM", || async {
        app.reconcile_once().await;
        let (_, vm) = gsaasd.get(&format!("/v1/vms/{moving}"), &admin.login.token).await;
        (vm["host"] == GPU_HOST).then_some(vm)
    })
    .await;
    let after = gsaasd.get(&format!("/v1/vms/{moving}"), &alpha.token).await.1;
    assert_eq!(after["rcuda_env"], before["rcuda_env"], "nothing changes inside the VM");
    assert!(after["events"].as_array().unwrap().iter().any(|e| e["kind"] == "moved"), "{after}");
    // Its route is on gpu-host-1's agent now, and gone from rgpu-host-1's.
    let agents = app.in_process_agents().expect("in-process agents");
    let hosts = app.hosts().await.unwrap();
    let host = |name: &str| hosts.iter().find(|h| h.name.as_str() == name).unwrap().clone();
    let masked = admin_view["cgpus"][0]["masked_endpoint"].as_str().unwrap().parse().unwrap();
    let source = admin_view["fixed_ip"].as_str().unwrap().parse().unwrap();
    let operator = gsaasd::auth::Caller::new("ops", None, gsaasd::auth::Role::Admin);
    let tap = app
        .visible_vm(&operator, moving.parse().unwrap(), gsaasd::policy::actions::VM_SHOW)
        .await
        .unwrap()
        .vm
        .tap
        .unwrap();
    let target = admin_view["cgpus"][0]["rcuda_endpoint"].as_str().map(str::to_owned);
    let routed =
        |name: &str| agents.resolve(&host(name), source, &tap, masked).map(|t| t.to_string());
    assert_eq!(routed(GPU_HOST), target);
    assert_eq!(routed(RGPU_HOST), None);

    // A user deletes the other one in Nova: gsaasd ends its VM and frees its cGPU.
    let doomed_server = doomed_vm["server_id"].as_str().expect("a server").to_owned();
    let (status, body) =
        admin.call(Method::DELETE, &format!("{compute}/servers/{doomed_server}"), None).await;
    assert_eq!(status, 204, "{body}");
    let ended = eventually("gsaasd ending the VM", || async {
        app.reconcile_once().await;
        let (_, vm) = gsaasd.get(&format!("/v1/vms/{doomed}"), &alpha.token).await;
        (vm["state"] == "deleted").then_some(vm)
    })
    .await;
    assert!(ended["error"].as_str().unwrap_or("").contains("deleted outside GSaaS"), "{ended}");
    assert_eq!(pool_use(&gsaasd, &alpha.token).await, (1, 1024));

    // The moved VM terminates cleanly from its new host.
    let (status, body) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{moving}"), &alpha.token, None).await;
    assert_eq!(status, 202, "{body}");
    let vm = gsaasd.until(&moving, &alpha.token, &["deleted", "error"]).await;
    assert_eq!(vm["state"], "deleted", "{vm}");
    assert_eq!(admin.server(&server).await.0, 404);
    assert_eq!(routed(GPU_HOST), None);
}

/// An operator's policy file against the real Keystone's roles: a user with only Keystone's
/// `reader` role in alpha lists alpha's VMs but may not launch (403 naming the rule), a member
/// launches, and the admins of the `admin` project (gsaasd's admin scope) may no longer drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_gives_real_keystone_roles_their_rights() {
    let http = client();
    let dir = std::env::temp_dir().join(format!("gsaas-policy-os-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.yaml");
    std::fs::write(
        &file,
        "\"gpu:vm:create\": \"role:member and project_id:%(project_id)s\"\n\
         \"gpu:vm:list\": \"(role:reader or role:member) and project_id:%(project_id)s or rule:context_is_admin\"\n\
         \"gpu:host:drain\": \"rule:context_is_admin and not project_name:admin\"\n",
    )
    .unwrap();
    let path = file.clone();
    let gsaasd = Gsaasd::start_configured(1, move |c| c.auth.policy_file = Some(path)).await;
    let reader = Login::new(&http, "alpha-reader").await;
    let alpha = Login::new(&http, "alpha").await;
    let operator = Login::new(&http, support::openstack::SERVICE_CLOUD).await;

    let body = launch_body("policy", FLAVOR, 1, "any");
    let (status, problem) = gsaasd.call(Method::POST, "/v1/vms", &reader.token, Some(&body)).await;
    assert_eq!((status, problem["code"].as_str()), (403, Some("policy_not_allowed")), "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("gpu:vm:create"), "{problem}");
    let id = gsaasd.launch(&alpha.token, &body).await;
    let (status, listed) = gsaasd.get("/v1/vms", &reader.token).await;
    assert_eq!((status, listed["vms"][0]["id"].as_str()), (200, Some(id.as_str())), "{listed}");

    let (status, problem) = gsaasd
        .call(
            Method::POST,
            &format!("/v1/hosts/{GPU_HOST}/drain"),
            &operator.token,
            Some(&json!({})),
        )
        .await;
    assert_eq!(status, 403, "{problem}");
    let (status, _) =
        gsaasd.call(Method::DELETE, &format!("/v1/vms/{id}"), &alpha.token, None).await;
    assert_eq!(status, 202);
    let _ = std::fs::remove_dir_all(dir);
}
