//! Framing of startup packets and tagged frames.

use bytes::{BufMut, Bytes, BytesMut};
use pgfresh_wire::build;
use pgfresh_wire::{
    decode_backend, decode_frame, decode_frontend, decode_startup, frame_at, CancelKey, Decoded,
    Frame, FrameError, Limits, StartupPacket,
};

fn buf(bytes: &[u8]) -> BytesMut {
    BytesMut::from(bytes)
}

fn tagged(tag: u8, len: u32, body: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u8(tag);
    b.put_u32(len);
    b.put_slice(body);
    b
}

fn expect_frame(r: Result<Decoded<Frame>, FrameError>) -> Frame {
    match r {
        Ok(Decoded::Frame(f)) => f,
        other => panic!("expected a frame, got {other:?}"),
    }
}

#[test]
fn splits_consecutive_frames_without_copying() {
    let mut input = BytesMut::new();
    input.extend_from_slice(&build::query("select 1"));
    input.extend_from_slice(&build::sync());
    input.extend_from_slice(b"Q\0"); // start of a third frame
    let base = input.as_ptr();
    let limits = Limits::default();

    let q = expect_frame(decode_frontend(&mut input, &limits));
    assert_eq!(q.tag, b'Q');
    assert_eq!(q.body(), b"select 1\0");
    assert_eq!(q.raw, build::query("select 1"));
    // The frame shares the input's memory.
    assert_eq!(q.raw.as_ptr(), base);

    let s = expect_frame(decode_frontend(&mut input, &limits));
    assert_eq!(s.tag, b'S');
    assert!(s.body().is_empty());
    assert_eq!(s.len(), 5);

    assert_eq!(
        decode_frontend(&mut input, &limits),
        Ok(Decoded::Incomplete { needed: None })
    );
    assert_eq!(&input[..], b"Q\0");
}

#[test]
fn incomplete_reports_missing_bytes() {
    let limits = Limits::default();
    let full = build::query("select 42");
    for cut in 0..full.len() {
        let mut b = buf(&full[..cut]);
        let expected = if cut < 5 {
            None
        } else {
            Some(full.len() - cut)
        };
        assert_eq!(
            decode_frame(&mut b, &limits),
            Ok(Decoded::Incomplete { needed: expected }),
            "cut at {cut}"
        );
        assert_eq!(b.len(), cut, "nothing consumed");
    }
}

#[test]
fn length_below_four_is_rejected() {
    for len in 0..4 {
        let mut b = tagged(b'Q', len, b"");
        assert_eq!(
            decode_frame(&mut b, &Limits::default()),
            Err(FrameError::TooShort { len: len as usize })
        );
    }
}

#[test]
fn huge_length_is_rejected_from_the_header_alone() {
    // A header claiming 2 GiB with only 5 bytes present: rejected at once,
    // with nothing reserved.
    let mut b = tagged(b'd', 0x8000_0000, b"");
    let cap_before = b.capacity();
    assert_eq!(
        decode_frame(&mut b, &Limits::default()),
        Err(FrameError::TooLong {
            len: 0x8000_0000,
            max: 1 << 30
        })
    );
    assert_eq!(b.capacity(), cap_before);
    let mut b = tagged(b'd', u32::MAX, b"");
    assert!(matches!(
        decode_backend(&mut b, &Limits::default()),
        Err(FrameError::TooLong { .. })
    ));
}

#[test]
fn configurable_maximum() {
    let limits = Limits {
        max_message: 16,
        max_startup: 64,
    };
    let mut ok = tagged(b'd', 16, &[0; 12]);
    assert_eq!(expect_frame(decode_frame(&mut ok, &limits)).len(), 17);
    let mut too_long = tagged(b'd', 17, &[0; 13]);
    assert_eq!(
        decode_frame(&mut too_long, &limits),
        Err(FrameError::TooLong { len: 17, max: 16 })
    );
}

#[test]
fn frontend_tags_are_validated() {
    let limits = Limits::default();
    for &tag in b"QPBDECSHFdcfXp" {
        let mut b = tagged(tag, 4, b"");
        assert_eq!(expect_frame(decode_frontend(&mut b, &limits)).tag, tag);
    }
    for tag in 0..=255u8 {
        if b"QPBDECSHFdcfXp".contains(&tag) {
            continue;
        }
        // Rejected as soon as the type byte arrives.
        let mut b = buf(&[tag]);
        assert_eq!(
            decode_frontend(&mut b, &limits),
            Err(FrameError::UnknownTag(tag))
        );
        // Servers may send anything.
        let mut b = tagged(tag, 4, b"");
        assert_eq!(expect_frame(decode_backend(&mut b, &limits)).tag, tag);
    }
}

