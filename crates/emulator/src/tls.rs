//! The emulator's certificates: a CA (`CA:TRUE`) and a leaf (`CA:FALSE`, SAN `IP:127.0.0.1`,
//! `IP:::1`, `DNS:localhost`) signed by it, served as leaf + chain with the ring provider.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::EmulatorError;

/// A ready server configuration and the PEM clients must trust.
pub(crate) struct TlsMaterial {
    pub config: Arc<rustls::ServerConfig>,
    pub ca_pem: String,
}

fn cert_err(e: impl std::fmt::Display) -> EmulatorError {
    EmulatorError::Certificate(e.to_string())
}

/// Generates a fresh CA and leaf and builds the rustls server configuration.
pub(crate) fn generate() -> Result<TlsMaterial, EmulatorError> {
    let ca_key = KeyPair::generate().map_err(cert_err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
    let mut ca_dn = DistinguishedName::new();
    ca_dn.push(
        DnType::CommonName,
        "vmss-capacity-controller ARM emulator CA",
    );
    ca_params.distinguished_name = ca_dn;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(cert_err)?;

    let leaf_key = KeyPair::generate().map_err(cert_err)?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).map_err(cert_err)?;
    leaf.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    leaf.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
    let mut leaf_dn = DistinguishedName::new();
    leaf_dn.push(DnType::CommonName, "localhost");
    leaf.distinguished_name = leaf_dn;
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // Strict verifiers (OpenSSL's X509_STRICT, Python 3.13+) want an authority key identifier.
    leaf.use_authority_key_identifier_extension = true;
    let leaf_cert = leaf
        .signed_by(&leaf_key, &ca_cert, &ca_key)
        .map_err(cert_err)?;

    let chain = vec![leaf_cert.der().clone(), ca_cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(cert_err)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(cert_err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsMaterial {
        config: Arc::new(config),
        ca_pem: ca_cert.pem(),
    })
}
