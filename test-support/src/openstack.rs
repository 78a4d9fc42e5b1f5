//! gsaasd against the real OpenStack of `scripts/openstack-dev.sh` (the e2e test and the Table 5.5
//! bench): where the cloud is, tenants' and the admin's Keystone tokens, the admin's view of Nova
//! and Neutron, and a gsaasd in Keystone mode with the Nova backend.
//!
//! `scripts/test.sh` starts the cloud and exports `GSAAS_OPENSTACK_CLOUDS` (its clouds.yaml: clouds
//! `gsaas-service`, `alpha`, `beta`, `alpha-reader`). Without it these tests fail: they never pass
//! silently. Where the catalog says gsaasd is, one test at a time serves one ([`CatalogLease`]).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpgpums::{HostId, HostKind};
use gsaasd::cloud::nova::NovaConfig;
use gsaasd::config::{AuthConfig, AuthMode, CloudConfig, Config, InventoryGpu, InventoryHost};
use gsaasd::openstack::AuthSettings;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{status_json, test_config, Store};

pub const CLOUDS_VAR: &str = "GSAAS_OPENSTACK_CLOUDS";
/// gsaasd's service user (Keystone admin) and the two tenants.
pub const SERVICE_CLOUD: &str = "gsaas-service";
/// Nova's compute services of `scripts/openstack-dev.sh`.
pub const GPU_HOST: &str = "gpu-host-1";
pub const RGPU_HOST: &str = "rgpu-host-1";
/// The image and flavor `scripts/openstack-dev.sh` creates.
pub const IMAGE: &str = "gsaas-tiny";
pub const FLAVOR: &str = "gsaas.tiny";
/// Project beta's private image, and the projects' networks (in the Neutron stand-in).
pub const BETA_PRIVATE_IMAGE: &str = "gsaas-beta-private";
pub const BETA_NETWORK: &str = "beta-net";
/// Limit of one request, and of every wait for a state.
pub const BOUND: Duration = Duration::from_secs(90);

/// The clouds.yaml of the running dev cloud; panics with what to do when it is not set.
pub fn clouds_yaml() -> PathBuf {
    match std::env::var_os(CLOUDS_VAR) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{CLOUDS_VAR}={} does not exist: is the cloud still running? \
                 (`scripts/openstack-dev.sh status`)",
                path.display()
            );
            path
        }
        _ => panic!(
            "{CLOUDS_VAR} is not set: these tests need the real OpenStack of \
             scripts/openstack-dev.sh. Run them with `scripts/test.sh`, or run \
             `scripts/openstack-dev.sh start` and export {CLOUDS_VAR}=<the clouds.yaml path it prints>"
        ),
    }
}

/// A value of the dev cloud's `ports.env` (beside its clouds.yaml): `P_GSAAS`, `KEYSTONE_URL`.
pub fn dev_cloud_setting(name: &str) -> String {
    let ports = clouds_yaml().with_file_name("ports.env");
    let text = std::fs::read_to_string(&ports)
        .unwrap_or_else(|e| panic!("{}: {e}: is the dev cloud running?", ports.display()));
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| {
            panic!(
                "{} has no {name}: restart the dev cloud (scripts/openstack-dev.sh)",
                ports.display()
            )
        })
        .to_owned()
}

/// The user name and password of a cloud of the dev cloud's clouds.yaml (what a person types
/// into a sign-in form).
pub fn cloud_user(cloud: &str) -> (String, String) {
    let settings = AuthSettings::load(Some(cloud), Some(&clouds_yaml()), &|_| None)
        .unwrap_or_else(|e| panic!("cloud {cloud}: {e}"));
    (settings.username.clone().expect("the cloud names its user"), settings.password)
}

