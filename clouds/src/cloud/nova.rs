//! The real cloud: OpenStack Nova (compute API v2.1), with Neutron for ports and networks and
//! Glance for images, found through the service user's Keystone catalog.
//!
//! Shaped by what a real Nova does:
//! - Every compute call names microversion 2.74 (`OpenStack-API-Version: compute 2.74`): `host` in
//!   `POST /servers` (locality `local`) needs 2.74, server tags (2.52) make our servers findable,
//!   and `networks` is mandatory from 2.37 on. The compute images API is gone since 2.36, so images
//!   are checked in Glance (`GET /v2/images`).
//! - Idempotency: each server carries our VM id twice, in its metadata (`gsaas_vm_id`, what
//!   [`ServerInfo::vm`] is read from) and as a tag (`gsaas-vm-<id>`), because Nova can filter a
//!   listing by tag but not by metadata. `create_server` looks for the VM's server first, so a
//!   retried step (or one resumed after a crash) finds the server instead of creating a second one.
//! - `OS-EXT-SRV-ATTR:host` is shown to admins only: the service user needs the `admin` role (also
//!   needed for `host`). An ACTIVE server without the attribute is reported as a configuration
//!   error instead of waiting for a host that will never appear.
//! - Servers are created as their tenant ([`ServerSpec::tenant`]): with the tenant's Keystone token,
//!   so Nova puts the server in the tenant's project (its
//!   quota, its `openstack server list`), and Nova, Glance and Neutron authorize the tenant's image,
//!   flavor and network as the tenant's own. Everything after the creation (following the server,
//!   its ports, deleting it) is gsaasd's service user's, which sees every project's servers.
//! - Placement: a tenant may not name a host (Nova's policy keeps `host` for admins), so locality
//!   `local` asks for the GPU host's own availability zone (`local_availability_zone`, e.g.
//!   `gsaas-{host}`: an aggregate per GPU host the operator creates) and `remote` for
//!   `availability_zone` (the compute-rGPU hosts'); `any` lets Nova choose. Created as the service
//!   user (no tenant), a server is pinned with `host`, or sent to `availability_zone`, else one
//!   host of the list is picked from the VM id (stable across retries).
//! - The VM's fixed IP and tap device come from Neutron's ports (`tap` + the port id's first 11
//!   characters, the name Nova's libvirt driver gives it); Nova's `addresses` are the fallback when
//!   the catalog has no network service or the server has no port. "Deployed" is the server's port
//!   ACTIVE in Neutron (wired on its host): what happens inside the guest is not visible to the
//!   cloud.
//! - Errors: no answer, 5xx or 401 after a fresh token -> `Unavailable`; a request timeout ->
//!   `Timeout`; 400/404/409 -> `Invalid` naming the field Nova's message is about (`host` for
//!   "Compute host X could not be found."); 403/413 about quota -> `Quota`. User data over Nova's
//!   limit (65,535 bytes base64-encoded) is refused before any request.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use gpgpums::{HostId, Resources, VmId};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use super::{
    Checked, Cloud, CloudError, Delegation, HostConstraint, ServerId, ServerInfo, ServerSeen,
    ServerSpec, ServerStatus, TenantToken, VmRequest,
};
use gsaas_infra::ErrorChain;

mod lookups;
use lookups::LookupKey;

use crate::openstack::keystone::{error_message, AUTH_TOKEN};
use crate::openstack::{AuthSettings, HttpOptions, Keystone, KeystoneError, OpenStackConfigError};

/// The metadata key that holds GSaaS's VM id.
pub const VM_ID_METADATA: &str = "gsaas_vm_id";
/// The compute microversion every request names.
pub const COMPUTE_MICROVERSION: &str = "2.74";
const MIN_MICROVERSION: u32 = 74;

/// The server tag that makes the VM's server findable (`GET /servers/detail?tags=`).
/// Nova's limit on the base64-encoded user_data, in bytes.
pub const NOVA_USER_DATA_MAX_BASE64: usize = 65535;

/// The length of `n` bytes once base64-encoded (padded), as Nova measures user_data.
pub fn base64_len(n: usize) -> usize {
    n.div_ceil(3).saturating_mul(4)
}

/// Whether Nova takes user_data of `bytes` bytes (see [`super::Cloud::check_user_data_len`]).
pub fn check_user_data_len(bytes: usize) -> Result<(), String> {
    let encoded = base64_len(bytes);
    if encoded > NOVA_USER_DATA_MAX_BASE64 {
        return Err(format!(
            "{bytes} bytes are {encoded} base64-encoded; Nova accepts at most \
             {NOVA_USER_DATA_MAX_BASE64}"
        ));
    }
    Ok(())
}

