//! Who is calling: bearer JWTs signed by gsaasd's own Ed25519 key.
//!
//! One key signs three kinds of tokens: tenants' (`member`, bound to a project), admins' and agents'
//! (bound to a host name). The same key signs gsaasd's requests to the agents (audience
//! `rodvr-agent`), so an agent needs only gsaasd's public key. Tokens arrive as
//! `Authorization: Bearer` or as `X-Auth-Token`, as OpenStack clients send them.
//!
//! Authorization is coarse on purpose: a route states the role it needs; a caller without it is told
//! the thing does not exist (404), so tenants cannot probe for admin resources or other projects' VMs.
//!
//! Every token has an id (`jti`), and can be revoked by it (`gsaasd token revoke`): the revoked ids
//! are kept in the database, and every replica reloads them every few seconds
//! ([`Keys::set_revoked`]). Agents renew their own token before it expires
//! (`POST /v1/hosts/{host}/token`); a renewed token carries the id of the first token of its line
//! (`root`), so revoking that id ends the whole line.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rodvr_contract::auth::TokenSigner;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::openstack::{TokenValidator, ValidationError};

/// Audience of tokens for gsaasd's own API.
pub const API_AUDIENCE: &str = "gsaas";

pub use crate::config::MAX_TOKEN_TTL_SECS;

pub use crate::caller::{Caller, Role};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claims {
    sub: String,
    aud: String,
    iat: u64,
    exp: u64,
    /// The token's id, by which it is revoked (absent in tokens from before ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
    /// For a renewed token: the id of the first token of its line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    root: Option<String>,
    /// The tenant's project (members and admins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    project: Option<String>,
    roles: Vec<Role>,
}

impl Claims {
    /// The ids whose revocation revokes this token: its own, and its line's first.
    fn ids(&self) -> impl Iterator<Item = &str> {
        self.jti.iter().chain(&self.root).map(String::as_str)
    }
}

/// A token's id and lifetime, as `gsaasd token revoke` needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenId {
    /// The id that ends the token's whole line: its root, or its own id.
    pub line: String,
    /// When the token expires (seconds since the epoch).
    pub expires: u64,
}

/// What a successful verification learned.
#[derive(Debug, Clone)]
struct Verified {
    caller: Caller,
    exp: u64,
    /// The ids whose revocation revokes the token.
    ids: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read or write signing key {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("signing key {path} is not an Ed25519 PKCS#8 PEM key")]
    Format { path: String },
    #[error(
        "signing key {path} is the example key earlier versions of the Helm chart published \
         (whatever its encoding): anyone can sign tokens with it; generate your own \
         (openssl genpkey -algorithm ed25519)"
    )]
    Published { path: String },
}

/// The public half of the example signing key earlier versions of the Helm chart published: a
/// key with this public key is anyone's, however its private half is encoded.
pub const PUBLISHED_EXAMPLE_PUBLIC_KEY: &str =
    "MCowBQYDK2VwAyEA7uPyDauzbvsSd30x3v3ejpIWDbrjs1oQ3oe7LQ8IEco=";

/// gsaasd's signing key.
#[derive(Clone)]
pub struct Keys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    private_pem: String,
    public_pem: String,
    /// Tokens this key verified, with their caller and expiry: a signature check costs tens of
    /// microseconds, and clients send the same token with every request.
    verified: Arc<Mutex<HashMap<String, Verified>>>,
    /// Revoked token ids, as last loaded from the database.
    revoked: Arc<RwLock<HashSet<String>>>,
}

/// How many verified tokens are remembered (the cache is emptied when full).
const VERIFIED_CACHE: usize = 4096;

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").finish_non_exhaustive()
    }
}

