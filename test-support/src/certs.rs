//! A throwaway certificate authority for TLS tests: a CA and leaf certificates for the names and
//! addresses a test serves on (P-256 keys, valid for a day).

use std::path::{Path, PathBuf};

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{BasicConstraints, KeyUsage, SubjectAlternativeName};
use openssl::x509::{X509NameBuilder, X509};

#[derive(Debug)]
pub struct Ca {
    key: PKey<Private>,
    cert: X509,
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn builder(common_name: &str, key: &PKey<Private>) -> openssl::x509::X509Builder {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", common_name).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let mut serial = BigNum::new().unwrap();
    serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap()).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    b.set_not_after(&Asn1Time::days_from_now(1).unwrap()).unwrap();
    b
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = key();
        let mut b = builder(name, &key);
        let subject = {
            let mut n = X509NameBuilder::new().unwrap();
            n.append_entry_by_text("CN", name).unwrap();
            n.build()
        };
        b.set_issuer_name(&subject).unwrap();
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap()).unwrap();
        b.append_extension(KeyUsage::new().critical().key_cert_sign().crl_sign().build().unwrap())
            .unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        Ca { key, cert: b.build() }
    }

    pub fn cert_pem(&self) -> String {
        String::from_utf8(self.cert.to_pem().unwrap()).unwrap()
    }

    /// A certificate for `names` (IP addresses or DNS names) and its key, as PEM.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let key = key();
        let mut b = builder(names[0], &key);
        b.set_issuer_name(self.cert.subject_name()).unwrap();
        let mut san = SubjectAlternativeName::new();
        for name in names {
            if name.parse::<std::net::IpAddr>().is_ok() {
                san.ip(name);
            } else {
                san.dns(name);
            }
        }
        let san = san.build(&b.x509v3_context(Some(&self.cert), None)).unwrap();
        b.append_extension(san).unwrap();
        b.sign(&self.key, MessageDigest::sha256()).unwrap();
        let cert = String::from_utf8(b.build().to_pem().unwrap()).unwrap();
        let key = String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        (cert, key)
    }

    /// Writes the CA's certificate and a certificate for `names` with its key into `dir`, named
    /// after `prefix`; returns (CA, certificate, key) paths.
    pub fn write(&self, dir: &Path, prefix: &str, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
        let (cert, key) = self.issue(names);
        let paths = [format!("{prefix}-ca.pem"), format!("{prefix}.crt"), format!("{prefix}.key")]
            .map(|name| dir.join(name));
        std::fs::write(&paths[0], self.cert_pem()).unwrap();
        std::fs::write(&paths[1], cert).unwrap();
        std::fs::write(&paths[2], key).unwrap();
        let [ca, cert, key] = paths;
        (ca, cert, key)
    }
}