/// Where the dev cloud's catalog says gsaasd is (service type `gpu-scheduling`).
pub fn catalog_address() -> std::net::SocketAddr {
    let port: u16 = dev_cloud_setting("P_GSAAS").parse().expect("P_GSAAS is a port");
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// The catalog's gsaasd address, held by one test at a time in every test binary (a lock file
/// beside the clouds.yaml): the tests of clients that find gsaasd in the catalog serve it there.
#[derive(Debug)]
pub struct CatalogLease(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

impl CatalogLease {
    pub async fn take() -> CatalogLease {
        let path = clouds_yaml().with_file_name("gsaas-catalog.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let locked = tokio::task::spawn_blocking(move || {
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .unwrap_or_else(|(_, e)| panic!("locking the catalog's address: {e}"))
        })
        .await
        .expect("the lock task");
        CatalogLease(locked)
    }
}

/// One Keystone login (password, project-scoped) with a cloud of the clouds.yaml.
#[derive(Debug, Clone)]
pub struct Login {
    pub token: String,
    pub user_id: String,
    pub project_id: String,
    catalog: Value,
}

impl Login {
    pub async fn new(http: &reqwest::Client, cloud: &str) -> Login {
        let clouds = clouds_yaml();
        let settings = AuthSettings::load(Some(cloud), Some(&clouds), &|_| None)
            .unwrap_or_else(|e| panic!("cloud {cloud} of {}: {e}", clouds.display()));
        let response = http
            .post(format!("{}/auth/tokens", settings.identity_v3()))
            .json(&settings.password_auth_body())
            .send()
            .await
            .unwrap_or_else(|e| panic!("Keystone at {}: {e}", settings.auth_url));
        let token = response
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (status, body) = status_json(response).await;
        assert_eq!(status, 201, "Keystone login as {cloud}: {body}");
        Login {
            token: token.expect("Keystone returns X-Subject-Token"),
            user_id: body["token"]["user"]["id"].as_str().expect("a user").to_owned(),
            project_id: body["token"]["project"]["id"].as_str().expect("a project").to_owned(),
            catalog: body["token"]["catalog"].clone(),
        }
    }

    /// The ids of the servers this login's project sees in Nova (`GET /servers`, as the tenant).
    pub async fn own_servers(&self, http: &reqwest::Client) -> Vec<String> {
        let url = format!("{}/servers", self.endpoint("compute"));
        let response = http.get(&url).header("X-Auth-Token", &self.token).send().await;
        let (status, body) = status_json(response.unwrap_or_else(|e| panic!("{url}: {e}"))).await;
        assert_eq!(status, 200, "{body}");
        let servers = body["servers"].as_array().cloned().unwrap_or_default();
        servers.iter().filter_map(|s| s["id"].as_str().map(str::to_owned)).collect()
    }

    /// The trusts this login's user delegated (`GET /v3/OS-TRUST/trusts`, as the trustor).
    pub async fn own_trusts(&self, http: &reqwest::Client) -> Vec<Value> {
        let url = format!("{}/OS-TRUST/trusts?trustor_user_id={}", self.identity(), self.user_id);
        let response = http.get(&url).header("X-Auth-Token", &self.token).send().await;
        let (status, body) = status_json(response.unwrap_or_else(|e| panic!("{url}: {e}"))).await;
        assert_eq!(status, 200, "{body}");
        body["trusts"].as_array().cloned().unwrap_or_default()
    }

    /// Revokes this login's token (`DELETE /v3/auth/tokens`), as a user logging out does.
    pub async fn revoke(&self, http: &reqwest::Client) {
        let url = format!("{}/auth/tokens", self.identity());
        let response = http
            .delete(&url)
            .header("X-Auth-Token", &self.token)
            .header("X-Subject-Token", &self.token)
            .send()
            .await;
        let status = response.unwrap_or_else(|e| panic!("{url}: {e}")).status().as_u16();
        assert_eq!(status, 204, "revoking a token");
    }

    fn identity(&self) -> String {
        let identity = self.endpoint("identity");
        if identity.ends_with("/v3") {
            identity
        } else {
            format!("{identity}/v3")
        }
    }

    /// The public endpoint of a catalog service type.
    pub fn endpoint(&self, service_type: &str) -> String {
        self.catalog
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["type"] == service_type)
            .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
            .find(|e| e["interface"] == "public")
            .and_then(|e| e["url"].as_str())
            .unwrap_or_else(|| panic!("no {service_type} endpoint in the catalog"))
            .trim_end_matches('/')
            .to_owned()
    }
}

/// The admin's direct view of Nova and Neutron, to check what gsaasd did there.
#[derive(Debug)]
pub struct Admin {
    pub http: reqwest::Client,
    pub login: Login,
}

impl Admin {
    pub async fn new() -> Admin {
        let http = client();
        let login = Login::new(&http, SERVICE_CLOUD).await;
        Admin { http, login }
    }

