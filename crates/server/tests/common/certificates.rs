//! Certificates made for a test (rcgen), and a rustls client that trusts them.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use zipcache_server::TlsFiles;

/// A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, as
/// PEM files in a fresh directory.
pub struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    pub fn generate(name: &str) -> Certificates {
        let dir = std::env::temp_dir().join(format!("zipcache-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("certificate directory");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, "zipcache test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write");
        for (name, names, usage) in [
            (
                "server",
                vec!["localhost".to_string(), "127.0.0.1".to_string()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            (
                "client",
                vec!["client".to_string()],
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
        ] {
            let mut params = CertificateParams::new(names).expect("params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().expect("key");
            let cert = params.signed_by(&key, &ca).expect("sign");
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).expect("write");
            std::fs::write(dir.join(format!("{name}-key.pem")), key.serialize_pem())
                .expect("write");
        }
        Certificates { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn server_files(&self, verify_clients: bool) -> TlsFiles {
        TlsFiles {
            cert: self.path("server.pem"),
            key: self.path("server-key.pem"),
            ca: verify_clients.then(|| self.path("ca.pem")),
        }
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS connection to `127.0.0.1:port` (as `localhost`) that trusts only the CA in
/// `ca`; the handshake runs on first use.
pub fn tls_stream(
    port: u16,
    ca: &Path,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_file_iter(ca).expect("CA") {
        roots.add(certificate.expect("CA PEM")).expect("CA");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = "localhost".try_into().expect("server name");
    let connection =
        rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("client");
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    rustls::StreamOwned::new(connection, tcp)
}