pub fn vm_tag(vm: VmId) -> String {
    format!("gsaas-vm-{vm}")
}

/// `[cloud.nova]` of gsaasd's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NovaConfig {
    /// The cloud of clouds.yaml to use; default: `OS_CLOUD`; with neither, the `OS_*` variables.
    pub cloud: Option<String>,
    /// clouds.yaml to read; default: `OS_CLIENT_CONFIG_FILE` or openstacksdk's usual places.
    pub clouds_yaml: Option<PathBuf>,
    /// Compute microversion, at least 2.74.
    pub microversion: String,
    /// Limit of one HTTP request to Keystone, Nova, Neutron or Glance.
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// The service token is renewed when it has less than this left.
    pub token_refresh_margin_secs: u64,
    /// How often a server is polled while waiting for it.
    pub poll_interval_ms: u64,
    /// `networks` for a request that names none: `auto`, `none`, or a network name or id.
    pub default_network: String,
    /// Where servers of locality `remote` go (an availability zone holding the compute-rGPU
    /// hosts), and those of locality `any` created as the service user; unset: the service user
    /// names one host of the schedulable list, and tenants cannot launch `remote`.
    pub availability_zone: Option<String>,
    /// The availability zone of one GPU host, `{host}` standing for its name (e.g.
    /// `gsaas-{host}`), where locality `local` puts a tenant's server; unset: tenants cannot
    /// launch `local`.
    pub local_availability_zone: Option<String>,
    /// The roles a tenant delegates (a Keystone trust) so that its queued launch is created as
    /// it later: what creating a server in its project takes.
    pub delegated_roles: Vec<String>,
    /// How long what a check found (a request's flavor, image and networks, as ids) is reused
    /// for the same project's requests naming the same ones; 0: every check asks Nova, Glance
    /// and Neutron. Nova still checks the creation itself, so an image deleted meanwhile fails
    /// that launch there instead of at its request.
    pub lookup_cache_secs: u64,
}

impl Default for NovaConfig {
    fn default() -> Self {
        NovaConfig {
            cloud: None,
            clouds_yaml: None,
            microversion: COMPUTE_MICROVERSION.to_owned(),
            request_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            token_refresh_margin_secs: 120,
            poll_interval_ms: 1_000,
            default_network: "auto".to_owned(),
            availability_zone: None,
            local_availability_zone: None,
            delegated_roles: vec!["member".to_owned()],
            lookup_cache_secs: 30,
        }
    }
}