#[test]
fn frame_from_raw_checks_length() {
    let f = Frame::from_raw(build::query("x")).unwrap();
    assert_eq!(f.tag, b'Q');
    assert_eq!(f.into_bytes(), build::query("x"));
    assert!(Frame::from_raw(Bytes::from_static(b"Q\0\0")).is_err());
    assert!(Frame::from_raw(Bytes::from_static(b"Q\0\0\0\x02")).is_err());
    assert!(Frame::from_raw(Bytes::from_static(b"Q\0\0\0\x06x")).is_err());
    assert!(Frame::from_raw(Bytes::from_static(b"Q\0\0\0\x04x")).is_err());
    // A hand-built frame with no header has an empty body, no panic.
    let bogus = Frame {
        tag: b'Q',
        raw: Bytes::from_static(b"Q"),
    };
    assert!(bogus.body().is_empty());
}

// ------------------------------------------------------------- startup

fn startup_packet(code: u32, rest: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u32(8 + rest.len() as u32);
    b.put_u32(code);
    b.put_slice(rest);
    b
}

fn decode_one(mut b: BytesMut) -> Result<StartupPacket, FrameError> {
    match decode_startup(&mut b, &Limits::default())? {
        Decoded::Frame(p) => {
            assert!(b.is_empty(), "whole packet consumed");
            Ok(p)
        }
        Decoded::Incomplete { needed } => panic!("incomplete, needed {needed:?}"),
    }
}

#[test]
fn startup_message_round_trip() {
    let bytes = build::startup(&[
        ("user", "alice"),
        ("database", "shop"),
        ("application_name", "psql"),
        ("client_encoding", "'utf-8'"),
        ("options", "-c search_path=app"),
    ]);
    let StartupPacket::Startup(m) = decode_one(buf(&bytes)).unwrap() else {
        panic!("not a startup message")
    };
    assert_eq!(m.protocol, 196_608);
    assert_eq!((m.major(), m.minor()), (3, 0));
    assert_eq!(m.user(), Some("alice"));
    assert_eq!(m.database(), Some("shop"));
    assert_eq!(m.options(), Some("-c search_path=app"));
    assert_eq!(m.get("client_encoding"), Some("'utf-8'"));
    assert_eq!(m.get("missing"), None);
    assert_eq!(m.params.len(), 5);
    assert_eq!(m.to_bytes(), bytes);
}

#[test]
fn startup_database_defaults_to_user() {
    let b = build::startup(&[("user", "bob")]);
    let StartupPacket::Startup(m) = decode_one(buf(&b)).unwrap() else {
        panic!()
    };
    assert_eq!(m.database(), Some("bob"));
    let b = build::startup(&[("user", "bob"), ("database", "")]);
    let StartupPacket::Startup(m) = decode_one(buf(&b)).unwrap() else {
        panic!()
    };
    assert_eq!(m.database(), Some("bob"));
    let b = build::startup(&[]);
    let StartupPacket::Startup(m) = decode_one(buf(&b)).unwrap() else {
        panic!()
    };
    assert_eq!((m.user(), m.database()), (None, None));
}

#[test]
fn startup_minor_versions_are_accepted() {
    let b = startup_packet(0x0003_0002, b"user\0u\0\0");
    let StartupPacket::Startup(m) = decode_one(b).unwrap() else {
        panic!()
    };
    assert_eq!((m.major(), m.minor()), (3, 2));
    assert_eq!(
        &m.to_bytes()[..],
        &startup_packet(0x0003_0002, b"user\0u\0\0")[..]
    );
}

#[test]
fn special_requests() {
    assert_eq!(
        decode_one(buf(&build::ssl_request())),
        Ok(StartupPacket::SslRequest)
    );
    assert_eq!(
        decode_one(buf(&build::gssenc_request())),
        Ok(StartupPacket::GssEncRequest)
    );
    let key = CancelKey {
        pid: 4242,
        secret: -17,
    };
    assert_eq!(
        decode_one(buf(&build::cancel_request(key))),
        Ok(StartupPacket::Cancel(key))
    );
}

#[test]
fn special_requests_with_wrong_length() {
    let cases = [
        startup_packet(80_877_103, b"x"),
        startup_packet(80_877_104, b"xyzw"),
        startup_packet(80_877_102, &[0; 4]),
        startup_packet(80_877_102, &[0; 12]),
    ];
    for b in cases {
        assert!(
            matches!(decode_one(b), Err(FrameError::InvalidStartup(_))),
            "wrong length accepted"
        );
    }
}

