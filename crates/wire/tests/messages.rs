//! Typed views, builders and errors.

use bytes::{BufMut, Bytes, BytesMut};
use pgfresh_wire::{
    build, parse_backend, parse_frontend, sqlstate, Auth, BackendMessage, CancelKey, ErrorResponse,
    Frame, FrameError, FrontendMessage, Severity, TxStatus,
};

fn frame(bytes: Bytes) -> Frame {
    Frame::from_raw(bytes).expect("builder produced a well-formed frame")
}

fn raw(tag: u8, body: &[u8]) -> Frame {
    let mut b = BytesMut::new();
    b.put_u8(tag);
    b.put_u32(body.len() as u32 + 4);
    b.put_slice(body);
    Frame::from_raw(b.freeze()).unwrap()
}

#[test]
fn frontend_builders_round_trip() {
    let cases: Vec<(Bytes, FrontendMessage<'static>)> = vec![
        (
            build::query("select 1; select 2"),
            FrontendMessage::Query {
                sql: "select 1; select 2",
            },
        ),
        (
            build::parse("s1", "select $1::int", &[23, 0]),
            FrontendMessage::Parse {
                name: "s1",
                sql: "select $1::int",
                param_types: vec![23, 0],
            },
        ),
        (
            build::describe(b'S', "s1"),
            FrontendMessage::Describe {
                kind: b'S',
                name: "s1",
            },
        ),
        (
            build::execute("", 100),
            FrontendMessage::Execute {
                portal: "",
                max_rows: 100,
            },
        ),
        (
            build::close(b'P', "p"),
            FrontendMessage::Close {
                kind: b'P',
                name: "p",
            },
        ),
        (build::sync(), FrontendMessage::Sync),
        (build::flush(), FrontendMessage::Flush),
        (build::terminate(), FrontendMessage::Terminate),
        (
            build::copy_data(b"1\t2\n"),
            FrontendMessage::CopyData(b"1\t2\n"),
        ),
        (build::copy_done(), FrontendMessage::CopyDone),
        (
            build::copy_fail("aborted"),
            FrontendMessage::CopyFail { message: "aborted" },
        ),
        (
            build::password_message(b"md5abc"),
            FrontendMessage::Password(b"md5abc\0"),
        ),
        (
            build::sasl_response(b"c=biws"),
            FrontendMessage::Password(b"c=biws"),
        ),
    ];
    for (bytes, expected) in cases {
        let f = frame(bytes.clone());
        let parsed = parse_frontend(&f).unwrap();
        assert_eq!(parsed, expected);
        assert_eq!(parsed.tag(), f.tag);
    }
    let f = raw(b'F', b"\0\0\0\x01anything");
    assert_eq!(parse_frontend(&f), Ok(FrontendMessage::FunctionCall));
}

