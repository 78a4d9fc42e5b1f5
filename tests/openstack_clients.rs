//! OpenStack's own ways in to GSaaS, against the real cloud of `scripts/openstack-dev.sh` (where
//! `scripts/openstack-dev/provision.py` registers gsaasd in the catalog as `gpu-scheduling`): the
//! `gsaas` CLI finding gsaasd in the Keystone catalog from `OS_CLOUD` alone, and the real
//! python-openstackclient with this repository's plugin (`openstack gpu ...`, `osc-plugin/`), and
//! a real Horizon with this repository's panels (`horizon-plugin/`) in real Chromium; each client
//! installed by `scripts/openstack-clients.sh` into a venv of its own.
//!
//! And CloudKitty's Prometheus collector (`cloudkitty` from PyPI, in its venv) rating the usage
//! counters of gsaasd's `/metrics` through a real Prometheus (Debian's), with
//! `deploy/cloudkitty/`'s configuration as shipped; and Ceilometer's notification endpoint
//! (`ceilometer` from PyPI) metering gsaasd's notifications from a real RabbitMQ with
//! `deploy/ceilometer/`'s meter definitions.
//!
//! Each test of the catalog serves its gsaasd (Keystone mode, the Nova backend) where the catalog says gsaasd is,
//! holding the catalog's address for itself (`CatalogLease`: one such test at a time, in every
//! test binary).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use gsaas_test_support::openstack::{
    cloud_user, clouds_yaml, dev_cloud_setting, Gsaasd, Login, FLAVOR, IMAGE,
};
use serde_json::Value;

/// Runs `gsaas ARGS` with a clean environment: only `env`, the dev cloud's clouds.yaml and an
/// empty home (no config file), so only the catalog can say where gsaasd is.
fn gsaas(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    std::fs::create_dir_all(home).unwrap();
    Command::new(support::gsaas_binary())
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("OS_CLIENT_CONFIG_FILE", clouds_yaml())
        .envs(env.iter().copied())
        .output()
        .expect("gsaas runs")
}

fn json_of(output: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "gsaas failed: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gsaas_finds_gsaasd_in_the_keystone_catalog() {
    let _gsaasd = Gsaasd::start_in_catalog(2, |_| {}).await;
    let home = std::env::temp_dir().join(format!("gsaas-catalog-{}", std::process::id()));
    let alpha = [("OS_CLOUD", "alpha")];
    let run = |args: Vec<&str>, env: &[(&str, &str)]| {
        let home = home.clone();
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let env: Vec<(String, String)> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            gsaas(&home, &args, &env)
        })
    };

    // OS_CLOUD alone: the public endpoint; a VM launched and terminated through it.
    let listed = json_of(&run(vec!["-f", "json", "list"], &alpha).await.unwrap());
    assert_eq!(listed["vms"], serde_json::json!([]), "{listed}");
    let launch = vec![
        "-f", "json", "launch", "--ncgpus", "1", "--image", IMAGE, "--flavor", FLAVOR, "--wait",
    ];
    let vm = json_of(&run(launch, &alpha).await.unwrap());
    assert_eq!(vm["state"], "ready", "{vm}");
    let id = vm["id"].as_str().unwrap().to_owned();
    // The internal endpoint, and a token given as is (OS_TOKEN, its catalog asked of Keystone).
    let internal = vec!["-f", "json", "--os-interface", "internal", "list"];
    let listed = json_of(&run(internal, &alpha).await.unwrap());
    assert_eq!(listed["vms"][0]["id"], id.as_str(), "{listed}");
    let login = Login::new(&reqwest::Client::new(), "alpha").await;
    let keystone = dev_cloud_setting("KEYSTONE_URL");
    let token = [("OS_TOKEN", login.token.as_str()), ("OS_AUTH_URL", keystone.as_str())];
    let listed = json_of(&run(vec!["-f", "json", "list"], &token).await.unwrap());
    assert_eq!(listed["vms"][0]["id"], id.as_str(), "{listed}");

    // A region the catalog does not have: said plainly, with what it has.
    let nowhere = run(vec!["--os-region-name", "Atlantis", "list"], &alpha).await.unwrap();
    let stderr = String::from_utf8_lossy(&nowhere.stderr);
    assert_eq!(nowhere.status.code(), Some(2), "{stderr}");
    for says in ["no public endpoint in region Atlantis", "public in RegionOne", "--url"] {
        assert!(stderr.contains(says), "{says:?} not in {stderr}");
    }

    let ended = run(vec!["-f", "json", "terminate", &id, "--wait"], &alpha).await.unwrap();
    assert_eq!(json_of(&ended)["state"], "deleted");
    let _ = std::fs::remove_dir_all(home);
}

