use super::*;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn server_for(password: &str) -> ScramServer {
    let verifier = ScramVerifier::from_password(password, b"0123456789abcdef", 4096);
    ScramServer::new(verifier, &mut StdRng::seed_from_u64(7))
}

/// Runs a full exchange between postgres-protocol's client and our server.
fn exchange(
    server_password: &str,
    client_password: &str,
    binding: ChannelBinding,
) -> Result<(), AuthError> {
    let mut server = server_for(server_password);
    let mut client = ScramSha256::new(client_password.as_bytes(), binding);
    let server_first = server.client_first(SCRAM_SHA_256, client.message())?;
    client
        .update(&server_first)
        .expect("client accepts server-first");
    let server_final = server.client_final(client.message())?;
    client
        .finish(&server_final)
        .expect("client verifies the server signature");
    assert!(server.is_done());
    Ok(())
}

#[test]
fn postgres_protocol_client_authenticates() {
    exchange("s3cret", "s3cret", ChannelBinding::unsupported()).unwrap();
    exchange("s3cret", "s3cret", ChannelBinding::unrequested()).unwrap();
    exchange("pässwörd ✓", "pässwörd ✓", ChannelBinding::unsupported()).unwrap();
}

#[test]
fn wrong_password_is_rejected() {
    let err = exchange("s3cret", "wrong", ChannelBinding::unsupported()).unwrap_err();
    assert_eq!(err, AuthError::InvalidProof);
    assert_eq!(err.sqlstate(), "28P01");
}

#[test]
fn channel_binding_is_refused() {
    let mut server = server_for("pw");
    let client = ScramSha256::new(b"pw", ChannelBinding::tls_server_end_point(vec![1, 2, 3]));
    assert_eq!(
        server.client_first(SCRAM_SHA_256, client.message()),
        Err(AuthError::ChannelBindingNotSupported)
    );
    // The exchange is over after an error.
    assert!(server.client_final(b"c=biws,r=x,p=AAAA").is_err());
}

#[test]
fn other_mechanisms_are_refused() {
    let mut server = server_for("pw");
    let err = server
        .client_first("SCRAM-SHA-256-PLUS", b"n,,n=,r=abc")
        .unwrap_err();
    assert!(matches!(err, AuthError::UnsupportedMechanism(ref m) if m == "SCRAM-SHA-256-PLUS"));
}

/// Rewrites the `r=` attribute of a client-final-message.
fn tamper_nonce(msg: &[u8]) -> Vec<u8> {
    let s = std::str::from_utf8(msg).unwrap();
    let parts: Vec<String> = s
        .split(',')
        .map(|a| match a.strip_prefix("r=") {
            Some(n) => format!("r={}X", &n[..n.len() - 1]),
            None => a.to_owned(),
        })
        .collect();
    parts.join(",").into_bytes()
}

#[test]
fn tampered_nonce_is_rejected() {
    let mut server = server_for("pw");
    let mut client = ScramSha256::new(b"pw", ChannelBinding::unsupported());
    let server_first = server
        .client_first(SCRAM_SHA_256, client.message())
        .unwrap();
    client.update(&server_first).unwrap();
    let tampered = tamper_nonce(client.message());
    assert_eq!(
        server.client_final(&tampered),
        Err(AuthError::NonceMismatch)
    );
}

#[test]
fn tampered_channel_binding_is_rejected() {
    let mut server = server_for("pw");
    let mut client = ScramSha256::new(b"pw", ChannelBinding::unsupported());
    let server_first = server
        .client_first(SCRAM_SHA_256, client.message())
        .unwrap();
    client.update(&server_first).unwrap();
    // "n,," was announced, "y,," (eSws) claimed in the final message.
    let msg = String::from_utf8(client.message().to_vec()).unwrap();
    let tampered = msg.replacen("c=biws", "c=eSws", 1);
    assert_eq!(
        server.client_final(tampered.as_bytes()),
        Err(AuthError::ChannelBindingMismatch)
    );
}

#[test]
fn tampered_proof_is_rejected() {
    let mut server = server_for("pw");
    let mut client = ScramSha256::new(b"pw", ChannelBinding::unsupported());
    let server_first = server
        .client_first(SCRAM_SHA_256, client.message())
        .unwrap();
    client.update(&server_first).unwrap();
    let msg = String::from_utf8(client.message().to_vec()).unwrap();
    let (head, _) = msg.rsplit_once(",p=").unwrap();
    let forged = format!("{head},p={}", STANDARD.encode([7u8; 32]));
    assert_eq!(
        server.client_final(forged.as_bytes()),
        Err(AuthError::InvalidProof)
    );
}

