//! TLS for the memcached and RESP ports (rustls, ring provider): the server certificate
//! chain and key from PEM files and, given a CA, client certificates required and checked.
//! The files are read again on SIGHUP and on memcached's `refresh_certs` ([`Tls::reload`]),
//! so certificates are rotated without a restart.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use crate::core::TlsFiles;

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certificates)
}

impl TlsFiles {
    /// Reads the files into an acceptor; the error names the file at fault.
    pub fn acceptor(&self) -> Result<TlsAcceptor, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certificates(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("{}: {e}", self.key.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match &self.ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for certificate in certificates(ca)? {
                    roots
                        .add(certificate)
                        .map_err(|e| format!("{}: {e}", ca.display()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("{}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("{} with {}: {e}", self.cert.display(), self.key.display()))?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// The acceptor both ports hand new connections to. A reload builds a new one from the
/// same files: connections accepted afterwards get the new certificates, open ones keep
/// theirs, and a reload that fails keeps the old acceptor.
pub struct Tls {
    files: TlsFiles,
    acceptor: ArcSwap<TlsAcceptor>,
}

impl Tls {
    pub fn load(files: TlsFiles) -> Result<Tls, String> {
        let acceptor = ArcSwap::from_pointee(files.acceptor()?);
        Ok(Tls { files, acceptor })
    }

    /// The acceptor for a connection accepted now.
    pub fn acceptor(&self) -> Arc<TlsAcceptor> {
        self.acceptor.load_full()
    }

    /// Reads the files again; the error names the file at fault.
    pub fn reload(&self) -> Result<(), String> {
        self.acceptor.store(Arc::new(self.files.acceptor()?));
        Ok(())
    }
}