    pub async fn call(&self, method: Method, url: &str, body: Option<&Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, url)
            .header("X-Auth-Token", &self.login.token)
            .header("OpenStack-API-Version", "compute 2.74");
        if let Some(body) = body {
            request = request.json(body);
        }
        status_json(request.send().await.unwrap_or_else(|e| panic!("{url}: {e}"))).await
    }

    /// `GET /servers/{id}` as admin: the status and the server (404: gone).
    pub async fn server(&self, id: &str) -> (u16, Value) {
        let url = format!("{}/servers/{id}", self.login.endpoint("compute"));
        let (status, body) = self.call(Method::GET, &url, None).await;
        (status, body["server"].clone())
    }

    /// Servers of any project carrying the VM's tag (what gsaasd finds its servers by).
    pub async fn servers_of_vm(&self, vm: &str) -> Vec<Value> {
        let compute = self.login.endpoint("compute");
        let url = format!("{compute}/servers/detail?all_tenants=1&tags=gsaas-vm-{vm}");
        let (status, body) = self.call(Method::GET, &url, None).await;
        assert_eq!(status, 200, "{body}");
        body["servers"].as_array().cloned().unwrap_or_default()
    }

    /// The server's ports, from (the stand-in of) Neutron.
    pub async fn ports(&self, server: &str) -> Vec<Value> {
        let url = format!("{}/v2.0/ports?device_id={server}", self.login.endpoint("network"));
        let (status, body) = self.call(Method::GET, &url, None).await;
        assert_eq!(status, 200, "{body}");
        body["ports"].as_array().cloned().unwrap_or_default()
    }

    /// A flavor that exists in Nova (created when missing; 409 = another test made it meanwhile).
    pub async fn ensure_flavor(&self, id: &str, ram_mb: u64) {
        let nova = self.login.endpoint("compute");
        if self.call(Method::GET, &format!("{nova}/flavors/{id}"), None).await.0 == 200 {
            return;
        }
        let body =
            json!({ "flavor": { "name": id, "id": id, "ram": ram_mb, "vcpus": 1, "disk": 1 } });
        let (status, answer) =
            self.call(Method::POST, &format!("{nova}/flavors"), Some(&body)).await;
        assert!(status == 200 || status == 409, "creating flavor {id}: {status} {answer}");
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(BOUND).build().expect("an HTTP client")
}

/// Inventory: `gpu-host-1` (compute-GPU) with `gpus` GPUs of 8 GiB, `rgpu-host-1` (compute-rGPU).
pub fn inventory(gpus: u32) -> Vec<InventoryHost> {
    inventory_named(GPU_HOST, gpus)
}

/// [`inventory`] with another name for the compute-GPU host.
pub fn inventory_named(gpu_host: &str, gpus: u32) -> Vec<InventoryHost> {
    vec![
        InventoryHost {
            name: HostId::new(gpu_host).expect("a host name"),
            kind: HostKind::ComputeGpu,
            gpus: vec![InventoryGpu::of("NVIDIA Quadro M4000", 8192, gpus)],
            gpu_network_address: Some(Ipv4Addr::new(10, 78, 0, 1)),
            remoting: Default::default(),
            server_base_port: None,
            topology: Default::default(),
        },
        InventoryHost {
            name: HostId::new(RGPU_HOST).expect("a host name"),
            kind: HostKind::ComputeRgpu,
            gpus: vec![],
            gpu_network_address: None,
            remoting: Default::default(),
            server_base_port: None,
            topology: Default::default(),
        },
    ]
}

/// gsaasd in Keystone mode on the dev cloud: the Nova backend as `gsaas-service`, in-process
/// agents on [`inventory`], its own SQLite database, port 0.
#[derive(Debug)]
pub struct Gsaasd {
    pub service: Option<gsaasd::service::Service>,
    pub http: reqwest::Client,
    dir: PathBuf,
    /// Held while serving at the catalog's address; dropped after the service (field order).
    catalog: Option<CatalogLease>,
}

impl Gsaasd {
    pub async fn start(gpus: u32) -> Gsaasd {
        Self::start_with(inventory(gpus)).await
    }

    pub async fn start_with(inventory: Vec<InventoryHost>) -> Gsaasd {
        Self::start_polling(inventory, 50).await
    }

    /// [`Gsaasd::start_polling`], its config changed by `tweak`.
    pub async fn start_configured(gpus: u32, tweak: impl FnOnce(&mut Config)) -> Gsaasd {
        Self::start_tweaked(inventory(gpus), 50, tweak).await
    }

    /// [`Gsaasd::start_configured`] where the dev cloud's catalog says gsaasd is, while the
    /// lease is held.
    pub async fn start_in_catalog(gpus: u32, tweak: impl FnOnce(&mut Config)) -> Gsaasd {
        let lease = CatalogLease::take().await;
        // The previous holder's gsaasd may still be closing its listener.
        eventually("the catalog's address to be free", || async {
            tokio::net::TcpListener::bind(catalog_address()).await.ok().map(drop)
        })
        .await;
        let mut gsaasd = Self::start_configured(gpus, |config| {
            config.listen = catalog_address();
            tweak(config);
        })
        .await;
        gsaasd.catalog = Some(lease);
        gsaasd
    }

    /// [`Gsaasd::start_with`], polling Nova and Neutron every `poll_interval_ms`.
    pub async fn start_polling(inventory: Vec<InventoryHost>, poll_interval_ms: u64) -> Gsaasd {
        Self::start_tweaked(inventory, poll_interval_ms, |_| {}).await
    }