#[test]
fn server_first_message_shape() {
    let mut server = server_for("pw");
    let reply = server
        .client_first(SCRAM_SHA_256, b"n,,n=alice,r=clientnonce")
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let attrs: Vec<&str> = reply.split(',').collect();
    assert_eq!(attrs.len(), 3);
    let nonce = attrs[0].strip_prefix("r=").unwrap();
    assert!(nonce.starts_with("clientnonce"));
    assert_eq!(nonce.len(), "clientnonce".len() + 24);
    assert_eq!(
        attrs[1],
        format!("s={}", STANDARD.encode(b"0123456789abcdef"))
    );
    assert_eq!(attrs[2], "i=4096");
}

#[test]
fn malformed_client_first_messages() {
    let cases: &[&[u8]] = &[
        b"",
        b"x,,n=,r=abc",
        b"n",
        b"n,",
        b"n,a=bob,n=,r=abc",
        b"n,,",
        b"n,,r=abc",
        b"n,,m=ext,n=,r=abc",
        b"n,,n=,r=",
        b"n,,n=,x=abc",
        b"n,,n=,r=ab c",
        b"n,,n=,r=abc,garbage",
        b"n,,n=,r=\xff",
    ];
    for case in cases {
        let mut server = server_for("pw");
        let err = server.client_first(SCRAM_SHA_256, case).unwrap_err();
        assert!(matches!(err, AuthError::Malformed(_)), "{case:?}: {err:?}");
        assert_eq!(err.sqlstate(), "08P01");
    }
}

#[test]
fn malformed_client_final_messages() {
    let cases: &[&[u8]] = &[
        b"",
        b"c=biws,r=abc",
        b"r=abc,c=biws,p=AAAA",
        b"c=biws,p=AAAA",
        b"c=!!!,r=abc,p=AAAA",
        b"c=biws,r=clientnonce,bad,p=AAAA",
        b"c=biws,r=clientnonce,p=AAAA",
        b"c=biws,r=clientnonce,p=!!",
        b"\xff",
    ];
    for case in cases {
        let mut server = server_for("pw");
        server
            .client_first(SCRAM_SHA_256, b"n,,n=,r=clientnonce")
            .unwrap();
        let err = server.client_final(case).unwrap_err();
        assert!(
            matches!(err, AuthError::Malformed(_) | AuthError::NonceMismatch),
            "{case:?}: {err:?}"
        );
    }
}

#[test]
fn out_of_order_messages() {
    let mut server = server_for("pw");
    assert!(matches!(
        server.client_final(b"c=biws,r=x,p=AAAA"),
        Err(AuthError::OutOfOrder(_))
    ));
    let mut server = server_for("pw");
    server.client_first(SCRAM_SHA_256, b"n,,n=,r=abc").unwrap();
    assert!(matches!(
        server.client_first(SCRAM_SHA_256, b"n,,n=,r=abc"),
        Err(AuthError::OutOfOrder(_))
    ));
}

#[test]
fn verifier_round_trips_through_postgres_format() {
    let v = ScramVerifier::from_password("postgres", b"0123456789abcdef", 4096);
    let text = v.to_string();
    assert!(text.starts_with("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$"));
    assert_eq!(ScramVerifier::parse(&text).unwrap(), v);
}

#[test]
fn verifier_from_postgres_protocol_authenticates() {
    // postgres-protocol hashes with a random salt, exactly as
    // `ALTER ROLE ... PASSWORD` would store it.
    let stored = postgres_protocol::password::scram_sha_256(b"hunter2");
    let verifier: ScramVerifier = stored.parse().unwrap();
    assert_eq!(verifier.iterations, 4096);
    assert_eq!(verifier.salt.len(), 16);
    assert_eq!(verifier.to_string(), stored);
    let mut server = ScramServer::new(verifier.clone(), &mut rand::rng());
    let mut client = ScramSha256::new(b"hunter2", ChannelBinding::unsupported());
    let first = server
        .client_first(SCRAM_SHA_256, client.message())
        .unwrap();
    client.update(&first).unwrap();
    let fin = server.client_final(client.message()).unwrap();
    client.finish(&fin).unwrap();
    // Same password and salt give the same verifier.
    assert_eq!(
        ScramVerifier::from_password("hunter2", &verifier.salt, 4096),
        verifier
    );
}

