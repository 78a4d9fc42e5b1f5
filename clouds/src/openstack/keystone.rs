//! Keystone v3: gsaasd's own service token (with the catalog that locates Nova, Neutron and Glance)
//! and the validation of tenants' tokens.
//!
//! One token is shared by every call: it is reused until shortly before its `expires_at` (a margin,
//! so that a request does not start with a token that dies in flight) and dropped when a service
//! answers 401, after which the next call authenticates again. A mutex around the token makes
//! concurrent callers wait for a single re-authentication instead of each starting one.
//!
//! Tenant tokens are validated with `GET /v3/auth/tokens` (the service token in `X-Auth-Token`, the
//! tenant's in `X-Subject-Token`). The answers are cached until the token expires (or a maximum age,
//! so that revocation takes effect), because every API call of a tenant would otherwise cost a
//! Keystone round trip; the cache is bounded and evicts stale entries first, then the one going
//! stale soonest. Refusals are cached too, briefly, and each client address may cause only so many
//! validations a minute: otherwise anyone could make gsaasd send Keystone one request per request.
//!
//! A Keystone admin role makes a GSaaS admin only where the configuration says
//! ([`AdminScope`]): on a system-scoped token, or in one named admin project. An admin of any other
//! project is a member of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde::Deserialize;

use super::client_budget::ClientBudget;
use super::time::parse_rfc3339;
use super::AuthSettings;

/// The header that carries a token to a service, and Keystone's answer header.
pub const AUTH_TOKEN: &str = "X-Auth-Token";
pub const SUBJECT_TOKEN: &str = "X-Subject-Token";

