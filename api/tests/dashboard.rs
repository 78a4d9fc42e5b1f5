//! The web dashboard: its embedded assets are served with their types and a strict CSP, and, in a
//! real headless Chromium (Debian's, driven by playwright-core from `api/tests/dashboard/`), a
//! tenant launches a VM through the form (after seeing a field error), sees it ready with its stage
//! timings and no GPU locations, grows another by a cGPU and shrinks it (after seeing a field error
//! and a 507), queues a launch and cancels it, queues an attach that starts when GPUs free,
//! terminates one; an admin sees the hosts' GPU bars (partitions naming their parent) and drains a
//! host; an admin puts projects in a cohort, and a tenant of it borrows past its quota and sees
//! the loan marked.
//!
//! The browser helpers are `gsaas_test_support::browser`. Needs `node` (18 or later) and `chromium` (`CHROMIUM` overrides `/usr/bin/chromium`); without them
//! the test fails, it does not skip. `npm ci` runs in `api/tests/dashboard/` when playwright-core is
//! not installed there. Screenshots go to a temporary directory, or to
//! `GSAAS_DASHBOARD_SCREENSHOTS` (relative to the workspace root) to refresh the ones in `docs/`:
//!
//! ```text
//! GSAAS_DASHBOARD_SCREENSHOTS=docs cargo test -p gsaasd --test integration dashboard::
//! ```

use crate::support;