    async fn start_tweaked(
        inventory: Vec<InventoryHost>,
        poll_interval_ms: u64,
        tweak: impl FnOnce(&mut Config),
    ) -> Gsaasd {
        let clouds = clouds_yaml();
        let (mut config, dir) = test_config(Store::Sqlite);
        config.auth = AuthConfig { mode: AuthMode::Keystone, ..AuthConfig::default() };
        // The operators: admins of the dev cloud's `admin` project (the gsaas-service cloud's).
        config.auth.keystone_admin_scope.project = Some("admin".to_owned());
        config.cloud = CloudConfig::Nova {
            nova: NovaConfig {
                cloud: Some(SERVICE_CLOUD.to_owned()),
                clouds_yaml: Some(clouds),
                poll_interval_ms,
                // The dev cloud has no real Neutron: servers boot without a network, and the
                // stand-in gives each placed server its port.
                default_network: "none".to_owned(),
                // Tenants may not name hosts: each compute host is a zone of its own
                // (scripts/openstack-dev.sh), and the one compute-rGPU host's is remote's.
                local_availability_zone: Some("gsaas-{host}".to_owned()),
                availability_zone: Some(format!("gsaas-{RGPU_HOST}")),
                ..NovaConfig::default()
            },
        };
        config.launch.active_timeout_secs = 60;
        config.launch.deploy_timeout_secs = 60;
        config.inventory = inventory;
        tweak(&mut config);
        let service = tokio::time::timeout(BOUND, gsaasd::service::start(config))
            .await
            .expect("gsaasd starts in time")
            .expect("gsaasd starts");
        Gsaasd { service: Some(service), http: client(), dir, catalog: None }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.service.as_ref().expect("running").url());
        let mut request = self.http.request(method, &url).header("X-Auth-Token", token);
        if let Some(body) = body {
            request = request.json(body);
        }
        status_json(request.send().await.unwrap_or_else(|e| panic!("{url}: {e}"))).await
    }

    pub async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call(Method::GET, path, token, None).await
    }

    /// Launches; returns the VM's id (asserting 202).
    pub async fn launch(&self, token: &str, body: &Value) -> String {
        let (status, vm) = self.call(Method::POST, "/v1/vms", token, Some(body)).await;
        assert_eq!(status, 202, "launch {body}: {vm}");
        vm["id"].as_str().expect("an id").to_owned()
    }

    /// Polls the VM (every 20 ms, at most [`BOUND`]) until its state is one of `states`; returns
    /// that answer. Each poll reads only the answer's `state`, as a lean client would (a VM of 75
    /// cGPUs is a 30 KB answer: read as a whole JSON tree on every poll, the Table 5.5 bench's
    /// client cost more CPU than gsaasd's answering it).
    pub async fn until(&self, id: &str, token: &str, states: &[&str]) -> Value {
        #[derive(serde::Deserialize)]
        struct Polled<'a> {
            #[serde(borrow)]
            state: std::borrow::Cow<'a, str>,
        }
        let url = format!("{}/v1/vms/{id}", self.service.as_ref().expect("running").url());
        let deadline = Instant::now() + BOUND;
        loop {
            let response = self.http.get(&url).header("X-Auth-Token", token).send().await;
            let response = response.unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = response.status().as_u16();
            let body = response.bytes().await.unwrap_or_else(|e| panic!("{url}: {e}"));
            let whole = || {
                serde_json::from_slice::<Value>(&body)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
            };
            assert_eq!(status, 200, "{}", whole());
            let polled: Polled<'_> = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("VM {id}: {e}: {}", String::from_utf8_lossy(&body)));
            if states.contains(&&*polled.state) {
                return whole();
            }
            assert!(
                Instant::now() < deadline,
                "VM {id} still {} after {BOUND:?}: {}",
                polled.state,
                whole()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Gsaasd {
    /// Follows the VM with the API's long poll (`?wait=60`, answered once the VM settles) until
    /// its state is one of `states` (at most [`BOUND`]); returns that answer.
    pub async fn until_settled(&self, id: &str, token: &str, states: &[&str]) -> Value {
        let deadline = Instant::now() + BOUND;
        loop {
            let (status, vm) = self.get(&format!("/v1/vms/{id}?wait=60"), token).await;
            assert_eq!(status, 200, "{vm}");
            if vm["state"].as_str().is_some_and(|s| states.contains(&s)) {
                return vm;
            }
            assert!(
                Instant::now() < deadline,
                "VM {id} still {} after {BOUND:?}: {vm}",
                vm["state"]
            );
        }
    }
}

impl Drop for Gsaasd {
    fn drop(&mut self) {
        if let Some(service) = self.service.take() {
            service.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` (every 50 ms, at most [`BOUND`]) until it returns `Some`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
