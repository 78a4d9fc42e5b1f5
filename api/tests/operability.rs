//! gsaasd as operators run it: settings from flags, `GSAAS_*` variables and the file in that
//! order, JSON logs, and a request id on every answer, in its problem document and in the log
//! line of the request.

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{Store, TestService};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_names_its_request_and_problems_carry_the_same_id() {
    let t = TestService::start(Store::Sqlite).await;
    let get = |path: &str, forged: bool| {
        let mut request = t.http.get(t.url(path));
        if forged {
            request = request.header("X-Request-Id", "forged");
        }
        request.send()
    };
    let mut ids = Vec::new();
    for (path, status) in [("/healthz", 200), ("/v1/vms", 401), ("/v1/nothing-here", 404)] {
        let response = get(path, true).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{path}");
        let id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{path}: {id}");
        if status != 200 {
            let problem: Value = response.json().await.unwrap();
            assert_eq!(problem["request_id"], id.as_str(), "{path}: {problem}");
        }
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each request its own id, never the client's");
    // A problem raised before the handler (a body too large) has it too.
    let response = t
        .http
        .post(t.url("/v1/vms"))
        .bearer_auth(t.member())
        .body(vec![b' '; 300 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["request_id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_takes_flags_then_variables_then_the_file_and_logs_json() {
    let dir = std::env::temp_dir().join(format!("gsaasd-operability-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let [from_file, from_env, from_flag] = ["file", "env", "flag"].map(|d| dir.join(d));
    let config = dir.join("gsaasd.toml");
    // The file's address cannot be bound here: the variable's must win.
    std::fs::write(
        &config,
        format!(
            "listen = \"192.0.2.1:80\"\ndata_dir = {:?}\n[cloud.sim]\nfixed_ip_range = \"10.77.0.0/24\"\n",
            from_file.display().to_string()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gsaasd"))
        .args(["serve", "-c"])
        .arg(&config)
        .arg("--data-dir")
        .arg(&from_flag)
        .env("GSAAS_LISTEN", "127.0.0.1:0")
        .env("GSAAS_DATA_DIR", &from_env)
        .env("GSAAS_LOG_FORMAT", "json")
        .env_remove("GSAAS_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let process = support::Process(child);
    let (url_tx, url_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("gsaasd serving on ") {
                let _ = url_tx.send(url.to_owned());
            }
        }
    });
    let logs = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let url = url_rx.recv_timeout(Duration::from_secs(30)).expect("gsaasd serves");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(from_flag.join("gsaas.sqlite").exists(), "the flag's data directory is used");
    assert!(!from_env.exists() && !from_file.exists());

    let response = reqwest::get(format!("{url}/v1/vms")).await.unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
    drop(process);
    let logs = logs.join().unwrap();
    let lines: Vec<Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let request = lines
        .iter()
        .find(|l| l["fields"]["request_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no log line of request {id}:\n{logs}"));
    let fields = &request["fields"];
    assert_eq!(fields["message"], "request");
    assert_eq!(
        (&fields["method"], &fields["route"], &fields["status"]),
        (&"GET".into(), &"/v1/vms".into(), &401.into())
    );
    assert!(fields["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{request}");
    assert!(request["level"] == "INFO" && request["timestamp"].is_string(), "{request}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_setting_is_refused_naming_it() {
    for (var, value, flag, named) in [
        ("GSAAS_HTTP__BODY_TIMEOUT_SECS", "soon", None, "GSAAS_HTTP__BODY_TIMEOUT_SECS"),
        ("GSAAS_QUEUE__NO_SUCH_KEY", "1", None, "GSAAS_QUEUE__NO_SUCH_KEY"),
        ("GSAAS_UNRELATED", "x", Some("--listen=nowhere"), "--listen"),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gsaasd"));
        command.arg("check-config").env(var, value).env_remove("GSAAS_DATABASE_URL");
        if let Some(flag) = flag {
            command.arg(flag);
        }
        let out = command.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(named), "{var}: {err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gsaasd"))
        .args(["check-config", "--database-url", "postgres://db/gsaas"])
        .env("GSAAS_DATABASE_URL", "postgres://elsewhere/gsaas")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("postgres://db/gsaas"), "{text}");
}

/// `gsaasd --version` names the version and the commit; `/` lists the API's versions to a JSON
/// client (as OpenStack services do) and is the dashboard to a browser; `/v1/` describes v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_discoverable() {
    let out = Command::new(support::gsaasd_binary()).arg("--version").output().unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let want =
        format!("gsaasd {} (commit {})", env!("CARGO_PKG_VERSION"), support::checkout_commit());
    assert_eq!(printed.trim(), want);

    let t = TestService::start(Store::Sqlite).await;
    let root = t.http.get(t.url("/")).header("accept", "application/json").send().await.unwrap();
    assert_eq!(root.status(), 200);
    let versions: Value = root.json().await.unwrap();
    assert_eq!(
        versions,
        serde_json::json!({ "versions": [
            { "id": "v1", "status": "CURRENT", "links": [{ "rel": "self", "href": "/v1/" }] }
        ] })
    );
    let page = t.http.get(t.url("/")).header("accept", "text/html,*/*").send().await.unwrap();
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    for path in ["/v1/", "/v1"] {
        let (status, v1) = t.get("", path).await;
        assert_eq!((status, v1["version"]["id"].as_str()), (200, Some("v1")), "{v1}");
        // Anyone may ask, so neither names the build an attacker would look up.
        for build in [support::checkout_commit(), env!("CARGO_PKG_VERSION").to_owned()] {
            assert!(!v1.to_string().contains(&build), "{path} names {build}: {v1}");
            assert!(!versions.to_string().contains(&build), "/ names {build}: {versions}");
        }
    }
}

/// What a restore must bring back: every VM (deleted ones too) with its cGPUs, the pool's
/// bookings, and the usage up to `until_ms` (a running VM's grows after).
async fn views(t: &TestService, admin: &str, until_ms: i64) -> (Value, Value, Value) {
    let (_, list) = t.get(admin, "/v1/vms?deleted=true").await;
    let (_, pool) = t.get(admin, "/v1/pool").await;
    let end = support::rfc3339(until_ms);
    let (_, usage) = t.get(admin, &format!("/v1/usage?start=2000-01-01&end={end}")).await;
    (list, pool["totals"].clone(), usage["projects"].clone())
}

/// `gsaasd db backup` copies the store while gsaasd serves; a fresh gsaasd started on the copy
/// (before the same cloud, as a restore would be) has the same VMs, bookings, routes and usage.
/// PostgreSQL's stores are refused, naming its own tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_the_same_vms_bookings_and_routes() {
    use std::os::unix::fs::PermissionsExt;
    let mut t = TestService::start(Store::Sqlite).await;
    let (member, admin) = (t.member(), t.admin());
    let kept = t.launch(&member, &support::shared_launch(2, 1024)).await;
    t.wait_state(&member, &kept, "ready").await;
    let gone = t.launch(&member, &support::shared_launch(1, 512)).await;
    t.wait_state(&member, &gone, "ready").await;
    t.delete(&member, &format!("/v1/vms/{gone}")).await;
    t.wait_state(&member, &gone, "deleted").await;

    let until = gsaasd::db::now_ms();
    let copy = t.dir.join("backup.sqlite");
    let (ok, out, err) = t.gsaasd(&["db", "backup", "--to", copy.to_str().unwrap()]);
    assert!(ok && out.starts_with("backed up to"), "{out} {err}");
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the copy holds tenants' data");
    let (ok, _, err) = t.gsaasd(&["db", "backup", "--to", copy.to_str().unwrap()]);
    assert!(!ok && err.contains("exists already"), "{err}");

    let before = views(&t, &admin, until).await;
    let sim = t.crash();

    // A fresh gsaasd: its own data directory, the copy as its store, the same cloud.
    let (config, dir) = support::test_config(Store::Sqlite);
    std::fs::create_dir_all(&config.data_dir).unwrap();
    std::fs::copy(&copy, config.data_dir.join("gsaas.sqlite")).unwrap();
    let restored = TestService::start_config_with_sim(config, dir, sim).await;
    let app = &restored.service().app;
    app.reconcile_once().await;
    let after = views(&restored, &restored.admin(), until).await;
    assert_eq!(after.0, before.0, "the same VMs, states and cGPUs");
    assert_eq!(after.1, before.1, "the same bookings");
    assert_eq!(after.2, before.2, "the same usage");
    let vm = &after.0["vms"].as_array().unwrap().iter().find(|v| v["id"] == kept.as_str()).unwrap();
    let agents = app.in_process_agents().expect("in-process agents");
    let hosts = app.hosts().await.unwrap();
    let host = hosts.iter().find(|h| vm["host"] == h.name.as_str()).unwrap();
    let admin_caller =
        gsaasd::caller::Caller::new("ops", Some("ops".into()), gsaasd::auth::Role::Admin);
    let details = app
        .visible_vm(&admin_caller, kept.parse().unwrap(), gsaasd::policy::actions::VM_SHOW)
        .await
        .unwrap();
    let source = vm["fixed_ip"].as_str().unwrap().parse().unwrap();
    for cgpu in vm["cgpus"].as_array().unwrap() {
        let masked = cgpu["masked_endpoint"].as_str().unwrap().parse().unwrap();
        let tap = details.vm.tap.as_deref().unwrap();
        let routed = agents.resolve(host, source, tap, masked).map(|t| t.to_string());
        assert_eq!(routed.as_deref(), cgpu["rcuda_endpoint"].as_str(), "the route is back");
    }

    let pg = TestService::start(Store::Postgres).await;
    let (ok, _, err) = pg.gsaasd(&["db", "backup", "--to", pg.dir.join("x").to_str().unwrap()]);
    assert!(!ok && err.contains("pg_dump"), "{err}");
}
