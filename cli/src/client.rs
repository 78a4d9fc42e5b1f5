//! Talking to gsaasd: where it is, who we are, and what its answers mean for the exit code.
//!
//! Every failure becomes one [`Failure`]: a one-line message (from the server's problem document, or
//! naming the URL that could not be reached) and the exit code of its kind.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::blocking::{Client as Http, RequestBuilder, Response};
use serde::Deserialize;
use serde_json::Value;

use openstack_config::AuthSettings;

use crate::openstack::{self, Credentials, Where};

pub use crate::failure::{exit, unreachable, Failure};

/// The config file's settings; every one optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub url: Option<String>,
    pub token: Option<String>,
    pub image: Option<String>,
    pub flavor: Option<String>,
}

impl FileConfig {
    /// Reads `path`, or GSAAS_CONFIG, or `~/.config/gsaas/config.toml` if it exists.
    pub fn load(path: Option<&Path>) -> Result<FileConfig, Failure> {
        let explicit = path
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("GSAAS_CONFIG").map(PathBuf::from));
        let path = match explicit {
            Some(path) => path,
            None => match std::env::var_os("HOME") {
                Some(home) => {
                    let default = PathBuf::from(home).join(".config/gsaas/config.toml");
                    if !default.exists() {
                        return Ok(FileConfig::default());
                    }
                    default
                }
                None => return Ok(FileConfig::default()),
            },
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Failure::usage(format!("cannot read config file {}: {e}", path.display()))
        })?;
        toml::from_str(&text)
            .map_err(|e| Failure::usage(format!("invalid config file {}: {e}", path.display())))
    }
}

/// Who we are to gsaasd.
#[derive(Debug)]
pub enum Auth {
    /// Nothing given.
    None,
    /// A gsaasd token (`--token`, GSAAS_TOKEN, the config file), sent as `Authorization: Bearer`.
    Bearer(String),
    /// A Keystone token (`OS_TOKEN`), sent as `X-Auth-Token`, and where its catalog is.
    Keystone(String, Where),
    /// OpenStack password credentials, exchanged for a Keystone token on the first request.
    Password(Box<AuthSettings>, OnceCell<String>),
}

impl Auth {
    /// The gsaasd token if one is given (flag, GSAAS_TOKEN or config file), else the OpenStack
    /// credentials of the environment (`OS_TOKEN`, `OS_CLOUD` + clouds.yaml, `OS_*`), else none.
    pub fn resolve(gsaas_token: Option<String>) -> Result<Auth, Failure> {
        if let Some(token) = gsaas_token.filter(|t| !t.trim().is_empty()) {
            return Ok(Auth::Bearer(token.trim().to_owned()));
        }
        Ok(match openstack::credentials(&|name| std::env::var(name).ok())? {
            None => Auth::None,
            Some(Credentials::Token(token, place)) => Auth::Keystone(token, place),
            Some(Credentials::Password(password)) => Auth::Password(password, OnceCell::new()),
        })
    }

    /// gsaasd's URL in the Keystone catalog of these credentials (a password login happens now,
    /// and its token is kept for the requests), or `None` for credentials without a catalog (a
    /// gsaasd token, or none). `interface` and `region` as given on the command line, else the
    /// credentials' own (`OS_INTERFACE`, `OS_REGION_NAME`, the cloud's), else public and any.
    pub fn discover(
        &self,
        interface: Option<&str>,
        region: Option<&str>,
    ) -> Result<Option<String>, Failure> {
        let (catalog, own_interface, own_region) = match self {
            Auth::None | Auth::Bearer(_) => return Ok(None),
            Auth::Keystone(token, place) => (
                openstack::catalog_of(token, place)?,
                place.interface.clone(),
                place.region.clone(),
            ),
            Auth::Password(password, token) => {
                let issued = openstack::issue_token(password)?;
                let _ = token.set(issued.token);
                let interface = Some(password.interface.clone()).filter(|i| !i.is_empty());
                (issued.catalog, interface, password.region_name.clone())
            }
        };
        let interface = interface.map(str::to_owned).or(own_interface);
        let region = region.map(str::to_owned).or(own_region);
        openstack::gsaasd_url(&catalog, interface.as_deref(), region.as_deref()).map(Some)
    }
}