/// The venv `scripts/openstack-clients.sh KIND` builds (or finds up to date), bounded.
pub fn client_venv(kind: &str) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut child = Command::new(workspace.join("scripts/openstack-clients.sh"))
        .arg(kind)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("scripts/openstack-clients.sh runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "installing {kind} took over 15 minutes");
        std::thread::sleep(Duration::from_millis(200));
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "scripts/openstack-clients.sh {kind} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// `openstack ARGS` of the venv, as `cloud` of the dev cloud's clouds.yaml, in a clean
/// environment: (exit code, stdout, stderr).
fn openstack(venv: &Path, cloud: &str, args: &[&str]) -> (i32, String, String) {
    let home = std::env::temp_dir().join(format!("gsaas-osc-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let output = Command::new(venv.join("bin/openstack"))
        .arg("--os-cloud")
        .arg(cloud)
        .args(args)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .env("OS_CLIENT_CONFIG_FILE", clouds_yaml())
        .output()
        .expect("openstack runs");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (output.status.code().unwrap_or(-1), text(output.stdout), text(output.stderr))
}

/// `openstack ARGS -f json` that must succeed: its JSON.
fn openstack_json(venv: &Path, cloud: &str, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.extend(["-f", "json"]);
    let (code, stdout, stderr) = openstack(venv, cloud, &args);
    assert_eq!(code, 0, "openstack {}: {stderr}{stdout}", args.join(" "));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `openstack gpu ...` as a tenant and as an operator: every command, OSC's formatters, and the
/// refusals (another project's VM, a tenant at an operator's command) as OSC errors. And cohorts:
/// an operator puts alpha and beta in one (`gpu cohort set|show|list`), alpha launches past its
/// quota with `--borrow` (refused with `--no-borrow`) and its cGPU past the quota is shown
/// borrowed (`gpu server show|list`, `gpu cgpu list`, `gpu quota show`), a tenant cannot list
/// cohorts, and `gpu cohort remove` of the last member ends the cohort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_gpu_commands_work_with_the_real_openstack_client() {
    let venv = tokio::task::spawn_blocking(|| client_venv("osc")).await.unwrap();
    let gsaasd = Gsaasd::start_in_catalog(2, |_| {}).await;
    let alpha_project = Login::new(&reqwest::Client::new(), "alpha").await.project_id;
    let run = |cloud: &'static str, args: Vec<String>| {
        let venv = venv.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            openstack_json(&venv, cloud, &args)
        })
    };
    let fails = |cloud: &'static str, args: Vec<String>| {
        let venv = venv.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, stdout, stderr) = openstack(&venv, cloud, &args);
            assert_ne!(code, 0, "openstack {} succeeded: {stdout}", args.join(" "));
            stderr
        })
    };
    let a = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();

    // A tenant: create (waiting for ready), list, show, grow, shrink.
    let create =
        format!("gpu server create --ncgpus 1 --image {IMAGE} --flavor {FLAVOR} --wait osc-vm");
    let vm = run("alpha", a(&create)).await.unwrap();
    assert_eq!((vm["state"].as_str(), vm["ncgpus"].as_u64()), (Some("ready"), Some(1)), "{vm}");
    assert_eq!(vm["project"], alpha_project.as_str(), "{vm}");
    let id = vm["id"].as_str().unwrap().to_owned();
    let listed = run("alpha", a("gpu server list")).await.unwrap();
    assert_eq!(listed[0]["ID"], id.as_str(), "{listed}");
    assert_eq!(listed[0]["State"], "ready", "{listed}");
    let shown = run("alpha", a(&format!("gpu server show {id} -c state -c cgpus"))).await.unwrap();
    assert_eq!(shown.as_object().unwrap().len(), 2, "-c picks columns: {shown}");
    assert!(shown["cgpus"].as_str().unwrap().starts_with("#0 live "), "{shown}");
    let grown = run("alpha", a(&format!("gpu cgpu attach {id} --ncgpus 1 --wait"))).await.unwrap();
    assert!(grown["cgpus"].as_str().unwrap().contains("#1 live"), "{grown}");
    let shrunk = run("alpha", a(&format!("gpu cgpu detach {id} 0 --wait"))).await.unwrap();
    let cgpus = shrunk["cgpus"].as_str().unwrap();
    assert!(cgpus.starts_with("#1 live") && !cgpus.contains("#0"), "{shrunk}");
    let pool = run("alpha", a("gpu pool show")).await.unwrap();
    assert_eq!((pool["gpus"].as_u64(), pool.get("hosts")), (Some(2), None), "{pool}");
    assert_eq!(run("alpha", a("gpu queue list")).await.unwrap(), serde_json::json!([]));
    let quota = run("alpha", a("gpu quota show")).await.unwrap();
    assert_eq!(quota["project"], alpha_project.as_str(), "{quota}");
    // Another project's tenant does not see it; a tenant is no operator.
    let stderr = fails("beta", a(&format!("gpu server show {id}"))).await.unwrap();
    assert!(stderr.contains("not found") && stderr.contains("HTTP 404"), "{stderr}");
    let stderr = fails("alpha", a("gpu host list")).await.unwrap();
    assert!(stderr.contains("HTTP 404"), "{stderr}");
    // A compute share where no host runs MPS: refused naming the field, not placed without it.
    let share = format!(
        "gpu cgpu attach {id} --ncgpus 1 --mode shared --gpu-memory 512 --compute-percent 30"
    );
    let stderr = fails("alpha", a(&share)).await.unwrap();
    assert!(stderr.contains("HTTP 422") && stderr.contains("compute_percent"), "{stderr}");

    // An operator (the admin project's admin): hosts, GPUs, quotas.
    let hosts = run("gsaas-service", a("gpu host list")).await.unwrap();
    let names: Vec<&str> =
        hosts.as_array().unwrap().iter().map(|h| h["Name"].as_str().unwrap()).collect();
    assert!(names.contains(&"gpu-host-1") && names.contains(&"rgpu-host-1"), "{hosts}");
    let drained = run("gsaas-service", a("gpu host drain gpu-host-1")).await.unwrap();
    assert_eq!(drained["state"], "drained", "{drained}");
    let back = run("gsaas-service", a("gpu host undrain gpu-host-1")).await.unwrap();
    assert_ne!(back["state"], "drained", "{back}");
    let tainted =
        run("gsaas-service", a("gpu gpu taint gpu-host-1:gpu1 --reason fan")).await.unwrap();
    assert_eq!(tainted["id"], "gpu-host-1:gpu1", "{tainted}");
    assert!(tainted["taint"].to_string().contains("fan"), "{tainted}");
    let untainted = run("gsaas-service", a("gpu gpu untaint gpu-host-1:gpu1")).await.unwrap();
    assert!(untainted["taint"].is_null(), "{untainted}");
    let evacuated = run("gsaas-service", a("gpu host evacuate rgpu-host-1")).await.unwrap();
    assert_eq!(evacuated["moved"], 0, "{evacuated}");
    let set = format!("gpu quota set {alpha_project} --cgpus 5 --vms none");
    let quota = run("gsaas-service", a(&set)).await.unwrap();
    assert_eq!(
        (quota["cgpus"].as_u64(), quota["own_limits"].as_bool()),
        (Some(5), Some(true)),
        "{quota}"
    );
    let stderr = fails("gsaas-service", a("gpu host forget rgpu-host-1")).await.unwrap();
    assert!(stderr.contains("HTTP 409"), "{stderr}");
    let all = run("gsaas-service", a("gpu server list")).await.unwrap();
    assert_eq!(all[0]["Project"], alpha_project.as_str(), "{all}");

    // Commands that print nothing: (exit code, stdout, stderr).
    let plain = |cloud: &'static str, args: Vec<String>| {
        let venv = venv.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            openstack(&venv, cloud, &args)
        })
    };
    let delete = a(&format!("gpu server delete {id} --wait"));
    let (code, stdout, stderr) = plain("alpha", delete).await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    let ended = run("alpha", a(&format!("gpu server show {id} -c state"))).await.unwrap();
    assert_eq!(ended["state"], "deleted", "{ended}");

    // Cohorts, as an operator: alpha (a quota of 1 cGPU) borrows what beta (2) leaves unused.
    let beta_project = Login::new(&reqwest::Client::new(), "beta").await.project_id;
    for (project, cgpus) in [(&alpha_project, 1), (&beta_project, 2)] {
        let quota = run("gsaas-service", a(&format!("gpu quota set {project} --cgpus {cgpus}")));
        let quota = quota.await.unwrap();
        assert_eq!(quota["cgpus"].as_u64(), Some(cgpus), "{quota}");
        assert!(quota["cohort"].is_null(), "in no cohort yet: {quota}");
    }
    let set = format!("gpu cohort set osc-lab {alpha_project} --borrow-cgpus 2 --lend-cgpus none");
    let cohort = run("gsaas-service", a(&set)).await.unwrap();
    let terms = &cohort["members"][alpha_project.as_str()]["terms"];
    assert_eq!(terms["borrowing_limit"]["cgpus"], 2, "{cohort}");
    assert_eq!(terms["borrow_by_default"], false, "{cohort}");
    let set =
        format!("gpu cohort set osc-lab {beta_project} --lend-cgpus 1 --no-borrow-by-default");
    run("gsaas-service", a(&set)).await.unwrap();
    // A borrowing limit on one GPU model (its name has spaces: one argument); the other terms
    // stay as they were.
    let model = "NVIDIA Quadro M4000";
    let mut by_model = a(&format!("gpu cohort set osc-lab {alpha_project} --borrow-cgpus 1"));
    by_model.splice(5..5, ["--model".to_owned(), model.to_owned()]);
    run("gsaas-service", by_model).await.unwrap();
    let shown = run("gsaas-service", a("gpu cohort show osc-lab")).await.unwrap();
    let members = shown["members"].as_object().expect("the members");
    let mut projects: Vec<&str> = members.keys().map(String::as_str).collect();
    projects.sort_unstable();
    let mut expected = vec![alpha_project.as_str(), beta_project.as_str()];
    expected.sort_unstable();
    assert_eq!(projects, expected, "{shown}");
    let alpha_terms = &members[alpha_project.as_str()]["terms"];
    assert_eq!(alpha_terms["borrowing_limit"]["cgpus"], 2, "{shown}");
    assert_eq!(alpha_terms["borrowing_limit_by_model"][model]["cgpus"], 1, "{shown}");
    assert_eq!(members[beta_project.as_str()]["terms"]["lending_limit"]["cgpus"], 1, "{shown}");
    assert_eq!(shown["lendable"]["cgpus"], 2, "alpha's 1 unused, beta's 1 lent: {shown}");
    // Per model, only borrowing limits.
    let mut lend = a(&format!("gpu cohort set osc-lab {alpha_project} --lend-cgpus 1"));
    lend.splice(5..5, ["--model".to_owned(), model.to_owned()]);
    let stderr = fails("gsaas-service", lend).await.unwrap();
    assert!(stderr.contains("not per model"), "{stderr}");
    // A tenant is no operator here either.
    let stderr = fails("alpha", a("gpu cohort list")).await.unwrap();
    assert!(stderr.contains("HTTP 403") || stderr.contains("HTTP 404"), "{stderr}");
    let listed = run("gsaas-service", a("gpu cohort list")).await.unwrap();
    assert_eq!(listed[0]["Name"], "osc-lab", "{listed}");

    // A tenant past its quota: refused unless it borrows; with --borrow, the cGPU past the quota
    // is on loan, and said so wherever cGPUs are shown.
    let create =
        format!("gpu server create --ncgpus 2 --image {IMAGE} --flavor {FLAVOR} --wait osc-borrow");
    let stderr = fails("alpha", a(&format!("{create} --no-borrow"))).await.unwrap();
    assert!(stderr.contains("HTTP 403") && stderr.contains("quota_exceeded"), "{stderr}");
    let vm = run("alpha", a(&format!("{create} --borrow"))).await.unwrap();
    assert_eq!(vm["state"], "ready", "{vm}");
    assert_eq!(vm["borrowed"], serde_json::json!([1]), "the cGPU past the quota: {vm}");
    let borrower = vm["id"].as_str().unwrap().to_owned();
    let cgpus = run("alpha", a(&format!("gpu cgpu list {borrower}"))).await.unwrap();
    let marks: Vec<(u64, bool)> = cgpus
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["Index"].as_u64().unwrap(), c["Borrowed"].as_bool().unwrap()))
        .collect();
    assert_eq!(marks, [(0, false), (1, true)], "{cgpus}");
    let listed = run("alpha", a("gpu server list")).await.unwrap();
    let row = listed.as_array().unwrap().iter().find(|v| v["ID"] == borrower.as_str());
    assert_eq!(row.map(|v| v["Borrowed"].clone()), Some(1.into()), "{listed}");
    let quota = run("alpha", a("gpu quota show")).await.unwrap();
    assert_eq!(quota["cohort"], "osc-lab", "{quota}");
    assert_eq!(quota["borrowed"]["cgpus"], 1, "{quota}");
    let shown = run("gsaas-service", a("gpu cohort show osc-lab")).await.unwrap();
    assert_eq!(shown["members"][alpha_project.as_str()]["borrowed"]["cgpus"], 1, "{shown}");
    assert_eq!(shown["borrowed"]["cgpus"], 1, "{shown}");

    // The members out one by one: the last one out ends the cohort.
    let delete = a(&format!("gpu server delete {borrower} --wait"));
    let (code, stdout, stderr) = plain("alpha", delete).await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    let remove =
        |project: &str| plain("gsaas-service", a(&format!("gpu cohort remove osc-lab {project}")));
    let (code, stdout, stderr) = remove(&alpha_project).await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    let shown = run("gsaas-service", a("gpu cohort show osc-lab")).await.unwrap();
    assert_eq!(shown["members"].as_object().map(|m| m.len()), Some(1), "{shown}");
    let (code, stdout, stderr) = remove(&alpha_project).await.unwrap();
    assert!(code != 0 && stderr.contains("not in cohort osc-lab"), "{stdout}{stderr}");
    let (code, stdout, stderr) = remove(&beta_project).await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(run("gsaas-service", a("gpu cohort list")).await.unwrap(), serde_json::json!([]));
    let stderr = fails("gsaas-service", a("gpu cohort delete osc-lab")).await.unwrap();
    assert!(stderr.contains("HTTP 404"), "{stderr}");
    // A cohort ended whole.
    let set = format!("gpu cohort set osc-lab2 {beta_project} --borrow-by-default");
    let cohort = run("gsaas-service", a(&set)).await.unwrap();
    assert_eq!(cohort["members"][beta_project.as_str()]["terms"]["borrow_by_default"], true);
    let (code, stdout, stderr) =
        plain("gsaas-service", a("gpu cohort delete osc-lab2")).await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(run("gsaas-service", a("gpu cohort list")).await.unwrap(), serde_json::json!([]));
    drop(gsaasd);
}

