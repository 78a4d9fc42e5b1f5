//! Shared by the integration tests and the benchmark: keys, temp dirs, network namespaces.
#![allow(dead_code)]

pub mod certs;
pub mod netns;
pub mod slow;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey, EncodePublicKey};

/// An Ed25519 key pair derived from `seed`: (private PKCS#8 PEM, public PEM).
pub fn key_pair(seed: u8) -> (String, String) {
    let key = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]);
    let private = key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
    let public = key.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
    (private, public)
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh directory for one test, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rodvr-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