impl NovaConfig {
    pub fn http_options(&self) -> HttpOptions {
        HttpOptions {
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            token_refresh_margin: Duration::from_secs(self.token_refresh_margin_secs),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NovaSetupError {
    #[error("OpenStack credentials")]
    Credentials(#[from] OpenStackConfigError),
    #[error("cloud.nova.microversion {0:?}: expected 2.N with N >= {MIN_MICROVERSION}")]
    Microversion(String),
    #[error("cloud.nova: {0} must not be 0")]
    Zero(&'static str),
    #[error("cannot build the HTTP client")]
    Client(#[source] KeystoneError),
}

/// The Nova cloud. See the module docs.
#[derive(Debug)]
pub struct NovaCloud {
    keystone: Arc<Keystone>,
    config: NovaConfig,
    /// What recent checks found (`lookup_cache_secs`).
    lookups: Mutex<HashMap<LookupKey, (Instant, Checked)>>,
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

#[derive(Debug, Deserialize)]
struct IdOnly {
    id: String,
}

/// A flavor as Nova shows it (`GET /flavors/{id}`, `/flavors/detail`).
#[derive(Debug, Deserialize)]
struct Flavor {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    vcpus: Option<u64>,
    /// MiB.
    #[serde(default)]
    ram: Option<u64>,
}

impl Flavor {
    fn resources(&self) -> Option<Resources> {
        Some(Resources::new(self.vcpus?.saturating_mul(1000), self.ram?))
    }
}

/// An image as Glance lists it.
#[derive(Debug, Deserialize)]
struct NamedId {
    id: String,
    #[serde(default)]
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Fault {
    #[serde(default)]
    message: String,
}

#[derive(Debug, Deserialize)]
struct NovaAddress {
    addr: String,
    #[serde(default)]
    version: u8,
    #[serde(rename = "OS-EXT-IPS:type", default)]
    kind: Option<String>,
}

/// Absent stays `None`; `null` becomes `Some(None)`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
struct NovaServer {
    id: String,
    status: String,
    #[serde(default)]
    metadata: HashMap<String, String>,
    #[serde(default)]
    fault: Option<Fault>,
    #[serde(rename = "OS-EXT-SRV-ATTR:host", default, deserialize_with = "present")]
    host: Option<Option<String>>,
    #[serde(default)]
    addresses: BTreeMap<String, Vec<NovaAddress>>,
}

#[derive(Debug, Deserialize)]
struct FixedIp {
    ip_address: String,
}

#[derive(Debug, Deserialize)]
struct Port {
    id: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    fixed_ips: Vec<FixedIp>,
}

impl Port {
    fn ipv4(&self) -> Option<Ipv4Addr> {
        self.fixed_ips.iter().find_map(|ip| ip.ip_address.parse().ok())
    }

    /// The port's tap device on its host.
    fn tap(&self) -> String {
        format!("tap{}", self.id.chars().take(11).collect::<String>())
    }
}

/// Percent-encodes a path segment or query value (everything but RFC 3986's unreserved).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse<T: serde::de::DeserializeOwned>(service: &str, body: &[u8]) -> Result<T, CloudError> {
    serde_json::from_slice(body).map_err(|e| CloudError::Unavailable {
        reason: format!("unexpected answer from {service}"),
        source: Some(Box::new(e)),
    })
}

/// The request field a Nova 4xx message is about.
fn field_of(message: &str) -> &'static str {
    let m = message.to_lowercase();
    if m.contains("user data") || m.contains("user_data") {
        "user_data"
    } else if m.contains("flavor") {
        "flavor"
    } else if m.contains("image") {
        "image"
    } else if m.contains("network") {
        "networks"
    } else if m.contains("availability zone") || m.contains("availability_zone") {
        "availability_zone"
    } else if m.contains("host") || m.contains("hypervisor") {
        "host"
    } else {
        "vm"
    }
}

/// A 4xx that is not the caller's to retry: quota, a refused field, or the service user's rights.
/// The OpenStack project behind a catalog service type, for messages.
fn service_name(service_type: &str) -> &'static str {
    match service_type {
        "compute" => "Nova",
        "image" => "Glance",
        "network" => "Neutron",
        _ => "OpenStack",
    }
}

fn refused(service: &str, status: StatusCode, body: &[u8]) -> CloudError {
    let message = error_message(body);
    let quota = message.to_lowercase().contains("quota");
    match status.as_u16() {
        403 | 413 if quota => CloudError::Quota(message),
        400 | 404 | 409 | 422 => CloudError::Invalid { field: field_of(&message), reason: message },
        _ => {
            CloudError::unavailable(format!("{service} refused the request ({status}): {message}"))
        }
    }
}

fn keystone_error(e: KeystoneError) -> CloudError {
    CloudError::Unavailable { reason: "Keystone".to_owned(), source: Some(Box::new(e)) }
}

fn server_status(server: &NovaServer) -> Result<ServerStatus, CloudError> {
    Ok(match server.status.as_str() {
        "BUILD" => ServerStatus::Build,
        "ERROR" => ServerStatus::Error(
            server
                .fault
                .as_ref()
                .map(|f| f.message.clone())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "Nova reports ERROR without a fault message".to_owned()),
        ),
        "DELETED" | "SOFT_DELETED" => {
            return Err(CloudError::NotFound(format!("server {}", server.id)))
        }
        // Running, possibly in an operator's task that leaves it running.
        "ACTIVE" | "REBOOT" | "HARD_REBOOT" | "MIGRATING" | "REBUILD" | "RESIZE"
        | "VERIFY_RESIZE" | "REVERT_RESIZE" | "PASSWORD" => ServerStatus::Active,
        other => ServerStatus::Error(format!("server is {other}")),
    })
}

impl NovaCloud {
    /// From gsaasd's configuration, with credentials from clouds.yaml and the process's `OS_*`.
    pub fn from_config(config: &NovaConfig) -> Result<NovaCloud, NovaSetupError> {
        let env = |name: &str| std::env::var(name).ok();
        let auth =
            AuthSettings::load(config.cloud.as_deref(), config.clouds_yaml.as_deref(), &env)?;
        if auth.token.is_some() {
            return Err(NovaSetupError::Credentials(OpenStackConfigError::Invalid {
                origin: auth.origin,
                reason: "auth_type token: gsaasd's service user needs password credentials, \
                         which it renews itself"
                    .into(),
            }));
        }
        NovaCloud::new(auth, config.clone())
    }

    pub fn new(auth: AuthSettings, config: NovaConfig) -> Result<NovaCloud, NovaSetupError> {
        let keystone =
            Keystone::new(auth, config.http_options()).map_err(NovaSetupError::Client)?;
        NovaCloud::with_keystone(Arc::new(keystone), config)
    }

    /// Shares an existing Keystone session (the one tenant-token validation uses).
    pub fn with_keystone(
        keystone: Arc<Keystone>,
        config: NovaConfig,
    ) -> Result<NovaCloud, NovaSetupError> {
        let minor = config
            .microversion
            .strip_prefix("2.")
            .and_then(|m| m.parse::<u32>().ok())
            .filter(|m| *m >= MIN_MICROVERSION);
        if minor.is_none() {
            return Err(NovaSetupError::Microversion(config.microversion));
        }
        for (name, value) in [
            ("request_timeout_ms", config.request_timeout_ms),
            ("connect_timeout_ms", config.connect_timeout_ms),
            ("poll_interval_ms", config.poll_interval_ms),
        ] {
            if value == 0 {
                return Err(NovaSetupError::Zero(name));
            }
        }
        Ok(NovaCloud { keystone, config, lookups: Mutex::new(HashMap::new()) })
    }

    pub fn keystone(&self) -> Arc<Keystone> {
        self.keystone.clone()
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.config.poll_interval_ms)
    }

    /// Whether the catalog lists `service_type`.
    async fn has_service(&self, service_type: &str) -> Result<bool, CloudError> {
        let token = self.keystone.token().await.map_err(keystone_error)?;
        Ok(self.keystone.endpoint(&token, service_type).is_ok())
    }

    /// One request to a catalog service, as gsaasd's service user or (`tenant`) as the tenant. A
    /// 401 to gsaasd's token drops it and retries once with a new one; a 401 to a tenant's is the
    /// tenant's to renew. No answer and 5xx are
    /// `Unavailable`, a timeout is `Timeout`; other statuses are returned.
    async fn call(
        &self,
        service_type: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        tenant: Option<&TenantToken>,
    ) -> Result<Answer, CloudError> {
        let mut retried = false;
        loop {
            let token = self.keystone.token().await.map_err(keystone_error)?;
            let mut base = self.keystone.endpoint(&token, service_type).map_err(keystone_error)?;
            if let (Some(tenant), Some(project)) = (tenant, &token.project_id) {
                // An endpoint with the service project's id in its path (`/v2.1/<project>`) is
                // the tenant's with the tenant's.
                base = base.replace(&format!("/{project}"), &format!("/{}", tenant.project_id));
            }
            let url = format!("{base}{path}");
            let mut request = self
                .keystone
                .http()
                .request(method.clone(), &url)
                .header("Accept", "application/json");
            // No X-Service-Token beside a tenant's: Nova accepts one only from a user with the
            // `service` role, which gsaasd's user needs not have. Everything after the creation
            // is gsaasd's own request anyway.
            let bearer = tenant.map_or(token.token.as_str(), |t| t.token.as_str());
            request = request.header(AUTH_TOKEN, bearer);
            if service_type == "compute" {
                request = request.header(
                    "OpenStack-API-Version",
                    format!("compute {}", self.config.microversion),
                );
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let sent = async {
                let response = request.send().await?;
                let status = response.status();
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, body))
            };
            let (status, body) = match sent.await {
                Ok(answer) => answer,
                Err(e) if e.is_timeout() => {
                    tracing::warn!(%method, url, error = %ErrorChain(&e), "OpenStack request timed out");
                    return Err(CloudError::Timeout(self.keystone.options().request_timeout));
                }
                Err(e) => {
                    return Err(CloudError::Unavailable {
                        reason: format!("cannot reach {service_type} at {url}"),
                        source: Some(Box::new(e)),
                    })
                }
            };
            if status == StatusCode::UNAUTHORIZED && tenant.is_some() {
                return Err(CloudError::Invalid {
                    field: "token",
                    reason: format!(
                        "{} refused the tenant's Keystone token (expired or revoked): launch \
                         again with a fresh one",
                        service_name(service_type)
                    ),
                });
            }
            if status == StatusCode::UNAUTHORIZED {
                self.keystone.invalidate(&token.token).await;
                if !retried {
                    retried = true;
                    continue;
                }
                return Err(CloudError::unavailable(format!(
                    "{service_type} refuses gsaasd's fresh token: {}",
                    error_message(&body)
                )));
            }
            if status.is_server_error() {
                return Err(CloudError::unavailable(format!(
                    "{service_type} failed ({status}) on {method} {path}: {}",
                    error_message(&body)
                )));
            }
            return Ok(Answer { status, body: body.to_vec() });
        }
    }

    /// GET `path` from a catalog service: the parsed body on 200, `None` on 404, `refused` else.
    async fn get_optional<T: serde::de::DeserializeOwned>(
        &self,
        service_type: &'static str,
        path: &str,
        tenant: Option<&TenantToken>,
    ) -> Result<Option<T>, CloudError> {
        let answer = self.call(service_type, Method::GET, path, None, tenant).await?;
        let service = service_name(service_type);
        match answer.status.as_u16() {
            200 => parse::<T>(service, &answer.body).map(Some),
            404 => Ok(None),
            _ => Err(refused(service, answer.status, &answer.body)),
        }
    }

    /// GET `path` from a catalog service, which must answer 200 (listings).
    async fn get_listing<T: serde::de::DeserializeOwned>(
        &self,
        service_type: &'static str,
        path: &str,
        tenant: Option<&TenantToken>,
    ) -> Result<T, CloudError> {
        let answer = self.call(service_type, Method::GET, path, None, tenant).await?;
        let service = service_name(service_type);
        if answer.status != StatusCode::OK {
            return Err(refused(service, answer.status, &answer.body));
        }
        parse::<T>(service, &answer.body)
    }

    async fn get_server(&self, id: &ServerId) -> Result<NovaServer, CloudError> {
        #[derive(Deserialize)]
        struct Envelope {
            server: NovaServer,
        }
        let path = format!("/servers/{}", encode(&id.0));
        match self.get_optional::<Envelope>("compute", &path, None).await? {
            Some(envelope) => Ok(envelope.server),
            None => Err(CloudError::NotFound(format!("server {id}"))),
        }
    }

    /// The server's Neutron ports; `None` when the catalog has no network service.
    async fn ports(&self, id: &str) -> Result<Option<Vec<Port>>, CloudError> {
        if !self.has_service("network").await? {
            return Ok(None);
        }
        #[derive(Deserialize)]
        struct Envelope {
            ports: Vec<Port>,
        }
        let path = format!("/v2.0/ports?device_id={}", encode(id));
        Ok(Some(self.get_listing::<Envelope>("network", &path, None).await?.ports))
    }

    /// The fixed IPv4 address and tap device: Neutron's port, else Nova's `addresses`.
    async fn network_of(
        &self,
        server: &NovaServer,
    ) -> Result<(Option<Ipv4Addr>, Option<String>), CloudError> {
        if let Some(ports) = self.ports(&server.id).await? {
            if let Some((port, ip)) = ports.iter().find_map(|p| p.ipv4().map(|ip| (p, ip))) {
                return Ok((Some(ip), Some(port.tap())));
            }
        }
        let fixed = server
            .addresses
            .values()
            .flatten()
            .filter(|a| a.version == 4 && a.kind.as_deref().is_none_or(|k| k == "fixed"))
            .find_map(|a| a.addr.parse().ok());
        Ok((fixed, None))
    }

    async fn info(&self, server: NovaServer) -> Result<ServerInfo, CloudError> {
        let status = server_status(&server)?;
        let vm = server
            .metadata
            .get(VM_ID_METADATA)
            .and_then(|v| v.parse::<VmId>().ok())
            .ok_or_else(|| {
                CloudError::NotFound(format!("GSaaS server {} (no {VM_ID_METADATA})", server.id))
            })?;
        let host = match &server.host {
            Some(Some(host)) => {
                Some(HostId::new(host.clone()).map_err(|e| CloudError::Unavailable {
                    reason: format!("Nova's host name {host:?}"),
                    source: Some(Box::new(e)),
                })?)
            }
            _ => None,
        };
        let (fixed_ip, tap) = if status == ServerStatus::Active {
            self.network_of(&server).await?
        } else {
            (None, None)
        };
        Ok(ServerInfo { id: ServerId(server.id), vm, status, host, fixed_ip, tap })
    }

    /// Where the server goes: `(key of POST /servers, value)`, or `None` to let Nova choose. A
    /// tenant (`as_tenant`) may not name a host, so its servers go to availability zones.
    fn placement(
        &self,
        vm: VmId,
        host: &HostConstraint,
        as_tenant: bool,
    ) -> Result<Option<(&'static str, String)>, CloudError> {
        let zone = |zone: String| Ok(Some(("availability_zone", zone)));
        match host {
            HostConstraint::Pinned(host) if as_tenant => {
                match &self.config.local_availability_zone {
                    Some(template) => zone(template.replace("{host}", host.as_str())),
                    None => Err(CloudError::Invalid {
                        field: "locality",
                        reason: "locality local needs an availability zone per GPU host, and \
                                 this cloud's GSaaS has none (cloud.nova.local_availability_zone)"
                            .to_owned(),
                    }),
                }
            }
            HostConstraint::Pinned(host) => Ok(Some(("host", host.as_str().to_owned()))),
            HostConstraint::OnlyOf(hosts) if hosts.is_empty() => Err(CloudError::Invalid {
                field: "network",
                reason: "no schedulable host may run the VM within its network constraint"
                    .to_owned(),
            }),
            HostConstraint::OnlyOf(hosts) => {
                let pick = &hosts[(vm.as_uuid().as_u128() % hosts.len() as u128) as usize];
                match (as_tenant, &self.config.local_availability_zone) {
                    (false, _) => Ok(Some(("host", pick.as_str().to_owned()))),
                    (true, Some(template)) => zone(template.replace("{host}", pick.as_str())),
                    (true, None) => Err(CloudError::Invalid {
                        field: "network",
                        reason: "a network constraint needs an availability zone per host, \
                                 and this cloud's GSaaS has none \
                                 (cloud.nova.local_availability_zone)"
                            .to_owned(),
                    }),
                }
            }
            HostConstraint::AnyOf(_) if self.config.availability_zone.is_some() => {
                zone(self.config.availability_zone.clone().unwrap_or_default())
            }
            HostConstraint::AnyOf(hosts) if hosts.is_empty() => Err(CloudError::Invalid {
                field: "host",
                reason: "no schedulable host for the VM".to_owned(),
            }),
            // A tenant's VM without a zone: Nova chooses among every compute host.
            HostConstraint::AnyOf(_) if as_tenant => Ok(None),
            HostConstraint::AnyOf(hosts) => {
                let pick = (vm.as_uuid().as_u128() % hosts.len() as u128) as usize;
                Ok(Some(("host", hosts[pick].as_str().to_owned())))
            }
        }
    }

    /// The live server carrying `vm`'s tag, as `tenant` sees its project's servers, or as the
    /// service user sees every project's.
    async fn find_server_as(
        &self,
        vm: VmId,
        tenant: Option<&TenantToken>,
    ) -> Result<Option<ServerId>, CloudError> {
        #[derive(Deserialize)]
        struct Envelope {
            servers: Vec<NovaServer>,
        }
        let all = if tenant.is_some() { "" } else { "all_tenants=1&" };
        let path = format!("/servers/detail?{all}tags={}", encode(&vm_tag(vm)));
        let vm = vm.to_string();
        Ok(self
            .get_listing::<Envelope>("compute", &path, tenant)
            .await?
            .servers
            .into_iter()
            .filter(|s| !matches!(s.status.as_str(), "DELETED" | "SOFT_DELETED"))
            .find(|s| s.metadata.get(VM_ID_METADATA) == Some(&vm))
            .map(|s| ServerId(s.id)))
    }

    /// Runs `wait` for at most `timeout`.
    async fn bounded<T>(
        timeout: Duration,
        wait: impl std::future::Future<Output = Result<T, CloudError>>,
    ) -> Result<T, CloudError> {
        tokio::time::timeout(timeout, wait).await.map_err(|_| CloudError::Timeout(timeout))?
    }
}

#[async_trait]
impl Cloud for NovaCloud {
    async fn check(
        &self,
        request: &VmRequest,
        tenant: Option<&TenantToken>,
    ) -> Result<Checked, CloudError> {
        self.resolve(request, tenant, true).await
    }

    fn needs_tenant_token(&self) -> bool {
        true
    }

    async fn delegate(
        &self,
        tenant: &TenantToken,
        until: Option<std::time::SystemTime>,
    ) -> Result<Delegation, CloudError> {
        let roles = &self.config.delegated_roles;
        let trust = self
            .keystone
            .create_trust(&tenant.token, &tenant.user_id, &tenant.project_id, roles, until)
            .await;
        match trust {
            Ok(id) => Ok(Delegation(id)),
            // The tenant may not delegate (a role it lacks in its project): its request's fault.
            Err(KeystoneError::Rejected { message, .. })
            | Err(KeystoneError::Failed { status: 400, message }) => Err(CloudError::Invalid {
                field: "queue",
                reason: format!(
                    "a queued launch is created as you later, through a Keystone trust that \
                     delegates role(s) {} in your project to gsaasd, and Keystone refused it: \
                     {message}",
                    roles.join(", ")
                ),
            }),
            Err(e) => Err(keystone_error(e)),
        }
    }

    async fn redeem(&self, delegation: &Delegation) -> Result<TenantToken, CloudError> {
        match self.keystone.trust_token(&delegation.0).await {
            Ok(t) => {
                Ok(TenantToken { token: t.token, user_id: t.user_id, project_id: t.project_id })
            }
            Err(KeystoneError::Rejected { .. }) => Err(CloudError::NotFound(
                "the tenant's delegation (it expired, or the tenant revoked it)".into(),
            )),
            Err(e) => Err(keystone_error(e)),
        }
    }

    async fn revoke(
        &self,
        delegation: &Delegation,
        tenant: &TenantToken,
    ) -> Result<(), CloudError> {
        self.keystone.delete_trust(&tenant.token, &delegation.0).await.map_err(keystone_error)
    }

    fn check_user_data_len(&self, bytes: usize) -> Result<(), String> {
        check_user_data_len(bytes)
    }

    async fn create_server(&self, spec: &ServerSpec) -> Result<ServerId, CloudError> {
        check_user_data_len(spec.user_data.len())
            .map_err(|reason| CloudError::Invalid { field: "user_data", reason })?;
        let tenant = spec.tenant.as_ref();
        let placement = self.placement(spec.vm, &spec.host, tenant.is_some())?;
        // A launch's first attempt has nothing to find; any other may have created it already.
        if !spec.first_attempt {
            if let Some(id) = self.find_server_as(spec.vm, tenant).await? {
                return Ok(id);
            }
        }
        let Checked { flavor, image, networks, .. } = match &spec.checked {
            // What the launch's check resolved, stored with it: nothing to resolve.
            Some(checked) => checked.clone(),
            None => self.resolve(&spec.request, tenant, false).await?,
        };
        let mut server = json!({
            "name": spec.request.name,
            "imageRef": image,
            "flavorRef": flavor,
            "metadata": { VM_ID_METADATA: spec.vm.to_string() },
            "tags": [vm_tag(spec.vm)],
            "user_data": base64::engine::general_purpose::STANDARD.encode(&spec.user_data),
            "networks": networks,
        });
        if let Some((key, value)) = placement {
            server[key] = json!(value);
        }
        let body = json!({ "server": server });
        let answer = self.call("compute", Method::POST, "/servers", Some(&body), tenant).await?;
        match answer.status.as_u16() {
            200 | 202 => {
                #[derive(Deserialize)]
                struct Envelope {
                    server: IdOnly,
                }
                Ok(ServerId(parse::<Envelope>("Nova", &answer.body)?.server.id))
            }
            _ => {
                let refusal = refused("Nova", answer.status, &answer.body);
                if matches!(refusal, CloudError::Invalid { .. }) {
                    // What was found of the project may be why (an image deleted since): its
                    // next check asks again.
                    self.forget_lookups(tenant.map(|t| t.project_id.as_str()));
                }
                Err(refusal)
            }
        }
    }

    async fn find_server(&self, vm: VmId) -> Result<Option<ServerId>, CloudError> {
        self.find_server_as(vm, None).await
    }

    async fn server(&self, id: &ServerId) -> Result<ServerInfo, CloudError> {
        let server = self.get_server(id).await?;
        self.info(server).await
    }

    async fn wait_active(
        &self,
        id: &ServerId,
        timeout: Duration,
    ) -> Result<ServerInfo, CloudError> {
        let wait = async {
            loop {
                let server = self.get_server(id).await?;
                match server_status(&server)? {
                    ServerStatus::Build => {}
                    ServerStatus::Error(fault) => return Err(CloudError::ServerFailed(fault)),
                    ServerStatus::Active => match &server.host {
                        None => {
                            return Err(CloudError::unavailable(
                                "Nova does not show OS-EXT-SRV-ATTR:host: \
                                 gsaasd's service user needs the admin role",
                            ))
                        }
                        // ACTIVE, its host not shown yet: poll again.
                        Some(None) => {}
                        Some(Some(_)) => return self.info(server).await,
                    },
                }
                tokio::time::sleep(self.poll_interval()).await;
            }
        };
        Self::bounded(timeout, wait).await
    }

    async fn wait_deployed(&self, id: &ServerId, timeout: Duration) -> Result<(), CloudError> {
        let wait = async {
            loop {
                let server = self.get_server(id).await?;
                match server_status(&server)? {
                    ServerStatus::Build => {}
                    ServerStatus::Error(fault) => return Err(CloudError::ServerFailed(fault)),
                    ServerStatus::Active => match self.ports(&server.id).await? {
                        // No Neutron, or no port (`networks: none`): ACTIVE is all there is to see.
                        None => return Ok(()),
                        Some(ports) if ports.iter().all(|p| p.status == "ACTIVE") => return Ok(()),
                        Some(_) => {}
                    },
                }
                tokio::time::sleep(self.poll_interval()).await;
            }
        };
        Self::bounded(timeout, wait).await
    }

    /// `GET /servers/detail?all_tenants=1&changes-since=...`, a page of 1,000 at a time (Nova's
    /// default `max_limit`); with `changes-since`, Nova lists deleted servers too.
    async fn changed_servers(
        &self,
        since: Option<std::time::SystemTime>,
    ) -> Result<Vec<ServerSeen>, CloudError> {
        #[derive(Deserialize)]
        struct Envelope {
            servers: Vec<NovaServer>,
        }
        // Nova caps `limit` at its `api.max_limit`, so a short page does not mean the last one:
        // pages are read until one comes back empty.
        const PAGE: usize = 1000;
        let since = since
            .map(|t| {
                format!("&changes-since={}", encode(&crate::openstack::time::format_rfc3339(t)))
            })
            .unwrap_or_default();
        let mut seen = Vec::new();
        let mut marker = String::new();
        loop {
            let path = format!("/servers/detail?all_tenants=1&limit={PAGE}{since}{marker}");
            let page = self.get_listing::<Envelope>("compute", &path, None).await?.servers;
            let Some(last) = page.last() else { return Ok(seen) };
            marker = format!("&marker={}", encode(&last.id));
            for server in page {
                // A server in a cell that is down comes back partial: seen, not gone, no host.
                if server.status == "UNKNOWN" {
                    seen.push(ServerSeen { id: ServerId(server.id), host: None, gone: false });
                    continue;
                }
                let host = match server.host {
                    Some(host) => host.and_then(|h| HostId::new(h).ok()),
                    None => {
                        return Err(CloudError::unavailable(
                            "Nova does not show OS-EXT-SRV-ATTR:host: gsaasd's service user \
                             needs the admin role",
                        ))
                    }
                };
                let gone = matches!(server.status.as_str(), "DELETED" | "SOFT_DELETED");
                seen.push(ServerSeen { id: ServerId(server.id), host, gone });
            }
        }
    }

    async fn delete_server(&self, id: &ServerId, timeout: Duration) -> Result<(), CloudError> {
        let path = format!("/servers/{}", encode(&id.0));
        let answer = self.call("compute", Method::DELETE, &path, None, None).await?;
        match answer.status.as_u16() {
            204 | 202 | 200 => {}
            404 => return Ok(()),
            409 => {
                return Err(CloudError::unavailable(format!(
                    "Nova cannot delete server {id} now: {}",
                    error_message(&answer.body)
                )))
            }
            _ => return Err(refused("Nova", answer.status, &answer.body)),
        }
        let gone = async {
            loop {
                match self.get_server(id).await {
                    Err(CloudError::NotFound(_)) => return Ok(()),
                    Err(e) => return Err(e),
                    // SOFT_DELETED stays until the operator's reclaim interval; DELETED is
                    // Nova's last step before it destroys the row and frees the host's
                    // Placement allocations, so the deletion is done only at 404.
                    Ok(server) if server.status == "SOFT_DELETED" => return Ok(()),
                    Ok(_) => tokio::time::sleep(self.poll_interval()).await,
                }
            }
        };
        Self::bounded(timeout, gone).await
    }
}

/// The one `kind` that `name` (a name or an id) finds among `candidates`, or why not: there is
/// none, or several share the name (then it must be named by id). `field` is the request's.
fn the_one<T>(
    candidates: Vec<T>,
    field: &'static str,
    kind: &str,
    name: &str,
) -> Result<T, CloudError> {
    let mut candidates = candidates.into_iter();
    let reason = match (candidates.next(), candidates.next()) {
        (Some(one), None) => return Ok(one),
        (None, _) => format!("no {kind} {name:?}"),
        (Some(_), Some(_)) => format!("several {kind}s are named {name:?}; name it by id"),
    };
    Err(CloudError::Invalid { field, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_length_is_padded() {
        assert_eq!([0, 1, 2, 3, 4].map(base64_len), [0, 4, 4, 4, 8]);
        assert_eq!(base64_len(49_149), 65_532);
        assert_eq!(base64_len(usize::MAX), usize::MAX);
        assert!(check_user_data_len(49_149).is_ok());
        assert!(check_user_data_len(49_150).unwrap_err().contains("65536 base64-encoded"));
    }

    #[test]
    fn a_name_finds_one_resource_or_says_why_not() {
        let reason = |e: CloudError| match e {
            CloudError::Invalid { field, reason } => format!("{field}: {reason}"),
            other => panic!("not a refusal of the request: {other:?}"),
        };
        assert_eq!(the_one(vec![7], "image", "image", "cirros").unwrap(), 7);
        let none = the_one(Vec::<u8>::new(), "networks", "network", "private").unwrap_err();
        assert_eq!(reason(none), "networks: no network \"private\"");
        let several = the_one(vec![1, 2], "image", "image", "cirros").unwrap_err();
        assert_eq!(reason(several), "image: several images are named \"cirros\"; name it by id");
    }
}
