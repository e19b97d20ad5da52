//! Certificates for TLS tests: a CA of the test's own and an agent certificate it signed,
//! written as PEM files into a directory the test owns. Made fresh per call (rcgen), so no
//! test depends on a key checked into the repository or on the clock of whoever made it.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A CA and one agent certificate signed by it, as files.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// The CA's certificate: what clients trust (`DQUANT_TLS_CA`).
    pub ca: PathBuf,
    /// The agent's certificate (PEM chain) and private key (`[tls] cert`, `key`).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes `prefix-ca.pem`, `prefix-cert.pem` and `prefix-key.pem` into `dir`: a fresh CA and
/// an agent certificate it signed, valid for `names` (DNS names or IP addresses).
pub fn make_pki(dir: &Path, prefix: &str, names: &[&str]) -> TestPki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{prefix} test CA"));
    let ca_key = KeyPair::generate().expect("a CA key");
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("the CA signs itself");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf_params = CertificateParams::new(names).expect("agent certificate params");
    let leaf_key = KeyPair::generate().expect("an agent key");
    let leaf = leaf_params
        .signed_by(&leaf_key, &ca)
        .expect("the CA signs the agent's certificate");
    let pki = TestPki {
        ca: dir.join(format!("{prefix}-ca.pem")),
        cert: dir.join(format!("{prefix}-cert.pem")),
        key: dir.join(format!("{prefix}-key.pem")),
    };
    std::fs::write(&pki.ca, ca.pem()).expect("writing the CA");
    std::fs::write(&pki.cert, leaf.pem()).expect("writing the certificate");
    std::fs::write(&pki.key, leaf_key.serialize_pem()).expect("writing the key");
    pki
}
