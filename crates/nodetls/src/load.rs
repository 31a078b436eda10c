//! Building rustls client configurations from [`Settings`], and keeping them while the
//! files they came from stay as they were.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ClientConfig;

use crate::verify::{AnyCertificate, ChainOnly};
use crate::{Mode, Settings};

/// Each file's modification time and length (`None`: unreadable or not configured).
type Stamp = Vec<Option<(SystemTime, u64)>>;

struct Entry {
    /// What `config` was built from.
    built: Stamp,
    config: Arc<ClientConfig>,
    /// The stamp whose load failed last (reported once).
    failed: Option<Stamp>,
}

fn cache() -> &'static Mutex<HashMap<Settings, Entry>> {
    static CACHE: OnceLock<Mutex<HashMap<Settings, Entry>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn stamp(s: &Settings) -> Stamp {
    [&s.ca_file, &s.cert_file, &s.key_file]
        .iter()
        .map(|p| {
            if p.is_empty() {
                return None;
            }
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

/// The configuration for `s` (not `disable`), from the cache while no file changed.
pub(crate) fn cached(s: &Settings) -> Result<Arc<ClientConfig>, String> {
    let now = stamp(s);
    let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = cache.get(s) {
        if e.built == now || e.failed.as_ref() == Some(&now) {
            return Ok(e.config.clone());
        }
    }
    match build(s) {
        Ok(config) => {
            let config = Arc::new(config);
            cache.insert(
                s.clone(),
                Entry {
                    built: now,
                    config: config.clone(),
                    failed: None,
                },
            );
            Ok(config)
        }
        Err(reason) => match cache.get_mut(s) {
            Some(e) => {
                tracing::warn!(%reason, "server TLS files changed and do not load; the previous ones stay in use");
                e.failed = Some(now);
                Ok(e.config.clone())
            }
            None => Err(reason),
        },
    }
}

/// Every certificate in a PEM file; an error names the file (none in it is an error).
pub fn certs(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{path}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path}: no certificate in the file"));
    }
    Ok(certs)
}

/// A rustls client configuration for `s`: the mode's certificate check, the client
/// certificate when one is given, ALPN `postgresql` as PostgreSQL 17 asks of clients.
pub(crate) fn build(s: &Settings) -> Result<ClientConfig, String> {
    s.check()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if s.mode.verifies() {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&s.ca_file)? {
            roots.add(c).map_err(|e| format!("{}: {e}", s.ca_file))?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("{}: {e}", s.ca_file))?;
        if s.mode == Mode::VerifyFull {
            builder.with_webpki_verifier(webpki)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
        }
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
    };
    let mut config = if s.cert_file.is_empty() {
        builder.with_no_client_auth()
    } else {
        let chain = certs(&s.cert_file)?;
        let key = PrivateKeyDer::from_pem_file(Path::new(&s.key_file))
            .map_err(|e| format!("{}: {e}", s.key_file))?;
        builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("server_tls_cert_file and server_tls_key_file: {e}"))?
    };
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}