use gsaasd::cloud::sim::SimConfig;
use gsaasd::config::CloudConfig;
use support::browser::{
    install_playwright_core, require_node_and_chromium, run_script, screenshot_dir,
};
use support::{Store, TestService};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_are_embedded_and_served_with_their_types_and_a_strict_csp() {
    let t = TestService::start(Store::Sqlite).await;
    for (path, content_type) in [
        ("/", "text/html; charset=utf-8"),
        ("/dashboard", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/app.css", "text/css; charset=utf-8"),
        ("/dashboard/icon.svg", "image/svg+xml"),
    ] {
        let response = t.http.get(t.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert_eq!(csp, gsaasd::dashboard::CONTENT_SECURITY_POLICY);
        for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'"] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        let body = response.text().await.unwrap();
        assert!(!body.is_empty(), "{path}");
    }
    // The page is public; the API behind it still wants a token, and unknown paths stay problems.
    let (status, _) =
        support::status_json(t.http.get(t.url("/v1/vms")).send().await.unwrap()).await;
    assert_eq!(status, 401);
    let (status, problem) =
        support::status_json(t.http.get(t.url("/dashboard/nope.js")).send().await.unwrap()).await;
    assert_eq!((status, problem["code"].as_str()), (404, Some("not_found")), "{problem}");
}

/// In Keystone mode, on the real Keystone of `scripts/openstack-dev.sh`: a wrong password and an
/// unknown project are refused beside the form; a member signs in (through gsaasd: the browser
/// never reaches Keystone), sees its project's VM and not another project's, switches to its
/// other project, and signs out, after which every token the page used is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_users_sign_in_switch_project_and_sign_out_in_a_real_browser() {
    use support::openstack::{Gsaasd, Login, FLAVOR, IMAGE};
    let chromium = require_node_and_chromium();
    install_playwright_core().await;
    let gsaasd = Gsaasd::start(2).await;
    let http = support::openstack::client();
    let alpha = Login::new(&http, "alpha").await;
    let beta = Login::new(&http, "beta").await;
    let body = serde_json::json!({ "image": IMAGE, "flavor": FLAVOR, "ncgpus": 1 });
    let own = gsaasd.launch(&alpha.token, &body).await;
    let foreign = gsaasd.launch(&beta.token, &body).await;
    let (user, password) = support::openstack::cloud_user("alpha");
    let url = format!("{}/", gsaasd.service.as_ref().unwrap().url());
    let scratch = std::env::temp_dir().join(format!("gsaas-keystone-ui-{}", std::process::id()));
    let screenshots = screenshot_dir(&scratch);
    let result = run_script(
        "keystone.mjs",
        &[
            ("GSAAS_URL", url.as_str()),
            ("GSAAS_USER", &user),
            ("GSAAS_PASSWORD", &password),
            ("GSAAS_PROJECT", "alpha"),
            ("GSAAS_OTHER_PROJECT", "alpha-lab"),
            ("GSAAS_OWN_VM", &own),
            ("GSAAS_FOREIGN_VM", &foreign),
            ("GSAAS_SCREENSHOTS", screenshots.to_str().unwrap()),
            ("CHROMIUM", chromium.to_str().unwrap()),
        ],
    )
    .await;
    // Three tokens (the unscoped root, alpha's, then alpha-lab's), each revoked at sign-out:
    // Keystone itself no longer knows them (asked directly, as a service validates a token), and
    // gsaasd refuses them.
    let tokens: Vec<&str> =
        result["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), 3, "{result}");
    let operator = Login::new(&http, "gsaas-service").await;
    let keystone = support::openstack::dev_cloud_setting("KEYSTONE_URL");
    let known = |token: String| {
        let (http, keystone, operator) = (http.clone(), keystone.clone(), operator.token.clone());
        async move {
            let answer = http
                .get(format!("{keystone}/auth/tokens"))
                .header("X-Auth-Token", operator)
                .header("X-Subject-Token", token)
                .send()
                .await
                .unwrap();
            answer.status().as_u16() == 200
        }
    };
    for token in tokens {
        assert!(!known(token.to_owned()).await, "Keystone still knows a signed-out token");
        assert_eq!(gsaasd.get("/v1/vms", token).await.0, 401, "a signed-out token still works");
    }
    // Naming no project signs in to the user's default one; revoking the session's root ends
    // the project's token too.
    let url = format!("{}/v1/auth/tokens", gsaasd.service.as_ref().unwrap().url());
    let body = serde_json::json!({ "password": { "user": user, "password": password } });
    let session: serde_json::Value =
        http.post(&url).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(session["project"]["id"], alpha.project_id.as_str(), "{session}");
    let (root, scoped) =
        (session["unscoped_token"].as_str().unwrap(), session["token"].as_str().unwrap());
    assert!(known(scoped.to_owned()).await);
    let answer = http.delete(&url).header("X-Auth-Token", root).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 204);
    assert!(!known(scoped.to_owned()).await, "the project's token outlived the session's root");
    for (id, login) in [(&own, &alpha), (&foreign, &beta)] {
        let (status, _) = gsaasd
            .call(reqwest::Method::DELETE, &format!("/v1/vms/{id}"), &login.token, None)
            .await;
        assert_eq!(status, 202);
    }
    let _ = std::fs::remove_dir_all(scratch);
}

/// A sign-out that Keystone cannot complete (on a fake Keystone whose revocations fail) is shown
/// on the sign-in page and retried until it is done; then every token of the session is revoked
/// at Keystone and refused by gsaasd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_out_keystone_missed_is_shown_and_retried_in_a_real_browser() {
    use std::sync::atomic::Ordering;
    let chromium = require_node_and_chromium();
    install_playwright_core().await;
    let s = crate::keystone_auth::setup_with("dashboard-signout", |_| {}).await;
    s.fake.revocations_fail.store(true, Ordering::SeqCst);
    // Keystone comes back once the page has retried (a third attempt at revoking).
    let fake = s.fake.clone();
    let comeback = tokio::spawn(async move {
        let attempts = || {
            let log = fake.log.lock().unwrap();
            log.iter()
                .filter(|(m, p, _)| m == reqwest::Method::DELETE && p == "/identity/v3/auth/tokens")
                .count()
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while attempts() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "the page never retried");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        fake.revocations_fail.store(false, Ordering::SeqCst);
    });
    let scratch = std::env::temp_dir().join(format!("gsaas-signout-ui-{}", std::process::id()));
    let screenshots = screenshot_dir(&scratch);
    let url = format!("{}/", s.service.url());
    let result = run_script(
        "signout.mjs",
        &[
            ("GSAAS_URL", url.as_str()),
            ("GSAAS_SCREENSHOTS", screenshots.to_str().unwrap()),
            ("CHROMIUM", chromium.to_str().unwrap()),
        ],
    )
    .await;
    comeback.await.unwrap();
    let mut used: Vec<String> = result["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    used.sort();
    assert_eq!(used, ["alice-unscoped", "tenant-a"], "{result}");
    let revoked = s.fake.revoked.lock().unwrap().clone();
    for token in &used {
        assert!(revoked.contains(token), "{token} was never revoked: {revoked:?}");
    }
    assert_eq!(s.get("/v1/vms", "tenant-a").await.0, 401);
    s.service.abort();
    let _ = std::fs::remove_dir_all(scratch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_launches_and_terminates_and_an_admin_drains_in_a_real_browser() {
    let chromium = require_node_and_chromium();
    install_playwright_core().await;

    // Stages that take a visible while, as a real cloud's would (scaled down).
    let t = TestService::start_with(Store::Sqlite, |config| {
        config.cloud = CloudConfig::Sim {
            sim: SimConfig {
                creation_delay_ms: 150,
                activation_delay_ms: 600,
                deployment_delay_ms: 350,
                deletion_delay_ms: 300,
                ..SimConfig::default()
            },
        };
        // The launch form asks for priority 5.
        config.quotas.max_priority = 100;
        // An A100 in two partitions, on a host drained below (so the testbed's room is as it was).
        let mut a100 = gsaasd::config::InventoryGpu::of("A100", 81920, 1);
        a100.partitions = vec![gsaasd::config::InventoryPartition {
            profile: "3g.40gb".into(),
            memory_mib: 40960,
            count: 2,
            model: None,
            traits: Default::default(),
        }];
        config.inventory = config.inventory();
        config.inventory.push(gsaasd::config::InventoryHost {
            name: "mig0".parse().unwrap(),
            kind: gpgpums::HostKind::ComputeGpu,
            gpus: vec![a100],
            gpu_network_address: None,
            remoting: Default::default(),
            server_base_port: None,
            topology: Default::default(),
        });
    })
    .await;
    let tenant = t.member();
    let admin = t.admin();
    let (status, _) = t.post(&admin, "/v1/hosts/mig0/drain", &serde_json::json!({})).await;
    assert_eq!(status, 200);
    // The tenant's project has limits of its own, which the page shows and enforces; one per
    // GPU model too.
    let limits = serde_json::json!({
        "cgpus": 100, "vms": 2, "models": {"NVIDIA Quadro M4000": {"cgpus": 80}}
    });
    let (status, quota) = t.put(&admin, "/v1/quotas/alpha", &limits).await;
    assert_eq!(status, 200, "{quota}");

    // What a tenant must never see: host names, GPU ids, real rCUDA endpoints and addresses.
    let (status, pool) = t.get(&admin, "/v1/pool").await;
    assert_eq!(status, 200, "{pool}");
    let hosts = pool["hosts"].as_array().expect("admins get hosts");
    let mut hidden = Vec::new();
    for host in hosts {
        hidden.push(host["name"].as_str().unwrap().to_owned());
        for gpu in host["gpus"].as_array().unwrap() {
            let endpoint = gpu["rcuda_endpoint"].as_str().unwrap();
            hidden.push(endpoint.to_owned());
            hidden.push(endpoint.split(':').next().unwrap().to_owned());
            hidden.push(gpu["id"].as_str().unwrap().to_owned());
        }
    }
    hidden.retain(|s| s.len() >= 6);
    hidden.sort();
    hidden.dedup();
    let drain_host = hosts
        .iter()
        .rev()
        .find(|h| h["gpus"].as_array().unwrap().is_empty())
        .or(hosts.last())
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();

    let screenshots = screenshot_dir(&t.dir);
    let hidden = serde_json::to_string(&hidden).unwrap();
    let result = run_script(
        "browser.mjs",
        &[
            ("GSAAS_URL", t.url("").as_str()),
            ("GSAAS_TENANT_TOKEN", &tenant),
            ("GSAAS_ADMIN_TOKEN", &admin),
            ("GSAAS_HIDDEN", &hidden),
            ("GSAAS_DRAIN_HOST", &drain_host),
            ("GSAAS_SCREENSHOTS", screenshots.to_str().unwrap()),
            ("CHROMIUM", chromium.to_str().unwrap()),
        ],
    )
    .await;

    // The browser's clicks did what the page said.
    let id = |key: &str| result[key].as_str().unwrap_or_else(|| panic!("{key} in {result}"));
    let (status, deleted) = t.get(&tenant, &format!("/v1/vms/{}", id("deleted"))).await;
    assert_eq!((status, deleted["state"].as_str()), (200, Some("deleted")), "{deleted}");
    let (_, list) = t.get(&tenant, "/v1/vms").await;
    let vms = list["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 1, "{list}");
    assert_eq!(vms[0]["id"], id("kept"));
    assert_eq!(vms[0]["state"], "ready");
    assert_eq!(vms[0]["gpus"]["ncgpus"], 2);
    assert_eq!(vms[0]["gpus"]["policy"], "least-load-fit");
    assert_eq!(vms[0]["gpus"]["distinct_gpus"], true);
    // It grew by cGPU 2 and gave up cGPU 0 through the dialog and the detach button.
    let cgpus: Vec<(u64, &str)> = vms[0]["cgpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].as_u64().unwrap(), c["state"].as_str().unwrap()))
        .collect();
    assert_eq!(cgpus, [(1, "live"), (2, "live")], "{list}");
    // It waited in the queue for a whole GPU, got it when the filler went, and gave it up again.
    let (_, kept) = t.get(&tenant, &format!("/v1/vms/{}", id("kept"))).await;
    let kinds: Vec<&str> =
        kept["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["attached"], "{kept}");
    for cancelled in ["queued", "filler"] {
        let (_, vm) = t.get(&tenant, &format!("/v1/vms/{}", id(cancelled))).await;
        assert_eq!(vm["state"], "deleted", "{vm}");
    }
    let (_, queue) = t.get(&admin, "/v1/queue").await;
    assert_eq!(queue["requests"], serde_json::json!([]), "{queue}");
    let (_, ops_vm) = t.get(&admin, &format!("/v1/vms/{}", id("admin_vm"))).await;
    assert_eq!(
        (ops_vm["state"].as_str(), ops_vm["project"].as_str()),
        (Some("ready"), Some("ops"))
    );
    let (_, host_list) = t.get(&admin, "/v1/hosts").await;
    let drained: Vec<&str> = host_list["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["state"] == "drained")
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(drained, [drain_host.as_str(), "mig0"], "the browser drained its host");

    for name in
        ["dashboard-pool.png", "dashboard-vm.png", "dashboard-elastic.png", "dashboard-queue.png"]
    {
        let png = std::fs::read(screenshots.join(name)).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{name}: {} bytes", png.len());
    }
}

/// Cohorts through the page (`cohorts.mjs`): an admin puts alpha (borrowing at most one whole
/// GPU) and beta (lending at most one) in cohort `lab` through the form, after a fraction, a limit
/// too high and a project of another cohort are refused; changes beta's terms through Edit; takes
/// a project out of cohort `other` and deletes it. Alpha's tenant, whose page has no Cohorts
/// section and never asks for cohorts, is refused two whole GPUs on a quota of one unless it
/// borrows, then sees its second cGPU marked `borrowed` and its quota card name the cohort and
/// the loan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_puts_projects_in_a_cohort_and_a_tenant_sees_its_borrowed_cgpus_in_a_real_browser()
{
    use serde_json::json;
    let chromium = require_node_and_chromium();
    install_playwright_core().await;
    let t = TestService::start(Store::Sqlite).await;
    let (admin, tenant) = (t.admin(), t.member());
    for (project, gpus) in [("alpha", 1), ("beta", 2)] {
        let path = format!("/v1/quotas/{project}");
        let (status, quota) = t.put(&admin, &path, &json!({"exclusive_gpus": gpus})).await;
        assert_eq!(status, 200, "{quota}");
    }
    let (status, other) =
        t.put(&admin, "/v1/cohorts/other", &json!({"members": {"gamma": {}}})).await;
    assert_eq!(status, 200, "{other}");

    let screenshots = screenshot_dir(&t.dir);
    let result = run_script(
        "cohorts.mjs",
        &[
            ("GSAAS_URL", t.url("").as_str()),
            ("GSAAS_ADMIN_TOKEN", &admin),
            ("GSAAS_TENANT_TOKEN", &tenant),
            ("GSAAS_SCREENSHOTS", screenshots.to_str().unwrap()),
            ("CHROMIUM", chromium.to_str().unwrap()),
        ],
    )
    .await;

    // The form's clicks made the cohort the page showed, with each member's whole terms.
    let (_, list) = t.get(&admin, "/v1/cohorts").await;
    let names: Vec<&str> =
        list["cohorts"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["lab"], "{list}");
    let (status, lab) = t.get(&admin, "/v1/cohorts/lab").await;
    assert_eq!(status, 200, "{lab}");
    let none = json!({"cgpus": null, "memory_mib": null, "exclusive_gpus": null});
    let one_gpu = json!({"cgpus": null, "memory_mib": null, "exclusive_gpus": 1});
    let terms = |project: &str| {
        let terms = &lab["members"][project]["terms"];
        (
            terms["borrowing_limit"].clone(),
            terms["lending_limit"].clone(),
            terms["borrow_by_default"].clone(),
        )
    };
    assert_eq!(terms("alpha"), (one_gpu.clone(), none.clone(), json!(false)), "{lab}");
    let a100 = json!({"A100": {"cgpus": 1, "memory_mib": null, "exclusive_gpus": null}});
    assert_eq!(lab["members"]["alpha"]["terms"]["borrowing_limit_by_model"], a100, "{lab}");
    // Beta's lending limit as the page's other admin changed it while the page saved alpha.
    let lent = json!({"cgpus": 3, "memory_mib": null, "exclusive_gpus": 1});
    assert_eq!(terms("beta"), (none, lent, json!(true)), "{lab}");
    assert_eq!(lab["members"].as_object().unwrap().len(), 2, "{lab}");
    // The launch the tenant asked to borrow: its second whole GPU on loan.
    let borrower = result["borrower"].as_str().unwrap_or_else(|| panic!("borrower in {result}"));
    let (_, vm) = t.get(&tenant, &format!("/v1/vms/{borrower}")).await;
    let marks: Vec<bool> =
        vm["cgpus"].as_array().unwrap().iter().map(|c| c["borrowed"] == true).collect();
    assert_eq!(marks, [false, true], "{vm}");
    let (_, quota) = t.get(&tenant, "/v1/quotas/alpha").await;
    assert_eq!(
        (quota["cohort"].as_str(), &quota["borrowed"]["exclusive_gpus"]),
        (Some("lab"), &json!(1)),
        "{quota}"
    );
    let png = std::fs::read(screenshots.join("dashboard-cohorts.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
}
