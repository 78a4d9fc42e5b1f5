//! Controller-signed requests.
//!
//! Only the controller may change a host's routes, so every agent request carries an EdDSA
//! (Ed25519) JWT signed by the controller for the audience `rodvr-agent` and for one host (the
//! `host` claim). The agent holds only the public key, so a stolen agent config cannot mint tokens,
//! and it refuses tokens made out to another host, so a token that reached one agent (a
//! compromised host, an address gsaasd was misled to) opens no other host's routes. Tokens live a
//! minute. [`TokenSigner`] is the controller's side, kept here so `gsaasd` and the tests sign
//! exactly what [`TokenVerifier`] checks.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use gpgpums::ids::HostId;

use crate::protocol::AGENT_AUDIENCE;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not an Ed25519 key in PEM form")]
    BadPem(#[source] jsonwebtoken::errors::Error),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claims {
    aud: String,
    exp: u64,
    iat: u64,
    sub: String,
    /// The one host whose agent accepts the token.
    host: String,
}

/// Checks bearer tokens against the controller's public key, for one host.
#[derive(Clone)]
pub struct TokenVerifier {
    key: DecodingKey,
    validation: Validation,
    host: HostId,
}

impl std::fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenVerifier").finish_non_exhaustive()
    }
}

impl TokenVerifier {
    /// `pem` holds the controller's Ed25519 public key (`-----BEGIN PUBLIC KEY-----`); `host` is
    /// the host this agent serves.
    pub fn from_public_pem(pem: &[u8], host: HostId) -> Result<Self, KeyError> {
        let key = DecodingKey::from_ed_pem(pem).map_err(KeyError::BadPem)?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[AGENT_AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = 5;
        Ok(Self { key, validation, host })
    }

    /// Whether `token` is a valid, unexpired controller token for this host's agent.
    pub fn verify(&self, token: &str) -> bool {
        jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .is_ok_and(|data| data.claims.host == self.host.as_str())
    }
}

/// Mints agent tokens with the controller's private key.
#[derive(Clone)]
pub struct TokenSigner {
    key: EncodingKey,
    subject: String,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner").field("subject", &self.subject).finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// `pem` holds the controller's Ed25519 private key (PKCS#8, `-----BEGIN PRIVATE KEY-----`).
    pub fn from_private_pem(pem: &[u8], subject: impl Into<String>) -> Result<Self, KeyError> {
        let key = EncodingKey::from_ed_pem(pem).map_err(KeyError::BadPem)?;
        Ok(Self { key, subject: subject.into() })
    }

    /// A token for the agent of `host` (audience `rodvr-agent`), valid for `ttl`.
    pub fn sign(&self, host: &HostId, ttl: Duration) -> String {
        self.sign_for(AGENT_AUDIENCE, host, ttl)
    }

    /// A token for any audience; tests use it to check that other audiences are refused.
    pub fn sign_for(&self, audience: &str, host: &HostId, ttl: Duration) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let claims = Claims {
            aud: audience.into(),
            iat: now,
            exp: now.saturating_add(ttl.as_secs()),
            sub: self.subject.clone(),
            host: host.to_string(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.key)
            .expect("signing with a parsed Ed25519 key cannot fail")
    }
}

/// Test keys: an Ed25519 key pair derived from `seed`, as (private PKCS#8 PEM, public PEM).
#[cfg(test)]
pub(crate) fn test_key_pair(seed: u8) -> (String, String) {
    use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey, EncodePublicKey};
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let private = key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
    let public = key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
    (private, public)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str) -> HostId {
        HostId::new(name).unwrap()
    }

    #[test]
    fn only_controller_tokens_for_this_hosts_agent_verify() {
        let (private, public) = test_key_pair(1);
        let (other_private, _) = test_key_pair(2);
        let verifier = TokenVerifier::from_public_pem(public.as_bytes(), host("h1")).unwrap();
        let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
        let ttl = Duration::from_secs(60);
        assert!(verifier.verify(&signer.sign(&host("h1"), ttl)));
        assert!(!verifier.verify(&signer.sign(&host("h2"), ttl)), "another host's token");
        assert!(!verifier.verify(&signer.sign_for("gsaasd", &host("h1"), ttl)));
        let impostor = TokenSigner::from_private_pem(other_private.as_bytes(), "gsaasd").unwrap();
        assert!(!verifier.verify(&impostor.sign(&host("h1"), ttl)));
        assert!(!verifier.verify("not.a.token"));
        assert!(TokenVerifier::from_public_pem(b"garbage", host("h1")).is_err());
    }

    #[test]
    fn expired_and_hostless_tokens_are_refused() {
        let (private, public) = test_key_pair(3);
        let verifier = TokenVerifier::from_public_pem(public.as_bytes(), host("h1")).unwrap();
        let signer = TokenSigner::from_private_pem(private.as_bytes(), "gsaasd").unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let old = Claims {
            aud: AGENT_AUDIENCE.into(),
            iat: now - 600,
            exp: now - 300,
            sub: "x".into(),
            host: "h1".into(),
        };
        let expired =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &old, &signer.key).unwrap();
        assert!(!verifier.verify(&expired));
        // A token from before tokens named their host opens no agent.
        #[derive(Serialize)]
        struct Hostless {
            aud: &'static str,
            iat: u64,
            exp: u64,
            sub: &'static str,
        }
        let hostless = Hostless { aud: AGENT_AUDIENCE, iat: now, exp: now + 60, sub: "gsaasd" };
        let hostless =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &hostless, &signer.key).unwrap();
        assert!(!verifier.verify(&hostless));
        // One not valid yet (`nbf` an hour ahead) opens nothing until then.
        let future = serde_json::json!({
            "aud": AGENT_AUDIENCE, "iat": now, "nbf": now + 3600, "exp": now + 7200,
            "sub": "gsaasd", "host": "h1",
        });
        let future =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &future, &signer.key).unwrap();
        assert!(!verifier.verify(&future));
    }
}