impl Keys {
    /// Loads the key at `path`. When it does not exist, creates it (0600, in a 0700 directory)
    /// with its public half beside it (`<path>.pub`). An existing key is only read: it may be a
    /// read-only mount (a Kubernetes Secret), and its public half is `gsaasd public-key`.
    pub fn load_or_create(path: &Path) -> Result<Keys, KeyError> {
        let io = |source| KeyError::Io { path: path.display().to_string(), source };
        if !path.exists() {
            let key = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng);
            let pem = key.to_pkcs8_pem(LineEnding::LF).expect("PKCS#8 encoding").to_string();
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                gsaas_infra::files::create_private_dir(dir).map_err(io)?;
            }
            write_private(path, &pem).map_err(io)?;
            let keys = Keys::from_private_pem(&pem).expect("a key generated here loads");
            std::fs::write(path.with_extension("pub"), &keys.public_pem).map_err(io)?;
            return Ok(keys);
        }
        let pem = std::fs::read_to_string(path).map_err(io)?;
        let keys = Keys::from_private_pem(&pem)
            .ok_or_else(|| KeyError::Format { path: path.display().to_string() })?;
        if keys.public_pem.contains(PUBLISHED_EXAMPLE_PUBLIC_KEY) {
            return Err(KeyError::Published { path: path.display().to_string() });
        }
        Ok(keys)
    }

    pub fn from_private_pem(pem: &str) -> Option<Keys> {
        let key = ed25519_dalek::SigningKey::from_pkcs8_pem(pem).ok()?;
        let public_pem = key.verifying_key().to_public_key_pem(LineEnding::LF).ok()?;
        Some(Keys {
            encoding: EncodingKey::from_ed_pem(pem.as_bytes()).ok()?,
            decoding: DecodingKey::from_ed_pem(public_pem.as_bytes()).ok()?,
            private_pem: pem.to_owned(),
            public_pem,
            verified: Arc::default(),
            revoked: Arc::default(),
        })
    }

    /// Replaces the set of revoked token ids (from the database).
    pub fn set_revoked(&self, ids: HashSet<String>) {
        *self.revoked.write().expect("revoked ids") = ids;
    }

    fn is_revoked(&self, ids: &[String]) -> bool {
        let revoked = self.revoked.read().expect("revoked ids");
        ids.iter().any(|id| revoked.contains(id))
    }

    /// The public key in PEM form, for agents' configs.
    pub fn public_pem(&self) -> &str {
        &self.public_pem
    }

    /// Signs gsaasd's requests to agents.
    pub fn agent_signer(&self) -> TokenSigner {
        TokenSigner::from_private_pem(self.private_pem.as_bytes(), "gsaasd")
            .expect("a key that loaded here loads there")
    }

    /// Issues an API token with a fresh id. `project` is required for members and admins, `host`
    /// is the subject of an agent token. The lifetime is capped at [`MAX_TOKEN_TTL_SECS`].
    pub fn issue(&self, subject: &str, project: Option<&str>, role: Role, ttl: Duration) -> String {
        self.sign(subject, project, role, ttl, None)
    }

    fn sign(
        &self,
        subject: &str,
        project: Option<&str>,
        role: Role,
        ttl: Duration,
        root: Option<String>,
    ) -> String {
        let now = unix_now();
        let claims = Claims {
            sub: subject.to_owned(),
            aud: API_AUDIENCE.to_owned(),
            iat: now,
            exp: now + ttl.as_secs().min(MAX_TOKEN_TTL_SECS),
            jti: Some(uuid::Uuid::new_v4().to_string()),
            root,
            project: project.map(str::to_owned),
            roles: vec![role],
        };
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.encoding)
            .expect("signing with a loaded key cannot fail")
    }

    /// A new token for the agent whose valid token is `token`, in the same line (see the module
    /// docs), valid for `ttl`.
    pub fn renew_agent_token(&self, token: &str, ttl: Duration) -> Result<String, Error> {
        let claims = self.verify_signed(token)?;
        let verified = Self::caller_of(&claims)?;
        if verified.caller.role != Role::Agent || self.is_revoked(&verified.ids) {
            return Err(Error::Unauthenticated("only a valid agent token can be renewed".into()));
        }
        let root = claims.root.or(claims.jti);
        Ok(self.sign(&claims.sub, None, Role::Agent, ttl, root))
    }

    /// The id and expiry of a token signed by this key (whether or not it is still valid), for
    /// revoking it.
    pub fn token_id(&self, token: &str) -> Result<TokenId, Error> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[API_AUDIENCE]);
        validation.validate_exp = false;
        validation.set_required_spec_claims(&["aud"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map_err(|_| Error::invalid("token", "is not a token signed by this gsaasd"))?
            .claims;
        let line = claims.root.or(claims.jti).ok_or_else(|| {
            Error::invalid("token", "has no id (issued before ids): rotate the signing key")
        })?;
        Ok(TokenId { line, expires: claims.exp })
    }

    /// Checks a token and says who it belongs to, or why it is refused.
    pub fn verify(&self, token: &str) -> Result<Caller, Error> {
        let cached = self.verified.lock().expect("token cache").get(token).cloned();
        let verified = match cached {
            Some(verified) if unix_now() < verified.exp => verified,
            _ => {
                let verified = Self::caller_of(&self.verify_signed(token)?)?;
                let mut cache = self.verified.lock().expect("token cache");
                if cache.len() >= VERIFIED_CACHE {
                    cache.clear();
                }
                cache.insert(token.to_owned(), verified.clone());
                verified
            }
        };
        if self.is_revoked(&verified.ids) {
            return Err(Error::Unauthenticated("token has been revoked".into()));
        }
        Ok(verified.caller)
    }

    fn verify_signed(&self, token: &str) -> Result<Claims, Error> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[API_AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = 5;
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation).map_err(|e| {
                Error::Unauthenticated(
                    match e.kind() {
                        ErrorKind::ExpiredSignature => "token expired; issue a new one",
                        ErrorKind::ImmatureSignature => "token is not valid yet (nbf)",
                        ErrorKind::InvalidSignature => {
                            "token signature is not valid for this service"
                        }
                        ErrorKind::InvalidAudience => "token is not meant for the GSaaS API",
                        ErrorKind::InvalidAlgorithm => "token is not signed with EdDSA",
                        ErrorKind::MissingRequiredClaim(_) => "token lacks a required claim",
                        _ => "token is malformed",
                    }
                    .to_owned(),
                )
            })?;
        Ok(data.claims)
    }

    fn caller_of(claims: &Claims) -> Result<Verified, Error> {
        let role = if claims.roles.contains(&Role::Admin) {
            Role::Admin
        } else if claims.roles.contains(&Role::Member) {
            Role::Member
        } else if claims.roles.contains(&Role::Agent) {
            Role::Agent
        } else if claims.roles.contains(&Role::Metrics) {
            Role::Metrics
        } else {
            return Err(Error::Unauthenticated("token carries no known role".into()));
        };
        let projectless = matches!(role, Role::Agent | Role::Metrics);
        if !projectless && claims.project.as_deref().is_none_or(str::is_empty) {
            return Err(Error::Unauthenticated("token names no project".into()));
        }
        let caller = Caller::new(claims.sub.clone(), claims.project.clone(), role);
        Ok(Verified { caller, exp: claims.exp, ids: claims.ids().map(str::to_owned).collect() })
    }
}