#[derive(Debug, thiserror::Error)]
pub enum KeystoneError {
    #[error("cannot reach {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} did not answer within {timeout:?}")]
    Timeout {
        url: String,
        timeout: Duration,
        #[source]
        source: reqwest::Error,
    },
    #[error("Keystone refused the service credentials ({status}): {message}")]
    Rejected { status: u16, message: String },
    #[error("Keystone failed ({status}): {message}")]
    Failed { status: u16, message: String },
    #[error("unexpected answer from Keystone: {reason}")]
    Protocol {
        reason: String,
        #[source]
        source: Option<serde_json::Error>,
    },
    #[error(transparent)]
    NoEndpoint(#[from] NoEndpoint),
    #[error("cannot use the CA bundle {path}")]
    CaCert {
        path: std::path::PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Timeouts and the re-authentication margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpOptions {
    /// Limit for one whole request (connect, send, answer).
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// A token is renewed when it has less than this left.
    pub token_refresh_margin: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            token_refresh_margin: Duration::from_secs(120),
        }
    }
}

pub use openstack_config::catalog::{CatalogEndpoint, CatalogEntry, NoEndpoint};

#[derive(Debug, Clone, Deserialize)]
struct Named {
    id: String,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct ProjectScope {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    domain: Option<Named>,
}

#[derive(Debug, Clone, Deserialize)]
struct TokenBody {
    expires_at: String,
    #[serde(default)]
    catalog: Vec<CatalogEntry>,
    #[serde(default)]
    project: Option<ProjectScope>,
    /// Present on system-scoped tokens (`{"all": true}`).
    #[serde(default)]
    system: Option<serde_json::Value>,
    user: Named,
    #[serde(default)]
    roles: Vec<Named>,
    /// The token's audit id, then (for a token had from another) its chain's first token's.
    #[serde(default)]
    audit_ids: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct TokenEnvelope {
    token: TokenBody,
}

/// gsaasd's current service token.
#[derive(Debug, Clone)]
pub struct ServiceToken {
    pub token: String,
    /// The service user's id (a trust's trustee).
    pub user_id: String,
    pub expires_at: SystemTime,
    pub project_id: Option<String>,
    pub catalog: Arc<Vec<CatalogEntry>>,
}

/// A Keystone session for gsaasd's service user. See the module docs.
#[derive(Debug)]
pub struct Keystone {
    http: reqwest::Client,
    settings: AuthSettings,
    options: HttpOptions,
    current: tokio::sync::Mutex<Option<ServiceToken>>,
}

/// The message of an OpenStack error body (`{"error": {"message"}}`, `{"badRequest": {"message"}}`,
/// `{"NeutronError": {"message"}}`), or the start of the text.
pub fn error_message(body: &[u8]) -> String {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body) {
        for value in map.values() {
            if let Some(message) = value.get("message").and_then(|m| m.as_str()) {
                return message.to_owned();
            }
            if let Some(message) = value.as_str() {
                return message.to_owned();
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(no message)".to_owned()
    } else {
        text.chars().take(300).collect()
    }
}

/// A Keystone answer that is no success: the service credentials' fault (401, 403, 404), or
/// Keystone's.
pub(crate) fn refusal(status: StatusCode, body: &[u8]) -> KeystoneError {
    let (status, message) = (status.as_u16(), error_message(body));
    match status {
        401 | 403 | 404 => KeystoneError::Rejected { status, message },
        _ => KeystoneError::Failed { status, message },
    }
}

/// The certificates of a PEM bundle (`cacert`), trusted besides the system's.
fn ca_bundle(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, KeystoneError> {
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| KeystoneError::CaCert {
        path: path.to_owned(),
        source,
    };
    let pem = std::fs::read(path).map_err(|e| failed(Box::new(e)))?;
    let certificates =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| failed(Box::new(e)))?;
    if certificates.is_empty() {
        return Err(failed("no PEM certificate in it".into()));
    }
    Ok(certificates)
}

impl Keystone {
    /// A session; nothing is sent until the first call. `settings` must have passed
    /// [`AuthSettings::check`] (as [`AuthSettings::load`] ensures).
    pub fn new(settings: AuthSettings, options: HttpOptions) -> Result<Keystone, KeystoneError> {
        let mut builder = reqwest::Client::builder()
            .timeout(options.request_timeout)
            .connect_timeout(options.connect_timeout);
        if let Some(path) = &settings.cacert {
            for certificate in ca_bundle(path)? {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let http = builder
            .build()
            .map_err(|source| KeystoneError::Unreachable { url: settings.identity_v3(), source })?;
        Ok(Keystone { http, settings, options, current: tokio::sync::Mutex::new(None) })
    }

    /// The HTTP client shared with the other services' clients (same timeouts).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn options(&self) -> HttpOptions {
        self.options
    }

    pub fn settings(&self) -> &AuthSettings {
        &self.settings
    }

    /// Maps a failed send to `Unreachable` or `Timeout`.
    fn send_error(&self, url: &str, source: reqwest::Error) -> KeystoneError {
        if source.is_timeout() {
            KeystoneError::Timeout {
                url: url.to_owned(),
                timeout: self.options.request_timeout,
                source,
            }
        } else {
            KeystoneError::Unreachable { url: url.to_owned(), source }
        }
    }

    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), KeystoneError> {
        let response = request.send().await.map_err(|e| self.send_error(url, e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(|e| self.send_error(url, e))?;
        Ok((status, headers, body.to_vec()))
    }

    /// A valid service token: the cached one while it has more than the margin left, else a new one.
    pub async fn token(&self) -> Result<ServiceToken, KeystoneError> {
        let mut current = self.current.lock().await;
        if let Some(token) = current.as_ref() {
            if SystemTime::now() + self.options.token_refresh_margin < token.expires_at {
                return Ok(token.clone());
            }
        }
        let token = self.authenticate().await?;
        *current = Some(token.clone());
        Ok(token)
    }

    /// Forgets `token` (a service answered 401 to it); the next [`token`](Self::token) re-authenticates.
    pub async fn invalidate(&self, token: &str) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|t| t.token == token) {
            *current = None;
        }
    }

    /// Authenticates with `body` (`POST /v3/auth/tokens`): the new token, and the token's body.
    pub(crate) async fn issue(
        &self,
        body: &serde_json::Value,
    ) -> Result<(String, Vec<u8>), KeystoneError> {
        let url = format!("{}/auth/tokens", self.settings.identity_v3());
        let request = self.http.post(&url).json(body);
        let (status, headers, body) = self.send(request, &url).await?;
        if !matches!(status, StatusCode::CREATED | StatusCode::OK) {
            return Err(refusal(status, &body));
        }
        let token = headers
            .get(SUBJECT_TOKEN)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| KeystoneError::Protocol {
                reason: format!("{status} without an {SUBJECT_TOKEN} header"),
                source: None,
            })?
            .to_owned();
        Ok((token, body))
    }

    async fn authenticate(&self) -> Result<ServiceToken, KeystoneError> {
        let (token, body) = self.issue(&self.settings.password_auth_body()).await?;
        let envelope: TokenEnvelope =
            serde_json::from_slice(&body).map_err(|source| KeystoneError::Protocol {
                reason: "the token body does not parse".into(),
                source: Some(source),
            })?;
        let expires_at =
            parse_rfc3339(&envelope.token.expires_at).ok_or_else(|| KeystoneError::Protocol {
                reason: format!("expires_at {:?} is not RFC 3339", envelope.token.expires_at),
                source: None,
            })?;
        Ok(ServiceToken {
            token,
            user_id: envelope.token.user.id,
            expires_at,
            project_id: envelope.token.project.map(|p| p.id),
            catalog: Arc::new(envelope.token.catalog),
        })
    }

    /// The URL (no trailing slash) of `service_type` in `token`'s catalog, for the configured
    /// interface and region.
    pub fn endpoint(
        &self,
        token: &ServiceToken,
        service_type: &str,
    ) -> Result<String, KeystoneError> {
        let region = self.settings.region_name.as_deref();
        let interface = self.settings.interface.as_str();
        Ok(openstack_config::catalog::endpoint(&token.catalog, service_type, interface, region)?)
    }

    /// Validates a tenant's token: `Ok(None)` when Keystone does not know it (404, or expired).
    /// A 401 to the service token drops it and retries once with a new one.
    pub async fn validate(&self, subject: &str) -> Result<Option<TokenInfo>, KeystoneError> {
        // `?nocatalog`: a tenant token's catalog is large and of no use here.
        let url = format!("{}/auth/tokens?nocatalog", self.settings.identity_v3());
        let mut service = self.token().await?;
        let (mut status, mut body) = self.validate_once(&url, &service.token, subject).await?;
        if status == StatusCode::UNAUTHORIZED {
            self.invalidate(&service.token).await;
            service = self.token().await?;
            (status, body) = self.validate_once(&url, &service.token, subject).await?;
        }
        match status {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => return Ok(None),
            _ => return Err(refusal(status, &body)),
        }
        let envelope: TokenEnvelope =
            serde_json::from_slice(&body).map_err(|source| KeystoneError::Protocol {
                reason: "the validated token does not parse".into(),
                source: Some(source),
            })?;
        let token = envelope.token;
        let Some(expires_at) = parse_rfc3339(&token.expires_at) else {
            return Err(KeystoneError::Protocol {
                reason: format!("expires_at {:?} is not RFC 3339", token.expires_at),
                source: None,
            });
        };
        if expires_at <= SystemTime::now() {
            return Ok(None);
        }
        let system = token.system.as_ref().is_some_and(|s| s.get("all") == Some(&true.into()));
        let domain = token.project.as_ref().and_then(|p| p.domain.clone());
        Ok(Some(TokenInfo {
            user_id: token.user.id,
            user_name: token.user.name,
            project_id: token.project.as_ref().map(|p| p.id.clone()),
            project_name: token.project.and_then(|p| p.name),
            project_domain: domain.map(|d| (d.id, d.name)),
            system,
            roles: token.roles.into_iter().filter_map(|r| r.name).collect(),
            expires_at,
            audit_ids: token.audit_ids,
        }))
    }

    async fn validate_once(
        &self,
        url: &str,
        service: &str,
        subject: &str,
    ) -> Result<(StatusCode, Vec<u8>), KeystoneError> {
        let request = self
            .http
            .request(Method::GET, url)
            .header(AUTH_TOKEN, service)
            .header(SUBJECT_TOKEN, subject);
        let (status, _, body) = self.send(request, url).await?;
        Ok((status, body))
    }
}

/// What Keystone says about a validated token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub user_id: String,
    pub user_name: Option<String>,
    /// `None` for unscoped, domain- or system-scoped tokens.
    pub project_id: Option<String>,
    pub project_name: Option<String>,
    /// The project's domain: (id, name).
    pub project_domain: Option<(String, Option<String>)>,
    /// Whether the token is scoped to the whole system.
    pub system: bool,
    pub roles: Vec<String>,
    pub expires_at: SystemTime,
    /// Keystone's audit ids: the token's own, then, if it was had from another token (a
    /// rescoping), the first token of its chain's.
    pub audit_ids: Vec<String>,
}

impl TokenInfo {
    /// What every token of this one's chain shares (the audit id of the chain's first token, as
    /// Keystone's revocation events name a chain): a sign-in's unscoped root and every token
    /// rescoped from it, or from those.
    pub fn audit_chain(&self) -> Option<&str> {
        self.audit_ids.last().map(String::as_str)
    }
}

/// Where a Keystone admin role makes a GSaaS admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminScope {
    /// Keystone's roles that count.
    pub roles: Vec<String>,
    /// On a system-scoped token.
    pub system: bool,
    /// In this project: its id, or its name in `project_domain` (an id or a name).
    pub project: Option<String>,
    pub project_domain: String,
}

impl AdminScope {
    /// Whether `info` is an admin's token.
    pub fn admits(&self, info: &TokenInfo) -> bool {
        if !info.roles.iter().any(|r| self.roles.contains(r)) {
            return false;
        }
        if info.system {
            return self.system;
        }
        let Some(admin_project) = &self.project else { return false };
        if info.project_id.as_ref() == Some(admin_project) {
            return true;
        }
        let in_domain = info.project_domain.as_ref().is_some_and(|(id, name)| {
            *id == self.project_domain || name.as_ref() == Some(&self.project_domain)
        });
        in_domain && info.project_name.as_ref() == Some(admin_project)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    /// Keystone does not know the token, or it has expired (the caller answers 401).
    #[error("the token is invalid or expired")]
    Invalid,
    /// A valid token without a project: gsaasd's resources belong to projects.
    #[error("the token is not scoped to a project")]
    Unscoped,
    /// This client made Keystone validate too many tokens lately (the caller answers 429).
    #[error("too many token validations from this client")]
    RateLimited,
    /// Keystone could not say (the caller answers 503).
    #[error("cannot validate the token")]
    Keystone(#[source] KeystoneError),
}

/// A tenant (or admin) authenticated by Keystone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantIdentity {
    pub info: TokenInfo,
    /// The token's project; `None` only for a system-scoped admin.
    pub project_id: Option<String>,
    /// Whether its roles and scope make it an admin ([`AdminScope`]); a member of its project
    /// otherwise.
    pub admin: bool,
}

/// How [`TokenValidator`] caches and limits.
#[derive(Debug, Clone)]
pub struct ValidatorSettings {
    pub admin: AdminScope,
    /// At most this many valid tokens are cached.
    pub capacity: usize,
    /// A cached answer is reused for at most this long, even if the token lives longer, so that
    /// a revoked token stops working (keystonemiddleware's `token_cache_time`, 300 s by default).
    pub max_age: Duration,
    /// A refused token is refused again without asking Keystone for this long.
    pub refusal_ttl: Duration,
    /// Keystone requests one client (an IPv4 address or an IPv6 /64) may cause per minute.
    pub per_client_per_minute: u32,
}

/// The most refusals remembered (beyond it, the expired ones and then all are forgotten).
const MAX_REMEMBERED: usize = 10_000;

#[derive(Debug)]
struct CacheEntry {
    identity: TenantIdentity,
    /// The earlier of the token's expiry and the end of the cache's own lifetime for it.
    fresh_until: SystemTime,
}

/// Validates tenants' Keystone tokens with a bounded cache. See the module docs.
#[derive(Debug)]
pub struct TokenValidator {
    keystone: Arc<Keystone>,
    settings: ValidatorSettings,
    cache: Mutex<HashMap<String, CacheEntry>>,
    /// Hashes of refused tokens (keyed with this process's random key), until when to refuse them.
    refused: Mutex<HashMap<u64, std::time::Instant>>,
    hasher: std::collections::hash_map::RandomState,
    budget: Mutex<ClientBudget>,
    /// Sign-outs of tokens not cached here ask Keystone what they are, this many at once: a
    /// sign-out draws on no client's budget (a neighbour must not be able to keep a user
    /// signed in), so this is what bounds what a flood of them costs Keystone.
    unknown_sign_outs: tokio::sync::Semaphore,
    /// Tokens of ended sessions whose revocation Keystone did not confirm, with their chain: the
    /// next sign-out of that chain revokes them.
    unrevoked: Mutex<HashMap<String, Option<String>>>,
}

/// How many sign-outs of tokens not cached here ask Keystone at once.
const MAX_UNKNOWN_SIGN_OUTS: usize = 4;

impl TokenValidator {
    pub fn new(keystone: Arc<Keystone>, mut settings: ValidatorSettings) -> TokenValidator {
        settings.capacity = settings.capacity.max(1);
        TokenValidator {
            keystone,
            settings,
            cache: Mutex::default(),
            refused: Mutex::default(),
            hasher: std::collections::hash_map::RandomState::new(),
            budget: Mutex::default(),
            unknown_sign_outs: tokio::sync::Semaphore::new(MAX_UNKNOWN_SIGN_OUTS),
            unrevoked: Mutex::default(),
        }
    }

