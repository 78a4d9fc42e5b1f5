//! The agent's own credential for the controller, renewed before it expires.
//!
//! An agent token lives a day by default; without renewal a host would fall out of scheduling a
//! day after it was set up. So the agent trades its token for a fresh one once half of its life
//! is gone, and keeps the fresh one in a 0600 file beside its state file, since the token in its
//! config may be on a read-only mount (a Kubernetes Secret). At start it uses whichever of the two
//! lives longer, so an operator's newly issued token still wins over an older renewal.
//!
//! The agent reads its token's `iat` and `exp` without checking the signature: it only decides
//! when to renew its own credential, and gsaasd checks every token it is sent.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Lifetime {
    #[serde(default)]
    iat: u64,
    exp: u64,
}

fn lifetime(token: &str) -> Option<Lifetime> {
    jsonwebtoken::dangerous::insecure_decode::<Lifetime>(token).ok().map(|data| data.claims)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// Whether `token` has lived half of its life (or cannot be read): time to renew it.
pub fn needs_renewal(token: &str) -> bool {
    match lifetime(token) {
        Some(Lifetime { iat, exp }) => now() >= iat + exp.saturating_sub(iat) / 2,
        None => false,
    }
}

/// Where a renewed token is kept: `controller-token` beside the state file.
pub fn renewed_token_path(state_file: &Path) -> PathBuf {
    let dir = state_file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    dir.join("controller-token")
}

/// Of the configured token and the one renewed into `renewed` (if any), the one that expires
/// later.
pub fn current_token(configured: &str, renewed: &Path) -> String {
    let Ok(kept) = std::fs::read_to_string(renewed) else { return configured.to_owned() };
    let kept = kept.trim();
    let expiry = |token: &str| lifetime(token).map(|l| l.exp);
    match (expiry(kept), expiry(configured)) {
        (Some(kept_exp), Some(configured_exp)) if kept_exp > configured_exp => kept.to_owned(),
        (Some(_), None) => kept.to_owned(),
        _ => configured.to_owned(),
    }
}

/// Writes a renewed token to `path` (0600, whole or not at all).
pub fn keep(path: &Path, token: &str) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    gsaas_infra::files::open_private(&tmp, false)?.write_all(token.as_bytes())?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(iat: u64, exp: u64) -> String {
        use base64::Engine;
        let b64 = |v: serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        let header = b64(serde_json::json!({"alg": "EdDSA", "typ": "JWT"}));
        let claims = b64(serde_json::json!({"sub": "h1", "iat": iat, "exp": exp}));
        format!("{header}.{claims}.c2ln")
    }

    #[test]
    fn renews_at_half_life_and_prefers_the_longer_lived_token() {
        let t = now();
        assert!(!needs_renewal(&token(t, t + 3600)));
        assert!(needs_renewal(&token(t - 1900, t + 1700)));
        assert!(needs_renewal(&token(t - 7200, t - 3600)), "expired");
        assert!(!needs_renewal("not-a-jwt"), "an opaque token is never renewed");

        let dir = std::env::temp_dir().join(format!("rodvr-cred-{}", std::process::id()));
        gsaas_infra::files::create_private_dir(&dir).unwrap();
        let kept = renewed_token_path(&dir.join("routes.json"));
        let configured = token(t - 100, t + 1000);
        assert_eq!(current_token(&configured, &kept), configured, "nothing renewed yet");
        let renewed = token(t, t + 5000);
        keep(&kept, &renewed).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(current_token(&configured, &kept), renewed);
        let reissued = token(t, t + 9000);
        assert_eq!(current_token(&reissued, &kept), reissued, "an operator's newer token wins");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