/// The token a request carries (`Authorization: Bearer`, or `X-Auth-Token` as OpenStack clients
/// send it).
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Result<&str, Error> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| Error::Unauthenticated("Authorization header is not text".into()))?;
        Ok(value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| Error::Unauthenticated("Authorization must be `Bearer <token>`".into()))?
            .trim())
    } else if let Some(value) = headers.get("x-auth-token") {
        Ok(value
            .to_str()
            .map_err(|_| Error::Unauthenticated("X-Auth-Token is not text".into()))?
            .trim())
    } else {
        Err(Error::Unauthenticated(
            "missing token: send `Authorization: Bearer <token>`; an operator issues one with \
             `gsaasd token issue --project P --role member`"
                .into(),
        ))
    }
}

/// The caller's Keystone token, when it authenticated with one (Keystone mode): what a cloud
/// that acts as the tenant needs. `None` for gsaasd's own tokens.
pub fn tenant_token(
    headers: &axum::http::HeaderMap,
    caller: &Caller,
    state: &impl HasKeys,
) -> Option<crate::cloud::TenantToken> {
    state.keystone()?;
    let token = bearer_token(headers).ok()?;
    if looks_like_jwt(token) {
        return None;
    }
    Some(crate::cloud::TenantToken {
        token: token.to_owned(),
        user_id: caller.subject.clone(),
        project_id: caller.project.clone()?,
    })
}

