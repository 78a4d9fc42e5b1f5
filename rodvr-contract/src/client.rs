//! Typed HTTP clients for both directions of the agent protocol.
//!
//! [`AgentClient`] is what the controller (`gsaasd`) uses to push tables, read them back and check
//! health; it signs a short-lived token per request, made out to the one host it talks to.
//! [`ControllerClient`] is what the agent uses to register, heartbeat and renew its own bearer
//! token. Neither retries: the caller's reconciler or heartbeat loop is the retry.

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;

use gpgpums::ids::HostId;

use crate::auth::TokenSigner;
use crate::protocol::{
    AppliedState, ApplyStatus, ErrorBody, Health, HostReport, RouteTable, RttTarget, RttTargets,
    MAX_RTT_TARGETS,
};
use crate::version::{self, Skew};

const TOKEN_TTL: Duration = Duration::from_secs(60);

/// The most of an answer either side reads: a table read back is at most what an agent takes
/// in a push.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;
/// The most of an error answer either side reads: the other side may be hostile, and an error
/// says what it has to say in far less.
pub const MAX_ERROR_BYTES: usize = 64 << 10;
/// The most of an error's message kept (in logs, taints and alerts).
pub const MAX_ERROR_MESSAGE_CHARS: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request to {url} failed")]
    Transport { url: String, source: reqwest::Error },
    #[error("{url} answered with more than {limit} bytes; the rest was not read")]
    Oversized { url: String, limit: usize },
    /// The other side speaks a protocol outside the skew policy (see [`crate::version`]).
    #[error("{url}: {skew}")]
    Skew { url: String, skew: Skew },
    #[error("{url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
        /// The table entry at fault, when the agent named one.
        entry: Option<String>,
    },
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            Self::Transport { .. } | Self::Oversized { .. } | Self::Skew { .. } => None,
        }
    }

    /// The entry the agent named as at fault (`routes[3].target`), if any.
    pub fn entry(&self) -> Option<&str> {
        match self {
            Self::Status { entry, .. } => entry.as_deref(),
            Self::Transport { .. } | Self::Oversized { .. } | Self::Skew { .. } => None,
        }
    }
}

/// The answer's body, read chunk by chunk: `None` once it passes `limit` (what is left is not
/// read, and the connection is dropped).
async fn read_capped(
    mut response: Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// The error an answer with a non-2xx `status` carries: the first [`MAX_ERROR_BYTES`] of its
/// body at most, and of its message [`MAX_ERROR_MESSAGE_CHARS`].
async fn status_error(url: String, status: reqwest::StatusCode, response: Response) -> ClientError {
    let reason = || status.canonical_reason().unwrap_or("error").to_owned();
    let body = read_capped(response, MAX_ERROR_BYTES).await.ok().flatten();
    let (message, entry) = match body.and_then(|b| serde_json::from_slice::<ErrorBody>(&b).ok()) {
        Some(body) => (body.error, body.entry),
        None => (reason(), None),
    };
    let message = match message.char_indices().nth(MAX_ERROR_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &message[..cut]),
        None => message,
    };
    let entry = entry.filter(|e| e.len() <= 256);
    ClientError::Status { url, status: status.as_u16(), message, entry }
}

/// A client that trusts the system's CAs (tests and tools; the binaries build theirs with
/// [`gsaas_infra::httpd::http_client`] and their configured CA).
pub fn http_client() -> reqwest::Client {
    gsaas_infra::httpd::http_client(None).expect("a client without a CA bundle always builds")
}

/// Which side answers a request, and so which check its protocol header gets.
#[derive(Debug, Clone, Copy)]
enum Peer {
    Agent,
    Controller,
}

/// Sends `request` with this build's protocol and checks the answer's (see [`crate::version`]).
async fn exchange(url: &str, peer: Peer, request: RequestBuilder) -> Result<Response, ClientError> {
    let request = request.header(version::HEADER, version::PROTOCOL);
    let response: Response = request
        .send()
        .await
        .map_err(|source| ClientError::Transport { url: url.to_owned(), source })?;
    if response.status().is_success() {
        let header = response.headers().get(version::HEADER).map(|v| v.to_str().unwrap_or("?"));
        let checked = match peer {
            Peer::Agent => version::check_agent(header),
            Peer::Controller => version::check_controller(header),
        };
        checked.map_err(|skew| ClientError::Skew { url: url.to_owned(), skew })?;
    }
    Ok(response)
}