/// A child process that is killed and reaped when the test ends, however it ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Horizon from the package registry (`scripts/openstack-clients.sh horizon`: this
/// repository's panels enabled as Horizon plugins are) on the dev cloud, on `port`, killed on drop.
fn start_horizon(venv: &Path, port: u16) -> Reaped {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let log = std::fs::File::create(venv.join("state/devserver.log")).unwrap();
    let child = Command::new(venv.join("bin/python"))
        .args(["-W", "ignore", "-m", "django", "runserver", "--noreload"])
        .arg(format!("127.0.0.1:{port}"))
        .env("PYTHONPATH", workspace.join("horizon-plugin/devserver"))
        .env("DJANGO_SETTINGS_MODULE", "gsaas_horizon_settings")
        .env("GSAAS_HORIZON_STATE", venv.join("state"))
        .env("GSAAS_HORIZON_KEYSTONE_URL", dev_cloud_setting("KEYSTONE_URL"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("Horizon's development server starts");
    Reaped(child)
}

/// A signed-in Horizon session over plain HTTP, as a browser without JavaScript: the pages as
/// Horizon renders them, its forms posted with their CSRF token, its cookies kept by hand.
struct HorizonPages {
    http: reqwest::Client,
    base: String,
    cookies: std::collections::BTreeMap<String, String>,
}

impl HorizonPages {
    async fn sign_in(base: &str, user: &str, password: &str) -> HorizonPages {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(90))
            .build()
            .unwrap();
        let mut pages = HorizonPages { http, base: base.to_owned(), cookies: Default::default() };
        let (status, login) = pages.get("/auth/login/").await;
        assert_eq!(status, 200, "{login}");
        let region = hidden_value(&login, "region").unwrap_or_default();
        let fields = [("username", user), ("password", password), ("region", region.as_str())];
        let (status, answer) = pages.post("/auth/login/", &login, &fields).await;
        assert_eq!(status, 302, "signed in as {user}: {answer}");
        pages
    }

    async fn answer(&mut self, request: reqwest::RequestBuilder) -> (u16, String) {
        let cookies: Vec<String> = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let response = request.header("Cookie", cookies.join("; ")).send().await.unwrap();
        for set in response.headers().get_all(reqwest::header::SET_COOKIE) {
            let pair = set.to_str().unwrap().split(';').next().unwrap_or_default();
            if let Some((name, value)) = pair.split_once('=') {
                self.cookies.insert(name.trim().to_owned(), value.trim().to_owned());
            }
        }
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn get(&mut self, path: &str) -> (u16, String) {
        let request = self.http.get(format!("{}{path}", self.base));
        self.answer(request).await
    }

    /// Posts `fields` to `path` as the form of `page` (its CSRF token added).
    async fn post(&mut self, path: &str, page: &str, fields: &[(&str, &str)]) -> (u16, String) {
        let token = hidden_value(page, "csrfmiddlewaretoken").expect("the form's CSRF token");
        let mut form = reqwest::Url::parse("http://form/").unwrap();
        form.query_pairs_mut()
            .append_pair("csrfmiddlewaretoken", &token)
            .extend_pairs(fields.iter().copied());
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(form.query().unwrap_or_default().to_owned());
        self.answer(request).await
    }
}

/// The value of the first `<input name="NAME" ... value="...">` of `html`.
fn hidden_value(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\""))?;
    let start = html[..at].rfind('<')?;
    let tag = &html[start..at + html[at..].find('>')?];
    let value = &tag[tag.find("value=\"")? + 7..];
    Some(value[..value.find('"')?].to_owned())
}