/// A JWT is three base64url segments; Keystone's Fernet and PKI tokens are not.
pub(crate) fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && token.starts_with("eyJ")
}

fn write_private(path: &Path, pem: &str) -> std::io::Result<()> {
    use std::io::Write;
    gsaas_infra::files::open_private(path, true)?.write_all(pem.as_bytes())
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The client's address, where the server knows it (the key of its Keystone budget).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub Option<std::net::IpAddr>);

impl ClientAddr {
    fn of(parts: &Parts) -> ClientAddr {
        let peer = parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        ClientAddr(peer.map(|info| info.0.ip()))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddr::of(parts))
    }
}

/// What the extractor needs from the application state.
pub trait HasKeys {
    fn keys(&self) -> &Keys;

    /// Validates tenants' Keystone tokens, when the service accepts them.
    fn keystone(&self) -> Option<&TokenValidator> {
        None
    }
}

impl<S> FromRequestParts<S> for Caller
where
    S: HasKeys + Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let token = bearer_token(&parts.headers)?;
        match (state.keys().verify(token), state.keystone()) {
            (Ok(caller), _) => Ok(caller),
            // Not one of ours: with Keystone auth it may be a tenant's Keystone token.
            (Err(jwt_error), Some(keystone)) if !looks_like_jwt(token) => {
                let ClientAddr(client) = ClientAddr::of(parts);
                match keystone.validate(token, client).await {
                    Ok(identity) => Ok(Caller::keystone(&identity)),
                    Err(ValidationError::Invalid) => Err(Error::Unauthenticated(
                        "the Keystone token is invalid or expired".into(),
                    )),
                    Err(ValidationError::Unscoped) => Err(Error::Unauthenticated(
                        "the Keystone token is not scoped to a project".into(),
                    )),
                    Err(ValidationError::RateLimited) => Err(Error::TooManyRequests(
                        "too many unknown tokens from this address; retry in a minute".into(),
                    )),
                    Err(e @ ValidationError::Keystone(_)) => {
                        tracing::debug!(jwt = %jwt_error, "not a gsaasd token either");
                        Err(Error::unavailable("keystone", e))
                    }
                }
            }
            (Err(e), _) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        Keys::from_private_pem(&key.to_pkcs8_pem(LineEnding::LF).unwrap()).unwrap()
    }

    #[test]
    fn issued_tokens_verify_and_others_are_refused_with_a_reason() {
        let keys = keys();
        let hour = Duration::from_secs(3600);
        let token = keys.issue("alice", Some("p1"), Role::Member, hour);
        let caller = keys.verify(&token).unwrap();
        assert_eq!(caller.project.as_deref(), Some("p1"));
        assert_eq!(caller.role, Role::Member);
        assert_eq!(
            keys.verify(&keys.issue("h1", None, Role::Agent, hour)).unwrap().role,
            Role::Agent
        );

        let other = ed25519_dalek::SigningKey::from_bytes(&[8; 32]);
        let other = Keys::from_private_pem(&other.to_pkcs8_pem(LineEnding::LF).unwrap()).unwrap();
        let forged = other.issue("mallory", Some("p1"), Role::Admin, hour);
        let reason = keys.verify(&forged).unwrap_err().to_string();
        assert!(reason.contains("signature"), "{reason}");
        let expired = keys.issue("alice", Some("p1"), Role::Member, Duration::ZERO);
        // Expiry has 5 s leeway; forge an older one.
        let claims = Claims {
            sub: "alice".into(),
            aud: API_AUDIENCE.into(),
            iat: 1,
            exp: 2,
            jti: None,
            root: None,
            project: Some("p1".into()),
            roles: vec![Role::Member],
        };
        let old =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &keys.encoding).unwrap();
        assert!(keys.verify(&old).unwrap_err().to_string().contains("expired"));
        assert!(keys.verify(&expired).is_ok(), "within leeway");
        assert!(keys.verify("garbage").unwrap_err().to_string().contains("malformed"));
        let now = unix_now();
        let future = serde_json::json!({
            "sub": "alice", "aud": API_AUDIENCE, "iat": now, "nbf": now + 3600,
            "exp": now + 7200, "project": "p1", "roles": ["admin"],
        });
        let future =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &future, &keys.encoding).unwrap();
        assert!(keys.verify(&future).unwrap_err().to_string().contains("not valid yet"));
        let agent_token = keys.agent_signer().sign(&gpgpums::HostId::new("h1").unwrap(), hour);
        assert!(
            keys.verify(&agent_token).is_err(),
            "gsaasd's tokens for agents do not open its API"
        );
        let no_project = keys.issue("bob", None, Role::Member, hour);
        assert!(keys.verify(&no_project).unwrap_err().to_string().contains("project"));
    }

    #[test]
    fn revoking_an_id_ends_the_token_and_every_renewal_of_it() {
        let keys = keys();
        let day = Duration::from_secs(86_400);
        let agent = keys.issue("h1", None, Role::Agent, day);
        let renewed = keys.renew_agent_token(&agent, day).unwrap();
        let renewed_again = keys.renew_agent_token(&renewed, day).unwrap();
        let member = keys.issue("alice", Some("p1"), Role::Member, day);
        assert!(keys.renew_agent_token(&member, day).is_err(), "only agents renew");
        for token in [&agent, &renewed, &renewed_again, &member] {
            keys.verify(token).unwrap();
        }
        // Every token of the line names the first token's id.
        let line = keys.token_id(&agent).unwrap().line;
        assert_eq!(keys.token_id(&renewed_again).unwrap().line, line);
        keys.set_revoked([line].into_iter().collect());
        for token in [&agent, &renewed, &renewed_again] {
            let err = keys.verify(token).unwrap_err().to_string();
            assert!(err.contains("revoked"), "{err}");
            assert!(keys.renew_agent_token(token, day).is_err(), "a revoked token renews");
        }
        keys.verify(&member).unwrap();
        keys.set_revoked(Default::default());
        keys.verify(&renewed).unwrap();
        // Lifetimes are capped: no overflow into the past.
        let forever = keys.issue("alice", Some("p1"), Role::Member, Duration::from_secs(u64::MAX));
        let id = keys.token_id(&forever).unwrap();
        assert!(id.expires > unix_now() && id.expires <= unix_now() + MAX_TOKEN_TTL_SECS);
        keys.verify(&forever).unwrap();
        assert!(keys.token_id("garbage").is_err());
    }

    #[test]
    fn a_key_is_created_once_and_reloaded() {
        let dir = std::env::temp_dir().join(format!("gsaas-keys-{}", std::process::id()));
        let path = dir.join("signing-key.pem");
        let first = Keys::load_or_create(&path).unwrap();
        let second = Keys::load_or_create(&path).unwrap();
        assert_eq!(first.public_pem(), second.public_pem());
        assert!(std::fs::read_to_string(path.with_extension("pub"))
            .unwrap()
            .contains("PUBLIC KEY"));
        std::fs::write(&path, "nope").unwrap();
        assert!(matches!(Keys::load_or_create(&path), Err(KeyError::Format { .. })));
        // The example key the chart once published, in both PKCS#8 encodings (v1, and v2 with
        // its public key), is nobody's own.
        let published = ed25519_dalek::SigningKey::from_bytes(b"replace-me-with-your-own-key-123");
        let v1 = "-----BEGIN PRIVATE KEY-----\n\
                  MC4CAQAwBQYDK2VwBCIEIHJlcGxhY2UtbWUtd2l0aC15b3VyLW93bi1rZXktMTIz\n\
                  -----END PRIVATE KEY-----\n";
        let v2 = published.to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
        assert_ne!(v1, v2, "two encodings of one key");
        for pem in [v1.to_owned(), v2] {
            std::fs::write(&path, pem).unwrap();
            assert!(matches!(Keys::load_or_create(&path), Err(KeyError::Published { .. })));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