#[test]
fn bind_reads_its_parameters_on_demand() {
    let f = frame(build::bind(
        "p",
        "s1",
        &[1],
        &[Some(b"\0\0\0\x01"), None, Some(b"")],
        &[0, 1],
    ));
    let Ok(FrontendMessage::Bind {
        portal,
        statement,
        params,
    }) = parse_frontend(&f)
    else {
        panic!("not a Bind");
    };
    assert_eq!((portal, statement), ("p", "s1"));
    assert_eq!(params.param_formats().collect::<Vec<_>>(), vec![1]);
    assert_eq!(params.len(), 3);
    assert_eq!(
        params.values().collect::<Vec<_>>(),
        vec![Some(&b"\0\0\0\x01"[..]), None, Some(&b""[..])]
    );
    assert_eq!(params.result_formats().collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(
        f.raw,
        build::bind(
            portal,
            statement,
            &[1],
            &params.values().collect::<Vec<_>>(),
            &[0, 1]
        )
    );
}

#[test]
fn frontend_malformed_bodies() {
    let cases: Vec<(u8, Vec<u8>, &str)> = vec![
        (b'Q', b"select 1".to_vec(), "missing NUL"),
        (b'Q', b"select 1\0x".to_vec(), "trailing bytes"),
        (b'Q', b"select \xff\0".to_vec(), "invalid UTF-8"),
        (b'P', b"s\0select 1\0".to_vec(), "missing param count"),
        (b'P', b"s\0select 1\0\xff\xff".to_vec(), "negative count"),
        (
            b'P',
            b"s\0select 1\0\0\x02\0\0\0\x17".to_vec(),
            "count beyond body",
        ),
        (
            b'B',
            b"p\0s\0\0\0\0\x01\0\0\0\x09abc\0\0".to_vec(),
            "param longer than body",
        ),
        (
            b'B',
            b"p\0s\0\0\0\0\x01\xff\xff\xff\xfe\0\0".to_vec(),
            "param length -2",
        ),
        (b'B', b"p\0s\0\x7f\xff".to_vec(), "format count beyond body"),
        (b'B', b"p\0s\0\0\0\0\0".to_vec(), "missing result formats"),
        (b'D', b"Xname\0".to_vec(), "bad describe kind"),
        (b'D', b"".to_vec(), "empty describe"),
        (b'C', b"Sname".to_vec(), "unterminated close"),
        (b'E', b"\0\0\0".to_vec(), "short row limit"),
        (b'S', b"x".to_vec(), "sync with body"),
        (b'H', b"x".to_vec(), "flush with body"),
        (b'X', b"x".to_vec(), "terminate with body"),
        (b'c', b"x".to_vec(), "copydone with body"),
        (b'f', b"oops".to_vec(), "unterminated copyfail"),
    ];
    for (tag, body, what) in cases {
        let f = raw(tag, &body);
        let r = parse_frontend(&f);
        assert!(
            matches!(r, Err(FrameError::Malformed { tag: t, .. }) if t == tag),
            "{what}: {r:?}"
        );
    }
    assert_eq!(
        parse_frontend(&raw(b'Z', b"I")),
        Err(FrameError::UnknownTag(b'Z'))
    );
}

#[test]
fn bind_with_large_declared_counts_does_not_allocate_blindly() {
    // 32767 parameters claimed, none present.
    let f = raw(b'B', b"\0\0\0\0\x7f\xff");
    let r = parse_frontend(&f);
    assert!(matches!(r, Err(FrameError::Malformed { .. })));
}

#[test]
fn backend_builders_round_trip() {
    let key = CancelKey { pid: 7, secret: 99 };
    let cases: Vec<(Bytes, BackendMessage<'static>)> = vec![
        (
            build::authentication_ok(),
            BackendMessage::Authentication(Auth::Ok),
        ),
        (
            build::auth_cleartext(),
            BackendMessage::Authentication(Auth::CleartextPassword),
        ),
        (
            build::auth_md5([1, 2, 3, 4]),
            BackendMessage::Authentication(Auth::Md5Password { salt: [1, 2, 3, 4] }),
        ),
        (
            build::auth_sasl(&["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"]),
            BackendMessage::Authentication(Auth::Sasl {
                mechanisms: vec!["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"],
            }),
        ),
        (
            build::auth_sasl_continue(b"r=abc,s=xyz,i=4096"),
            BackendMessage::Authentication(Auth::SaslContinue(b"r=abc,s=xyz,i=4096")),
        ),
        (
            build::auth_sasl_final(b"v=abc"),
            BackendMessage::Authentication(Auth::SaslFinal(b"v=abc")),
        ),
        (
            build::parameter_status("TimeZone", "UTC"),
            BackendMessage::ParameterStatus {
                name: "TimeZone",
                value: "UTC",
            },
        ),
        (
            build::backend_key_data(key),
            BackendMessage::BackendKeyData(key),
        ),
        (
            build::ready_for_query(TxStatus::Idle),
            BackendMessage::ReadyForQuery(TxStatus::Idle),
        ),
        (
            build::ready_for_query(TxStatus::InTransaction),
            BackendMessage::ReadyForQuery(TxStatus::InTransaction),
        ),
        (
            build::ready_for_query(TxStatus::Failed),
            BackendMessage::ReadyForQuery(TxStatus::Failed),
        ),
        (
            build::command_complete("INSERT 0 1"),
            BackendMessage::CommandComplete { tag: "INSERT 0 1" },
        ),
        (
            build::empty_query_response(),
            BackendMessage::EmptyQueryResponse,
        ),
        (build::parse_complete(), BackendMessage::ParseComplete),
        (build::bind_complete(), BackendMessage::BindComplete),
        (build::close_complete(), BackendMessage::CloseComplete),
        (build::no_data(), BackendMessage::NoData),
        (build::copy_done(), BackendMessage::CopyDone),
        (build::copy_data(b"row"), BackendMessage::CopyData),
        (
            build::notification_response(12, "jobs", "{\"id\":1}"),
            BackendMessage::NotificationResponse {
                pid: 12,
                channel: "jobs",
                payload: "{\"id\":1}",
            },
        ),
        (
            build::negotiate_protocol_version(0, &["_pq_.x"]),
            BackendMessage::NegotiateProtocolVersion,
        ),
    ];
    for (bytes, expected) in cases {
        assert_eq!(parse_backend(&frame(bytes)).unwrap(), expected);
    }
}

#[test]
fn backend_opaque_and_unknown_types() {
    let cases = [
        (b'T', BackendMessage::RowDescription),
        (b'D', BackendMessage::DataRow),
        (b'G', BackendMessage::CopyInResponse),
        (b'H', BackendMessage::CopyOutResponse),
        (b'W', BackendMessage::CopyBothResponse),
        (b't', BackendMessage::ParameterDescription),
        (b's', BackendMessage::PortalSuspended),
        (b'V', BackendMessage::Other(b'V')),
        (b'~', BackendMessage::Other(b'~')),
    ];
    for (tag, expected) in cases {
        let body: &[u8] = if tag == b's' { b"" } else { b"\x00\x01garbage" };
        assert_eq!(parse_backend(&raw(tag, body)), Ok(expected));
    }
    assert_eq!(
        parse_backend(&raw(b'R', &[0, 0, 0, 7, 1, 2])),
        Ok(BackendMessage::Authentication(Auth::Other(7)))
    );
}

#[test]
fn backend_malformed_bodies() {
    let cases: Vec<(u8, Vec<u8>, &str)> = vec![
        (b'R', vec![0, 0], "short auth code"),
        (b'R', vec![0, 0, 0, 0, 1], "auth ok with body"),
        (b'R', vec![0, 0, 0, 5, 1, 2, 3], "short md5 salt"),
        (
            b'R',
            [&[0, 0, 0, 10][..], b"SCRAM-SHA-256\0"].concat(),
            "unterminated mechanism list",
        ),
        (b'S', b"TimeZone\0UTC".to_vec(), "unterminated value"),
        (b'K', vec![0, 0, 0, 1, 0, 0, 0], "short key"),
        (b'K', vec![0; 12], "long key"),
        (b'Z', b"X".to_vec(), "unknown status"),
        (b'Z', b"".to_vec(), "no status"),
        (b'Z', b"II".to_vec(), "two status bytes"),
        (b'C', b"SELECT 1".to_vec(), "unterminated tag"),
        (b'E', b"SERROR\0".to_vec(), "missing terminator"),
        (b'E', b"SERROR".to_vec(), "unterminated field"),
        (b'N', b"M\xff\0\0".to_vec(), "bad utf8"),
        (b'E', b"SERROR\0\0x".to_vec(), "trailing bytes"),
        (b'A', b"\0\0\0\x01chan\0".to_vec(), "missing payload"),
        (b'1', b"x".to_vec(), "parse complete with body"),
        (b'I', b"x".to_vec(), "empty query with body"),
    ];
    for (tag, body, what) in cases {
        let f = raw(tag, &body);
        let r = parse_backend(&f);
        assert!(
            matches!(r, Err(FrameError::Malformed { tag: t, .. }) if t == tag),
            "{what}: {r:?}"
        );
    }
}

#[test]
fn error_response_round_trip() {
    let err = ErrorResponse::error(sqlstate::READ_ONLY_SQL_TRANSACTION, "cannot write here")
        .with_detail("the session is pinned to a standby")
        .with_hint("use BEGIN READ WRITE");
    let f = frame(err.to_bytes());
    assert_eq!(f.tag, b'E');
    let BackendMessage::ErrorResponse(fields) = parse_backend(&f).unwrap() else {
        panic!("not an error")
    };
    assert_eq!(fields.severity, Some("ERROR"));
    assert_eq!(fields.severity_nonlocalized, Some("ERROR"));
    assert_eq!(fields.code, Some("25006"));
    assert_eq!(fields.message, Some("cannot write here"));
    assert_eq!(fields.detail, Some("the session is pinned to a standby"));
    assert_eq!(fields.hint, Some("use BEGIN READ WRITE"));
    let all: Vec<(u8, &str)> = fields.fields().collect();
    assert_eq!(
        all.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        b"SVCMDH".to_vec()
    );
    assert_eq!(fields.get(b'C'), Some("25006"));
    assert_eq!(fields.get(b'P'), None);
    assert_eq!(ErrorResponse::from_fields(&fields), err);

    let notice = ErrorResponse::new(Severity::Notice, "00000", "hello");
    let f = frame(notice.to_notice_bytes());
    assert_eq!(f.tag, b'N');
    let BackendMessage::NoticeResponse(fields) = parse_backend(&f).unwrap() else {
        panic!("not a notice")
    };
    assert_eq!(fields.severity_code(), Some("NOTICE"));
    assert_eq!(fields.detail, None);
    assert_eq!(build::notice(&notice), notice.to_notice_bytes());
    assert_eq!(build::error_response(&err), err.to_bytes());
}

#[test]
fn error_fields_keep_unknown_fields() {
    let body = b"SERROR\0VERROR\0C42P01\0Mrelation \"t\" does not exist\0P15\0Fparse_relation.c\0L1449\0\0";
    let f = raw(b'E', body);
    let BackendMessage::ErrorResponse(fields) = parse_backend(&f).unwrap() else {
        panic!()
    };
    assert_eq!(fields.fields().count(), 7);
    assert_eq!(fields.get(b'P'), Some("15"));
    assert_eq!(fields.get(b'L'), Some("1449"));
    let copy = ErrorResponse::from_fields(&fields);
    assert_eq!(copy.code, "42P01");
    assert_eq!(copy.severity, Severity::Error);
}

#[test]
fn fatal_and_exact_bytes() {
    let err = ErrorResponse::fatal(
        sqlstate::INVALID_PASSWORD,
        "password authentication failed for user \"a\"",
    );
    assert_eq!(err.severity, Severity::Fatal);
    let expected: &[u8] =
        b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"a\"\0\0";
    let bytes = err.to_bytes();
    assert_eq!(&bytes[5..], expected);
    assert_eq!(
        u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize,
        expected.len() + 4
    );
    assert_eq!(
        err.to_string(),
        "FATAL: password authentication failed for user \"a\" (28P01)"
    );
}

#[test]
fn frame_errors_become_fatal_protocol_violations() {
    let e = FrameError::UnknownTag(b'z');
    let resp = ErrorResponse::from(&e);
    assert_eq!(resp.severity, Severity::Fatal);
    assert_eq!(resp.code, "08P01");
    assert_eq!(resp.message, "invalid frontend message type 'z' (122)");
    assert_eq!(
        FrameError::TooLong { len: 5, max: 4 }.to_string(),
        "invalid message length 5: larger than the maximum of 4 bytes"
    );
}

#[test]
fn builders_cut_strings_at_nul() {
    let f = frame(build::query("select 1\0; drop table t"));
    assert_eq!(
        parse_frontend(&f),
        Ok(FrontendMessage::Query { sql: "select 1" })
    );
    let err = ErrorResponse::error("XX000", "a\0b");
    assert!(parse_backend(&frame(err.to_bytes())).is_ok());
}

#[test]
fn fixed_messages_exact_bytes() {
    assert_eq!(&build::sync()[..], b"S\0\0\0\x04");
    assert_eq!(&build::flush()[..], b"H\0\0\0\x04");
    assert_eq!(&build::terminate()[..], b"X\0\0\0\x04");
    assert_eq!(&build::ssl_no()[..], b"N");
    assert_eq!(&build::ready_for_query(TxStatus::Idle)[..], b"Z\0\0\0\x05I");
    assert_eq!(&build::authentication_ok()[..], b"R\0\0\0\x08\0\0\0\0");
    assert_eq!(&build::ssl_request()[..], b"\0\0\0\x08\x04\xd2\x16\x2f");
    assert_eq!(
        &build::startup(&[("user", "u")])[..],
        b"\0\0\0\x10\0\x03\0\0user\0u\0\0"
    );
}

#[test]
fn tx_status_bytes() {
    for s in [TxStatus::Idle, TxStatus::InTransaction, TxStatus::Failed] {
        assert_eq!(TxStatus::from_byte(s.as_byte()), Some(s));
    }
    assert_eq!(TxStatus::from_byte(b'x'), None);
}

#[test]
fn sqlstate_helpers() {
    for code in [
        sqlstate::PROTOCOL_VIOLATION,
        sqlstate::INVALID_PASSWORD,
        sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
        sqlstate::TOO_MANY_CONNECTIONS,
        sqlstate::CONNECTION_FAILURE,
        sqlstate::ADMIN_SHUTDOWN,
        sqlstate::CANNOT_CONNECT_NOW,
        sqlstate::QUERY_CANCELED,
        sqlstate::FEATURE_NOT_SUPPORTED,
        sqlstate::INVALID_CATALOG_NAME,
        sqlstate::READ_ONLY_SQL_TRANSACTION,
        sqlstate::REPLICA_NOT_CAUGHT_UP,
    ] {
        assert!(sqlstate::is_valid(code), "{code}");
    }
    assert_eq!(sqlstate::class("28P01"), Some("28"));
    assert_eq!(sqlstate::class("28p01"), None);
    assert!(!sqlstate::is_valid("2800"));
    assert_eq!(Severity::parse("FATAL"), Some(Severity::Fatal));
    assert_eq!(Severity::parse("fatal"), None);
}