#[derive(Debug)]
pub struct Client {
    http: Http,
    pub url: String,
    auth: Auth,
}

impl Client {
    pub fn new(url: &str, auth: Auth) -> Client {
        let http = Http::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client builds");
        Client { http, url: url.trim_end_matches('/').to_owned(), auth }
    }

    fn authorized(&self, request: RequestBuilder) -> Result<RequestBuilder, Failure> {
        match &self.auth {
            Auth::None => Err(Failure {
                message: "no token: set GSAAS_TOKEN or pass --token (an operator issues one with \
                      `gsaasd token issue --project PROJECT`), or, with a Keystone-backed \
                      gsaasd, OS_CLOUD or the OS_* variables"
                    .into(),
                code: exit::AUTH,
            }),
            Auth::Bearer(token) => Ok(request.bearer_auth(token)),
            Auth::Keystone(token, _) => Ok(request.header("X-Auth-Token", token)),
            Auth::Password(password, token) => {
                if token.get().is_none() {
                    let _ = token.set(openstack::issue_token(password)?.token);
                }
                Ok(request.header("X-Auth-Token", token.get().expect("set above")))
            }
        }
    }

    fn send(&self, request: RequestBuilder) -> Result<Value, Failure> {
        let response = self.authorized(request)?.send().map_err(|e| self.unreachable(&e))?;
        decode(response)
    }

    fn unreachable(&self, e: &reqwest::Error) -> Failure {
        unreachable(&format!("gsaasd at {}", self.url), e)
    }

    pub fn get(&self, path: &str) -> Result<Value, Failure> {
        self.send(self.http.get(format!("{}{path}", self.url)))
    }

    pub fn post(
        &self,
        path: &str,
        body: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<Value, Failure> {
        let mut request = self.http.post(format!("{}{path}", self.url)).json(body);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        self.send(request)
    }

    pub fn put(&self, path: &str, body: &Value) -> Result<Value, Failure> {
        self.send(self.http.put(format!("{}{path}", self.url)).json(body))
    }

    pub fn delete(&self, path: &str) -> Result<Value, Failure> {
        self.send(self.http.delete(format!("{}{path}", self.url)))
    }

    /// A `PUT` (`body`) or, without one, a `DELETE` of `path`, made only if what it changes is
    /// still at `version` (`If-Match`; none: unconditional). `None`: it changed meanwhile (409
    /// `version_conflict`),
    /// and nothing was done.
    pub fn change_if_match(
        &self,
        path: &str,
        body: Option<&Value>,
        version: Option<&str>,
    ) -> Result<Option<Value>, Failure> {
        let url = format!("{}{path}", self.url);
        let mut request = match body {
            Some(body) => self.http.put(url).json(body),
            None => self.http.delete(url),
        };
        if let Some(version) = version {
            request = request.header("If-Match", format!("\"{version}\""));
        }
        let response = self.authorized(request)?.send().map_err(|e| self.unreachable(&e))?;
        if response.status().as_u16() != 409 {
            return decode(response).map(Some);
        }
        let text = response.text().unwrap_or_default();
        let problem: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if problem["code"] == "version_conflict" {
            return Ok(None);
        }
        let detail = problem["detail"].as_str().map_or(text, str::to_owned);
        Err(Failure { message: detail, code: exit::REFUSED })
    }
}

/// The body of a 2xx answer, or the problem document's message and its exit code.
fn decode(response: Response) -> Result<Value, Failure> {
    let status = response.status().as_u16();
    let text = response.text().unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if (200..300).contains(&status) {
        return Ok(body);
    }
    let detail =
        body["detail"].as_str().map(str::to_owned).unwrap_or_else(|| format!("HTTP {status}"));
    let code = match status {
        401 => exit::AUTH,
        404 => exit::NOT_FOUND,
        507 => exit::NO_CAPACITY,
        400 | 413 | 422 => exit::USAGE,
        500.. => exit::UNAVAILABLE,
        _ => exit::REFUSED,
    };
    let message = match status {
        404 => format!("not found: {detail}"),
        507 => format!("no GPU capacity: {detail}"),
        403 => format!("over quota: {detail}"),
        401 => format!("authentication failed: {detail}"),
        _ => detail,
    };
    Err(Failure { message, code })
}