async fn send<T: DeserializeOwned>(
    url: String,
    peer: Peer,
    request: RequestBuilder,
) -> Result<T, ClientError> {
    let transport = |source| ClientError::Transport { url: url.clone(), source };
    let response = exchange(&url, peer, request).await?;
    let status = response.status();
    if !status.is_success() {
        return Err(status_error(url, status, response).await);
    }
    let Some(body) = read_capped(response, MAX_ANSWER_BYTES).await.map_err(transport)? else {
        return Err(ClientError::Oversized { url, limit: MAX_ANSWER_BYTES });
    };
    serde_json::from_slice(&body).map_err(|e| ClientError::Status {
        url: url.clone(),
        status: status.as_u16(),
        message: format!("the answer is not the expected JSON: {e}"),
        entry: None,
    })
}

/// The controller's client for one host's agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    base: String,
    host: HostId,
    signer: TokenSigner,
}

impl AgentClient {
    /// `base` is where the agent of `host` is reached, e.g. `http://10.0.0.11:7450`.
    pub fn new(base: impl Into<String>, host: HostId, signer: TokenSigner) -> Self {
        Self::with_http(http_client(), base, host, signer)
    }

    /// Like [`AgentClient::new`], over an existing client (its connections are reused).
    pub fn with_http(
        http: reqwest::Client,
        base: impl Into<String>,
        host: HostId,
        signer: TokenSigner,
    ) -> Self {
        let base = base.into().trim_end_matches('/').to_owned();
        Self { http, base, host, signer }
    }

    fn request(&self, method: Method, path: &str) -> (String, RequestBuilder) {
        let url = format!("{}{path}", self.base);
        let token = self.signer.sign(&self.host, TOKEN_TTL);
        let req = self.http.request(method, &url).bearer_auth(token);
        (url, req)
    }

    /// Pushes the host's complete route table.
    pub async fn put_routes(&self, table: &RouteTable) -> Result<ApplyStatus, ClientError> {
        let (url, req) = self.request(Method::PUT, "/v1/routes");
        send(url, Peer::Agent, req.json(table)).await
    }

    /// Reads back what the agent holds and applied.
    pub async fn routes(&self) -> Result<AppliedState, ClientError> {
        let (url, req) = self.request(Method::GET, "/v1/routes");
        send(url, Peer::Agent, req).await
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        let (url, req) = self.request(Method::GET, "/v1/health");
        send(url, Peer::Agent, req).await
    }

    pub async fn host(&self) -> Result<HostReport, ClientError> {
        let (url, req) = self.request(Method::GET, "/v1/host");
        send(url, Peer::Agent, req).await
    }
}

/// The agent's client for the controller.
#[derive(Debug)]
pub struct ControllerClient {
    http: reqwest::Client,
    base: String,
    token: std::sync::RwLock<String>,
}

/// A renewed token, as gsaasd answers `POST /v1/hosts/{host}/token`.
#[derive(Debug, Clone, serde::Deserialize)]
struct Renewed {
    token: String,
}

impl ControllerClient {
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        Self::with_http(http_client(), base, token)
    }

    /// Like [`ControllerClient::new`], over `http` (built with the controller's CA).
    pub fn with_http(
        http: reqwest::Client,
        base: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        let base = base.into().trim_end_matches('/').to_owned();
        Self { http, base, token: std::sync::RwLock::new(token.into()) }
    }

    /// The token presented now.
    pub fn token(&self) -> String {
        self.token.read().expect("token").clone()
    }

    /// Registers the host or refreshes its registration (`PUT /v1/hosts/{host}`); the response
    /// body is ignored.
    pub async fn register(&self, report: &HostReport) -> Result<(), ClientError> {
        let url = format!("{}/v1/hosts/{}", self.base, report.host);
        let req = self.http.put(&url).bearer_auth(self.token()).json(report);
        let response = exchange(&url, Peer::Controller, req).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        Err(status_error(url, status, response).await)
    }

    /// The GPU hosts whose round trips the host's agent measures
    /// (`GET /v1/hosts/{host}/rtt-targets`), at most [`MAX_RTT_TARGETS`] of them.
    pub async fn rtt_targets(&self, host: &HostId) -> Result<Vec<RttTarget>, ClientError> {
        let url = format!("{}/v1/hosts/{host}/rtt-targets", self.base);
        let req = self.http.get(&url).bearer_auth(self.token());
        let answer: RttTargets = send(url, Peer::Controller, req).await?;
        Ok(answer.targets.into_iter().take(MAX_RTT_TARGETS).collect())
    }

    /// Trades the current token for a fresh one (`POST /v1/hosts/{host}/token`), which it
    /// presents from then on; returns it.
    pub async fn renew(&self, host: &HostId) -> Result<String, ClientError> {
        let url = format!("{}/v1/hosts/{host}/token", self.base);
        let req = self.http.post(&url).bearer_auth(self.token());
        let renewed: Renewed = send(url, Peer::Controller, req).await?;
        *self.token.write().expect("token") = renewed.token.clone();
        Ok(renewed.token)
    }
}
