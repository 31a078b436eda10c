//! Certificates made in the test (rcgen): a CA, a server certificate for `localhost` and
//! a client certificate for user `app`, as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A CA and what it signed, as PEM files in `dir`.
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

pub fn write_private(path: &Path, pem: &str) {
    std::fs::write(path, pem).unwrap();
    // libpq refuses a client key others can read.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A CA named `name`, a server certificate for `localhost` and a client certificate for
/// user `app`, written to `dir` with `name` in the file names.
pub fn make_pki(dir: &Path, name: &str) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("pgfresh test CA {name}"));
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let mut server_params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();

    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(DnType::CommonName, "app");
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();

    let pki = Pki {
        ca: dir.join(format!("{name}-ca.pem")),
        server_cert: dir.join(format!("{name}-server.pem")),
        server_key: dir.join(format!("{name}-server.key")),
        client_cert: dir.join(format!("{name}-client.pem")),
        client_key: dir.join(format!("{name}-client.key")),
    };
    std::fs::write(&pki.ca, ca.pem()).unwrap();
    std::fs::write(&pki.server_cert, server.pem()).unwrap();
    write_private(&pki.server_key, &server_key.serialize_pem());
    std::fs::write(&pki.client_cert, client.pem()).unwrap();
    write_private(&pki.client_key, &client_key.serialize_pem());
    pki
}