#[test]
fn real_postgres_verifiers_parse() {
    // From PostgreSQL's own regression suite (password.sql): a valid
    // verifier used as a control...
    let text = "SCRAM-SHA-256$4096:A6xHKoH/494E941doaPOYg==$Ky+A30sewHIH3VHQLRN9vYsuzlgNyGNKCh37dy96Rqw=:COPdlNiIkrsacU5QoxydEuOH6e/KfiipeETb/bPw8ZI=";
    let v = ScramVerifier::parse(text).unwrap();
    assert_eq!(v.iterations, 4096);
    assert_eq!(v.salt.len(), 16);
    assert_eq!(v.to_string(), text);
    // ...and the verifier of the empty password, which PostgreSQL
    // recognises as such: our derivation must reproduce it exactly.
    let empty = "SCRAM-SHA-256$4096:hpFyHTUsSWcR7O9P$LgZFIt6Oqdo27ZFKbZ2nV+vtnYM995pDh9ca6WSi120=:qVV5NeluNfUPkwm7Vqat25RjSPLkGeoZBQs6wVv+um4=";
    let v = ScramVerifier::parse(empty).unwrap();
    assert_eq!(v.salt.len(), 12);
    assert_eq!(ScramVerifier::from_password("", &v.salt, 4096), v);
    assert_ne!(ScramVerifier::from_password(" ", &v.salt, 4096), v);
}

#[test]
fn invalid_verifiers() {
    let cases = [
        "",
        "md5abcdef",
        "SCRAM-SHA-256$",
        "SCRAM-SHA-256$4096$a:b",
        "SCRAM-SHA-256$x:c2FsdA==$AAAA:AAAA",
        "SCRAM-SHA-256$0:c2FsdA==$AAAA:AAAA",
        "SCRAM-SHA-256$4096:!!$AAAA:AAAA",
        "SCRAM-SHA-256$4096:$AAAA:AAAA",
        "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
        "SCRAM-SHA-256$4096:c2FsdA==$AAAA",
    ];
    for case in cases {
        assert!(
            matches!(
                ScramVerifier::parse(case),
                Err(AuthError::InvalidVerifier(_))
            ),
            "{case}"
        );
    }
}

#[test]
fn our_client_against_our_server() {
    let mut server = server_for("pw");
    let mut client = crate::auth::ScramClient::new("pw");
    let first = server
        .client_first(client.mechanism(), client.initial_message())
        .unwrap();
    let fin = client.update(&first).unwrap().to_vec();
    let server_final = server.client_final(&fin).unwrap();
    client.finish(&server_final).unwrap();
    assert!(client.is_done());
    // A server that does not know the password cannot fake the final step.
    let mut client = crate::auth::ScramClient::new("pw");
    let mut imposter = server_for("other");
    let first = imposter
        .client_first(client.mechanism(), client.initial_message())
        .unwrap();
    let fin = client.update(&first).unwrap().to_vec();
    assert!(imposter.client_final(&fin).is_err());
    assert!(matches!(
        client.finish(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        Err(AuthError::Server(_))
    ));
    assert!(matches!(
        client.finish(b"v="),
        Err(AuthError::OutOfOrder(_))
    ));
}

#[test]
fn client_initial_response_frame() {
    let client = crate::auth::ScramClient::new("pw");
    let frame = client.initial_response();
    let body = &frame[5..];
    let (mech, data) = crate::auth::parse_sasl_initial_response(body).unwrap();
    assert_eq!(mech, "SCRAM-SHA-256");
    assert_eq!(data, client.initial_message());
    assert!(data.starts_with(b"n,,n=,r="));
}

#[test]
fn mock_verifier_fails_like_a_wrong_password() {
    let secret = b"process secret";
    let mock = ScramVerifier::mock("ghost", secret);
    assert_eq!(mock, ScramVerifier::mock("ghost", secret));
    assert_ne!(mock.salt, ScramVerifier::mock("other", secret).salt);
    assert_ne!(
        mock.salt,
        ScramVerifier::mock("ghost", b"another secret").salt
    );
    assert_eq!(mock.salt.len(), 16);
    assert_eq!(mock.iterations, DEFAULT_ITERATIONS);
    for password in ["", "ghost", "process secret"] {
        let mut server = ScramServer::new(mock.clone(), &mut rand::rng());
        let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
        let first = server
            .client_first(SCRAM_SHA_256, client.message())
            .unwrap();
        client.update(&first).unwrap();
        assert_eq!(
            server.client_final(client.message()),
            Err(AuthError::InvalidProof)
        );
    }
}