    /// How many tokens are cached now.
    pub fn cached(&self) -> usize {
        self.cache.lock().expect("token cache").len()
    }

    /// The Keystone session the validations go through (sign-ins use it too).
    pub fn keystone(&self) -> &Keystone {
        &self.keystone
    }

    /// Forgets a token, so that the next use asks Keystone again (it was revoked here).
    pub fn forget(&self, token: &str) {
        self.cache.lock().expect("token cache").remove(token);
        self.remember_refusal(token);
    }

    /// Ends the session `token` belongs to: the token and every token of its chain that this
    /// validator has cached (a sign-in's unscoped root and the tokens rescoped from it) stop
    /// working here at once, and each is revoked at Keystone (whatever Keystone itself does with
    /// the tokens had from a revoked one). Draws on no client's budget. A token Keystone does
    /// not know is already ended. On an error, every token was forgotten here and those not
    /// named in it were revoked; signing out again with any of them revokes the rest.
    pub async fn end_session(&self, token: &str) -> Result<usize, ValidationError> {
        let cached = self.cache.lock().expect("token cache").get(token).map(|e| e.identity.clone());
        let cached = cached.map(|identity| identity.info.audit_chain().map(str::to_owned));
        let unrevoked = self.unrevoked.lock().expect("unrevoked tokens").get(token).cloned();
        let chain = match cached.or(unrevoked) {
            Some(chain) => chain,
            None if self.refused_now(token) => return Ok(0),
            None => {
                let _permit = self.unknown_sign_outs.acquire().await.expect("never closed");
                match self.keystone.validate(token).await.map_err(ValidationError::Keystone)? {
                    Some(info) => info.audit_chain().map(str::to_owned),
                    None => {
                        self.remember_refusal(token);
                        return Ok(0);
                    }
                }
            }
        };
        let mut ended = vec![token.to_owned()];
        if let Some(chain) = chain.as_deref() {
            let of_chain = |c: Option<&str>| c == Some(chain);
            let cache = self.cache.lock().expect("token cache");
            let unrevoked = self.unrevoked.lock().expect("unrevoked tokens");
            let cached = cache.iter().filter(|(_, e)| of_chain(e.identity.info.audit_chain()));
            let pending = unrevoked.iter().filter(|(_, c)| of_chain(c.as_deref()));
            for other in cached.map(|(t, _)| t).chain(pending.map(|(t, _)| t)) {
                if !ended.contains(other) {
                    ended.push(other.clone());
                }
            }
        }
        for token in &ended {
            self.forget(token);
        }
        let mut failed = None;
        for token in &ended {
            let revoked = self.keystone.revoke(token).await;
            let mut unrevoked = self.unrevoked.lock().expect("unrevoked tokens");
            match revoked {
                Ok(()) => {
                    unrevoked.remove(token);
                }
                Err(e) => {
                    if unrevoked.len() < MAX_REMEMBERED {
                        unrevoked.insert(token.clone(), chain.clone());
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => Ok(ended.len()),
            Some(e) => Err(ValidationError::Keystone(e)),
        }
    }

    /// Whether `token` was refused lately (and is refused again without asking Keystone).
    fn refused_now(&self, token: &str) -> bool {
        let key = self.refusal_key(token);
        let until = self.refused.lock().expect("refused tokens").get(&key).copied();
        until.is_some_and(|until| until > std::time::Instant::now())
    }

    /// Takes one Keystone request from `client`'s budget (shared by validations of unknown
    /// tokens and sign-ins); `false` when it is spent.
    pub fn take_budget(&self, client: std::net::IpAddr) -> bool {
        let per_minute = self.settings.per_client_per_minute;
        self.budget.lock().expect("client budgets").take(client, per_minute)
    }

    fn refusal_key(&self, token: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, token)
    }

    fn remember_refusal(&self, token: &str) {
        let now = std::time::Instant::now();
        let mut refused = self.refused.lock().expect("refused tokens");
        if refused.len() >= MAX_REMEMBERED {
            refused.retain(|_, until| *until > now);
            if refused.len() >= MAX_REMEMBERED {
                refused.clear();
            }
        }
        refused.insert(self.refusal_key(token), now + self.settings.refusal_ttl);
    }

    /// Validates `token` for a client at `client` (the rate limit's key, when known).
    pub async fn validate(
        &self,
        token: &str,
        client: Option<std::net::IpAddr>,
    ) -> Result<TenantIdentity, ValidationError> {
        let now = SystemTime::now();
        {
            let mut cache = self.cache.lock().expect("token cache");
            match cache.get(token) {
                Some(entry) if entry.fresh_until > now => return Ok(entry.identity.clone()),
                Some(_) => {
                    cache.remove(token);
                }
                None => {}
            }
        }
        if self.refused_now(token) {
            return Err(ValidationError::Invalid);
        }
        if client.is_some_and(|client| !self.take_budget(client)) {
            return Err(ValidationError::RateLimited);
        }
        let info = match self.keystone.validate(token).await.map_err(ValidationError::Keystone)? {
            Some(info) => info,
            None => {
                self.remember_refusal(token);
                return Err(ValidationError::Invalid);
            }
        };
        let admin = self.settings.admin.admits(&info);
        let project_id = match (&info.project_id, admin) {
            (Some(project), _) => Some(project.clone()),
            (None, true) => None,
            (None, false) => return Err(ValidationError::Unscoped),
        };
        let identity = TenantIdentity { info, project_id, admin };
        let mut cache = self.cache.lock().expect("token cache");
        if cache.len() >= self.settings.capacity {
            let now = SystemTime::now();
            cache.retain(|_, e| e.fresh_until > now);
            while cache.len() >= self.settings.capacity {
                let soonest = cache
                    .iter()
                    .min_by_key(|(_, e)| e.fresh_until)
                    .map(|(k, _)| k.clone())
                    .expect("a full cache has entries");
                cache.remove(&soonest);
            }
        }
        let fresh_until = identity.info.expires_at.min(SystemTime::now() + self.settings.max_age);
        cache.insert(token.to_owned(), CacheEntry { identity: identity.clone(), fresh_until });
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(roles: &[&str], project: Option<(&str, &str, &str)>, system: bool) -> TokenInfo {
        TokenInfo {
            user_id: "u".into(),
            user_name: None,
            project_id: project.map(|p| p.0.to_owned()),
            project_name: project.map(|p| p.1.to_owned()),
            project_domain: project.map(|p| (p.2.to_owned(), Some("Default".to_owned()))),
            system,
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            expires_at: SystemTime::now(),
            audit_ids: vec!["a".into()],
        }
    }

    #[test]
    fn an_admin_role_counts_only_in_the_admin_scope() {
        let mut scope = AdminScope {
            roles: vec!["admin".into()],
            system: true,
            project: None,
            project_domain: "Default".into(),
        };
        let system_admin = info(&["admin"], None, true);
        let project_admin = info(&["admin"], Some(("p1", "tenant-1", "default")), false);
        let ops_admin = info(&["admin"], Some(("p0", "ops", "default")), false);
        let ops_member = info(&["member"], Some(("p0", "ops", "default")), false);
        assert!(scope.admits(&system_admin));
        assert!(!scope.admits(&project_admin), "an admin of a tenant's own project");
        assert!(!scope.admits(&ops_admin));
        scope.project = Some("ops".into());
        assert!(scope.admits(&ops_admin), "by name in the Default domain");
        assert!(!scope.admits(&ops_member));
        assert!(!scope.admits(&project_admin));
        scope.project_domain = "other".into();
        assert!(!scope.admits(&ops_admin), "a project of that name in another domain");
        scope.project = Some("p0".into());
        assert!(scope.admits(&ops_admin), "by id");
        scope.system = false;
        assert!(!scope.admits(&system_admin));
    }
}
