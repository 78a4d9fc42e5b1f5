//! Nova and Glance/Neutron through `NovaCloud`: the requests it builds, the answers it reads,
//! its errors and its bounds.

use super::*;

#[tokio::test]
async fn auth_request_catalog_and_token_reuse() {
    let mock = Mock::start(standard).await;
    let cloud = nova(&mock);
    cloud.check(&request(), None).await.unwrap();
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(mock.auths(), 1, "the token is reused");
    let requests = mock.requests();
    let auth = &requests[0];
    assert_eq!(auth.json(), fixture_json("keystone/auth_requests_project-name-password.json"));
    assert_eq!(auth.header("x-auth-token"), None);
    // The compute endpoint is the catalog's public `compute` (v2.1), not `compute_legacy`.
    let calls: Vec<_> = requests[1..].iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    let flavor = format!("GET {NOVA}/flavors/1");
    let image = format!("GET /glance/v2/images/{IMAGE_ID}");
    assert_eq!(calls, [flavor.clone(), image.clone(), flavor, image]);
    for req in &requests[1..] {
        assert_compute_headers(req, "service-token");
    }
}

#[tokio::test]
async fn a_401_drops_the_token_and_retries_once_with_a_new_one() {
    let auths = Arc::new(AtomicUsize::new(0));
    let reject = Arc::new(AtomicBool::new(false));
    let (a, r) = (auths.clone(), reject.clone());
    let mock = Mock::start(move |req, base| {
        if req.is(&Method::POST, "/identity/v3/auth/tokens") {
            let n = a.fetch_add(1, Ordering::SeqCst) + 1;
            return auth_reply(base, &format!("tok-{n}"), in_an_hour());
        }
        if req.path.starts_with("/nova/") && r.swap(false, Ordering::SeqCst) {
            return nova_error(401, "error", "The request you have made requires authentication.");
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    cloud.check(&request(), None).await.unwrap();
    reject.store(true, Ordering::SeqCst);
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(auths.load(Ordering::SeqCst), 2);
    let flavor_gets: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/flavors/1"))
        .map(|r| r.header("x-auth-token").unwrap().to_owned())
        .collect();
    assert_eq!(flavor_gets, ["tok-1", "tok-1", "tok-2"]);

    // A service that refuses even a fresh token is unavailable, not an endless loop.
    let mock = Mock::start(|req, base| {
        if req.path.starts_with("/nova/") {
            return nova_error(401, "error", "The request you have made requires authentication.");
        }
        standard(req, base)
    })
    .await;
    let err = nova(&mock).check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    assert_eq!(mock.auths(), 2);
}

#[tokio::test]
async fn a_token_close_to_its_expiry_is_renewed() {
    let mock = Mock::start(|req, base| {
        if req.is(&Method::POST, "/identity/v3/auth/tokens") {
            // Inside the default 120 s margin: never reused.
            return auth_reply(base, "short", SystemTime::now() + Duration::from_secs(30));
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(mock.auths(), 2, "one per call");
}

#[tokio::test]
async fn check_finds_flavors_by_name_and_refuses_unknown_parts() {
    let mock = Mock::start(|req, base| {
        let get = Method::GET;
        if req.is(&get, &format!("{NOVA}/flavors/m1.tiny"))
            || req.is(&get, &format!("{NOVA}/flavors/m1.huge"))
        {
            return nova_error(404, "itemNotFound", "Flavor m1.tiny could not be found.");
        }
        if req.is(&get, &format!("{NOVA}/flavors/detail")) {
            let flavor = fixture_json("nova/flavors_flavor-get-resp.json")["flavor"].clone();
            return reply(200, json!({ "flavors": [flavor] }).to_string());
        }
        if req.is(&get, "/glance/v2/images?name=cirros") {
            let image = json!({ "id": IMAGE_ID, "name": "cirros", "status": "active" });
            return reply(200, json!({ "images": [image.clone(), image] }).to_string());
        }
        if req.is(&get, "/glance/v2/images?name=queued") {
            let image = json!({ "id": IMAGE_ID, "name": "queued", "status": "queued" });
            return reply(200, json!({ "images": [image] }).to_string());
        }
        if req.is(&get, "/neutron/v2.0/networks?name=private") {
            let net = json!({ "id": NETWORK_ID, "name": "private" });
            return reply(200, json!({ "networks": [net] }).to_string());
        }
        if req.is(&get, "/neutron/v2.0/networks?name=nowhere") {
            return reply(200, r#"{"networks": []}"#);
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    let mut by_name = request();
    by_name.flavor = "m1.tiny".into();
    by_name.networks = vec!["private".into()];
    let checked = cloud.check(&by_name, None).await.unwrap();
    let flavor = fixture_json("nova/flavors_flavor-get-resp.json")["flavor"]["id"].clone();
    assert_eq!(json!(checked.flavor), flavor, "the flavor's id, found by its name");
    let shape = Some(gpgpums::Resources::new(1000, 512));
    assert_eq!(checked.flavor_resources, shape, "the fixture's 1 vCPU and 512 MiB");
    assert_eq!(checked.image, IMAGE_ID);
    assert_eq!(checked.networks, json!([{ "uuid": NETWORK_ID }]));

    let field = |r: Result<Checked, CloudError>| match r {
        Err(CloudError::Invalid { field, .. }) => field,
        other => panic!("expected Invalid, got {other:?}"),
    };
    let mut bad = request();
    bad.flavor = "m1.huge".into();
    assert_eq!(field(cloud.check(&bad, None).await), "flavor");
    let mut bad = request();
    bad.image = "cirros".into();
    assert_eq!(field(cloud.check(&bad, None).await), "image", "two images of that name");
    bad.image = "queued".into();
    assert_eq!(field(cloud.check(&bad, None).await), "image", "not active");
    bad.image = "0e12087a-0000-476a-8f84-7398e991cecc".into();
    assert_eq!(field(cloud.check(&bad, None).await), "image", "no such id");
    let mut bad = request();
    bad.networks = vec!["nowhere".into()];
    assert_eq!(field(cloud.check(&bad, None).await), "networks");
    // Images are checked in Glance: the compute images API is gone from 2.36 on.
    assert_eq!(mock.count(&Method::GET, &format!("{NOVA}/images")), 0);
}

/// A cloud whose Nova creates servers, answering with the upstream sample.
/// A project's checks of the same flavor, image and networks reuse what the first found for
/// `lookup_cache_secs`; another project, another image, a failed check or an expired entry asks
/// again, and `0` keeps nothing.
#[tokio::test]
async fn a_projects_lookups_are_reused_for_a_while_and_no_longer() {
    // Flavor 1 in any project's compute path (a tenant's token reaches Nova at its own).
    let mock = Mock::start(|req, base| {
        if req.method == Method::GET && req.path.ends_with("/flavors/1") {
            return reply(200, fixture("nova/flavors_flavor-get-resp.json"));
        }
        standard(req, base)
    })
    .await;
    let asked = |mock: &Mock| {
        mock.requests()
            .iter()
            .filter(|r| r.method == Method::GET && !r.path.contains("/auth/"))
            .count()
    };
    let tenant = |project: &str| TenantToken {
        token: "tenant-token".into(),
        user_id: "u".into(),
        project_id: project.into(),
    };
    let cloud =
        NovaCloud::new(settings(&mock.base), NovaConfig { lookup_cache_secs: 1, ..config() })
            .unwrap();
    let (a, b) = (tenant(TENANT_PROJECT), tenant("7e9a0000000000000000000000000002"));
    let first = cloud.check(&request(), Some(&a)).await.unwrap();
    let per_check = asked(&mock);
    assert!(per_check >= 2, "a check looks its parts up: {per_check}");
    assert_eq!(cloud.check(&request(), Some(&a)).await.unwrap(), first);
    assert_eq!(asked(&mock), per_check, "the same project's same request: nothing asked");
    cloud.check(&request(), Some(&b)).await.unwrap();
    assert_eq!(asked(&mock), 2 * per_check, "another project asks for itself");
    let mut unknown = request();
    unknown.image = "0e12087a-0000-476a-8f84-7398e991cecc".into();
    for _ in 0..2 {
        assert!(cloud.check(&unknown, Some(&a)).await.is_err());
    }
    let after_failures = asked(&mock);
    assert!(after_failures >= 2 * per_check + 2, "a refusal is never kept: {after_failures}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    cloud.check(&request(), Some(&a)).await.unwrap();
    assert_eq!(asked(&mock), after_failures + per_check, "kept no longer than it says");

    // A creation Nova refuses (here: no route for POST /servers, a 404) drops what the project's
    // checks found, and a creation not just checked looks everything up itself.
    cloud.check(&request(), None).await.unwrap();
    let before = asked(&mock);
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(asked(&mock), before, "kept");
    let refused = cloud.create_server(&spec(VmId::new_random(), pinned("gpu-host-1"))).await;
    assert!(matches!(refused, Err(CloudError::Invalid { .. })), "{refused:?}");
    let after_create = asked(&mock);
    assert!(after_create >= before + per_check, "the creation looked up for itself");
    cloud.check(&request(), None).await.unwrap();
    assert_eq!(asked(&mock), after_create + per_check, "forgotten after the refusal");

    let uncached = nova(&mock);
    let before = asked(&mock);
    uncached.check(&request(), Some(&a)).await.unwrap();
    uncached.check(&request(), Some(&a)).await.unwrap();
    assert_eq!(asked(&mock), before + 2 * per_check, "0: every check asks");
}

async fn nova_that_creates() -> Mock {
    Mock::start(|req, base| {
        if req.is(&Method::POST, &format!("{NOVA}/servers")) {
            return reply(202, fixture("nova/servers_v2.74_server-create-resp.json"));
        }
        standard(req, base)
    })
    .await
}

#[tokio::test]
async fn create_sends_the_upstream_request_shape() {
    let mock = nova_that_creates().await;
    let cloud = nova(&mock);
    let vm = VmId::new_random();
    let spec = spec(vm, pinned("openstack-node-01"));
    let id = cloud.create_server(&spec).await.unwrap();
    assert_eq!(id, ServerId("84e2b49d-39a9-4d32-9100-e62161c236db".into()));

    let requests = mock.requests();
    let find = requests.iter().find(|r| r.path.contains("/servers/detail")).unwrap();
    // As the service user, across every project.
    assert_eq!(find.path, format!("{NOVA}/servers/detail?all_tenants=1&tags={}", vm_tag(vm)));
    let post =
        requests.iter().find(|r| r.method == Method::POST && r.path.ends_with("/servers")).unwrap();
    assert_compute_headers(post, "service-token");
    assert_eq!(post.header("content-type"), Some("application/json"));
    let body = post.json();
    let ours = body["server"].as_object().unwrap();
    let sample = fixture_json("nova/servers_v2.74_server-create-req-with-only-host.json");
    let sample = sample["server"].as_object().unwrap();
    // Every field we send is one the upstream sample sends (tags: 2.52+), with the same JSON type.
    for (key, value) in ours {
        if key == "tags" {
            assert_eq!(value, &json!([vm_tag(vm)]));
            continue;
        }
        let theirs = sample.get(key).unwrap_or_else(|| panic!("{key} is not in the sample"));
        assert_eq!(
            std::mem::discriminant(value),
            std::mem::discriminant(theirs),
            "{key}: {value} vs {theirs}"
        );
    }
    assert_eq!(ours["name"], "new-server-test");
    assert_eq!(ours["imageRef"], sample["imageRef"]);
    assert_eq!(ours["flavorRef"], "1");
    assert_eq!(ours["host"], sample["host"]);
    assert_eq!(ours["networks"], "auto");
    assert_eq!(ours["metadata"], json!({ VM_ID_METADATA: vm.to_string() }));
    let user_data = base64::engine::general_purpose::STANDARD
        .decode(ours["user_data"].as_str().unwrap())
        .unwrap();
    assert_eq!(user_data, spec.user_data);
}

/// A launch's first creation follows its check at once: no search for an earlier server, no
/// second lookup of the flavor, image and networks; the one POST carries the check's ids. Any
/// later creation searches first, and still takes the stored check's ids.
#[tokio::test]
async fn a_launchs_first_creation_is_one_post_with_the_checks_ids() {
    let mock = nova_that_creates().await;
    let cloud = nova(&mock);
    let checked = Checked {
        flavor: "flavor-id-from-the-check".into(),
        image: IMAGE_ID.into(),
        networks: json!([{ "uuid": NETWORK_ID }]),
        flavor_resources: None,
    };
    let first = ServerSpec {
        checked: Some(checked.clone()),
        first_attempt: true,
        ..spec(VmId::new_random(), pinned("openstack-node-01"))
    };
    cloud.create_server(&first).await.unwrap();
    let sent: Vec<(Method, String)> = mock
        .requests()
        .into_iter()
        .filter(|r| !r.path.starts_with("/identity"))
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(sent, vec![(Method::POST, format!("{NOVA}/servers"))], "only the creation");
    let post = &mock
        .requests()
        .into_iter()
        .find(|r| r.method == Method::POST && r.path.ends_with("/servers"))
        .unwrap();
    let server = post.json()["server"].clone();
    assert_eq!(server["flavorRef"], "flavor-id-from-the-check");
    assert_eq!(server["imageRef"], IMAGE_ID);
    assert_eq!(server["networks"], json!([{ "uuid": NETWORK_ID }]));

    // A retry, or a resumed saga, looks for the server a lost answer may have created, then
    // creates it with the ids its launch's check stored: no lookup of names again.
    let before = mock.requests().len();
    let retry = ServerSpec {
        checked: Some(checked),
        first_attempt: false,
        ..spec(VmId::new_random(), pinned("openstack-node-01"))
    };
    cloud.create_server(&retry).await.unwrap();
    let sent: Vec<(Method, String)> = mock.requests()[before..]
        .iter()
        .filter(|r| !r.path.starts_with("/identity"))
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert!(sent.iter().any(|(_, path)| path.contains("/servers/detail?")), "{sent:?}");
    assert!(
        sent.iter().all(|(_, path)| !["flavors", "images", "networks"]
            .iter()
            .any(|lookup| path.contains(lookup))),
        "the stored check's ids, not lookups: {sent:?}"
    );
    assert_eq!(sent.last().map(|(m, _)| m), Some(&Method::POST), "{sent:?}");

    // A launch stored before checks were kept resolves its names again.
    cloud.create_server(&spec(VmId::new_random(), pinned("openstack-node-01"))).await.unwrap();
    assert!(mock.requests().iter().any(|r| r.path.contains("/servers/detail?")));
}

/// Created for a tenant, the server is the tenant's: every request of the creation carries the
/// tenant's token (in the tenant's project's endpoint), none names a host, and the VM's server is
/// looked for among the tenant's servers only.
#[tokio::test]
async fn a_tenants_server_is_created_with_the_tenants_token_in_zones() {
    let mock = Mock::start(|req, base| {
        if req.is(&Method::POST, &format!("/nova/v2.1/{TENANT_PROJECT}/servers")) {
            return reply(202, fixture("nova/servers_v2.74_server-create-resp.json"));
        }
        if req.path.starts_with(&format!("/nova/v2.1/{TENANT_PROJECT}/")) {
            let req = Req { path: req.path.replace(TENANT_PROJECT, PROJECT), ..req.clone() };
            return standard(&req, base);
        }
        standard(req, base)
    })
    .await;
    let zoned = NovaConfig {
        availability_zone: Some("gsaas-rgpu".into()),
        local_availability_zone: Some("gsaas-{host}".into()),
        ..config()
    };
    let cloud = NovaCloud::new(settings(&mock.base), zoned).unwrap();
    let tenant = TenantToken {
        token: "tenant-token".into(),
        user_id: "tenant-user".into(),
        project_id: TENANT_PROJECT.into(),
    };
    let as_tenant =
        |host| ServerSpec { tenant: Some(tenant.clone()), ..spec(VmId::new_random(), host) };
    let hosts = vec![HostId::new("compute0-rgpu").unwrap()];
    for (host, zone) in [
        (pinned("gpu-host-1"), "gsaas-gpu-host-1"),
        (HostConstraint::AnyOf(hosts.clone().into()), "gsaas-rgpu"),
    ] {
        cloud.create_server(&as_tenant(host)).await.unwrap();
        let requests = mock.requests();
        let post = requests
            .iter()
            .rev()
            .find(|r| r.method == Method::POST && r.path.ends_with("/servers"))
            .unwrap();
        assert_eq!(post.path, format!("/nova/v2.1/{TENANT_PROJECT}/servers"));
        assert_compute_headers(post, "tenant-token");
        let body = post.json();
        assert_eq!(body["server"]["availability_zone"], zone, "{body}");
        assert!(body["server"].get("host").is_none(), "a tenant named a host: {body}");
    }
    let requests = mock.requests();
    for r in requests.iter().filter(|r| {
        r.path.contains("/servers") || r.path.contains("/images") || r.path.contains("/flavors")
    }) {
        assert_eq!(r.header("x-auth-token"), Some("tenant-token"), "{} {}", r.method, r.path);
        assert!(!r.path.contains("all_tenants"), "{}", r.path);
    }
    // Without the zones, a tenant's local or remote VM has nowhere to go.
    let plain = NovaCloud::new(settings(&mock.base), config()).unwrap();
    let err = plain.create_server(&as_tenant(pinned("gpu-host-1"))).await.unwrap_err();
    assert!(matches!(&err, CloudError::Invalid { field: "locality", .. }), "{err:?}");
}

#[tokio::test]
async fn remote_servers_go_to_the_configured_zone_or_one_listed_host() {
    let mock = nova_that_creates().await;
    let hosts: Vec<HostId> =
        ["compute0-rgpu", "compute1-rgpu"].iter().map(|h| HostId::new(*h).unwrap()).collect();
    let zoned = NovaConfig { availability_zone: Some("rgpu".into()), ..config() };
    let cloud = NovaCloud::new(settings(&mock.base), zoned).unwrap();
    cloud
        .create_server(&spec(VmId::new_random(), HostConstraint::AnyOf(hosts.clone().into())))
        .await
        .unwrap();
    let plain = NovaCloud::new(settings(&mock.base), config()).unwrap();
    let vm = VmId::new_random();
    plain.create_server(&spec(vm, HostConstraint::AnyOf(hosts.clone().into()))).await.unwrap();
    plain.create_server(&spec(vm, HostConstraint::AnyOf(hosts.clone().into()))).await.unwrap();
    let posts: Vec<Value> = mock
        .requests()
        .iter()
        .filter(|r| r.method == Method::POST && r.path.ends_with("/servers"))
        .map(|r| r.json()["server"].clone())
        .collect();
    assert_eq!(posts[0]["availability_zone"], "rgpu");
    assert!(posts[0].get("host").is_none());
    let host = posts[1]["host"].as_str().unwrap();
    assert!(hosts.iter().any(|h| h.as_str() == host), "{host}");
    assert_eq!(posts[2]["host"], posts[1]["host"], "the same VM gets the same host on a retry");
    let err =
        plain.create_server(&spec(vm, HostConstraint::AnyOf(Vec::new().into()))).await.unwrap_err();
    assert!(matches!(err, CloudError::Invalid { field: "host", .. }), "{err:?}");
}

#[tokio::test]
async fn create_finds_the_server_of_a_vm_instead_of_creating_another() {
    let vm = VmId::new_random();
    let other = VmId::new_random();
    let mock = Mock::start(move |req, base| {
        if req.method == Method::GET && req.path.contains("/servers/detail?") {
            // Nova's tag filter matched; the metadata decides (a foreign server is skipped).
            let foreign = server_body(other, "ACTIVE", Some("compute"), None)["server"].clone();
            let mut ours = server_body(vm, "BUILD", None, None)["server"].clone();
            ours["id"] = json!("ours-1");
            return reply(200, json!({ "servers": [foreign, ours] }).to_string());
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    assert_eq!(cloud.find_server(vm).await.unwrap(), Some(ServerId("ours-1".into())));
    let id = cloud.create_server(&spec(vm, pinned("compute"))).await.unwrap();
    assert_eq!(id, ServerId("ours-1".into()));
    assert_eq!(mock.count(&Method::POST, NOVA), 0, "no second server");
    assert_eq!(cloud.find_server(VmId::new_random()).await.unwrap(), None);
}

/// Nova answers GET /servers/{id} with each body of `states` in turn, then the last forever.
fn sequence(states: Vec<Value>) -> impl Fn(&Req, &str) -> Reply + Send + Sync + 'static {
    let next = AtomicUsize::new(0);
    move |req, base| {
        if req.is(&Method::GET, &format!("{NOVA}/servers/{SERVER_ID}")) {
            let i = next.fetch_add(1, Ordering::SeqCst).min(states.len() - 1);
            return reply(200, states[i].to_string());
        }
        standard(req, base)
    }
}

#[tokio::test]
async fn wait_active_follows_build_to_active_with_host_ip_and_tap() {
    let vm = VmId::new_random();
    let mock = Mock::start(sequence(vec![
        server_body(vm, "BUILD", None, None),
        server_body(vm, "BUILD", None, None),
        server_body(vm, "ACTIVE", Some("compute"), None),
    ]))
    .await;
    let cloud = nova(&mock);
    let id = ServerId(SERVER_ID.into());
    let info = cloud.wait_active(&id, BOUND).await.unwrap();
    assert_eq!(info.status, ServerStatus::Active);
    assert_eq!(info.vm, vm);
    assert_eq!(info.host, Some(HostId::new("compute").unwrap()));
    // The first upstream port: fixed IP 172.24.4.2, id d80b1a3b-4fc1-... -> tapd80b1a3b-4f.
    assert_eq!(info.fixed_ip, Some("172.24.4.2".parse().unwrap()));
    assert_eq!(info.tap.as_deref(), Some("tapd80b1a3b-4f"));
    assert_eq!(mock.count(&Method::GET, &format!("{NOVA}/servers/{SERVER_ID}")), 3);
    let ports = mock.requests().into_iter().find(|r| r.path.contains("/ports")).unwrap();
    assert_eq!(ports.path, format!("/neutron/v2.0/ports?device_id={SERVER_ID}"));
    assert_eq!(ports.header("x-auth-token"), Some("service-token"));
    assert_eq!(ports.header("openstack-api-version"), None, "only Nova takes a microversion");
    // `server` reads the same.
    assert_eq!(cloud.server(&id).await.unwrap(), info);
}

#[tokio::test]
async fn without_ports_the_fixed_ip_comes_from_novas_addresses() {
    let vm = VmId::new_random();
    let states = vec![server_body(vm, "ACTIVE", Some("compute"), None)];
    let servers = sequence(states);
    let mock = Mock::start(move |req, base| {
        if req.path.starts_with("/neutron/v2.0/ports") {
            return reply(200, r#"{"ports": []}"#);
        }
        servers(req, base)
    })
    .await;
    let info = nova(&mock).server(&ServerId(SERVER_ID.into())).await.unwrap();
    assert_eq!(info.fixed_ip, Some("192.168.1.30".parse().unwrap()));
    assert_eq!(info.tap, None);
}

#[tokio::test]
async fn error_carries_novas_fault_message() {
    let vm = VmId::new_random();
    let fault = "No valid host was found. There are not enough hosts available.";
    let mock = Mock::start(sequence(vec![
        server_body(vm, "BUILD", None, None),
        server_body(vm, "ERROR", None, Some(fault)),
    ]))
    .await;
    let err = nova(&mock).wait_active(&ServerId(SERVER_ID.into()), BOUND).await.unwrap_err();
    match err {
        CloudError::ServerFailed(message) => assert_eq!(message, fault),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_active_server_without_the_host_attribute_asks_for_the_admin_role() {
    let vm = VmId::new_random();
    let mut body = server_body(vm, "ACTIVE", None, None);
    body["server"].as_object_mut().unwrap().remove("OS-EXT-SRV-ATTR:host");
    let mock = Mock::start(sequence(vec![body])).await;
    let err = nova(&mock).wait_active(&ServerId(SERVER_ID.into()), BOUND).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("admin role"), "{err}");
}

#[tokio::test]
async fn wait_active_is_bounded() {
    let vm = VmId::new_random();
    let mock = Mock::start(sequence(vec![server_body(vm, "BUILD", None, None)])).await;
    let timeout = Duration::from_millis(200);
    let err = nova(&mock).wait_active(&ServerId(SERVER_ID.into()), timeout).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(t) if t == timeout), "{err:?}");
}

#[tokio::test]
async fn deployed_once_the_port_is_active() {
    let vm = VmId::new_random();
    let servers = sequence(vec![server_body(vm, "ACTIVE", Some("compute"), None)]);
    let lookups = Arc::new(AtomicUsize::new(0));
    let l = lookups.clone();
    let mock = Mock::start(move |req, base| {
        if req.path.starts_with("/neutron/v2.0/ports") {
            let mut ports = fixture_json("neutron/ports_ports-list-response.json");
            if l.fetch_add(1, Ordering::SeqCst) < 2 {
                ports["ports"][0]["status"] = json!("DOWN");
            }
            return reply(200, ports.to_string());
        }
        servers(req, base)
    })
    .await;
    nova(&mock).wait_deployed(&ServerId(SERVER_ID.into()), BOUND).await.unwrap();
    assert_eq!(lookups.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn delete_waits_for_404() {
    let vm = VmId::new_random();
    let gets = AtomicUsize::new(0);
    let mock = Mock::start(move |req, base| {
        let path = format!("{NOVA}/servers/{SERVER_ID}");
        if req.is(&Method::DELETE, &path) {
            return reply(204, "");
        }
        if req.is(&Method::GET, &path) {
            if gets.fetch_add(1, Ordering::SeqCst) < 2 {
                return reply(200, server_body(vm, "ACTIVE", Some("compute"), None).to_string());
            }
            return nova_error(404, "itemNotFound", "Instance could not be found.");
        }
        standard(req, base)
    })
    .await;
    let cloud = nova(&mock);
    cloud.delete_server(&ServerId(SERVER_ID.into()), BOUND).await.unwrap();
    assert_eq!(mock.count(&Method::DELETE, NOVA), 1);
    assert_eq!(mock.count(&Method::GET, &format!("{NOVA}/servers/{SERVER_ID}")), 3);
    let delete = mock.requests().into_iter().find(|r| r.method == Method::DELETE).unwrap();
    assert_compute_headers(&delete, "service-token");
    // A server that is already gone: DELETE answers 404, which is success.
    cloud.delete_server(&ServerId("gone".into()), BOUND).await.unwrap();
    let err = cloud.server(&ServerId("gone".into())).await.unwrap_err();
    assert!(matches!(err, CloudError::NotFound(_)), "{err:?}");
}

/// What `create_server` returns when Nova answers the POST with `answer`.
async fn create_against(answer: fn() -> Reply) -> CloudError {
    let mock = Mock::start(move |req, base| {
        if req.is(&Method::POST, &format!("{NOVA}/servers")) {
            return answer();
        }
        standard(req, base)
    })
    .await;
    nova(&mock).create_server(&spec(VmId::new_random(), pinned("nosuchhost"))).await.unwrap_err()
}

#[tokio::test]
async fn nova_errors_map_to_the_services_errors() {
    let err = create_against(|| {
        nova_error(400, "badRequest", "Compute host nosuchhost could not be found.")
    })
    .await;
    assert!(
        matches!(&err, CloudError::Invalid { field: "host", reason } if reason == "Compute host nosuchhost could not be found."),
        "{err:?}"
    );
    let err = create_against(|| nova_error(400, "badRequest", "Invalid flavorRef provided.")).await;
    assert!(matches!(err, CloudError::Invalid { field: "flavor", .. }), "{err:?}");
    let err = create_against(|| {
        nova_error(
            403,
            "forbidden",
            "Quota exceeded for instances: Requested 1, but already used 10 of 10 instances",
        )
    })
    .await;
    assert!(matches!(&err, CloudError::Quota(m) if m.contains("10 of 10")), "{err:?}");
    for status in [500, 503] {
        let err = match status {
            500 => {
                create_against(|| nova_error(500, "computeFault", "Unexpected API Error.")).await
            }
            _ => create_against(|| reply(503, "Service Unavailable")).await,
        };
        assert!(matches!(err, CloudError::Unavailable { .. }), "{status}: {err:?}");
        assert!(err.to_string().contains(&status.to_string()), "{err}");
    }
}

#[tokio::test]
async fn unreachable_keystone_is_unavailable_with_its_cause() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let cloud = NovaCloud::new(settings(&base), config()).unwrap();
    let err = cloud.check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    let keystone = err.source().expect("the Keystone error");
    assert!(keystone.to_string().contains("cannot reach"), "{keystone}");
    assert!(keystone.source().is_some(), "the connection error is kept");

    let mock = Mock::start(|req, _| {
        if req.path.starts_with("/identity/") {
            return reply(503, "<html>Service Unavailable</html>");
        }
        reply(500, "")
    })
    .await;
    let err = nova(&mock).check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Unavailable { .. }), "{err:?}");
    assert!(err.source().unwrap().to_string().contains("503"), "{err:?}");
}

#[tokio::test]
async fn a_slow_nova_times_out() {
    let mock = Mock::start(|req, base| {
        if req.path.starts_with("/nova/") {
            let mut slow = standard(req, base);
            slow.delay = Some(Duration::from_secs(5));
            return slow;
        }
        standard(req, base)
    })
    .await;
    let config = NovaConfig { request_timeout_ms: 300, ..config() };
    let cloud = NovaCloud::new(settings(&mock.base), config).unwrap();
    let started = std::time::Instant::now();
    let err = cloud.check(&request(), None).await.unwrap_err();
    assert!(matches!(err, CloudError::Timeout(t) if t == Duration::from_millis(300)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn too_large_user_data_is_refused_before_any_request() {
    let mock = Mock::start(standard).await;
    let cloud = nova(&mock);
    let mut spec = spec(VmId::new_random(), pinned("compute"));
    // 49,152 bytes are 65,536 base64-encoded: one over Nova's limit.
    spec.user_data = vec![b'x'; 49_152];
    let err = cloud.create_server(&spec).await.unwrap_err();
    assert!(matches!(err, CloudError::Invalid { field: "user_data", .. }), "{err:?}");
    assert!(mock.requests().is_empty());
    spec.user_data.truncate(49_149);
    let mock = nova_that_creates().await;
    nova(&mock).create_server(&spec).await.unwrap();
}
