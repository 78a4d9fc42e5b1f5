//! The `gsaas` binary against a real gsaasd on the embedded default (SQLite, simulated cloud) started
//! on a free port: both syntaxes, every command, `-f json` parsed back, errors and exit codes.

use std::process::{Command, Output};
use std::time::Duration;

use gsaasd::auth::Role;
use serde_json::Value;

struct Server {
    runtime: tokio::runtime::Runtime,
    service: Option<gsaasd::service::Service>,
    dir: std::path::PathBuf,
}

impl Server {
    fn start() -> Server {
        Server::start_with(|_| {})
    }

    /// [`Server::start`] with gsaasd's config changed by `tweak`.
    fn start_with(tweak: impl FnOnce(&mut gsaasd::config::Config)) -> Server {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gsaas-cli-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut config =
            gsaasd::config::Config { data_dir: dir.join("data"), ..Default::default() };
        config.listen = "127.0.0.1:0".parse().unwrap();
        tweak(&mut config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let service = runtime.block_on(gsaasd::service::start(config)).expect("gsaasd starts");
        Server { runtime, service: Some(service), dir }
    }

    fn url(&self) -> String {
        self.service.as_ref().unwrap().url()
    }

    fn token(&self, project: &str, role: Role) -> String {
        self.service.as_ref().unwrap().app.keys.issue(
            project,
            Some(project),
            role,
            Duration::from_secs(600),
        )
    }

    /// `gsaas` with `args`, this server's URL and `token`, and nothing else from the environment.
    fn command(&self, token: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gsaas"));
        command
            .args(args)
            .env("GSAAS_URL", self.url())
            .env("GSAAS_TOKEN", token)
            .env_remove("GSAAS_CONFIG")
            .env("HOME", &self.dir)
            .env_remove("GSAAS_IMAGE")
            .env_remove("GSAAS_FLAVOR")
            .env_remove("OS_CLOUD")
            .env_remove("OS_AUTH_URL")
            .env_remove("OS_TOKEN");
        command
    }

    /// Runs `gsaas` (see [`Server::command`]).
    fn gsaas(&self, token: &str, args: &[&str]) -> Output {
        self.command(token, args).output().expect("gsaas runs")
    }

    /// Starts `gsaas` (see [`Server::command`]), its output piped.
    fn spawn_gsaas(&self, token: &str, args: &[&str]) -> std::process::Child {
        self.command(token, args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("gsaas runs")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(service) = self.service.take() {
            let _guard = self.runtime.enter();
            service.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

const VM: [&str; 4] = ["--image", "cirros-0.6.2", "--flavor", "m1.small"];

#[test]
fn launch_show_env_list_terminate_with_both_syntaxes() {
    let server = Server::start();
    let token = server.token("demo", Role::Member);

    // Modern syntax, followed to ready.
    let mut args = vec![
        "-f",
        "json",
        "launch",
        "--ncgpus",
        "2",
        "--poolmem",
        "2048",
        "--mode",
        "shared",
        "--wait",
    ];
    args.extend(VM);
    let launched = server.gsaas(&token, &args);
    let vm = json(&launched);
    assert_eq!(vm["state"], "ready", "{vm}");
    assert_eq!(vm["cgpus"].as_array().unwrap().len(), 2);
    let progress = stderr(&launched);
    for stage in [
        "checking",
        "selecting GPUs",
        "creating VM",
        "activating",
        "deploying",
        "configuring routes",
    ] {
        assert!(progress.contains(stage), "stage {stage} not reported: {progress}");
    }
    let id = vm["id"].as_str().unwrap().to_owned();

    // The paper's syntax, with image and flavor from the environment.
    let paper = Command::new(env!("CARGO_BIN_EXE_gsaas"))
        .args(["-f", "json", "-l", "-ncgpus=1", "-poolmem=1024", "-mode=shared", "-locality=local"])
        .env("GSAAS_URL", server.url())
        .env("GSAAS_TOKEN", &token)
        .env("GSAAS_IMAGE", "cirros-0.6.2")
        .env("GSAAS_FLAVOR", "m1.small")
        .output()
        .unwrap();
    let second = json(&paper);
    assert_eq!(second["gpus"]["locality"], "local");
    assert_eq!(second["gpus"]["mode"], "shared");
    let second_id = second["id"].as_str().unwrap().to_owned();

    // list (table and JSON), show, env.
    let table = server.gsaas(&token, &["list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains(&id) && text.contains(&second_id), "{text}");
    let listed = json(&server.gsaas(&token, &["-f", "json", "list"]));
    assert_eq!(listed["vms"].as_array().unwrap().len(), 2);
    let shown = json(&server.gsaas(&token, &["-f", "json", "show", &id]));
    assert_eq!(shown["id"], id.as_str());
    let env = server.gsaas(&token, &["env", &id]);
    let env = String::from_utf8_lossy(&env.stdout);
    assert!(env.contains("export RCUDA_DEVICE_COUNT='2'"), "{env}");
    assert!(env.contains("export RCUDA_DEVICE_1='100.127.0.1@8309:0'"), "{env}");
    // Which cGPU each device is, and none missing.
    assert!(env.contains("export GSAAS_CGPUS='0,1'"), "{env}");
    assert!(env.contains("export GSAAS_CGPUS_MISSING=''"), "{env}");
    assert_eq!(shown["gpus"]["remoting"], "rcuda", "the service's default layer: {shown}");

    // Attach and detach, followed until done.
    let attached = json(&server.gsaas(
        &token,
        &[
            "-f",
            "json",
            "attach",
            &id,
            "--ncgpus",
            "2",
            "--poolmem",
            "1024",
            "--mode",
            "shared",
            "--wait",
        ],
    ));
    let states: Vec<&str> = attached["cgpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["live"; 4], "{attached}");
    let table = server.gsaas(&token, &["detach", &id, "1", "--wait"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("100.127.0.1:8311") && !text.contains("100.127.0.1:8309"), "{text}");
    let env = server.gsaas(&token, &["env", &id]);
    let env = String::from_utf8_lossy(&env.stdout);
    assert!(env.contains("export RCUDA_DEVICE_COUNT='3'"), "{env}");
    assert!(env.contains("export RCUDA_DEVICE_1='100.127.0.1@8310:0'"), "{env}");
    let missing = server.gsaas(&token, &["detach", &id, "1"]);
    assert_eq!(missing.status.code(), Some(3), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("cGPU 1 not found"), "{}", stderr(&missing));

    // Terminate: the paper's syntax and the modern one.
    let gone =
        json(&server.gsaas(&token, &["-f", "json", "-t", &format!("-id={second_id}"), "--wait"]));
    assert_eq!(gone["state"], "deleted");
    let gone = json(&server.gsaas(&token, &["-f", "json", "terminate", &id, "--wait"]));
    assert_eq!(gone["state"], "deleted");
    let pool = json(&server.gsaas(&token, &["-f", "json", "pool"]));
    assert_eq!(pool["totals"]["allocated_mib"], 0);
}

/// `gsaas -l -ncgpus=2 -poolmem=2048 -mode=shared`, exactly as the dissertation types it, as a
/// member of `server`: the VM gets `image` and `flavor`, the service's defaults.
fn the_papers_command_launches_with(server: &Server, image: &str, flavor: &str) {
    let token = server.token("demo", Role::Member);
    let paper =
        server.gsaas(&token, &["-f", "json", "-l", "-ncgpus=2", "-poolmem=2048", "-mode=shared"]);
    assert!(paper.status.success(), "{}", stderr(&paper));
    let vm = json(&paper);
    assert_eq!((vm["image"].as_str(), vm["flavor"].as_str()), (Some(image), Some(flavor)), "{vm}");
    assert_eq!(vm["gpus"]["ncgpus"], 2, "{vm}");
    assert_eq!(vm["gpus"]["mode"], "shared", "{vm}");
}

/// The dissertation's command works as typed when the service names a default image and flavor.
#[test]
fn the_papers_command_works_as_typed_with_the_services_image_and_flavor() {
    let server = Server::start_with(|config| {
        config.launch.default_image = Some("ubuntu-22.04".into());
        config.launch.default_flavor = Some("m1.small".into());
    });
    the_papers_command_launches_with(&server, "ubuntu-22.04", "m1.small");
}

/// On the embedded default (the simulated cloud, no `[launch]` defaults), the dissertation's
/// command works as typed: the simulated cloud's first image and flavor are the service's.
#[test]
fn the_papers_command_works_as_typed_on_the_embedded_default() {
    the_papers_command_launches_with(&Server::start(), "cirros-0.6.2", "m1.tiny");
}

#[test]
fn errors_are_one_line_with_distinct_exit_codes() {
    let server = Server::start();
    let token = server.token("demo", Role::Member);
    let admin = server.token("ops", Role::Admin);
    let check = |output: Output, code: i32, says: &str| {
        assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
        let message = stderr(&output);
        assert!(message.contains(says), "{message}");
        assert_eq!(message.trim_end().lines().count(), 1, "one line: {message}");
        assert!(!message.contains("panicked") && !message.contains("backtrace"));
    };
    // Usage: bad arguments, a missing image, a field the service refuses.
    let output = server.gsaas(&token, &["launch", "--ncgpus", "two"]);
    assert_eq!(output.status.code(), Some(2));
    // No image anywhere (a simulated cloud that lists none, so the service names no default):
    // refused by the service, naming it.
    let bare = Server::start_with(|config| config.cloud.sim_mut().unwrap().images.clear());
    let bare_token = bare.token("demo", Role::Member);
    check(bare.gsaas(&bare_token, &["launch", "--ncgpus", "1"]), 2, "image: is required");
    let mut args = vec!["launch", "--ncgpus", "1", "--mode", "shared"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 2, "gpu_memory_mib");
    let mut args = vec!["launch", "--ncgpus", "1", "--gpu-model", "V100"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 2, "gpu_model");
    let mut args = vec!["launch", "--ncgpus", "1", "--require-trait", "nvlink"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 2, "traits.required");
    // The testbed's GPUs are served by rCUDA: no GPU speaks LUPINE; and no layer is "scuda".
    let mut args = vec!["launch", "--ncgpus", "1", "--remoting", "lupine"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 2, "remoting");
    let mut args = vec!["launch", "--ncgpus", "1", "--remoting", "scuda"];
    args.extend(VM);
    assert_eq!(server.gsaas(&token, &args).status.code(), Some(2));
    // The testbed's hosts are on one switch: no rack to ask for.
    let mut args = vec!["launch", "--ncgpus", "1", "--same", "rack", "--same-preferred"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 2, "network.same");
    let mut args = vec!["launch", "--ncgpus", "1", "--max-rtt-us", "0"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 2, "network.max_rtt_us");
    let output =
        server.gsaas(&token, &["launch", "--ncgpus", "1", "--min-compute-capability", "8"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    // Not found.
    check(server.gsaas(&token, &["show", "00000000-0000-0000-0000-000000000000"]), 3, "not found");
    check(server.gsaas(&token, &["hosts"]), 3, "not found");
    // No capacity.
    let mut args = vec!["launch", "--ncgpus", "5"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 4, "no GPU capacity");
    // Authentication.
    check(server.gsaas("", &["list"]), 5, "gsaasd token issue");
    check(server.gsaas("nonsense", &["list"]), 5, "authentication failed");
    // Unreachable service.
    let output = Command::new(env!("CARGO_BIN_EXE_gsaas"))
        .args(["list"])
        .env("GSAAS_URL", "http://127.0.0.1:9")
        .env("GSAAS_TOKEN", &token)
        .output()
        .unwrap();
    check(output, 6, "http://127.0.0.1:9");
    // Admin commands work for admins.
    let hosts = json(&server.gsaas(&admin, &["-f", "json", "hosts"]));
    assert_eq!(hosts["hosts"].as_array().unwrap().len(), 4);
    let drained = json(&server.gsaas(&admin, &["-f", "json", "drain", "compute-gpu"]));
    assert_eq!(drained["state"], "drained");
    let mut args = vec!["launch", "--ncgpus", "1"];
    args.extend(VM);
    check(server.gsaas(&token, &args), 4, "no GPU capacity");
    let undrained = json(&server.gsaas(&admin, &["-f", "json", "undrain", "compute-gpu"]));
    assert_eq!(undrained["state"], "schedulable");
    // A config file can hold everything; a missing explicit one is an error naming it.
    let config = server.dir.join("gsaas.toml");
    std::fs::write(
        &config,
        format!(
            "url = \"{}\"\ntoken = \"{token}\"\nimage = \"cirros-0.6.2\"\nflavor = \"m1.small\"\n",
            server.url()
        ),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_gsaas"))
        .args(["-f", "json", "--config"])
        .arg(&config)
        .args(["launch", "--ncgpus", "1"])
        .env_remove("GSAAS_URL")
        .env_remove("GSAAS_TOKEN")
        .output()
        .unwrap();
    assert_eq!(json(&output)["state"], "creating");
    check(
        server.gsaas(&token, &["--config", "/nonexistent/gsaas.toml", "list"]),
        2,
        "/nonexistent/gsaas.toml",
    );
    // Help documents the exit codes and the paper's examples.
    let help = server.gsaas(&token, &["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Exit codes") && help.contains("gsaas -t -id=<VMid>"), "{help}");
}

#[test]
fn quotas_are_shown_set_and_enforced_with_their_own_exit_message() {
    let server = Server::start();
    let (admin, member) = (server.token("ops", Role::Admin), server.token("alpha", Role::Member));

    // Only the limits given change; `none` is no limit.
    let set = json(&server.gsaas(&admin, &["-f", "json", "quota", "set", "alpha", "--cgpus", "2"]));
    assert_eq!(set["limits"]["cgpus"], 2, "{set}");
    let set = json(&server.gsaas(
        &admin,
        &["-f", "json", "quota", "set", "alpha", "--vms", "3", "--memory-mib", "none"],
    ));
    assert_eq!((&set["limits"]["cgpus"], &set["limits"]["vms"]), (&2.into(), &3.into()), "{set}");
    assert!(set["limits"]["memory_mib"].is_null(), "{set}");
    let nothing = server.gsaas(&admin, &["quota", "set", "alpha"]);
    assert_eq!(nothing.status.code(), Some(2), "{}", stderr(&nothing));
    let bad = server.gsaas(&admin, &["quota", "set", "alpha", "--cgpus", "-3"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    let tenant = server.gsaas(&member, &["quota", "set", "alpha", "--cgpus", "9"]);
    assert_eq!(tenant.status.code(), Some(3), "{}", stderr(&tenant));

    // A launch past the limit: exit 1, "over quota", naming the resource.
    let launch = ["launch", "--ncgpus", "3", "--poolmem", "512", "--mode", "shared"];
    let over = server.gsaas(&member, &[&launch[..], &VM[..]].concat());
    assert_eq!(over.status.code(), Some(1), "{}", stderr(&over));
    assert!(
        stderr(&over).contains("over quota") && stderr(&over).contains("cgpus"),
        "{}",
        stderr(&over)
    );

    // The tenant's own view, as a table; the admin's list, and a reset.
    let shown = server.gsaas(&member, &["quota", "show"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("alpha") && text.contains("0 / 2") && text.contains("0 / none"),
        "{text}"
    );
    let shown = server.gsaas(&member, &["quota", "show", "alpha"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("its own limits") && text.contains("0 / 3"), "{text}");
    let other = server.gsaas(&member, &["quota", "show", "beta"]);
    assert_eq!(other.status.code(), Some(3), "{}", stderr(&other));
    // Limits per GPU model: set, shown in a table of their own, enforced naming the model, and
    // dropped once none is left.
    let m4000 = "NVIDIA Quadro M4000";
    let on_model = ["quota", "set", "alpha", "--model", m4000];
    let set =
        json(&server.gsaas(&admin, &[&["-f", "json"][..], &on_model, &["--cgpus", "1"]].concat()));
    assert_eq!(set["limits"]["models"][m4000]["cgpus"], 1, "{set}");
    assert_eq!(set["limits"]["cgpus"], 2, "the totals stay: {set}");
    let not_per_model = server.gsaas(&admin, &[&on_model[..], &["--vms", "1"]].concat());
    assert_eq!(not_per_model.status.code(), Some(2), "{}", stderr(&not_per_model));
    let shown = server.gsaas(&member, &["quota", "show", "alpha"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("model") && text.contains(m4000) && text.contains("0 / 1"), "{text}");
    let two = ["launch", "--ncgpus", "2", "--poolmem", "512", "--mode", "shared"];
    let over = server.gsaas(&member, &[&two[..], &VM[..]].concat());
    assert_eq!(over.status.code(), Some(1), "{}", stderr(&over));
    assert!(stderr(&over).contains(&format!("of GPU model {m4000}")), "{}", stderr(&over));
    let cleared = [&["-f", "json"][..], &on_model, &["--cgpus", "none"]].concat();
    let set = json(&server.gsaas(&admin, &cleared));
    assert_eq!(set["limits"]["models"], serde_json::json!({}), "{set}");
    let reset = json(&server.gsaas(&admin, &["-f", "json", "quota", "reset", "alpha"]));
    assert_eq!(reset["own_limits"], false, "{reset}");
}

#[test]
fn cohorts_are_set_member_by_member_and_a_launch_borrows_when_asked() {
    let server = Server::start();
    let (admin, member) = (server.token("ops", Role::Admin), server.token("alpha", Role::Member));
    server.gsaas(&admin, &["quota", "set", "alpha", "--cgpus", "1"]);
    server.gsaas(&admin, &["quota", "set", "beta", "--cgpus", "3"]);
    // Member by member: terms not given stay.
    let set = ["-f", "json", "cohort", "set", "lab", "alpha", "--borrow-cgpus", "2"];
    let lab = json(&server.gsaas(&admin, &set));
    assert_eq!(lab["members"]["alpha"]["terms"]["borrowing_limit"]["cgpus"], 2, "{lab}");
    let set = ["-f", "json", "cohort", "set", "lab", "beta", "--lend-cgpus", "1"];
    let lab = json(&server.gsaas(&admin, &set));
    assert_eq!(lab["members"]["alpha"]["terms"]["borrowing_limit"]["cgpus"], 2, "{lab}");
    assert_eq!(lab["lendable"]["cgpus"], 2, "alpha's 1 and beta's 1: {lab}");
    let tenant = server.gsaas(&member, &["cohort", "show"]);
    assert_ne!(tenant.status.code(), Some(0), "a tenant read the cohorts");
    let bad = server.gsaas(&admin, &["cohort", "set", "lab", "alpha", "--lend-cgpus", "-1"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));

    // Past the quota: refused unless asked; asked, the second cGPU is on loan and shown so.
    let two = [&["launch", "--ncgpus", "2", "--poolmem", "512", "--mode", "shared"][..], &VM[..]]
        .concat();
    let over = server.gsaas(&member, &two);
    assert_eq!(over.status.code(), Some(1), "{}", stderr(&over));
    let borrowing = [&two[..], &["--borrow", "--wait"]].concat();
    let vm = server.gsaas(&member, &borrowing);
    let text = String::from_utf8_lossy(&vm.stdout);
    assert!(text.contains("borrowed") && text.contains("yes"), "{text} {}", stderr(&vm));
    let shown = server.gsaas(&member, &["quota", "show", "alpha"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("cohort: lab") && text.contains("1 / 0 / 0"), "{text}");
    let table = String::from_utf8_lossy(&server.gsaas(&admin, &["cohort", "show", "lab"]).stdout)
        .into_owned();
    assert!(table.contains("alpha") && table.contains("borrowing limit"), "{table}");
    // Per GPU model: the totals stay; a model left with no limit is dropped.
    let set =
        ["-f", "json", "cohort", "set", "lab", "alpha", "--model", "T4", "--borrow-cgpus", "0"];
    let lab = json(&server.gsaas(&admin, &set));
    let terms = &lab["members"]["alpha"]["terms"];
    assert_eq!(terms["borrowing_limit_by_model"]["T4"]["cgpus"], 0, "{lab}");
    assert_eq!(terms["borrowing_limit"]["cgpus"], 2, "{lab}");
    let table = String::from_utf8_lossy(&server.gsaas(&admin, &["cohort", "show", "lab"]).stdout)
        .into_owned();
    assert!(table.contains("alpha borrows at most 0 / none / none of GPU model T4"), "{table}");
    let mixed = ["cohort", "set", "lab", "alpha", "--model", "T4", "--lend-cgpus", "1"];
    let mixed = server.gsaas(&admin, &mixed);
    assert_eq!(mixed.status.code(), Some(2), "{}", stderr(&mixed));
    let set =
        ["-f", "json", "cohort", "set", "lab", "alpha", "--model", "T4", "--borrow-cgpus", "none"];
    let lab = json(&server.gsaas(&admin, &set));
    assert!(lab["members"]["alpha"]["terms"].get("borrowing_limit_by_model").is_none(), "{lab}");

    // Six admins, each putting a project in at once: each reads, changes its member and writes
    // back only as read (again after a 412), so all six are in.
    let joining: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    let runs: Vec<_> = joining
        .iter()
        .map(|p| server.spawn_gsaas(&admin, &["cohort", "set", "lab", p, "--borrow-cgpus", "1"]))
        .collect();
    for run in runs {
        let out = run.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let lab = json(&server.gsaas(&admin, &["-f", "json", "cohort", "show", "lab"]));
    for p in joining.iter().map(String::as_str).chain(["alpha", "beta"]) {
        assert_eq!(lab["members"][p]["terms"]["borrowing_limit"]["cgpus"].is_null(), p == "beta");
    }
    for p in &joining {
        server.gsaas(&admin, &["cohort", "remove", "lab", p]);
    }

    // Members out one by one: the last one out ends the cohort.
    server.gsaas(&admin, &["cohort", "remove", "lab", "beta"]);
    let gone = server.gsaas(&admin, &["cohort", "remove", "lab", "beta"]);
    assert_eq!(gone.status.code(), Some(3), "{}", stderr(&gone));
    let last = server.gsaas(&admin, &["cohort", "remove", "lab", "alpha"]);
    assert!(String::from_utf8_lossy(&last.stdout).contains("ended"), "{}", stderr(&last));
    let list =
        String::from_utf8_lossy(&server.gsaas(&admin, &["cohort", "show"]).stdout).into_owned();
    assert!(!list.contains("lab"), "{list}");
}

#[test]
fn a_queued_launch_shows_its_place_while_it_waits_and_starts_when_gpus_free() {
    let server = Server::start();
    let member = server.token("alpha", Role::Member);
    let all = [&["-f", "json", "launch", "--ncgpus", "4", "--wait"][..], &VM[..]].concat();
    let big = json(&server.gsaas(&member, &all));
    assert_eq!(big["state"], "ready", "{big}");
    // Without --queue: refused; with it, the launch waits and says where it stands.
    let one = [&["launch", "--ncgpus", "1"][..], &VM[..]].concat();
    let refused = server.gsaas(&member, &one);
    assert_eq!(refused.status.code(), Some(4), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("no GPU capacity"), "{}", stderr(&refused));
    // Priorities above 0 are the admins' to give.
    let urgent = [&one[..], &["--queue", "--priority", "3", "--wait"][..]].concat();
    let refused = server.gsaas(&member, &urgent);
    assert!(stderr(&refused).contains("max_priority, 0"), "{}", stderr(&refused));
    let admin = server.token("ops", Role::Admin);
    let raised = server.gsaas(&admin, &["quota", "set", "alpha", "--max-priority", "3"]);
    let text = String::from_utf8_lossy(&raised.stdout);
    assert!(text.contains("highest priority: 3"), "{text} {}", stderr(&raised));
    let waiting = server.spawn_gsaas(&member, &urgent);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list = json(&server.gsaas(&member, &["-f", "json", "list"]));
        let queued = list["vms"].as_array().unwrap().iter().any(|vm| vm["state"] == "queued");
        if queued {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the launch never queued: {list}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let id = big["id"].as_str().unwrap();
    let done = server.gsaas(&member, &["terminate", id]);
    assert!(done.status.success(), "{}", stderr(&done));
    let output = waiting.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("queued: position 1"), "{}", stderr(&output));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("ready"), "{shown}");
}

#[test]
fn a_queued_attach_shows_its_place_and_the_vm_grows_when_gpus_free() {
    let server = Server::start();
    let member = server.token("alpha", Role::Member);
    let launch = |n: &str| {
        let args = [&["-f", "json", "launch", "--ncgpus", n, "--wait"][..], &VM[..]].concat();
        json(&server.gsaas(&member, &args))
    };
    let (big, small) = (launch("3"), launch("1"));
    let small = small["id"].as_str().unwrap().to_owned();
    let refused = server.gsaas(&member, &["attach", &small, "--ncgpus", "1"]);
    assert_eq!(refused.status.code(), Some(4), "{}", stderr(&refused));
    let waiting =
        server.spawn_gsaas(&member, &["attach", &small, "--ncgpus", "1", "--queue", "--wait"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let vm = json(&server.gsaas(&member, &["-f", "json", "show", &small]));
        if vm.get("queued_attaches").is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the attach never queued: {vm}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let shown = server.gsaas(&member, &["show", &small]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("queue position  1") && text.contains("attach"), "{text}");
    let queue = server.gsaas(&member, &["queue"]);
    let text = String::from_utf8_lossy(&queue.stdout);
    assert!(text.contains("waiting: 1 at priority 0") && text.contains(&small), "{text}");
    assert!(text.contains("attach") && text.contains("1 exclusive"), "{text}");
    let done = server.gsaas(&member, &["terminate", big["id"].as_str().unwrap()]);
    assert!(done.status.success(), "{}", stderr(&done));
    let output = waiting.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("queued: position 1"), "{}", stderr(&output));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("attached from the queue"), "{shown}");
    assert_eq!(shown.matches("live").count(), 2, "{shown}");
}

#[test]
fn admins_taint_evacuate_and_forget_and_see_gpu_conditions() {
    let server = Server::start();
    let token = server.token("demo", Role::Member);
    let admin = server.token("ops", Role::Admin);
    // The testbed's GPUs are Quadro M4000s, of compute capability 5.2.
    let mut args = vec!["-f", "json", "launch", "--ncgpus", "1", "--wait"];
    args.extend(["--gpu-model", "NVIDIA Quadro M4000", "--min-compute-capability", "5.0"]);
    args.extend(["--require-trait", "HW_GPU_CUDA_COMPUTE_CAPABILITY_V5_2"]);
    args.extend(["--avoid-trait", "CUSTOM_NVLINK"]);
    args.extend(VM);
    let vm = json(&server.gsaas(&token, &args));
    assert_eq!(vm["gpus"]["gpu_model"][0], "NVIDIA Quadro M4000", "{vm}");
    assert_eq!(vm["gpus"]["traits"]["avoid"][0], "CUSTOM_NVLINK", "{vm}");
    let id = vm["id"].as_str().unwrap().to_owned();
    let shown = json(&server.gsaas(&admin, &["-f", "json", "show", &id]));
    let gpu = shown["cgpus"][0]["gpu"].as_str().unwrap().to_owned();

    let tainted = json(&server.gsaas(&admin, &["-f", "json", "taint", &gpu, "--reason", "XID 79"]));
    assert!(tainted["taint"].as_str().unwrap().contains("XID 79"), "{tainted}");
    let moved = server.gsaas(&admin, &["evacuate", "--gpu", &gpu]);
    assert!(moved.status.success(), "{}", stderr(&moved));
    let text = String::from_utf8_lossy(&moved.stdout);
    assert!(text.contains("moved 1 cGPU(s) of 1 VM(s)"), "{text}");
    let after = json(&server.gsaas(&admin, &["-f", "json", "show", &id]));
    assert_ne!(after["cgpus"][0]["gpu"], gpu.as_str());
    assert_eq!(after["cgpus"][0]["masked_endpoint"], shown["cgpus"][0]["masked_endpoint"]);
    let pool = server.gsaas(&admin, &["pool"]);
    let text = String::from_utf8_lossy(&pool.stdout);
    assert!(text.contains("tainted: ops: XID 79"), "{text}");
    assert!(text.contains("NVIDIA Quadro M4000 (5.2)"), "{text}");
    assert!(server.gsaas(&admin, &["fences"]).status.success());
    // The background tasks: listed, and one run on demand; not a tenant's to see.
    let tasks = server.gsaas(&admin, &["tasks"]);
    let text = String::from_utf8_lossy(&tasks.stdout);
    assert!(text.contains("route_tables") && text.contains("queue_rounds"), "{text}");
    let ran = json(&server.gsaas(&admin, &["-f", "json", "tasks", "--activate", "route_tables"]));
    assert_eq!(ran["last_outcome"], "ok", "{ran}");
    assert!(ran["activations"].as_u64().unwrap() >= 1, "{ran}");
    assert!(!server.gsaas(&token, &["tasks"]).status.success(), "a tenant sees no tasks");
    let untainted = json(&server.gsaas(&admin, &["-f", "json", "untaint", &gpu]));
    assert!(untainted["taint"].is_null());

    // Forgetting a host whose agent is alive needs --force.
    let refused = server.gsaas(&admin, &["forget", "compute0-rgpu"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("force"), "{}", stderr(&refused));
    let forgotten =
        json(&server.gsaas(&admin, &["-f", "json", "forget", "compute0-rgpu", "--force"]));
    assert_eq!(forgotten["forgotten"], true);
    let hosts = server.gsaas(&admin, &["hosts"]);
    assert!(String::from_utf8_lossy(&hosts.stdout).contains("(forgotten)"));
    // Tenants cannot, and evacuate needs a GPU or a host.
    assert!(!server.gsaas(&token, &["evacuate", "--gpu", &gpu]).status.success());
    assert_eq!(server.gsaas(&admin, &["evacuate"]).status.code(), Some(2));
}

#[test]
fn usage_is_reported_as_tables_json_and_csv() {
    let server = Server::start();
    let (admin, member) = (server.token("ops", Role::Admin), server.token("alpha", Role::Member));
    let launch =
        [&["-f", "json", "launch", "--ncgpus", "2", "--wait", "--name", "train"][..], &VM].concat();
    let vm = json(&server.gsaas(&member, &launch));
    let id = vm["id"].as_str().unwrap();
    let done = server.gsaas(&member, &["terminate", id, "--wait"]);
    assert!(done.status.success(), "{}", stderr(&done));

    let (start, end) = ("2000-01-01", "2100-01-01T00:00:00+00:00");
    let report = json(
        &server.gsaas(&member, &["-f", "json", "usage", "alpha", "--start", start, "--end", end]),
    );
    let alpha = &report["projects"][0];
    assert_eq!(alpha["project"], "alpha", "{report}");
    assert!(alpha["cgpu_seconds"].as_f64().unwrap() > 0.0, "{report}");
    assert_eq!(alpha["vms"][0]["id"], id, "{report}");
    assert_eq!(report["end"], "2100-01-01T00:00:00.000000Z", "the offset's '+' arrived");

    let table = server.gsaas(&member, &["usage", "alpha", "--start", start, "--end", end]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{}", stderr(&table));
    assert!(text.contains("cgpu_hours") && text.contains("train") && text.contains(id), "{text}");
    let all = server.gsaas(&admin, &["usage", "--start", start, "--end", end]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(text.lines().any(|l| l.starts_with("alpha ")), "{text}");
    let csv = server.gsaas(&member, &["usage", "--start", start, "--end", end, "--csv"]);
    let text = String::from_utf8_lossy(&csv.stdout);
    assert!(text.starts_with("period_start,period_end,project,vm,"), "{text}");
    assert!(text.contains(",alpha,,,cgpu,"), "{text}");

    let other = server.gsaas(&member, &["usage", "beta"]);
    assert_eq!(other.status.code(), Some(3), "{}", stderr(&other));
    let bad = server.gsaas(&member, &["usage", "--start", "last week"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("start"), "{}", stderr(&bad));
}