#[test]
fn startup_errors() {
    let cases: Vec<(BytesMut, &str)> = vec![
        (startup_packet(80_877_199, b""), "unknown code"),
        (startup_packet(0x0002_0000, b"user\0u\0\0"), "v2"),
        (startup_packet(0x0004_0000, b"user\0u\0\0"), "v4"),
        (startup_packet(196_608, b""), "no terminator"),
        (
            startup_packet(196_608, b"user\0alice\0"),
            "no terminator after list",
        ),
        (
            startup_packet(196_608, b"user\0alice"),
            "unterminated value",
        ),
        (startup_packet(196_608, b"user\0"), "name without value"),
        (startup_packet(196_608, b"user\0alice\0db\0"), "odd list"),
        (startup_packet(196_608, b"user"), "unterminated name"),
        (
            startup_packet(196_608, b"\0extra"),
            "bytes after terminator",
        ),
        (
            startup_packet(196_608, b"user\0\xff\xfe\0\0"),
            "bad utf8 value",
        ),
        (startup_packet(196_608, b"\xc3\0v\0\0"), "bad utf8 name"),
    ];
    for (b, what) in cases {
        let r = decode_one(b);
        assert!(
            matches!(
                r,
                Err(FrameError::InvalidStartup(_)) | Err(FrameError::UnknownStartupCode(_))
            ),
            "{what}: {r:?}"
        );
    }
    assert_eq!(
        decode_one(startup_packet(80_877_199, b"")),
        Err(FrameError::UnknownStartupCode(80_877_199))
    );
    let err = decode_one(startup_packet(0x0002_0000, b"user\0u\0\0")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid startup packet: unsupported frontend protocol 2.0: server supports 3.0"
    );
    assert_eq!(err.sqlstate(), "08P01");
}

#[test]
fn startup_length_limits() {
    let limits = Limits::default();
    for len in 0..8u32 {
        let mut b = BytesMut::new();
        b.put_u32(len);
        b.put_u32(196_608);
        assert_eq!(
            decode_startup(&mut b, &limits),
            Err(FrameError::TooShort { len: len as usize })
        );
    }
    let mut b = BytesMut::new();
    b.put_u32(10 * 1024 + 1);
    assert_eq!(
        decode_startup(&mut b, &limits),
        Err(FrameError::TooLong {
            len: 10 * 1024 + 1,
            max: 10 * 1024
        })
    );
    // Garbage before startup, such as an HTTP request, reads as a huge length.
    let mut b = buf(b"GET / HTTP/1.1\r\n\r\n");
    assert!(matches!(
        decode_startup(&mut b, &limits),
        Err(FrameError::TooLong { .. })
    ));
    // A TLS ClientHello sent without SSLRequest.
    let mut b = buf(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc]);
    assert!(matches!(
        decode_startup(&mut b, &limits),
        Err(FrameError::TooLong { .. })
    ));
}

#[test]
fn startup_incomplete() {
    let full = build::startup(&[("user", "alice")]);
    for cut in 0..full.len() {
        let mut b = buf(&full[..cut]);
        let expected = if cut < 4 {
            None
        } else {
            Some(full.len() - cut)
        };
        assert_eq!(
            decode_startup(&mut b, &Limits::default()),
            Ok(Decoded::Incomplete { needed: expected })
        );
    }
    // SSLRequest followed by the StartupMessage in the same read.
    let mut b = BytesMut::new();
    b.extend_from_slice(&build::ssl_request());
    b.extend_from_slice(&full);
    assert_eq!(
        decode_startup(&mut b, &Limits::default()),
        Ok(Decoded::Frame(StartupPacket::SslRequest))
    );
    assert!(matches!(
        decode_startup(&mut b, &Limits::default()),
        Ok(Decoded::Frame(StartupPacket::Startup(_)))
    ));
    assert!(b.is_empty());
}

#[test]
fn frames_are_read_in_place() {
    let buf = [b'Z', 0, 0, 0, 5, b'I', b'C', 0, 0, 0, 9, b'S', b'E', b'L'];
    assert_eq!(frame_at(&buf, 0, 100), Ok(Some((b'Z', 6))));
    // Not all of it yet, not even all of the header.
    assert_eq!(frame_at(&buf, 6, 100), Ok(None));
    assert_eq!(frame_at(&buf, 12, 100), Ok(None));
    assert_eq!(frame_at(&buf, 20, 100), Ok(None));
    // Too short to count itself, or over the limit.
    assert_eq!(frame_at(&[b'Z', 0, 0, 0, 3], 0, 100), Err(3));
    assert_eq!(frame_at(&buf, 0, 4), Err(5));
}