/// The text of the cell of column class `class` in the table row of object `id`.
fn cell_text(html: &str, id: &str, class: &str) -> Option<String> {
    let row = &html[html.find(&format!("data-object-id=\"{id}\""))?..];
    let row = &row[..row.find("</tr>")?];
    let cell = &row[row.find(class)?..];
    let cell = &cell[cell.find('>')? + 1..];
    Some(cell[..cell.find("</td>")?].trim().to_owned())
}

/// Horizon with GSaaS's panels, in real Chromium: a tenant signs in to Horizon, opens Project >
/// GPUs, launches a VM with 2 cGPUs through the form, sees it ready (and its quota bar), attaches
/// a cGPU and detaches another, and terminates it; an operator opens Admin > GPUs, drains a host
/// and taints a GPU. gsaasd confirms each. Then, over HTTP (`HorizonPages`): alpha, in a cohort
/// with beta, launches and attaches past its quota with the forms' "Borrow past the quota" box
/// checked, and the GPUs table marks the cGPUs on loan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn horizon_gpus_panels_launch_terminate_drain_and_taint_in_a_real_browser() {
    use gsaas_test_support::browser::{
        install_playwright_core, require_node_and_chromium, run_script, screenshot_dir,
    };
    let chromium = require_node_and_chromium();
    install_playwright_core().await;
    let venv = tokio::task::spawn_blocking(|| client_venv("horizon")).await.unwrap();
    let gsaasd = Gsaasd::start_in_catalog(4, |_| {}).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _horizon = start_horizon(&venv, port);
    let url = format!("http://127.0.0.1:{port}");
    let login = format!("{url}/auth/login/");
    gsaas_test_support::openstack::eventually("Horizon to answer", || async {
        let answer = reqwest::get(&login).await.ok()?;
        (answer.status() == 200).then_some(())
    })
    .await;
    // Alpha's own limits, for the quota bars.
    let alpha = Login::new(&reqwest::Client::new(), "alpha").await;
    let operator = Login::new(&reqwest::Client::new(), "gsaas-service").await;
    let limits = serde_json::json!({ "cgpus": 8, "memory_mib": 16384, "vms": 4 });
    let path = format!("/v1/quotas/{}", alpha.project_id);
    let (status, quota) =
        gsaasd.call(reqwest::Method::PUT, &path, &operator.token, Some(&limits)).await;
    assert_eq!(status, 200, "{quota}");
    let (tenant, tenant_password) = cloud_user("alpha");
    let (admin, admin_password) = cloud_user("gsaas-service");
    let screenshots = screenshot_dir(&venv.join("state"));
    let result = run_script(
        "horizon.mjs",
        &[
            ("HORIZON_URL", url.as_str()),
            ("TENANT_USER", &tenant),
            ("TENANT_PASSWORD", &tenant_password),
            ("ADMIN_USER", &admin),
            ("ADMIN_PASSWORD", &admin_password),
            ("IMAGE", IMAGE),
            ("FLAVOR", FLAVOR),
            ("DRAIN_HOST", "gpu-host-1"),
            ("TAINT_GPU", "gpu-host-1:gpu3"),
            ("SCREENSHOTS", screenshots.to_str().unwrap()),
            ("CHROMIUM", chromium.to_str().unwrap()),
        ],
    )
    .await;

    // gsaasd saw what the pages said: the VM, of 2 shared cGPUs, ended; the host drained, the
    // GPU tainted.
    let vm = result["vm"].as_str().expect("the VM's id");
    let ended = gsaasd.until(vm, &alpha.token, &["deleted", "error"]).await;
    assert_eq!(ended["state"], "deleted", "{ended}");
    assert_eq!(
        (ended["gpus"]["ncgpus"].as_u64(), ended["gpus"]["mode"].as_str()),
        (Some(2), Some("shared")),
        "{ended}"
    );
    let (_, hosts) = gsaasd.get("/v1/hosts", &operator.token).await;
    let drained = hosts["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "gpu-host-1");
    assert_eq!(drained.map(|h| h["state"].clone()), Some(serde_json::json!("drained")), "{hosts}");
    let (_, pool) = gsaasd.get("/v1/pool", &operator.token).await;
    let gpus: Vec<&Value> = pool["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["gpus"].as_array().unwrap())
        .collect();
    let tainted = gpus.iter().find(|g| g["id"] == "gpu-host-1:gpu3").expect("the GPU");
    // gsaasd records who tainted it, before the reason.
    assert!(tainted["taint"].as_str().is_some_and(|t| t.ends_with(": fan noise")), "{tainted}");
    for name in ["horizon-launch.png", "horizon-project-gpus.png", "horizon-admin-gpus.png"] {
        let png = std::fs::read(screenshots.join(name)).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{name}: {} bytes", png.len());
    }

    // Borrowing from the forms: alpha (a quota of 1 cGPU) in a cohort with beta (2, unused), the
    // drained host back in service.
    let beta = Login::new(&reqwest::Client::new(), "beta").await;
    let (put, post) = (reqwest::Method::PUT, reqwest::Method::POST);
    let undrain = "/v1/hosts/gpu-host-1/undrain";
    let (status, host) =
        gsaasd.call(post, undrain, &operator.token, Some(&serde_json::json!({}))).await;
    assert_eq!(status, 200, "{host}");
    for (project, cgpus) in [(&alpha.project_id, 1), (&beta.project_id, 2)] {
        let limits = serde_json::json!({ "cgpus": cgpus });
        let path = format!("/v1/quotas/{project}");
        let (status, quota) = gsaasd.call(put.clone(), &path, &operator.token, Some(&limits)).await;
        assert_eq!(status, 200, "{quota}");
    }
    let members = serde_json::json!({ "members": { &alpha.project_id: {}, &beta.project_id: {} } });
    let (status, cohort) =
        gsaasd.call(put, "/v1/cohorts/horizon-lab", &operator.token, Some(&members)).await;
    assert_eq!(status, 200, "{cohort}");
    let mut pages = HorizonPages::sign_in(&url, &tenant, &tenant_password).await;
    let (status, form) = pages.get("/project/gpus/launch/").await;
    assert_eq!(status, 200, "{form}");
    assert!(form.contains("id=\"id_borrow\"") && form.contains("Borrow past the quota"), "{form}");
    let launch = [
        ("name", "horizon-borrow"),
        ("image", IMAGE),
        ("flavor", FLAVOR),
        ("ncgpus", "2"),
        ("mode", "exclusive"),
        ("locality", "any"),
        ("borrow", "on"),
    ];
    let (status, answer) = pages.post("/project/gpus/launch/", &form, &launch).await;
    assert_eq!(status, 302, "the launch form took it: {answer}");
    let (_, vms) = gsaasd.get("/v1/vms", &alpha.token).await;
    let vm = vms["vms"].as_array().unwrap().iter().find(|v| v["name"] == "horizon-borrow");
    let id = vm.and_then(|v| v["id"].as_str()).expect("the VM launched from the form").to_owned();
    let ready = gsaasd.until(&id, &alpha.token, &["ready", "error"]).await;
    let marks = |vm: &Value| -> Vec<bool> {
        let cgpus = vm["cgpus"].as_array().cloned().unwrap_or_default();
        cgpus.iter().map(|c| c["borrowed"] == true).collect()
    };
    assert_eq!(marks(&ready), [false, true], "the cGPU past the quota on loan: {ready}");
    // The attach form: its box too, one more cGPU on loan.
    let attach = format!("/project/gpus/{id}/attach/");
    let (status, form) = pages.get(&attach).await;
    assert_eq!(status, 200, "{form}");
    assert!(form.contains("id=\"id_borrow\""), "{form}");
    let fields = [("vm_id", id.as_str()), ("ncgpus", "1"), ("borrow", "on")];
    let (status, answer) = pages.post(&attach, &form, &fields).await;
    assert_eq!(status, 302, "the attach form took it: {answer}");
    let grown = gsaas_test_support::openstack::eventually("cGPU #2 live", || async {
        let (_, vm) = gsaasd.get(&format!("/v1/vms/{id}"), &alpha.token).await;
        let cgpus = vm["cgpus"].as_array()?;
        (cgpus.len() == 3 && cgpus.iter().all(|c| c["state"] == "live")).then_some(vm)
    })
    .await;
    assert_eq!(marks(&grown), [false, true, true], "{grown}");
    let (status, page) = pages.get("/project/gpus/").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(cell_text(&page, &id, "gsaas-borrowed").as_deref(), Some("#1, #2"), "{page}");
    assert!(page.contains("id=\"gsaas-cohort\"") && page.contains("horizon-lab"), "{page}");
    let (status, _) =
        gsaasd.call(reqwest::Method::DELETE, &format!("/v1/vms/{id}"), &alpha.token, None).await;
    assert_eq!(status, 202);
    let ended = gsaasd.until(&id, &alpha.token, &["deleted", "error"]).await;
    assert_eq!(ended["state"], "deleted", "{ended}");
}

/// `deploy/cloudkitty/` as shipped: Prometheus (Debian's `prometheus`) scrapes gsaasd's
/// `[metrics] listen` every second with `prometheus-scrape.yml`'s relabelling (`project` copied
/// to `project_id`), and CloudKitty's own collector code (`tests/cloudkitty_rating.py`) rates a
/// period with `metrics.yml`: its cGPU-hours per model and mode are gsaasd's usage report of the
/// same period. The counters' series exist (a first VM's) before the period, as in a cloud that
/// runs: `delta` cannot rate what a series held when Prometheus first saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudkitty_rates_the_usage_counters_through_a_real_prometheus() {
    use gsaas_test_support::{shared_launch, Store, TestService};
    let venv = client_venv("cloudkitty");
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let metrics = t.service().metrics_addr.expect("metrics.listen");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned();
    let deploy = workspace.join("deploy/cloudkitty");

    // Prometheus, scraping gsaasd as prometheus-scrape.yml says (its target and interval
    // replaced for the test).
    let scrape = std::fs::read_to_string(deploy.join("prometheus-scrape.yml")).unwrap();
    let relabel = &scrape[scrape.find("    metric_relabel_configs:").expect("the relabelling")..];
    let dir = t.dir.join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gsaasd\n    \
         scrape_interval: 1s\n    static_configs:\n      - targets: [\"{metrics}\"]\n{relabel}"
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut prometheus = Command::new("prometheus")
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus runs (Debian's prometheus package)");
    // CloudKitty takes Prometheus' HTTP API, as `[collector_prometheus] prometheus_url`.
    let url = format!("http://127.0.0.1:{port}/api/v1");

    // A first VM makes the series; then, in the period rated, a VM of 2 cGPUs for a few seconds,
    // with the counters flat (and scraped) at both ends.
    let member = t.member();
    let run = |seconds: u64| {
        let (t, member) = (&t, member.clone());
        async move {
            let id = t.launch(&member, &shared_launch(2, 1024)).await;
            t.wait_state(&member, &id, "ready").await;
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            t.delete(&member, &format!("/v1/vms/{id}")).await;
            t.wait_state(&member, &id, "deleted").await;
        }
    };
    run(1).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let unix = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let start = unix().as_secs() + 1;
    tokio::time::sleep(Duration::from_secs(3)).await;
    run(6).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let end = unix().as_secs();

    let rated = Command::new(venv.join("bin/python"))
        .arg(workspace.join("tests/cloudkitty_rating.py"))
        .arg(deploy.join("metrics.yml"))
        .arg(&url)
        .arg("alpha")
        .arg(start.to_string())
        .arg(end.to_string())
        .output()
        .expect("python runs");
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    assert!(
        rated.status.success(),
        "{}\nprometheus: {log}",
        String::from_utf8_lossy(&rated.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&rated.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cgpu: Vec<&Value> = lines.iter().filter(|l| l["metric"] == "cgpu").collect();
    assert_eq!(cgpu.len(), 1, "one model and mode rated: {lines:#?}\nprometheus: {log}");
    assert_eq!(cgpu[0]["groups"]["mode"], "shared", "{lines:#?}");
    assert_eq!(cgpu[0]["unit"], "cgpu-hour");

    let period = |s: u64| gsaas_test_support::rfc3339(s as i64 * 1000);
    let path = format!("/v1/usage/alpha?start={}&end={}", period(start), period(end));
    let (status, report) = t.get(&t.admin(), &path).await;
    assert_eq!(status, 200, "{report}");
    let used_hours = report["projects"][0]["cgpu_seconds"].as_f64().unwrap() / 3600.0;
    let rated_hours = cgpu[0]["qty"].as_f64().unwrap();
    assert!(used_hours > 10.0 / 3600.0, "two cGPUs for 6 s and more: {report}");
    // `delta` scales what its first and last samples in the range saw to the whole range: each
    // end by up to 1.1 times the mean scrape interval (1 s here, more when a loaded machine
    // scrapes late). With the counters flat at both ends, that only scales up: over a range of
    // `end - start` seconds, by up to range / (range - 2.2 s). Below what gsaasd counted, only
    // the counters' own granularity (10%).
    let range = (end - start) as f64;
    let most = used_hours * range / (range - 2.2).max(1.0) * 1.05;
    assert!(
        rated_hours >= used_hours * 0.9 && rated_hours <= most,
        "CloudKitty rated {rated_hours} cGPU-hours, gsaasd counted {used_hours} (at most {most} \
         over {range} s): {lines:#?}"
    );
    let memory: Vec<&Value> = lines.iter().filter(|l| l["metric"] == "gpu_memory").collect();
    let memory_gib_hours = memory[0]["qty"].as_f64().unwrap();
    assert!((memory_gib_hours - rated_hours).abs() <= 1e-6, "1 GiB per cGPU: {lines:#?}");
}

/// `deploy/ceilometer/gsaas-meters.yaml` as shipped, applied by Ceilometer's own notification
/// endpoint (`tests/ceilometer_meters.py`, Ceilometer 25.0.0 in its venv) to what gsaasd
/// published on a real RabbitMQ, read by an oslo.messaging listener as Ceilometer's notification
/// agent reads it: a VM's launch, attach, detach and termination become its meters, as does a
/// preemption that takes a cGPU back; each sample is on its VM, in the tenant's project, naming
/// no host, GPU or GPU server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ceilometer_meters_the_notifications_from_rabbitmq() {
    use gsaas_test_support::rabbitmq::Rabbit;
    use gsaas_test_support::{shared_launch_with, Store, TestService};
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};

    let venv = client_venv("ceilometer");
    let rabbit = Rabbit::start().await;
    let url = rabbit.transport_url();
    let t = TestService::start_with(Store::Sqlite, |c| {
        c.notifications.transport_url = Some(url.clone().into());
        c.notifications.poll_ms = 20;
        c.quotas.max_priority = 100;
    })
    .await;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned();
    let stderr_path = t.dir.join("ceilometer.log");
    let mut ceilometer = Command::new(venv.join("bin/python"))
        .arg(workspace.join("tests/ceilometer_meters.py"))
        .arg(workspace.join("deploy/ceilometer"))
        .arg(&url)
        .arg(&t.service().app.config.notifications.exchange)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("python runs");
    let lines = Arc::new(Mutex::new(Vec::<Value>::new()));
    let stdout = ceilometer.stdout.take().unwrap();
    // Killed however the test ends: an oslo.messaging listener whose broker is gone retries
    // for ever.
    let ceilometer = Reaped(ceilometer);
    {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                lines.lock().unwrap().push(value);
            }
        });
    }
    let log = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    // Waits on this thread, handed off by the runtime (`block_in_place`) so gsaasd's tasks, which
    // publish what is waited for, keep both workers.
    let wait_for = |what: &str, done: &dyn Fn(&[Value]) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if done(&lines.lock().unwrap()) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "waited a minute for {what}: {:#?}\nceilometer: {}",
                lines.lock().unwrap(),
                log()
            );
            tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(50)));
        }
    };
    wait_for("the listener", &|l| l.iter().any(|v| v == "listening"));
    let definitions = lines.lock().unwrap()[0]["definitions"].clone();
    assert_eq!(
        definitions,
        serde_json::json!(["gpu.vm", "gpu.vm.cgpus", "gpu.vm.memory", "gpu.vm.preemption"]),
        "every meter of the file loads: {}",
        log()
    );

    // A VM's life: two cGPUs of 1 GiB, a third of 2 GiB attached, the first detached, ended.
    let member = t.member();
    let launch = shared_launch_with(2, 1024, serde_json::json!({"name": "metered"}));
    let a = t.launch(&member, &launch).await;
    t.wait_state(&member, &a, "ready").await;
    t.attach_one_and_wait(&member, &a, 2048, 3).await;
    let mut hidden = gsaas_test_support::cgpu_locations(&t.admin_cgpus(&a).await);
    assert!(!hidden.is_empty());
    t.detach_and_wait(&member, &a, 0, 2).await;
    t.terminate_and_wait(&member, &a).await;

    // A preemption: beta's urgent launch takes one of alpha's two exclusive, preemptible cGPUs.
    let beta = t.token("beta", gsaasd::auth::Role::Member);
    let gsaas_test_support::Preemption { best_effort, protected, urgent } =
        t.preempt_one_cgpu(&member, &beta).await;
    // The taken cGPU's GPU is the urgent VM's now.
    for vm in [&best_effort, &protected, &urgent] {
        hidden.extend(gsaas_test_support::cgpu_locations(&t.admin_cgpus(vm).await));
    }

    let of = |l: &[Value], vm: &str, name: &str| -> Vec<Value> {
        l.iter().filter(|s| s["name"] == name && s["resource_id"] == vm).cloned().collect()
    };
    // gpu.vm: one sample at create.end and one at delete.end; the preempted VM's gauges: at
    // create.end, at the preemption and at the taken cGPU's detach.end.
    wait_for("the VM's end", &|l| of(l, &a, "gpu.vm").len() == 2);
    wait_for("the preempted cGPU's release", &|l| of(l, &best_effort, "gpu.vm.cgpus").len() == 3);
    drop(ceilometer);
    let samples = lines.lock().unwrap().clone();

    // In the order of the notifications' times: Ceilometer's listener handles messages on a
    // pool of threads, so samples may be printed out of order.
    let volumes = |vm: &str, name: &str| -> Vec<f64> {
        let mut of = of(&samples, vm, name);
        of.sort_by(|x, y| x["timestamp"].as_str().cmp(&y["timestamp"].as_str()));
        of.iter().map(|s| s["volume"].as_f64().unwrap_or(f64::NAN)).collect()
    };
    // create.end, attach.end, detach.end, and delete.end with what the VM held when it ended
    // (as Nova's delete.end describes the instance's flavor).
    assert_eq!(volumes(&a, "gpu.vm.cgpus"), [2.0, 3.0, 2.0, 2.0], "{samples:#?}");
    assert_eq!(volumes(&a, "gpu.vm.memory"), [2048.0, 4096.0, 3072.0, 3072.0], "{samples:#?}");
    assert_eq!(volumes(&a, "gpu.vm"), [1.0, 1.0], "{samples:#?}");
    // The preemption: one cGPU taken (a delta), the gauges down to one exclusive GPU's memory.
    assert_eq!(volumes(&best_effort, "gpu.vm.preemption"), [1.0], "{samples:#?}");
    assert_eq!(volumes(&best_effort, "gpu.vm.cgpus"), [2.0, 1.0, 1.0], "{samples:#?}");
    let memory = volumes(&best_effort, "gpu.vm.memory");
    assert!(memory[0] > 0.0 && memory[1..] == [memory[0] / 2.0; 2], "{samples:#?}");
    let preemption = &of(&samples, &best_effort, "gpu.vm.preemption")[0];
    assert_eq!(preemption["type"], "delta", "{preemption}");
    let model = preemption["metadata"]["model"].as_str().unwrap_or_default();
    assert!(!model.is_empty(), "the taken cGPU's GPU model: {preemption}");
    assert!(of(&samples, &protected, "gpu.vm.preemption").is_empty(), "{samples:#?}");
    // Each sample in its VM's project, by the launching user (the member token's subject).
    for s in samples.iter().filter(|s| s.get("name").is_some()) {
        let project = if [&a, &best_effort].iter().any(|vm| s["resource_id"] == vm.as_str()) {
            "alpha"
        } else {
            assert!([&protected, &urgent].iter().any(|vm| s["resource_id"] == vm.as_str()), "{s}");
            "beta"
        };
        assert_eq!((&s["project_id"], &s["user_id"]), (&project.into(), &project.into()), "{s}");
        let kind = if s["name"] == "gpu.vm.preemption" { "delta" } else { "gauge" };
        assert_eq!(s["type"], kind, "{s}");
        let text = s.to_string();
        for secret in &hidden {
            assert!(!text.contains(secret.as_str()), "a sample names {secret}: {s}");
        }
    }
    let units: Vec<Value> = ["gpu.vm", "gpu.vm.cgpus", "gpu.vm.memory"]
        .iter()
        .map(|n| of(&samples, &a, n)[0]["unit"].clone())
        .collect();
    assert_eq!(units, ["vm", "cgpu", "MiB"]);
    assert_eq!(preemption["unit"], "cgpu");
    assert_eq!(of(&samples, &a, "gpu.vm")[0]["metadata"]["display_name"], "metered");
}
